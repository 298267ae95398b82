// SPDX-License-Identifier: Apache-2.0
// What an engine loop needs beyond the manager's lifecycle (manager.cpp), as in C++: both batch
// kinds (set_batch(kind, ids, padded_size), their sizes and padding) and the exports of a layer's
// batch to FlashInfer's block-sparse decode and to FlashAttention's varlen view
// (interop/flashinfer_block_sparse.hpp, interop/flash_attn_varlen.hpp), as NumPy copies (the
// tables are computed; the K/V they index are the pool itself).
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "bound_kv_cache.hpp"
#include "tangram/interop/flash_attn_varlen.hpp"
#include "tangram/interop/flashinfer_block_sparse.hpp"

namespace nb = nanobind;

namespace tangram::python {

namespace {

/// Adds method `name` to KVCacheManager (an overload when one of that name exists).
template <class F, class... Extra>
void add_method(char const* name, F&& f, Extra&&... extra) {
  nb::handle cls = nb::type<bound_kv_cache>();
  // nanobind chains the overloads of a name that already exists in the scope.
  nb::setattr(cls,
              name,
              nb::cpp_function(std::forward<F>(f),
                               nb::scope(cls),
                               nb::name(name),
                               nb::is_method(),
                               std::forward<Extra>(extra)...));
}

nb::dict layout_dict(virtual_kv_layout const& l) {
  nb::dict d;
  d["page_size"]            = l.page_size;
  d["head_dim"]             = l.head_dim;
  d["page_stride_elements"] = l.page_stride_elements;
  d["v_offset_elements"]    = l.v_offset_elements;
  d["num_virtual_pages"]    = l.num_virtual_pages;
  return d;
}

}  // namespace

void bind_interop(nb::module_&) {
  add_method(
      "set_batch",
      [](bound_kv_cache& c,
         batch_kind kind,
         std::vector<sequence_id> const& ids,
         std::size_t padded_size) { c.kv.set_batch(kind, ids, padded_size); },
      nb::arg("kind"),
      nb::arg("ids"),
      nb::arg("padded_size") = 0,
      "set_batch(kind, ids, padded_size=0): the batch of `kind` (BatchKind.decode: append and\n"
      "decode attention; BatchKind.prefill: prefill attention and eviction). padded_size > "
      "len(ids)\n"
      "pads it with requests that hold nothing (a fixed batch size for CUDA graphs).\n"
      "set_batch(ids) is set_batch(BatchKind.decode, ids).");
  add_method(
      "batch_size_of",
      [](bound_kv_cache const& c, batch_kind kind) { return c.kv.batch_size(kind); },
      nb::arg("kind"),
      "Requests in the batch of `kind`, padding included (C++ batch_size(kind)).");
  add_method(
      "batch_padding",
      [](bound_kv_cache const& c, batch_kind kind) { return c.kv.batch_padding(kind); },
      nb::arg("kind") = batch_kind::decode,
      "Padding requests at the end of the batch of `kind`.");
  add_method(
      "batch_sequence",
      [](bound_kv_cache const& c, std::int32_t r, batch_kind kind) {
        return c.kv.batch_sequence(kind, r);
      },
      nb::arg("r"),
      nb::arg("kind") = batch_kind::decode,
      "The SequenceId of request r of the batch of `kind` (UsageError for a padding request).");
  add_method(
      "flashinfer_block_sparse",
      [](bound_kv_cache const& c, std::int32_t layer, batch_kind kind, std::int32_t max_pages) {
        flashinfer_block_sparse out;
        export_flashinfer_block_sparse(c.kv, kind, layer, out, max_pages);
        auto H = static_cast<std::size_t>(out.num_kv_heads);
        auto B = static_cast<std::size_t>(out.batch_size);
        nb::dict d;
        d["block_tables"] =
            numpy_copy(out.block_tables, {H, B, static_cast<std::size_t>(out.max_pages)});
        d["seq_lens"]    = numpy_copy(out.seq_lens, {H, B});
        d["max_seq_len"] = out.max_seq_len;
        d["layout"]      = layout_dict(out.layout);
        return d;
      },
      nb::arg("layer"),
      nb::arg("kind")      = batch_kind::decode,
      nb::arg("max_pages") = 0,
      "FlashInfer's per-KV-head block tables of `layer` for the batch of `kind`\n"
      "(interop/flashinfer_block_sparse.hpp): {'block_tables': int32 [H, B, max_pages] virtual\n"
      "page ids, 'seq_lens': int32 [H, B], 'max_seq_len', 'layout': strides of the K/V tensors\n"
      "over pool() (K: as_strided(pool, [num_virtual_pages, H, P, d], [P*d, 0, d, 1]); V from\n"
      "v_offset_elements)}. max_pages=0: the longest row. ValueError for a sliding-window ring\n"
      "wrapped mid-page with stale slots (a window that is not a multiple of the page size).");
  add_method(
      "flash_attn_varlen",
      [](bound_kv_cache const& c, std::int32_t layer, batch_kind kind, std::int32_t max_pages) {
        flash_attn_varlen_paged out;
        export_flash_attn_varlen(c.kv, kind, layer, out, max_pages);
        auto J = static_cast<std::size_t>(out.num_sequences);
        nb::dict d;
        d["cu_seqlens_q"] = numpy_copy(out.cu_seqlens_q, {J + 1});
        d["cu_seqlens_k"] = numpy_copy(out.cu_seqlens_k, {J + 1});
        d["seqused_k"]    = numpy_copy(out.seqused_k, {J});
        d["block_table"] =
            numpy_copy(out.block_table, {J, static_cast<std::size_t>(out.max_pages)});
        d["max_seqlen_q"] = out.max_seqlen_q;
        d["max_seqlen_k"] = out.max_seqlen_k;
        d["window_left"]  = out.window_left;
        d["layout"]       = layout_dict(out.layout);
        return d;
      },
      nb::arg("layer"),
      nb::arg("kind")      = batch_kind::decode,
      nb::arg("max_pages") = 0,
      "A FlashAttention varlen view of `layer` for the batch of `kind`\n"
      "(interop/flash_attn_varlen.hpp): sequence j = b * H + h holds one KV head and its GQA\n"
      "group of query heads (decode q [B, H*G, d] viewed as [B*H, G, d]); {'cu_seqlens_q',\n"
      "'cu_seqlens_k' int32 [B*H + 1], 'seqused_k' int32 [B*H], 'block_table' int32\n"
      "[B*H, max_pages], 'max_seqlen_q', 'max_seqlen_k', 'window_left' (window_size[0]; -1: "
      "none),\n"
      "'layout'}; k_cache = as_strided(pool, [num_virtual_pages, P, 1, d], [P*d, d, d, 1]).");
}

}  // namespace tangram::python
