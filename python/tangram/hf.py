# SPDX-License-Identifier: Apache-2.0
"""Hugging Face transformers on Tangram memory: ``TangramCache`` and a kvpress score adapter.

``TangramCache`` is a ``transformers.Cache`` whose K/V live in the pages of a Tangram
``KVCacheManager`` (a host pool): a request is admitted (its footprint reserved), each prefill
chunk is attended over the kept pages plus the chunk and then evicted into the pages by the CPU
reference kernels (``reference_prefill_attention``, ``reference_evict``), and each decode token is
appended and attended over the pages (``reference_append``, ``reference_decode_attention``). Pages
the eviction does not keep are never drawn, so the memory a compressed head saves is really free,
where kvpress's head-wise presses only mask.

The attention runs in Tangram's kernels, not in the model's: ``attach(model)`` registers the
attention implementation ``"tangram"`` (and a mask function that builds no mask) and switches the
model to it. Then::

    cache = TangramCache(model, prompt_tokens=n, max_new_tokens=t, keep_ratio=0.5,
                         scores=KVPressScores(KnormPress(compression_ratio=0.5)))
    out = model.generate(ids, past_key_values=cache, max_new_tokens=t, do_sample=False,
                         prefill_chunk_size=c)   # optional: chunked prefill, one eviction per chunk

One sequence per cache (batch size 1), decoder-only models with full attention in every layer
(Llama- and Qwen3-style). torch and transformers are imported by this module only.
"""
from __future__ import annotations

import contextvars
import json
import math
from typing import Callable, Optional

import numpy as np
import torch
from transformers import Cache
from transformers.cache_utils import CacheLayerMixin
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import AttentionInterface

import tangram

ATTENTION = "tangram"

# The cache whose update() ran last on this thread: the attention function of the same layer
# runs right after it (transformers passes the cache to update(), not to the attention).
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("tangram_hf_cache", default=None)


def _text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def model_spec(config, kv_dtype: str = "f32") -> "tangram.ModelSpec":
    """The Tangram model spec of a transformers config: every layer compressed (full attention)."""
    c = _text_config(config)
    hq = c.num_attention_heads
    hkv = getattr(c, "num_key_value_heads", None) or hq
    d = getattr(c, "head_dim", None) or c.hidden_size // hq
    types = getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers
    if any(t != "full_attention" for t in types):
        raise ValueError(f"config.layer_types: only full_attention layers are supported, got {types}")
    doc = {"name": getattr(c, "model_type", "hf"), "num_layers": c.num_hidden_layers,
           "num_query_heads": hq, "num_kv_heads": hkv, "head_dim": d, "kv_dtype": kv_dtype,
           "layers": [{"kind": "compressed"}] * c.num_hidden_layers}
    return tangram.parse_model_spec(json.dumps(doc), "transformers config")


def uniform_plan(config, keep_ratio: float, *, page_tokens: int = 16, group_size: int = 1,
                 kv_dtype: str = "f32") -> "tangram.StaticPlan":
    """A static plan in which every head keeps ``ceil(keep_ratio * n)`` of n tokens (no protected
    tokens): the budget a kvpress ``ScorerPress`` of ``compression_ratio = 1 - keep_ratio`` keeps
    per head (kvpress rounds down, Tangram up: they agree when ``keep_ratio * n`` is whole)."""
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio: must be in (0, 1], got {keep_ratio}")
    spec = model_spec(config, kv_dtype)
    L, H = spec.num_layers, spec.num_kv_heads
    profile = tangram.parse_budget_profile(json.dumps({
        "format": "tangram-budget-profile/v1", "model": spec.name, "scorer": "kvpress",
        "num_model_layers": L, "num_kv_heads": H, "layer_ids": list(range(L)),
        "sink_tokens": 0, "window_tokens": 0, "target_keep_ratio": keep_ratio,
        "budgets": [[keep_ratio] * H for _ in range(L)]}), "uniform profile")
    o = tangram.PlanOptions()
    o.reservation = "static"
    o.page_tokens = page_tokens
    o.group_size = group_size
    return tangram.build_plan(spec, profile, o)


class KVPressScores:
    """Per-head scores from a kvpress ``ScorerPress`` (``press.score``), for Tangram's eviction.

    Called with the layer's attention module, the chunk's hidden states and forward kwargs, and
    the candidates' keys/values ``[1, H, held + chunk, d]`` (held tokens first, in order); returns
    float32 ``[H, held + chunk]`` (higher is kept). The selection itself is Tangram's: the top
    ``k_h(n)`` by score, per head, as ``ScorerPress.compress`` takes its ``topk``."""

    def __init__(self, press):
        self.press = press

    def __call__(self, module, hidden_states, keys, values, kwargs) -> np.ndarray:
        s = self.press.score(module, hidden_states, keys, values, None, kwargs)
        return s[0].detach().to(torch.float32).cpu().numpy()


class _TangramLayer(CacheLayerMixin):
    """One layer of a TangramCache (what transformers' generic cache code inspects)."""

    is_sliding = False

    def __init__(self, owner: "TangramCache", layer: int):
        super().__init__()
        self.owner, self.layer = owner, layer
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states):  # nothing: the pool exists
        pass

    def update(self, key_states, value_states, cache_kwargs=None):
        return key_states, value_states

    def get_seq_length(self) -> int:
        return self.owner.seen_tokens

    def get_mask_sizes(self, cache_position):
        return int(cache_position[-1]) + 1, 0

    def get_max_cache_shape(self) -> int:
        return -1


class TangramCache(Cache):
    """A transformers ``Cache`` backed by a Tangram ``KVCacheManager`` (host pool, CPU reference
    kernels). One sequence of ``prompt_tokens`` prompt tokens and up to ``max_new_tokens``
    generated ones, admitted at the first forward (``MemoryError``-free: a request that does not
    fit raises ``RuntimeError`` naming the pages missing before anything runs).

    keep_ratio: each head keeps ``ceil(keep_ratio * n)`` tokens after n (1: nothing evicted, the
    cache then equals ``DynamicCache``). scores: a callable as ``KVPressScores`` (default: minus
    the key norm, Tangram's built-in ``key_norm``). plan: a plan of your own instead of
    ``uniform_plan(config, keep_ratio, ...)``.
    """

    def __init__(self, model, *, prompt_tokens: int, max_new_tokens: int, keep_ratio: float = 1.0,
                 scores: Optional[Callable] = None, plan=None, num_pages: int = 0,
                 page_tokens: int = 16, group_size: int = 1, kv_dtype: str = "f32"):
        if kv_dtype not in ("f32",):
            raise ValueError(f"kv_dtype: only 'f32' is supported by TangramCache, got {kv_dtype!r}")
        self.config = _text_config(model.config)
        self.plan = plan or uniform_plan(self.config, keep_ratio, page_tokens=page_tokens,
                                         group_size=group_size, kv_dtype=kv_dtype)
        L, H = self.plan.num_layers, self.plan.num_kv_heads
        if num_pages <= 0:
            num_pages = 2 * self._pages_for(prompt_tokens + max_new_tokens)
        self.kv = tangram.KVCacheManager(self.plan, num_pages=num_pages, max_sequences=1,
                                         max_chunk_tokens=max(1, prompt_tokens))
        self.prompt_tokens, self.max_new_tokens = int(prompt_tokens), int(max_new_tokens)
        self.scores = scores
        self.seq = None
        self.seen_tokens = 0
        self._kept = np.zeros(L * H, dtype=np.int32)
        self._hooks = []
        super().__init__(layers=[_TangramLayer(self, l) for l in range(L)])

    def _pages_for(self, tokens: int) -> int:
        return self.plan.num_groups * math.ceil(tokens / self.plan.page_tokens) + 1

    # ----- transformers' Cache interface
    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        _ACTIVE.set(self)
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def get_mask_sizes(self, cache_position, layer_idx: int = 0):
        return int(cache_position[-1]) + 1, 0

    # ----- memory
    def memory_bytes(self) -> int:
        """Bytes of the pages the sequence holds (used pages x page bytes)."""
        return self.kv.used_pages * self.plan.page_bytes

    def reserved_bytes(self) -> int:
        """Bytes promised to the sequence and not yet drawn (its remaining reservation)."""
        return self.kv.reserved_pages * self.plan.page_bytes

    def head_keys(self, layer: int, head: int) -> np.ndarray:
        """The K rows head (layer, head) holds, oldest first: float32 [len, d] read from the pool."""
        return self._held(layer, head, 0)

    def _held(self, layer: int, head: int, kv_index: int) -> np.ndarray:
        v = self.kv.view()
        g, col = (int(x) for x in v["head_group"][2 * (layer * self.plan.num_kv_heads + head):][:2])
        n = self.kv.head_len(self.seq, layer, head)
        P, Hp, d = self.plan.page_tokens, self.plan.group_size, self.plan.model.head_dim
        pages = np.asarray(self.kv.group_pages(self.seq, g), dtype=np.int64)
        pool = self.kv.pool().view(np.float32).reshape(-1, 2, Hp, P, d)
        t = np.arange(n)
        return pool[pages[t // P], kv_index, col, t % P]

    # ----- the attention implementation
    def _chunk_step(self, layer: int, c: int):
        if layer == 0:
            if self.seq is None:
                r = self.kv.admit(self.prompt_tokens, self.max_new_tokens)
                if r["id"] is None:
                    raise RuntimeError(f"TangramCache: the request does not fit ({r['reason']}, "
                                       f"{r['pages_missing']} pages missing)")
                self.seq = r["id"]
            self.kv.set_batch(tangram.BatchKind.prefill, [self.seq])
            self.kv.prepare_chunk(self.seq, c)

    def attend(self, module, query, key, value, scaling, kwargs):
        layer, H = module.layer_idx, self.plan.num_kv_heads
        q_len = query.shape[2]
        q = query[0].transpose(0, 1).to(torch.float32).contiguous().numpy()    # [c, Hq, d]
        k = key[0].transpose(0, 1).to(torch.float32).contiguous().numpy()      # [c, H, d]
        v = value[0].transpose(0, 1).to(torch.float32).contiguous().numpy()
        prompt_left = self.prompt_tokens - self.seen_tokens
        if prompt_left > 0:
            if q_len > prompt_left:
                raise ValueError(f"TangramCache: a forward of {q_len} tokens passes the "
                                 f"{prompt_left} prompt tokens left (prompt_tokens)")
            self._chunk_step(layer, q_len)
            indptr = np.array([0, q_len], dtype=np.int32)
            kind = tangram.BatchKind.prefill
            o, _ = tangram.reference_prefill_attention(self.kv, layer, indptr, q, k, v,
                                                       sm_scale=scaling, kind=kind)
            held = [self.kv.head_len(self.seq, layer, h) for h in range(H)]
            m = max(held) + q_len
            if self.scores is None:
                new_len = tangram.reference_evict(self.kv, layer, indptr, k, v, source="key_norm",
                                                  max_candidates=m, kind=kind)
            else:
                keys = np.zeros((1, H, m, k.shape[-1]), dtype=np.float32)
                vals = np.zeros_like(keys)
                for h in range(H):
                    n = held[h]
                    keys[0, h, :n], vals[0, h, :n] = self._held(layer, h, 0), self._held(layer, h, 1)
                    keys[0, h, n:n + q_len], vals[0, h, n:n + q_len] = k[:, h], v[:, h]
                s = np.full((H, m), -np.inf, dtype=np.float32)
                hidden = kwargs.get("hidden_states")
                # The press scores every head's candidates in one call when the heads hold as
                # many tokens (uniform budgets); otherwise once per length.
                for n in sorted({h_len + q_len for h_len in held}):
                    sh = self.scores(module, hidden, torch.from_numpy(keys[:, :, :n]),
                                     torch.from_numpy(vals[:, :, :n]), kwargs)
                    for h in range(H):
                        if held[h] + q_len == n:
                            s[h, :n] = sh[h, :n]
                new_len = tangram.reference_evict(self.kv, layer, indptr, k, v, source="supplied",
                                                  scores=s, max_candidates=m, kind=kind)
            self._kept[layer * H:(layer + 1) * H] = new_len[0]
            if layer == self.plan.num_layers - 1:
                self.kv.commit_chunk(self.seq, self._kept)
                self.seen_tokens += q_len
            return torch.from_numpy(o).unsqueeze(0).to(query.dtype)
        if q_len != 1:
            raise ValueError(f"TangramCache: decode takes one token per forward, got {q_len}")
        if layer == 0:
            self.kv.set_batch([self.seq])
            self.kv.decode_step()
        tangram.reference_append(self.kv, layer, k, v)
        o, _ = tangram.reference_decode_attention(self.kv, layer, q, sm_scale=scaling)
        if layer == self.plan.num_layers - 1:
            self.seen_tokens += 1
        return torch.from_numpy(o).unsqueeze(0).to(query.dtype)


def _tangram_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                       **kwargs):
    cache = _ACTIVE.get()
    if cache is None:
        raise RuntimeError("tangram attention: the model runs without a TangramCache "
                           "(pass past_key_values=TangramCache(...))")
    if scaling is None:
        scaling = 1.0 / math.sqrt(query.shape[-1])
    fwd = getattr(module, "_tangram_forward_kwargs", {})
    return cache.attend(module, query, key, value, float(scaling), fwd), None


def _no_mask(*args, **kwargs):
    return None


def _capture_kwargs(module, args, kwargs):
    module._tangram_forward_kwargs = kwargs


def attach(model) -> None:
    """Registers the ``"tangram"`` attention (and an empty mask function) with transformers and
    switches ``model`` to it; a forward pre-hook keeps each attention module's keyword arguments
    (hidden states, position embeddings) for score functions. Idempotent."""
    AttentionInterface.register(ATTENTION, _tangram_attention)
    AttentionMaskInterface.register(ATTENTION, _no_mask)
    model.set_attn_implementation(ATTENTION)
    inner = model.model.language_model if hasattr(model.model, "language_model") else model.model
    for layer in inner.layers:
        attn = layer.self_attn
        if not getattr(attn, "_tangram_hooked", False):
            attn.register_forward_pre_hook(_capture_kwargs, with_kwargs=True)
            attn._tangram_hooked = True
        # kvpress's scorers read the rotary embedding from the attention module
        attn.rotary_emb = inner.rotary_emb
