#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Builds the DERIVED retention-samples files of data/derived/ from the real ones in data/profiles/.

There are no real retention samples for the hybrid (sliding-window) models or the models with
four KV heads per layer, so these files re-map real measurements onto those models' shapes. They
exercise planning code paths (unprofiled sliding-window layers, few heads per layer); they say
nothing about how those models actually retain tokens. Deterministic; run from the repository root:

    python3 data/derived/make_derived.py
"""
import json
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

# (output, source scorer/model, target model name, model layers, target layer ids,
#  source layer index for each target layer, source KV heads kept)
DERIVED = [
    ("gemma-3-12b-it.derived.json", "snapkv/llama-3.1-8b-instruct", "google/gemma-3-12b-it", 48,
     [5, 11, 17, 23, 29, 35, 41, 47], [3, 7, 11, 15, 19, 23, 27, 31], list(range(8))),
    ("gpt-oss-20b.derived.json", "ea/qwen3-4b-instruct-2507", "openai/gpt-oss-20b", 24,
     list(range(1, 24, 2)), list(range(2, 36, 3)), list(range(8))),
    ("qwen2.5-7b-instruct.derived.json", "keydiff/qwen3-4b-instruct-2507",
     "Qwen/Qwen2.5-7B-Instruct", 28, list(range(28)), list(range(28)), [0, 2, 4, 6]),
]


def main():
    for out, src, model, num_layers, layer_ids, src_layers, src_heads in DERIVED:
        with open(os.path.join(ROOT, "data", "profiles", src + ".json")) as f:
            s = json.load(f)
        assert len(layer_ids) == len(src_layers)
        doc = {
            "format": "retention-samples/v1",
            "description": (
                "DERIVED, NOT MEASURED: real per-head retention of " + s["model"] + " (" +
                s["scorer"] + ", data/profiles/" + src + ".json) re-mapped onto the shape of " +
                model + ": profiled layer i takes source layer " + str(src_layers) + "[i], KV head j "
                "takes source KV head " + str(src_heads) + "[j]. For planning tests only."),
            "derived_from": "data/profiles/" + src + ".json",
            "model": model,
            "scorer": s["scorer"],
            "target_keep_ratio": s["target_keep_ratio"],
            "sink_tokens": s["sink_tokens"],
            "window_tokens": s["window_tokens"],
            "num_model_layers": num_layers,
            "layer_ids": layer_ids,
            "num_kv_heads": len(src_heads),
            "hybrid_sliding_window": len(layer_ids) < num_layers,
            "samples": [{
                "context_tokens": smp["context_tokens"],
                "kept_tokens": [[smp["kept_tokens"][l][h] for h in src_heads] for l in src_layers],
            } for smp in s["samples"]],
        }
        with open(os.path.join(ROOT, "data", "derived", out), "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")


if __name__ == "__main__":
    main()
