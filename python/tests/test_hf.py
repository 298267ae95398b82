# SPDX-License-Identifier: Apache-2.0
"""tangram.hf: transformers generate() on Tangram memory, against DynamicCache and kvpress.

Tiny randomly initialised Llama- and Qwen3-style models built from a config (no downloads), on the
CPU. Needs torch, transformers and kvpress (scripts/run_tests.sh installs them for the `hf` stage:
TANGRAM_STAGES=hf); skipped when they are absent.
"""
import copy
import importlib
import os

import numpy as np
import pytest


def _need(name):
    """The module, or a skip; TANGRAM_REQUIRE_HF=1 (the hf stage) makes its absence a failure."""
    if os.environ.get("TANGRAM_REQUIRE_HF"):
        return importlib.import_module(name)
    return pytest.importorskip(name)


torch = _need("torch")
transformers = _need("transformers")

from tangram import hf  # noqa: E402  (imports torch and transformers)

PROMPT, NEW = 40, 10


def tiny(kind):
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=256, attn_implementation="sdpa")
    torch.manual_seed(0)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common))
    return model.eval()


def prompt():
    # Distinct tokens: a repeated token's keys in layer 0 differ only by RoPE, which keeps their
    # norm, so KNorm scores would tie up to rounding and each library's reduction order (not the
    # press) would pick among them.
    g = torch.Generator().manual_seed(1)
    return torch.randperm(96, generator=g)[:PROMPT].unsqueeze(0)


def greedy(model, ids, cache, chunk=None):
    # An explicit all-ones mask: generate() would otherwise take the prompt's token 0 (the pad id)
    # for padding, which a TangramCache (one unpadded sequence) does not model.
    kw = dict(max_new_tokens=NEW, do_sample=False, past_key_values=cache, pad_token_id=0,
              attention_mask=torch.ones_like(ids))
    if chunk:
        kw["prefill_chunk_size"] = chunk
    with torch.no_grad():
        return model.generate(ids, **kw)[0, PROMPT:].tolist()


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("chunk", [None, 16])
def test_keep_ratio_one_generates_dynamic_cache_tokens(kind, chunk):
    model, ids = tiny(kind), prompt()
    # The same generate() call on DynamicCache (transformers' chunked prefill does not reproduce
    # its unchunked logits bit for bit, so each run is compared with the same chunking).
    want = greedy(model, ids, transformers.DynamicCache(), chunk)
    hf.attach(model)
    cache = hf.TangramCache(model, prompt_tokens=PROMPT, max_new_tokens=NEW)
    got = greedy(model, ids, cache, chunk)
    assert got == want
    # Every token in pages: one group per KV head (Hp 1), ceil((40 + 9 decoded) / 16) pages each.
    L, H = 2, 2
    assert cache.kv.used_pages == L * H * -(-(PROMPT + NEW - 1) // 16)
    cache.kv.check_invariants()


def kvpress_cache(model, press, ids):
    """kvpress's own run: the press hooked into a prefill of the whole prompt."""
    cache = transformers.DynamicCache()
    with torch.no_grad(), press(model):
        model(ids, past_key_values=cache)
    return cache


def rows_match(a, b, tol=1e-4):
    """Whether the rows of a and b ([n, d]) are the same set (each row of a near one of b)."""
    if a.shape != b.shape:
        return False
    dist = np.abs(a[:, None, :] - b[None, :, :]).max(-1)
    return bool((dist.min(1) <= tol).all() and len(set(dist.argmin(1).tolist())) == len(a))


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("press_name", ["knorm", "snapkv"])
def test_each_head_keeps_kvpress_selection(kind, press_name, capsys):
    kvpress = _need("kvpress")
    press = (kvpress.KnormPress(compression_ratio=0.5) if press_name == "knorm"
             else kvpress.SnapKVPress(compression_ratio=0.5, window_size=8))
    model, ids = tiny(kind), prompt()
    theirs = kvpress_cache(copy.deepcopy(model), press, ids)
    hf.attach(model)
    cache = hf.TangramCache(model, prompt_tokens=PROMPT, max_new_tokens=NEW, keep_ratio=0.5,
                            scores=hf.KVPressScores(press))
    with torch.no_grad():
        model(ids, past_key_values=cache)
    L, H = 2, 2
    for layer in range(L):
        k_theirs = theirs.layers[layer].keys[0].float().numpy()  # [H, kept, d]
        for h in range(H):
            ours = cache.head_keys(layer, h)
            assert ours.shape[0] == 20  # ceil(0.5 * 40) == kvpress's int(40 * 0.5)
            assert rows_match(ours, k_theirs[h]), (layer, h)
    # Memory: Tangram holds the kept tokens' pages; kvpress's ScorerPress shrinks its tensors too.
    theirs_bytes = sum(l.keys.nbytes + l.values.nbytes for l in theirs.layers)
    with capsys.disabled():
        print(f"\n  {kind}/{press_name}: Tangram holds {cache.memory_bytes()} B in pages "
              f"(+{cache.reserved_bytes()} B reserved for {NEW} answer tokens), kvpress "
              f"{theirs_bytes} B")
    assert cache.memory_bytes() == L * H * 2 * (2 * 16 * 16 * 4)  # 2 pages (K and V) per head


def test_compressed_generation_equals_kvpress(capsys):
    kvpress = _need("kvpress")
    press = kvpress.KnormPress(compression_ratio=0.5)
    model, ids = tiny("llama"), prompt()
    ref = copy.deepcopy(model)
    with press(ref):
        want = greedy(ref, ids, transformers.DynamicCache())
    hf.attach(model)
    cache = hf.TangramCache(model, prompt_tokens=PROMPT, max_new_tokens=NEW, keep_ratio=0.5,
                            scores=hf.KVPressScores(press))
    assert greedy(model, ids, cache) == want


def test_adakv_masks_where_tangram_frees(capsys):
    """AdaKV (head-wise budgets) in kvpress keeps every token and masks the evicted ones, so it
    holds the whole prompt; Tangram's static per-head budgets hold only what each head keeps.
    Their selections differ by design (AdaKV moves budget between the heads of a layer per input;
    a static plan fixes each head's count; Tangram's elastic eviction, not this cache, is the
    head-adaptive one): docs/python.md."""
    kvpress = _need("kvpress")
    press = kvpress.AdaKVPress(kvpress.KnormPress(compression_ratio=0.5))
    model, ids = tiny("llama"), prompt()
    theirs = kvpress_cache(copy.deepcopy(model), press, ids)
    theirs_bytes = sum(l.keys.nbytes + l.values.nbytes for l in theirs.layers)
    hf.attach(model)
    cache = hf.TangramCache(model, prompt_tokens=PROMPT, max_new_tokens=NEW, keep_ratio=0.5,
                            scores=hf.KVPressScores(press.press))
    with torch.no_grad():
        model(ids, past_key_values=cache)
    full = 2 * 2 * PROMPT * 16 * 4 * 2  # L x H x n x d x fp32 x (K and V)
    assert theirs_bytes == full
    assert cache.memory_bytes() < full
    with capsys.disabled():
        print(f"\n  AdaKV: kvpress holds {theirs_bytes} B (masks), Tangram {cache.memory_bytes()} B")


def test_errors_name_the_cause():
    model = tiny("llama")
    hf.attach(model)
    with pytest.raises(ValueError, match="keep_ratio"):
        hf.TangramCache(model, prompt_tokens=4, max_new_tokens=2, keep_ratio=0)
    cache = hf.TangramCache(model, prompt_tokens=4, max_new_tokens=2)
    with pytest.raises(ValueError, match="passes the 4 prompt tokens"):
        with torch.no_grad():
            model(torch.zeros((1, 6), dtype=torch.long), past_key_values=cache)


def test_the_example_generates_what_dynamic_cache_and_kvpress_do():
    """examples/python/hf_generate.py, the section's runnable example (docs/integration.md)."""
    _need("kvpress")
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "examples/python/hf_generate.py"
    spec = importlib.util.spec_from_file_location("hf_generate", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = example.run(verbose=False)
    assert out["tangram_keep_1"] == out["dynamic"]
    assert out["tangram_knorm"] == out["kvpress_knorm"]
    assert out["tangram_knorm"] != out["dynamic"]  # the compression changed the answer
    # Every token in pages at keep 1 (2 layers x 2 heads x ceil(49 / 16) pages of 2 KiB); half of
    # each head's 40 prompt tokens, 2 pages, under KnormPress; kvpress's exact-size tensors.
    assert out["tangram_keep_1_bytes"] == 2 * 2 * 4 * 2048
    assert out["tangram_knorm_bytes"] == 2 * 2 * 2 * 2048
    assert out["kvpress_bytes"] == 2 * 2 * (20 + 9) * 16 * 4 * 2
