# SPDX-License-Identifier: Apache-2.0
"""Hugging Face generate() on Tangram memory (tangram.hf), beside DynamicCache and kvpress.

A tiny randomly initialised Llama-style model built from a config (no download), on the CPU:
greedy generation with transformers' DynamicCache, with a TangramCache at keep ratio 1 (the same
tokens), and with a TangramCache that keeps half of each head's tokens by kvpress's KnormPress
scores (the same tokens as kvpress's own run, where kvpress is installed), with the memory each
holds. Needs torch and transformers (and kvpress for the compressed run):
`pip install -r python/requirements-hf.txt`.

Run: python examples/python/hf_generate.py [--model path-or-hub-id] [--prompt-tokens N]
"""
import argparse
import copy

import torch
import transformers

from tangram import hf


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(config).eval()


def greedy(model, ids, cache, new_tokens, chunk=None):
    kw = dict(max_new_tokens=new_tokens, do_sample=False, past_key_values=cache,
              attention_mask=torch.ones_like(ids), pad_token_id=0)
    if chunk:
        kw["prefill_chunk_size"] = chunk  # one Tangram eviction per chunk
    with torch.no_grad():
        return model.generate(ids, **kw)[0, ids.shape[1]:].tolist()


def cache_bytes(cache) -> int:
    return sum(l.keys.nbytes + l.values.nbytes for l in cache.layers)


def run(model=None, prompt_tokens: int = 40, new_tokens: int = 10, verbose: bool = True) -> dict:
    model = model if model is not None else tiny_llama()
    vocab = model.config.get_text_config(decoder=True).vocab_size
    g = torch.Generator().manual_seed(1)
    ids = torch.randperm(vocab, generator=g)[:prompt_tokens].unsqueeze(0)
    out = {}
    reference = copy.deepcopy(model)  # attach() switches a model's attention to Tangram's
    out["dynamic"] = greedy(reference, ids, transformers.DynamicCache(), new_tokens)

    hf.attach(model)
    full = hf.TangramCache(model, prompt_tokens=prompt_tokens, max_new_tokens=new_tokens)
    out["tangram_keep_1"] = greedy(model, ids, full, new_tokens)
    out["tangram_keep_1_bytes"] = full.memory_bytes()
    try:
        import kvpress
    except ImportError:
        kvpress = None
    if kvpress is not None:
        press = kvpress.KnormPress(compression_ratio=0.5)
        with press(reference):
            theirs = transformers.DynamicCache()
            out["kvpress_knorm"] = greedy(reference, ids, theirs, new_tokens)
        out["kvpress_bytes"] = cache_bytes(theirs)
        half = hf.TangramCache(model, prompt_tokens=prompt_tokens, max_new_tokens=new_tokens,
                               keep_ratio=0.5, scores=hf.KVPressScores(press))
        out["tangram_knorm"] = greedy(model, ids, half, new_tokens)
        out["tangram_knorm_bytes"] = half.memory_bytes()
    if verbose:
        print(f"DynamicCache           {out['dynamic']}")
        print(f"TangramCache, keep 1   {out['tangram_keep_1']}  "
              f"({out['tangram_keep_1_bytes']} B in pages)")
        if kvpress is not None:
            print(f"kvpress KnormPress 0.5 {out['kvpress_knorm']}  ({out['kvpress_bytes']} B)")
            print(f"TangramCache, keep 0.5 {out['tangram_knorm']}  "
                  f"({out['tangram_knorm_bytes']} B in pages)")
        else:
            print("kvpress not installed: the compressed comparison is skipped")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a local path or hub id (default: a tiny random Llama)")
    parser.add_argument("--prompt-tokens", type=int, default=40)
    parser.add_argument("--new-tokens", type=int, default=10)
    a = parser.parse_args()
    m = (transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
         if a.model else None)
    result = run(m, a.prompt_tokens, a.new_tokens)
    assert result["tangram_keep_1"] == result["dynamic"], "keep ratio 1 must equal DynamicCache"
    if "kvpress_knorm" in result:
        assert result["tangram_knorm"] == result["kvpress_knorm"], "KnormPress: kvpress differs"
