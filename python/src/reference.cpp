// SPDX-License-Identifier: Apache-2.0
// The CPU reference kernels on NumPy arrays, over a KVCacheManager's view and pool: append of a
// decode token's K/V, decode attention, and the fused eviction of a prefill chunk. They read and
// write the manager's page arena in place, exactly as the CUDA kernels do on a device pool. Under
// elastic reservation the per-layer eviction stages the chunk and writes its keys into stage_keys
// (laid out like the staged groups' page lists, KVCacheManager.stage_key_words), and
// reference_evict_elastic then does the request-wide selection after the last layer.
// One dtype rule for every function, as for the CUDA launchers (tangram.cuda): arrays are never
// converted by value. K/V in the cache dtype (chunk_k, chunk_v) are NumPy arrays of that element
// type (bf16 as uint16 bit patterns or ml_dtypes.bfloat16, fp8 as uint8); the appended K/V and
// the queries are float32, float16 or bfloat16 (or its uint16 bit patterns), read as they are;
// sinks, scores, q_lse and fp8 scales are float32; outputs are float32. Any other element type is
// refused naming the argument.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "arguments.hpp"
#include "arrays.hpp"
#include "bindings.hpp"
#include "bound_kv_cache.hpp"
#include "dtypes.hpp"
#include "tangram/core/detail/str.hpp"
#include "tangram/reference/append.hpp"
#include "tangram/reference/balanced_split.hpp"
#include "tangram/reference/decode_attention.hpp"
#include "tangram/reference/elastic_eviction.hpp"
#include "tangram/reference/eviction.hpp"
#include "tangram/reference/prefill_attention.hpp"

namespace nb = nanobind;

namespace tangram::python {

namespace {

/// Any element type: the binding checks it (never a conversion by value).
using any_array  = nb::ndarray<nb::c_contig, nb::device::cpu>;
using chunk_rows = nb::ndarray<std::int32_t const, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
/// Stage keys: any element type, shape and layout (taken as they are, never converted), so that
/// stage_key_data refuses a wrong one naming the argument and the sizes.
using key_array = nb::ndarray<nb::device::cpu>;
/// The same, read only (reference_evict_elastic reads them).
using key_input = nb::ndarray<nb::ro, nb::device::cpu>;

/// Checks that `a` holds exactly `count` elements (any shape), naming the argument.
void expect_elements(std::size_t size, std::int64_t count, char const* what) {
  TANGRAM_EXPECTS(static_cast<std::int64_t>(size) == count,
                  invalid_argument,
                  what,
                  ": expected ",
                  count,
                  " elements, got ",
                  size);
}

/// A float32 argument (sinks, scores, q_lse, fp8 scales): float32 elements, else refused naming
/// it (an array of another type is never converted by value).
float const* f32_data(any_array const& a, char const* what) {
  TANGRAM_EXPECTS(is_element(a.dtype(), nb::dlpack::dtype_code::Float, 32),
                  invalid_argument,
                  what,
                  ": expected float32 elements, got ",
                  dtype_name(a.dtype()),
                  " (arrays are never converted by value)");
  return static_cast<float const*>(a.data());
}

/// An activation argument (the appended K/V, queries): float32, float16 or bfloat16 (or its
/// uint16 bit patterns), read as it is. @return its dtype. @throw naming the argument.
dtype activation_dtype(any_array const& a, char const* what) {
  auto t = float_dtype_of(a.dtype());
  TANGRAM_EXPECTS(t.has_value(),
                  invalid_argument,
                  what,
                  ": expected float32, float16 or bfloat16 (uint16 bit patterns) elements, got ",
                  dtype_name(a.dtype()),
                  " (arrays are never converted by value)");
  return *t;
}

/// fp8 scales from optional k_scale / v_scale (both or neither; float32, 1 element (per tensor)
/// or `heads` (per KV head)): a kv_scales over the arrays (valid while they live); count 0 for
/// none. An empty array is refused, not read as "no scales". The values and the cache dtype are
/// checked by the reference (kernels/kv_scales.hpp).
kv_scales scales_of(std::optional<any_array> const& k_scale,
                    std::optional<any_array> const& v_scale,
                    std::int32_t heads) {
  TANGRAM_EXPECTS(k_scale.has_value() == v_scale.has_value(),
                  invalid_argument,
                  "k_scale, v_scale: pass both or neither");
  if (!k_scale) return {};
  auto n = static_cast<std::int64_t>(k_scale->size());
  TANGRAM_EXPECTS(n == 1 || n == heads,
                  invalid_argument,
                  "k_scale: expected 1 (per tensor) or ",
                  heads,
                  " (per KV head) elements, got ",
                  n);
  expect_elements(v_scale->size(), n, "v_scale");
  return {
      f32_data(*k_scale, "k_scale"), f32_data(*v_scale, "v_scale"), static_cast<std::int32_t>(n)};
}

/// K/V in the cache's dtype (see `carries`) with exactly `count` elements.
void expect_cache_elements(any_array const& a,
                           kv_cache_view const& v,
                           std::int64_t count,
                           char const* what) {
  expect_elements(a.size(), count, what);
  TANGRAM_EXPECTS(carries(a.dtype(), v.geometry.kv_dtype),
                  invalid_argument,
                  what,
                  ": the cache holds ",
                  to_string(v.geometry.kv_dtype),
                  "; pass float32 for f32, float16 for f16, uint16 bit patterns (or bfloat16) for "
                  "bf16, uint8 for fp8 (got elements of ",
                  a.itemsize(),
                  " bytes, dtype code ",
                  static_cast<int>(a.dtype().code),
                  ")");
}

/// The batch's chunk rows: chunk_indptr [batch + 1] from 0, each request's rows equal to the
/// chunk it prepared (the reference writes the chunk into the pages prepare_chunk drew, and
/// nowhere else is backed).
void expect_prepared_chunks(bound_kv_cache const& c, chunk_rows const& chunk_indptr,
                            batch_kind kind) {
  python::expect_prepared_chunks(c.kv, chunk_indptr.data(), chunk_indptr.size(), kind);
}

/// stage_keys: a 1-D uint32 array of exactly `words` elements (stage_key_layout of the batch:
/// KVCacheManager.stage_key_words), contiguous; checked before any work. @return its data.
/// @throw invalid_argument naming stage_keys, the expected and the given size or element type.
template <class Keys>
auto* stage_key_data(Keys const& keys, std::int64_t words) {
  std::string shape = "[";
  for (std::size_t i = 0; i < keys.ndim(); ++i)
    shape += (i ? ", " : "") + std::to_string(keys.shape(i));
  shape += "]";
  TANGRAM_EXPECTS(is_element(keys.dtype(), nb::dlpack::dtype_code::UInt, 32),
                  invalid_argument,
                  "stage_keys: expected uint32 elements, got ",
                  dtype_name(keys.dtype()),
                  " (shape ",
                  shape,
                  "; arrays are never converted by value: the staged keys must land in the "
                  "caller's array)");
  TANGRAM_EXPECTS(keys.ndim() == 1 && static_cast<std::int64_t>(keys.shape(0)) == words,
                  invalid_argument,
                  "stage_keys: expected shape [",
                  words,
                  "] (KVCacheManager.stage_key_words(chunk_indptr, kind) for this batch), got ",
                  shape);
  TANGRAM_EXPECTS(words <= 1 || keys.stride(0) == 1,
                  invalid_argument,
                  "stage_keys: must be contiguous (stride 1), got stride ",
                  keys.stride(0));
  using word = std::conditional_t<std::is_const_v<std::remove_pointer_t<decltype(keys.data())>>,
                                  std::uint32_t const,
                                  std::uint32_t>;
  return static_cast<word*>(keys.data());
}

/// The decode batch's balanced split map (reference/balanced_split.hpp), [L * (H + 1)].
std::vector<std::int32_t> balanced_map(kv_cache_view const& view, std::int32_t num_ctas) {
  std::vector<std::int32_t> map(static_cast<std::size_t>(view.num_layers) *
                                (static_cast<std::size_t>(view.num_kv_heads) + 1));
  balanced_split_params p;
  p.kv        = view;
  p.num_ctas  = num_ctas;
  p.cta_begin = map.data();
  reference::balance_decode_splits(p);
  return map;
}

}  // namespace

void bind_reference(nb::module_& m) {
  m.def(
      "reference_append",
      [](bound_kv_cache& c,
         std::int32_t layer,
         any_array k,
         any_array v,
         std::optional<any_array> k_scale,
         std::optional<any_array> v_scale) {
        c.expect_host_pool("reference_append");
        expect_layer(c.kv.plan(), layer);
        auto view = c.kv.view();
        std::int64_t count =
            static_cast<std::int64_t>(view.batch_size) * view.num_kv_heads * view.geometry.head_dim;
        expect_elements(k.size(), count, "k");
        expect_elements(v.size(), count, "v");
        auto src = activation_dtype(k, "k");
        TANGRAM_EXPECTS(activation_dtype(v, "v") == src,
                        invalid_argument,
                        "k, v: must have one element type, got ",
                        dtype_name(k.dtype()),
                        " and ",
                        dtype_name(v.dtype()));
        append_params p;
        p.kv        = view;
        p.layer     = layer;
        p.k         = k.data();
        p.v         = v.data();
        p.src_dtype = src;
        p.scales    = scales_of(k_scale, v_scale, view.num_kv_heads);
        reference::append_decode_kv(p);
      },
      nb::arg("kv"),
      nb::arg("layer"),
      nb::arg("k"),
      nb::arg("v"),
      nb::kw_only(),
      nb::arg("k_scale") = nb::none(),
      nb::arg("v_scale") = nb::none(),
      "Writes one decode token's K/V ([batch, H, d] float32, float16 or bfloat16 -- uint16 arrays\n"
      "are bfloat16 bit patterns -- one element type for both, converted to the cache dtype) of\n"
      "`layer` for every batch member, after decode_step (reference/append.hpp). fp8 caches:\n"
      "k_scale / v_scale float32 of 1 (per tensor) or H (per KV head) elements store x / s.");

  m.def(
      "reference_balance_decode_splits",
      [](bound_kv_cache& c) {
        auto view = c.kv.view();
        auto map  = balanced_map(view, c.kv.plan().splits.num_ctas());
        return numpy_copy(map,
                          {static_cast<std::size_t>(view.num_layers),
                           static_cast<std::size_t>(view.num_kv_heads) + 1});
      },
      nb::arg("kv"),
      "The split map balanced for the decode batch's head lengths (reference/balanced_split.hpp,\n"
      "what cuda.balance_decode_splits writes on the device): int32 [layers, H + 1], head h of\n"
      "layer l owning CTAs [m[l, h], m[l, h + 1]) of the plan's N_CTA. Reads lengths only.");

  m.def(
      "reference_decode_attention",
      [](bound_kv_cache& c,
         std::int32_t layer,
         any_array q,
         std::optional<any_array> sinks,
         float sm_scale,
         std::optional<any_array> k_scale,
         std::optional<any_array> v_scale,
         std::int32_t invariant_pieces,
         bool balanced_splits,
         bool layer_stream) {
        c.expect_host_pool("reference_decode_attention");
        TANGRAM_EXPECTS(!(balanced_splits && layer_stream),
                        invalid_argument,
                        "reference_decode_attention: balanced_splits and layer_stream: pass at "
                        "most one");
        auto view        = c.kv.view();
        auto const& plan = c.kv.plan();
        expect_layer(plan, layer);
        std::int32_t group = plan.model.gqa_group();
        std::int64_t rows  = static_cast<std::int64_t>(view.batch_size) * view.num_kv_heads * group;
        expect_elements(q.size(), rows * view.geometry.head_dim, "q");
        if (sinks) expect_elements(sinks->size(), view.num_kv_heads * group, "sinks");
        std::vector<float> o(static_cast<std::size_t>(rows * view.geometry.head_dim));
        std::vector<float> lse(static_cast<std::size_t>(rows));
        std::vector<std::int32_t> balanced;
        decode_params p;
        p.kv               = view;
        p.splits           = plan.splits.view();
        if (balanced_splits) {
          balanced           = balanced_map(view, plan.splits.num_ctas());
          p.splits.cta_begin = balanced.data();
        }
        if (layer_stream)
          p.splits = layer_stream_split(plan.num_layers, view.num_kv_heads, plan.splits.num_ctas());
        p.layer            = layer;
        p.group            = group;
        p.q                = q.data();
        p.q_dtype          = activation_dtype(q, "q");
        p.o                = o.data();
        p.o_dtype          = dtype::f32;
        p.lse              = lse.data();
        p.sinks            = sinks ? f32_data(*sinks, "sinks") : nullptr;
        p.sm_scale         = sm_scale;
        p.scales           = scales_of(k_scale, v_scale, view.num_kv_heads);
        p.invariant_pieces = invariant_pieces;
        reference::decode_attention(p);
        auto b  = static_cast<std::size_t>(view.batch_size);
        auto hq = static_cast<std::size_t>(view.num_kv_heads * group);
        return std::make_tuple(
            numpy_copy(o, {b, hq, static_cast<std::size_t>(view.geometry.head_dim)}),
            numpy_copy(lse, {b, hq}));
      },
      nb::arg("kv"),
      nb::arg("layer"),
      nb::arg("q"),
      nb::arg("sinks")            = nb::none(),
      nb::arg("sm_scale")         = 0.f,
      nb::arg("k_scale")          = nb::none(),
      nb::arg("v_scale")          = nb::none(),
      nb::arg("invariant_pieces") = 0,
      nb::arg("balanced_splits")  = false,
      nb::arg("layer_stream")     = false,
      "Decode attention of `layer` for the batch (reference/decode_attention.hpp, split as the\n"
      "plan's split map, with balanced_splits=True as reference_balance_decode_splits', or with\n"
      "layer_stream=True cut across heads as layer_stream_split):\n"
      "q [batch, query heads, d] float32, float16 or bfloat16 (uint16 bits)\n"
      "-> (o [batch, query heads, d],\n"
      "lse [batch, query heads]) float32. sm_scale 0 means 1/sqrt(d). fp8 caches: k_scale /\n"
      "v_scale float32 of 1 or H elements read stored * s. invariant_pieces K > 0: the\n"
      "batch-invariant pieces (at most K per request and head) instead of the split map's.");

  m.def(
      "reference_prefill_attention",
      [](bound_kv_cache& c,
         std::int32_t layer,
         chunk_rows chunk_indptr,
         any_array q,
         any_array chunk_k,
         any_array chunk_v,
         std::optional<any_array> sinks,
         float sm_scale,
         std::optional<any_array> k_scale,
         std::optional<any_array> v_scale,
         batch_kind kind) {
        c.expect_host_pool("reference_prefill_attention");
        auto view        = c.kv.view(kind);
        auto const& plan = c.kv.plan();
        expect_layer(plan, layer);
        expect_prepared_chunks(c, chunk_indptr, kind);
        std::int32_t group     = plan.model.gqa_group();
        auto const* ptr        = chunk_indptr.data();
        std::int32_t rows      = view.batch_size > 0 ? ptr[view.batch_size] : 0;
        std::int32_t max_chunk = 0;
        for (std::int32_t r = 0; r < view.batch_size; ++r)
          max_chunk = std::max(max_chunk, ptr[r + 1] - ptr[r]);
        std::int64_t hq  = static_cast<std::int64_t>(view.num_kv_heads) * group;
        std::int64_t row = static_cast<std::int64_t>(view.num_kv_heads) * view.geometry.head_dim;
        expect_elements(q.size(), rows * hq * view.geometry.head_dim, "q");
        expect_cache_elements(chunk_k, view, rows * row, "chunk_k");
        expect_cache_elements(chunk_v, view, rows * row, "chunk_v");
        if (sinks) expect_elements(sinks->size(), hq, "sinks");
        std::vector<float> o(static_cast<std::size_t>(rows * hq * view.geometry.head_dim));
        std::vector<float> lse(static_cast<std::size_t>(rows * hq));
        prefill_params p;
        p.kv           = view;
        p.layer        = layer;
        p.group        = group;
        p.chunk_indptr = ptr;
        p.max_chunk    = max_chunk;
        p.q            = q.data();
        p.q_dtype      = activation_dtype(q, "q");
        p.chunk_k      = chunk_k.data();
        p.chunk_v      = chunk_v.data();
        p.o            = o.data();
        p.o_dtype      = dtype::f32;
        p.lse          = lse.data();
        p.sinks        = sinks ? f32_data(*sinks, "sinks") : nullptr;
        p.sm_scale     = sm_scale;
        p.scales       = scales_of(k_scale, v_scale, view.num_kv_heads);
        reference::prefill_attention(p);
        auto n = static_cast<std::size_t>(rows), h = static_cast<std::size_t>(hq);
        return std::make_tuple(
            numpy_copy(o, {n, h, static_cast<std::size_t>(view.geometry.head_dim)}),
            numpy_copy(lse, {n, h}));
      },
      nb::arg("kv"),
      nb::arg("layer"),
      nb::arg("chunk_indptr").noconvert(),
      nb::arg("q"),
      nb::arg("chunk_k"),
      nb::arg("chunk_v"),
      nb::kw_only(),
      nb::arg("sinks")    = nb::none(),
      nb::arg("sm_scale") = 0.f,
      nb::arg("k_scale")  = nb::none(),
      nb::arg("v_scale")  = nb::none(),
      nb::arg("kind")     = batch_kind::decode,
      "Chunked-prefill attention of `layer` (reference/prefill_attention.hpp), state before the\n"
      "chunk (after prepare_chunk, before the eviction): each chunk row attends over its head's\n"
      "kept tokens and the chunk's rows up to itself. q [rows, query heads, d] float32 (float16,\n"
      "bfloat16 or uint16 bits),\n"
      "chunk_k/chunk_v [rows, H, d] in the cache dtype -> (o [rows, query heads, d],\n"
      "lse [rows, query heads]) float32. fp8 caches: k_scale / v_scale float32 of 1 or H\n"
      "elements (pages and chunk K/V read stored * s). kind: the batch it runs over (BatchKind;\n"
      "BatchKind.prefill for the batch set by set_batch(BatchKind.prefill, ids)).");

  m.def(
      "reference_evict",
      [](bound_kv_cache& c,
         std::int32_t layer,
         chunk_rows chunk_indptr,
         any_array chunk_k,
         any_array chunk_v,
         std::string const& source,
         std::optional<any_array> scores,
         std::optional<any_array> q,
         std::optional<any_array> q_lse,
         std::int32_t max_candidates,
         std::int32_t obs_window,
         std::optional<key_array> stage_keys,
         std::optional<any_array> k_scale,
         std::optional<any_array> v_scale,
         batch_kind kind) {
        c.expect_host_pool("reference_evict");
        auto view        = c.kv.view(kind);
        auto const& plan = c.kv.plan();
        expect_layer(plan, layer);
        expect_prepared_chunks(c, chunk_indptr, kind);
        expect_candidates_fit(c.kv, layer, max_candidates, kind);
        std::int64_t rows = chunk_indptr.data()[view.batch_size];
        expect_stage_keys_rule(plan, stage_keys.has_value(), "reference_evict_elastic");
        std::vector<std::int64_t> key_base;
        std::uint32_t* keys = nullptr;
        if (stage_keys) {
          std::int64_t words = stage_key_layout_of(c.kv, chunk_indptr.data(), chunk_indptr.size(),
                                                   kind, key_base);
          keys = stage_key_data(*stage_keys, words);
        }
        if (view.batch_size == 0)
          return numpy_copy(std::vector<std::int32_t>{},
                            {std::size_t{0}, static_cast<std::size_t>(view.num_kv_heads)});
        std::int64_t row = static_cast<std::int64_t>(view.num_kv_heads) * view.geometry.head_dim;
        expect_cache_elements(chunk_k, view, rows * row, "chunk_k");
        expect_cache_elements(chunk_v, view, rows * row, "chunk_v");
        eviction_params p;
        p.kv       = view;
        p.layer    = layer;
        auto rules = std::vector<head_rule>(
            plan.rules.begin() + static_cast<std::ptrdiff_t>(layer) * plan.num_kv_heads,
            plan.rules.begin() + static_cast<std::ptrdiff_t>(layer + 1) * plan.num_kv_heads);
        p.rules          = rules.data();
        p.sink           = plan.profile.sink_tokens;
        p.chunk_indptr   = chunk_indptr.data();
        p.chunk_k        = chunk_k.data();
        p.chunk_v        = chunk_v.data();
        p.max_candidates = max_candidates;
        p.source         = source_named(source);
        p.group          = plan.model.gqa_group();
        p.obs_window     = obs_window;
        p.q_dtype        = dtype::f32;
        if (scores) {
          expect_elements(
              scores->size(),
              static_cast<std::int64_t>(view.batch_size) * view.num_kv_heads * max_candidates,
              "scores");
          p.scores = f32_data(*scores, "scores");
        }
        if (q) {
          expect_elements(q->size(), rows * row * p.group, "q");
          p.q       = q->data();
          p.q_dtype = activation_dtype(*q, "q");
        }
        if (q_lse) {
          expect_elements(q_lse->size(), rows * view.num_kv_heads * p.group, "q_lse");
          p.q_lse = f32_data(*q_lse, "q_lse");
        }
        std::vector<std::int32_t> new_len(static_cast<std::size_t>(view.batch_size) *
                                          static_cast<std::size_t>(view.num_kv_heads));
        p.new_len        = new_len.data();
        p.stage_keys     = keys;
        p.stage_key_base = keys ? key_base.data() : nullptr;
        p.scales         = scales_of(k_scale, v_scale, view.num_kv_heads);
        reference::evict_chunk(p);
        return numpy_copy(new_len,
                          {static_cast<std::size_t>(view.batch_size),
                           static_cast<std::size_t>(view.num_kv_heads)});
      },
      nb::arg("kv"),
      nb::arg("layer"),
      nb::arg("chunk_indptr").noconvert(),
      nb::arg("chunk_k"),
      nb::arg("chunk_v"),
      nb::kw_only(),
      nb::arg("source") = "key_norm",
      nb::arg("scores") = nb::none(),
      nb::arg("q")      = nb::none(),
      nb::arg("q_lse")  = nb::none(),
      nb::arg("max_candidates"),
      nb::arg("obs_window")            = 32,
      nb::arg("stage_keys").noconvert() = nb::none(),
      nb::arg("k_scale")               = nb::none(),
      nb::arg("v_scale")               = nb::none(),
      nb::arg("kind")                  = batch_kind::decode,
      "The fused eviction of one prefill chunk for `layer` (reference/eviction.hpp), state\n"
      "before the chunk (after prepare_chunk): chunk_k/chunk_v [rows, H, d] in the cache dtype,\n"
      "rows of request r at chunk_indptr[r]..; source key_norm, supplied (scores [batch * H,\n"
      "max_candidates] float32) or snapkv (q [rows, query heads, d] float32, float16 or bfloat16;\n"
      "optional q_lse\n"
      "[rows, query heads] float32, reference_prefill_attention's lse: weights exp(s - lse),\n"
      "each logit once). Returns new_len\n"
      "[batch, H]: the layer's part of commit_chunk's kept counts. Elastic plans (and only they)\n"
      "pass stage_keys, uint32 [kv.stage_key_words(chunk_indptr, kind)] (laid out like the\n"
      "staged groups' page lists, no padding; the same array for every layer of the chunk and\n"
      "for reference_evict_elastic; contents on entry do not matter): compressed heads then\n"
      "append the chunk and write the key of every candidate after the protected lead (sink,\n"
      "pinned prefix) into it (new_len counts the candidates) for reference_evict_elastic. fp8 caches: k_scale / v_scale float32 of 1\n"
      "(per tensor) or H (per KV head) elements, the append's (built-in scores read K as\n"
      "stored * s; compaction copies bytes). kind: the batch it runs over (BatchKind).");

  m.def(
      "reference_evict_elastic",
      [](bound_kv_cache& c,
         chunk_rows chunk_indptr,
         key_input stage_keys,
         std::int32_t max_candidates,
         batch_kind kind) {
        c.expect_host_pool("reference_evict_elastic");
        auto view        = c.kv.view(kind);
        auto const& plan = c.kv.plan();
        expect_elastic_plan(plan, "reference_evict_elastic");
        expect_prepared_chunks(c, chunk_indptr, kind);
        std::vector<std::int64_t> key_base;
        std::int64_t words = stage_key_layout_of(c.kv, chunk_indptr.data(), chunk_indptr.size(),
                                                 kind, key_base);
        std::uint32_t const* keys = stage_key_data(stage_keys, words);
        auto batch                = static_cast<std::size_t>(view.batch_size);
        std::vector<std::int64_t> wanted(batch), limit(batch), pages(batch);
        for (std::size_t r = 0; r < batch; ++r) {
          auto seq  = c.kv.batch_sequence(kind, static_cast<std::int32_t>(r));
          wanted[r] = c.kv.elastic_wanted_tokens(seq);
          limit[r]  = c.kv.elastic_page_limit(seq);
        }
        auto heads =
            static_cast<std::size_t>(view.num_layers) * static_cast<std::size_t>(view.num_kv_heads);
        std::vector<std::int32_t> new_len(batch * heads);
        elastic_eviction_params e;
        e.kv             = view;
        e.rules          = plan.rules.data();
        e.sink           = plan.profile.sink_tokens;
        e.chunk_indptr   = chunk_indptr.data();
        e.max_candidates = max_candidates;
        e.stage_keys     = keys;
        e.stage_key_base = key_base.data();
        e.wanted         = wanted.data();
        e.page_limit     = limit.data();
        e.new_len        = new_len.data();
        e.pages_out      = pages.data();
        reference::evict_elastic(e);
        return std::make_tuple(numpy_copy(new_len, {batch, heads}), numpy_copy(pages, {batch}));
      },
      nb::arg("kv"),
      nb::arg("chunk_indptr").noconvert(),
      nb::arg("stage_keys").noconvert(),
      nb::kw_only(),
      nb::arg("max_candidates"),
      nb::arg("kind") = batch_kind::decode,
      "The elastic eviction's request-wide step after every layer staged the chunk\n"
      "(reference/elastic_eviction.hpp): per batch member the global top-K of the keys the\n"
      "stage launches of this chunk wrote into stage_keys (uint32\n"
      "[kv.stage_key_words(chunk_indptr, kind)], the same array),\n"
      "(K = elastic_wanted_tokens), the group lengths within elastic_page_limit, and the\n"
      "compaction in the pool. Returns (new_len [batch, layers * KV heads] int32, pages [batch]\n"
      "int64): new_len[r] is request r's commit_chunk kept counts.");
}

}  // namespace tangram::python
