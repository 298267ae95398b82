// SPDX-License-Identifier: Apache-2.0
// tangram.cuda: the CUDA launchers of tangram::kernels on device tensors (DLPack or
// __cuda_array_interface__), with a stream argument. Built only when the package is built with
// the kernels (nvcc found at `pip install .`).
//
// A DeviceMirror holds the manager's view on the device (kv_view_mirror: one async upload of the
// journal's changes per sync) and the plan's constant arrays (split map, head rules), uploaded
// once. Launchers take the mirror, check every tensor (CUDA, C-contiguous, element type, shape,
// device, workspace size) against what the kernel reads, and enqueue on the stream: no host
// synchronisation, no allocation, nothing copied.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../arguments.hpp"
#include "../arrays.hpp"
#include "../bindings.hpp"
#include "../bound_kv_cache.hpp"
#include "../dtypes.hpp"
#include "device_tensor.hpp"
#include "tangram/core/detail/str.hpp"
#include "tangram/device/kv_view_mirror.hpp"
#include "tangram/kernels/append.hpp"
#include "tangram/kernels/balanced_split.hpp"
#include "tangram/kernels/decode_attention.hpp"
#include "tangram/kernels/elastic_eviction.hpp"
#include "tangram/kernels/eviction.hpp"
#include "tangram/kernels/prefill_attention.hpp"
#include "tangram/memory/cuda_memory_resource.hpp"

namespace nb = nanobind;

namespace tangram::python {

namespace {

void cuda_check(cudaError_t e, char const* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a sticky launch error
  TANGRAM_FAIL(cuda_error, what, ": ", cudaGetErrorString(e));
}

/// A device copy of host data, made once: the plan's split map and rules (read only), and the
/// start of the balanced split map (rewritten on the device by balance_decode_splits).
class device_copy {
 public:
  device_copy(void const* host, std::size_t bytes, std::int32_t device)
      : memory_(device), bytes_(bytes > 0 ? bytes : 1) {
    data_ = memory_.allocate(bytes_);
    if (bytes > 0) {
      cudaError_t e = cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice);
      if (e != cudaSuccess) {
        memory_.deallocate(data_, bytes_);
        cuda_check(e, "DeviceMirror: cudaMemcpy of the plan's arrays");
      }
    }
  }
  ~device_copy() { memory_.deallocate(data_, bytes_); }
  device_copy(device_copy const&)            = delete;
  device_copy& operator=(device_copy const&) = delete;
  template <class T>
  [[nodiscard]] T const* get() const noexcept {
    return static_cast<T const*>(data_);
  }
  template <class T>
  [[nodiscard]] T* get() noexcept {
    return static_cast<T*>(data_);
  }

 private:
  cuda_memory_resource memory_;
  std::size_t bytes_;
  void* data_ = nullptr;
};

/// tangram.cuda.DeviceMirror: the view and the plan's constant arrays on the manager's device.
struct device_mirror {
  nb::object owner;  ///< the KVCacheManager: kept alive while the mirror exists
  bound_kv_cache* cache;
  kv_view_mirror mirror;
  device_copy cta_begin;
  device_copy balanced_begin;  ///< the map balance_decode_splits writes; the plan's until then
  device_copy rules;

  device_mirror(nb::handle manager, bound_kv_cache& c)
      : owner(nb::borrow(manager)),
        cache(&c),
        mirror(c.kv, checked_device(c)),
        cta_begin(c.kv.plan().splits.cta_begin.data(),
                  c.kv.plan().splits.cta_begin.size() * sizeof(std::int32_t),
                  c.device),
        balanced_begin(c.kv.plan().splits.cta_begin.data(),
                       c.kv.plan().splits.cta_begin.size() * sizeof(std::int32_t),
                       c.device),
        rules(c.kv.plan().rules.data(), c.kv.plan().rules.size() * sizeof(head_rule), c.device) {
    c.mirrored = true;  // only once every member is built (a failed construction leaves none)
  }

  ~device_mirror() { cache->mirrored = false; }
  device_mirror(device_mirror const&)            = delete;
  device_mirror& operator=(device_mirror const&) = delete;

  /// The manager's device, after the checks: a device arena, and no other mirror (each sync
  /// clears the manager's change journal, so a second mirror would silently miss changes).
  static std::int32_t checked_device(bound_kv_cache& c) {
    TANGRAM_EXPECTS(c.on_device(), invalid_argument,
                    "DeviceMirror: the manager's page arena is host memory; build the "
                    "KVCacheManager with memory='cuda' so kernels can read its pages");
    TANGRAM_EXPECTS(!c.mirrored, invalid_argument,
                    "DeviceMirror: this manager already has one (a mirror consumes the manager's "
                    "change journal; share that mirror)");
    return c.device;
  }

  [[nodiscard]] static_plan const& plan() const { return cache->kv.plan(); }
  [[nodiscard]] kv_cache_view const& view() const { return mirror.view(); }
  [[nodiscard]] split_map_view splits(bool balanced = false) const {
    auto s      = plan().splits.view();
    s.cta_begin = (balanced ? balanced_begin : cta_begin).get<std::int32_t>();
    return s;
  }
  [[nodiscard]] std::int32_t max_batch() const { return cache->kv.view_extents().batch; }

  /// A tensor on this mirror's device (DLPack states it; __cuda_array_interface__ does not, so
  /// its pointer is asked: device memory of this device, or managed memory).
  void expect_here(device_tensor const& t, char const* name) const {
    if (t.device >= 0) {
      TANGRAM_EXPECTS(t.device == cache->device, invalid_argument, name, ": on CUDA device ",
                      t.device, " but the manager's pool is on device ", cache->device);
      return;
    }
    cudaPointerAttributes a{};
    cuda_check(cudaPointerGetAttributes(&a, t.data), name);
    TANGRAM_EXPECTS((a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) &&
                        a.device == cache->device,
                    invalid_argument, name, ": not device memory of CUDA device ", cache->device);
  }
};

/// The chunk rows of a prefill or eviction launch against what the host knows: the mirror's
/// batch is the manager's (synced since set_batch), its members' prepared chunks add up to `rows`
/// and none exceeds `max_chunk` (the kernels trust chunk_indptr, which lives on the device).
void expect_synced_chunks(device_mirror const& m, std::int64_t rows, std::int64_t max_chunk,
                          char const* who) {
  auto const& kv = m.cache->kv;
  TANGRAM_EXPECTS(kv.batch_size() == m.view().batch_size, invalid_argument, who,
                  ": the manager's batch has ", kv.batch_size(), " requests but the mirror's has ",
                  m.view().batch_size, " (call mirror.sync after set_batch)");
  std::int64_t total = 0, longest = 0;
  for (std::int32_t r = 0; r < kv.batch_size(); ++r) {
    std::int64_t c = kv.info(kv.batch_sequence(r)).chunk_pending;
    total += c;
    longest = std::max(longest, c);
  }
  TANGRAM_EXPECTS(rows == total, invalid_argument, who, ": ", rows,
                  " chunk rows but the batch's prepared chunks (prepare_chunk) hold ", total);
  TANGRAM_EXPECTS(longest <= max_chunk, invalid_argument, who, ": max_chunk ", max_chunk,
                  " is below a prepared chunk of ", longest, " rows");
}

device_tensor workspace_of(device_mirror const& m, nb::handle obj, std::size_t need) {
  auto ws = device_tensor_from(obj, "workspace");
  m.expect_here(ws, "workspace");
  expect_writable(ws, "workspace");
  TANGRAM_EXPECTS(ws.bytes() >= static_cast<std::int64_t>(need), invalid_argument,
                  "workspace: needs ", need, " bytes, got ", ws.bytes(), " (",
                  ws.describe(), ")");
  return ws;
}

/// A tensor argument: on the mirror's device, of element type `ok`, with shape `shape`.
template <class Ok>
device_tensor tensor_arg(device_mirror const& m, nb::handle obj, char const* name,
                         std::initializer_list<std::int64_t> shape, Ok ok, char const* want_type,
                         bool output = false) {
  auto t = device_tensor_from(obj, name);
  m.expect_here(t, name);
  TANGRAM_EXPECTS(ok(t.dtype), invalid_argument, name, ": expected ", want_type, ", got ",
                  t.describe());
  expect_shape(t, shape, name);
  if (output) expect_writable(t, name);
  return t;
}

auto is_type(nb::dlpack::dtype_code c, int bits) {
  return [=](nb::dlpack::dtype t) { return is_element(t, c, bits); };
}
auto const is_f32 = is_type(nb::dlpack::dtype_code::Float, 32);
auto const is_i32 = is_type(nb::dlpack::dtype_code::Int, 32);
auto const is_i64 = is_type(nb::dlpack::dtype_code::Int, 64);
auto const is_u32 = is_type(nb::dlpack::dtype_code::UInt, 32);
auto const is_u8  = is_type(nb::dlpack::dtype_code::UInt, 8);
auto const is_float = [](nb::dlpack::dtype t) { return float_dtype_of(t).has_value(); };

/// fp8 scales from k_scale / v_scale (both or neither): float32 device tensors of shape [n], n 1
/// (per tensor) or H (per KV head), on the mirror's device; the launchers check n against the
/// cache (kernels/kv_scales.hpp). The tensors keep the arrays alive for the call; the caller keeps
/// them until the launch's work completes, as for every other tensor argument.
struct scale_tensors {
  std::optional<device_tensor> k, v;
  kv_scales scales;
};

scale_tensors scales_arg(device_mirror const& m, nb::handle k_scale, nb::handle v_scale) {
  TANGRAM_EXPECTS(k_scale.is_none() == v_scale.is_none(), invalid_argument,
                  "k_scale, v_scale: pass both or neither");
  scale_tensors t;
  if (k_scale.is_none()) return t;
  t.k      = tensor_arg(m, k_scale, "k_scale", {-1}, is_f32, "float32");
  t.v      = tensor_arg(m, v_scale, "v_scale", {t.k->shape[0]}, is_f32, "float32");
  t.scales = {static_cast<float const*>(t.k->data), static_cast<float const*>(t.v->data),
              static_cast<std::int32_t>(t.k->shape[0])};
  return t;
}

/// The host's stage_key_layout of the manager's decode batch (the mirror's, checked: `who` names
/// the caller) with its prepared chunks: fills `base` [batch * G], returns the words.
std::int64_t mirror_stage_key_layout(device_mirror const& m, char const* who,
                                     std::vector<std::int64_t>& base) {
  auto const& kv = m.cache->kv;
  TANGRAM_EXPECTS(kv.batch_size() == m.view().batch_size, invalid_argument, who,
                  ": the manager's batch has ", kv.batch_size(), " requests but the mirror's has ",
                  m.view().batch_size, " (call mirror.sync after set_batch)");
  return stage_key_layout_prepared(kv, batch_kind::decode, base);
}

/// stage_keys (uint32 [words]) and stage_key_base (int64 [batch * G]) device tensors, `words` and
/// the batch from mirror_stage_key_layout. The base's values live on the device and are not read
/// here.
std::pair<device_tensor, device_tensor> stage_key_args(device_mirror const& m, nb::handle keys,
                                                       nb::handle base, bool output) {
  std::vector<std::int64_t> host_base;
  std::int64_t words = mirror_stage_key_layout(m, "stage_keys", host_base);
  auto tk = tensor_arg(m, keys, "stage_keys", {words}, is_u32, "uint32", output);
  auto tb = tensor_arg(m, base, "stage_key_base", {static_cast<std::int64_t>(host_base.size())},
                       is_i64, "int64");
  return {std::move(tk), std::move(tb)};
}

}  // namespace

void bind_cuda(nb::module_& parent) {
  nb::module_ m = parent.def_submodule(
      "cuda",
      "The CUDA launchers of tangram::kernels on device tensors (DLPack or\n"
      "__cuda_array_interface__: PyTorch, CuPy, Numba) with a stream argument.");

  m.def(
      "device_count",
      [] {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) {
          cudaGetLastError();
          return 0;
        }
        return n;
      },
      "CUDA devices the runtime sees (0 without a driver or device; never raises).");

  m.def(
      "tensor_info",
      [](nb::handle t) {
        auto d = device_tensor_from(t, "tensor");
        nb::dict out;
        out["data"]     = reinterpret_cast<std::uintptr_t>(d.data);
        out["dtype"]    = d.describe().substr(0, d.describe().find('['));
        out["shape"]    = nb::tuple(nb::cast(d.shape));
        out["device"]   = d.device;
        out["readonly"] = d.readonly;
        return out;
      },
      nb::arg("tensor"),
      "What the launchers see in a device tensor: {'data', 'dtype', 'shape', 'device' (-1 when\n"
      "__cuda_array_interface__ does not say), 'readonly'}. Raises ValueError naming the\n"
      "problem (not CUDA, not C-contiguous, masked).");

  nb::class_<device_mirror>(
      m, "DeviceMirror",
      "The manager's view on its device, kept current by sync(stream) (kv_view_mirror: one\n"
      "asynchronous upload of what changed, pointers fixed for the mirror's life, CUDA-graph\n"
      "friendly), plus the plan's split map and head rules uploaded once. Keeps the manager\n"
      "alive. Call sync after the manager's calls of a step and before the launches that read\n"
      "the view; it is the only consumer of the manager's change journal.")
      .def(
          "__init__",
          [](device_mirror* self, nb::handle kv) {
            if (!nb::isinstance<bound_kv_cache>(kv) || !nb::inst_ready(kv))
              throw nb::type_error("DeviceMirror: kv must be a KVCacheManager");
            new (self) device_mirror(kv, nb::cast<bound_kv_cache&>(kv));
          },
          nb::arg("kv"))
      .def(
          "sync",
          [](device_mirror& m, nb::handle stream) { m.mirror.sync(m.cache->kv, stream_from(stream)); },
          nb::arg("stream") = nb::none(),
          "Enqueues on `stream` the upload of the view's changes since the last sync.")
      .def_prop_ro("device", [](device_mirror const& m) { return m.cache->device; })
      .def_prop_ro("batch_size", [](device_mirror const& m) { return m.view().batch_size; },
                   "The batch as of the last sync.")
      .def_prop_ro("bytes", [](device_mirror const& m) { return m.mirror.bytes(); })
      .def_prop_ro("last_sync_bytes", [](device_mirror const& m) { return m.mirror.last_sync_bytes(); })
      .def("decode_workspace_bytes",
           [](device_mirror const& m, std::int32_t invariant_pieces) {
             auto const& p = m.plan();
             return decode_workspace_bytes(m.splits(), m.max_batch(), p.model.gqa_group(),
                                           p.model.head_dim, invariant_pieces);
           },
           nb::arg("invariant_pieces") = 0,
           "Workspace bytes of decode_attention for any batch up to the manager's max_batch\n"
           "(with the same invariant_pieces as the calls).")
      .def("eviction_workspace_bytes",
           [](device_mirror const& m, std::int32_t max_candidates, std::string const& source,
              std::int32_t obs_window, bool from_lse) {
             auto const& p = m.plan();
             TANGRAM_EXPECTS(max_candidates >= 1, invalid_argument,
                             "max_candidates: must be >= 1, got ", max_candidates);
             return static_cast<std::size_t>(
                 eviction_workspace(m.max_batch(), p.num_kv_heads, max_candidates,
                                    source_named(source), p.model.gqa_group(), obs_window,
                                    p.model.head_dim, from_lse)
                     .bytes);
           },
           nb::arg("max_candidates"), nb::arg("source") = "key_norm", nb::arg("obs_window") = 32,
           nb::arg("from_lse") = false,
           "Workspace bytes of evict_chunk for any batch up to the manager's max_batch\n"
           "(from_lse: snapkv calls that pass q_lse, which need no statistics).")
      .def("stage_key_layout",
           [](device_mirror const& m) {
             std::vector<std::int64_t> base;
             std::int64_t words = mirror_stage_key_layout(m, "stage_key_layout", base);
             return std::make_pair(numpy_copy(base, {base.size()}), words);
           },
           "The elastic stage keys of the mirror's batch and its prepared chunks, computed on\n"
           "the host (C++ tangram::stage_key_layout over the manager's view): (base, words),\n"
           "base int64 numpy [batch * G] to upload as evict_chunk's / evict_elastic's\n"
           "stage_key_base, words the uint32 elements of their stage_keys (laid out like the\n"
           "staged groups' page lists, no padding). Call after prepare_chunk, set_batch and\n"
           "sync, once per chunk; the keys are needed only from the chunk's evict_chunk launches\n"
           "to its evict_elastic.")
      .def("elastic_workspace_bytes",
           [](device_mirror const& m) {
             auto const& v = m.view();
             return static_cast<std::size_t>(
                 elastic_workspace(m.max_batch(), v.num_layers * v.num_kv_heads, v.num_groups,
                                   v.geometry.group_size)
                     .bytes);
           },
           "Workspace bytes of evict_elastic for any batch up to the manager's max_batch.");

  m.def(
      "execute_page_copies",
      [](bound_kv_cache& c, nb::handle stream) {
        TANGRAM_EXPECTS(c.on_device(), invalid_argument,
                        "execute_page_copies: the manager's arena is host memory (use "
                        "KVCacheManager.execute_page_copies)");
        auto s     = reinterpret_cast<cudaStream_t>(stream_from(stream));
        auto bytes = static_cast<std::size_t>(c.kv.plan().page_bytes());
        auto* base = static_cast<std::byte*>(c.kv.pool().base());
        for (auto const& x : c.kv.pending_copies())
          cuda_check(cudaMemcpyAsync(base + static_cast<std::size_t>(x.dst) * bytes,
                                     base + static_cast<std::size_t>(x.src) * bytes, bytes,
                                     cudaMemcpyDeviceToDevice, s),
                     "execute_page_copies: cudaMemcpyAsync");
        c.kv.complete_page_copies();
      },
      nb::arg("kv"), nb::arg("stream") = nb::none(),
      "Enqueues the pending copy-on-write page copies (fork, continue_turn) on `stream`, then\n"
      "completes them in the manager: kernels that read the pages must run on the same stream\n"
      "(or after it).");

  m.def(
      "append_decode_kv",
      [](device_mirror const& m, std::int32_t layer, nb::handle k, nb::handle v,
         nb::handle k_scale, nb::handle v_scale, nb::handle stream) {
        auto const& view = m.view();
        expect_layer(m.plan(), layer);
        std::int64_t B = view.batch_size, H = view.num_kv_heads, d = view.geometry.head_dim;
        char const* types = "float32, float16 or bfloat16 (uint16 bits)";
        auto tk = tensor_arg(m, k, "k", {B, H, d}, is_float, types);
        auto tv = tensor_arg(m, v, "v", {B, H, d}, is_float, types);
        TANGRAM_EXPECTS(*float_dtype_of(tk.dtype) == *float_dtype_of(tv.dtype), invalid_argument,
                        "k, v: must have one element type, got ", tk.describe(), " and ",
                        tv.describe());
        append_params p;
        p.kv        = view;
        p.layer     = layer;
        p.k         = tk.data;
        p.v         = tv.data;
        p.src_dtype = *float_dtype_of(tk.dtype);
        auto ts     = scales_arg(m, k_scale, v_scale);
        p.scales    = ts.scales;
        append_decode_kv(p, stream_from(stream));
      },
      nb::arg("mirror"), nb::arg("layer"), nb::arg("k"), nb::arg("v"), nb::kw_only(),
      nb::arg("k_scale") = nb::none(), nb::arg("v_scale") = nb::none(),
      nb::arg("stream") = nb::none(),
      "Writes one decode token's K/V ([batch, H, d]) of `layer` for every batch member (after\n"
      "decode_step and sync), converted to the cache dtype. fp8 caches: k_scale / v_scale\n"
      "float32 device tensors of 1 (per tensor) or H (per KV head) elements store x / s.");

  m.def(
      "balance_decode_splits",
      [](device_mirror& m, nb::handle stream) {
        balanced_split_params p;
        p.kv        = m.view();
        p.num_ctas  = m.plan().splits.num_ctas();
        p.cta_begin = m.balanced_begin.get<std::int32_t>();
        balance_decode_splits(p, stream_from(stream));
      },
      nb::arg("mirror"),
      nb::kw_only(),
      nb::arg("stream") = nb::none(),
      "Writes the mirror's balanced split map from the batch's head lengths on the device (one\n"
      "launch for every layer; kernels/balanced_split.hpp): once per decode step, after sync and\n"
      "before the step's decode launches, which use it with balanced_splits=True. The plan's map\n"
      "until the first call; any map attends the same tokens, a balanced one is faster. With\n"
      "pdl=True decode launches, a kernel launched without PDL (the append) must run between.");

  m.def(
      "decode_attention",
      [](device_mirror const& m,
         std::int32_t layer,
         nb::handle q,
         nb::handle o,
         nb::handle workspace,
         nb::handle lse,
         nb::handle sinks,
         float sm_scale,
         nb::handle k_scale,
         nb::handle v_scale,
         std::int32_t invariant_pieces,
         bool pdl,
         nb::handle merge_counters,
         bool balanced_splits,
         bool layer_stream,
         nb::handle stream) {
        TANGRAM_EXPECTS(!(balanced_splits && layer_stream),
                        invalid_argument,
                        "decode_attention: balanced_splits and layer_stream: pass at most one");
        auto const& view = m.view();
        auto const& plan = m.plan();
        expect_layer(plan, layer);
        std::int32_t group = plan.model.gqa_group();
        std::int64_t B = view.batch_size, Hq = std::int64_t{view.num_kv_heads} * group,
                     d = view.geometry.head_dim;
        char const* types = "float32, float16 or bfloat16 (uint16 bits)";
        auto tq = tensor_arg(m, q, "q", {B, Hq, d}, is_float, types);
        auto to = tensor_arg(m, o, "o", {B, Hq, d}, is_float, types, true);
        decode_params p;
        p.kv       = view;
        p.splits   = layer_stream
                         ? layer_stream_split(plan.num_layers, view.num_kv_heads,
                                              m.splits(false).num_ctas)
                         : m.splits(balanced_splits);
        p.layer    = layer;
        p.group    = group;
        p.q        = tq.data;
        p.q_dtype  = *float_dtype_of(tq.dtype);
        p.o        = to.data;
        p.o_dtype  = *float_dtype_of(to.dtype);
        p.sm_scale = sm_scale;
        std::optional<device_tensor> tl, ts;
        if (!lse.is_none()) {
          tl    = tensor_arg(m, lse, "lse", {B, Hq}, is_f32, "float32", true);
          p.lse = static_cast<float*>(tl->data);
        }
        if (!sinks.is_none()) {
          ts      = tensor_arg(m, sinks, "sinks", {Hq}, is_f32, "float32");
          p.sinks = static_cast<float const*>(ts->data);
        }
        auto tsc = scales_arg(m, k_scale, v_scale);
        p.scales = tsc.scales;
        p.invariant_pieces = invariant_pieces;
        p.pdl              = pdl;
        std::optional<device_tensor> tc;
        if (!merge_counters.is_none()) {
          tc = tensor_arg(m, merge_counters, "merge_counters",
                          {std::int64_t{view.num_kv_heads} * m.max_batch()}, is_i32, "int32", true);
          p.merge_counters = static_cast<std::int32_t*>(tc->data);
        }
        p.validate();  // before the workspace size is computed from invariant_pieces
        auto ws  = workspace_of(m, workspace, decode_workspace_bytes(p));
        decode_attention(p, ws.data, static_cast<std::size_t>(ws.bytes()), stream_from(stream));
      },
      nb::arg("mirror"),
      nb::arg("layer"),
      nb::arg("q"),
      nb::arg("o"),
      nb::kw_only(),
      nb::arg("workspace"),
      nb::arg("lse")              = nb::none(),
      nb::arg("sinks")            = nb::none(),
      nb::arg("sm_scale")         = 0.f,
      nb::arg("k_scale")          = nb::none(),
      nb::arg("v_scale")          = nb::none(),
      nb::arg("invariant_pieces") = 0,
      nb::arg("pdl")              = false,
      nb::arg("merge_counters")   = nb::none(),
      nb::arg("balanced_splits")  = false,
      nb::arg("layer_stream")     = false,
      nb::arg("stream")           = nb::none(),
      "Decode attention of `layer` for the mirror's batch on the plan's split map (or, with\n"
      "balanced_splits=True, the map balance_decode_splits wrote this step): q and o\n"
      "[batch, query heads, d], lse [batch, query heads] float32, sinks [query heads] float32;\n"
      "workspace: a device uint8 tensor of at least mirror.decode_workspace_bytes() bytes.\n"
      "fp8 caches: k_scale / v_scale float32 device tensors of 1 or H elements (stored * s).\n"
      "invariant_pieces K > 0: batch-invariant mode (a request's result does not depend on the\n"
      "batch; at most K pieces per request and KV head; size the workspace with the same K).\n"
      "pdl: programmatic dependent launch (sm_90+; docs/kernels.md): the kernels may start while\n"
      "the previous kernel in the stream finishes; it must not write the view's arrays.\n"
      "merge_counters: int32 device tensor [H * max_batch], zeroed once and used by nothing else:\n"
      "the split kernel merges the partials itself (one launch per layer; left zero).\n"
      "layer_stream=True: no split map; the CTAs cut the layer's tokens across heads\n"
      "(layer_stream_split, docs/kernels.md), the plan's N_CTA of them.");

  m.def(
      "prefill_attention",
      [](device_mirror const& m, std::int32_t layer, nb::handle chunk_indptr, nb::handle q,
         nb::handle chunk_k, nb::handle chunk_v, nb::handle o, std::int32_t max_chunk,
         nb::handle workspace, nb::handle lse, nb::handle sinks, float sm_scale,
         nb::handle k_scale, nb::handle v_scale, nb::handle stream) {
        auto const& view = m.view();
        auto const& plan = m.plan();
        expect_layer(plan, layer);
        std::int32_t group = plan.model.gqa_group();
        std::int64_t B = view.batch_size, H = view.num_kv_heads, d = view.geometry.head_dim;
        auto cache_type = [&](nb::dlpack::dtype t) { return carries(t, view.geometry.kv_dtype); };
        std::string kv_type = "the cache's " + std::string(to_string(view.geometry.kv_dtype)) +
                              " (bf16: bfloat16 or uint16 bits; fp8: uint8)";
        char const* types = "float32, float16 or bfloat16 (uint16 bits)";
        auto ti = tensor_arg(m, chunk_indptr, "chunk_indptr", {B + 1}, is_i32, "int32");
        auto tk = tensor_arg(m, chunk_k, "chunk_k", {-1, H, d}, cache_type, kv_type.c_str());
        std::int64_t rows = tk.shape[0];
        auto tv = tensor_arg(m, chunk_v, "chunk_v", {rows, H, d}, cache_type, kv_type.c_str());
        auto tq = tensor_arg(m, q, "q", {rows, H * group, d}, is_float, types);
        auto to = tensor_arg(m, o, "o", {rows, H * group, d}, is_float, types, true);
        expect_synced_chunks(m, rows, max_chunk, "prefill_attention");
        prefill_params p;
        p.kv           = view;
        p.layer        = layer;
        p.group        = group;
        p.chunk_indptr = static_cast<std::int32_t const*>(ti.data);
        p.max_chunk    = max_chunk;
        p.q            = tq.data;
        p.q_dtype      = *float_dtype_of(tq.dtype);
        p.chunk_k      = tk.data;
        p.chunk_v      = tv.data;
        p.o            = to.data;
        p.o_dtype      = *float_dtype_of(to.dtype);
        p.sm_scale     = sm_scale;
        std::optional<device_tensor> tl, ts;
        if (!lse.is_none()) {
          tl    = tensor_arg(m, lse, "lse", {rows, H * group}, is_f32, "float32", true);
          p.lse = static_cast<float*>(tl->data);
        }
        if (!sinks.is_none()) {
          ts      = tensor_arg(m, sinks, "sinks", {H * group}, is_f32, "float32");
          p.sinks = static_cast<float const*>(ts->data);
        }
        auto tsc         = scales_arg(m, k_scale, v_scale);
        p.scales         = tsc.scales;
        std::size_t need = prefill_workspace_bytes(p);
        std::optional<device_tensor> ws;
        if (need > 0 || !workspace.is_none()) ws = workspace_of(m, workspace, need);
        prefill_attention(p, ws ? ws->data : nullptr,
                          ws ? static_cast<std::size_t>(ws->bytes()) : 0, stream_from(stream));
      },
      nb::arg("mirror"), nb::arg("layer"), nb::arg("chunk_indptr"), nb::arg("q"),
      nb::arg("chunk_k"), nb::arg("chunk_v"), nb::arg("o"), nb::kw_only(), nb::arg("max_chunk"),
      nb::arg("workspace") = nb::none(), nb::arg("lse") = nb::none(), nb::arg("sinks") = nb::none(), nb::arg("sm_scale") = 0.f,
      nb::arg("k_scale") = nb::none(), nb::arg("v_scale") = nb::none(),
      nb::arg("stream") = nb::none(),
      "Chunked-prefill attention of `layer` (after prepare_chunk and sync, before the layer's\n"
      "evict_chunk): q and o [rows, query heads, d], chunk_k/chunk_v [rows, H, d] in the cache\n"
      "dtype, chunk_indptr [batch + 1] int32 with no chunk above max_chunk rows (the kernel\n"
      "trusts it), lse [rows, query heads] float32 (the eviction scorer's normaliser).\n"
      "workspace: none today (prefill_workspace_bytes is 0); accepted for a split-KV future.");

  m.def(
      "evict_chunk",
      [](device_mirror const& m, std::int32_t layer, nb::handle chunk_indptr, nb::handle chunk_k,
         nb::handle chunk_v, nb::handle new_len, nb::handle workspace, std::int32_t max_candidates,
         std::string const& source, nb::handle scores, nb::handle q, nb::handle q_lse,
         std::int32_t obs_window, bool tensor_cores, nb::handle stage_keys,
         nb::handle stage_key_base, nb::handle k_scale,
         nb::handle v_scale, nb::handle stream) {
        auto const& view = m.view();
        auto const& plan = m.plan();
        expect_layer(plan, layer);
        std::int64_t B = view.batch_size, H = view.num_kv_heads, d = view.geometry.head_dim;
        std::int32_t group = plan.model.gqa_group();
        auto cache_type    = [&](nb::dlpack::dtype t) { return carries(t, view.geometry.kv_dtype); };
        std::string kv_type = "the cache's " + std::string(to_string(view.geometry.kv_dtype)) +
                              " (bf16: bfloat16 or uint16 bits; fp8: uint8)";
        auto ti = tensor_arg(m, chunk_indptr, "chunk_indptr", {B + 1}, is_i32, "int32");
        auto tk = tensor_arg(m, chunk_k, "chunk_k", {-1, H, d}, cache_type, kv_type.c_str());
        std::int64_t rows = tk.shape[0];
        auto tv = tensor_arg(m, chunk_v, "chunk_v", {rows, H, d}, cache_type, kv_type.c_str());
        auto tn = tensor_arg(m, new_len, "new_len", {B, H}, is_i32, "int32", true);
        expect_synced_chunks(m, rows, std::numeric_limits<std::int64_t>::max(), "evict_chunk");
        expect_candidates_fit(m.cache->kv, layer, max_candidates);
        eviction_params p;
        p.kv             = view;
        p.layer          = layer;
        p.rules          = m.rules.get<head_rule>() + static_cast<std::ptrdiff_t>(layer) * H;
        p.sink           = plan.profile.sink_tokens;
        p.chunk_indptr   = static_cast<std::int32_t const*>(ti.data);
        p.chunk_k        = tk.data;
        p.chunk_v        = tv.data;
        p.max_candidates = max_candidates;
        p.source         = source_named(source);
        p.group          = group;
        p.obs_window     = obs_window;
        p.new_len        = static_cast<std::int32_t*>(tn.data);
        std::optional<device_tensor> ts, tq, tkeys, tbase;
        if (!scores.is_none()) {
          ts       = tensor_arg(m, scores, "scores", {B, H, max_candidates}, is_f32, "float32");
          p.scores = static_cast<float const*>(ts->data);
        }
        if (!q.is_none()) {
          tq        = tensor_arg(m, q, "q", {rows, H * group, d}, is_float,
                                 "float32, float16 or bfloat16 (uint16 bits)");
          p.q       = tq->data;
          p.q_dtype = *float_dtype_of(tq->dtype);
        }
        std::optional<device_tensor> tl;
        if (!q_lse.is_none()) {
          tl      = tensor_arg(m, q_lse, "q_lse", {rows, H * group}, is_f32, "float32");
          p.q_lse = static_cast<float const*>(tl->data);
        }
        p.tensor_cores = tensor_cores;
        expect_stage_keys_rule(plan, !stage_keys.is_none(), "evict_elastic");
        TANGRAM_EXPECTS(stage_keys.is_none() == stage_key_base.is_none(), invalid_argument,
                        "stage_key_base: pass it with stage_keys and only with them "
                        "(DeviceMirror.stage_key_layout)");
        if (!stage_keys.is_none()) {
          auto [tk_, tb_] = stage_key_args(m, stage_keys, stage_key_base, true);
          tkeys = std::move(tk_);
          tbase = std::move(tb_);
          p.stage_keys     = static_cast<std::uint32_t*>(tkeys->data);
          p.stage_key_base = static_cast<std::int64_t const*>(tbase->data);
        }
        auto tsc = scales_arg(m, k_scale, v_scale);
        p.scales = tsc.scales;
        p.validate();
        auto ws = workspace_of(m, workspace, eviction_workspace_bytes(p));
        evict_chunk(p, ws.data, static_cast<std::size_t>(ws.bytes()), stream_from(stream));
      },
      nb::arg("mirror"), nb::arg("layer"), nb::arg("chunk_indptr"), nb::arg("chunk_k"),
      nb::arg("chunk_v"), nb::arg("new_len"), nb::kw_only(), nb::arg("workspace"),
      nb::arg("max_candidates"), nb::arg("source") = "key_norm", nb::arg("scores") = nb::none(),
      nb::arg("q") = nb::none(), nb::arg("q_lse") = nb::none(), nb::arg("obs_window") = 32,
      nb::arg("tensor_cores") = true, nb::arg("stage_keys") = nb::none(),
      nb::arg("stage_key_base") = nb::none(),
      nb::arg("k_scale") = nb::none(), nb::arg("v_scale") = nb::none(),
      nb::arg("stream") = nb::none(),
      "The fused eviction of one prefill chunk for `layer` (after prepare_chunk and sync):\n"
      "chunk_indptr [batch + 1] int32 (it must match each request's prepared chunk: the kernel\n"
      "trusts it), chunk_k/chunk_v [rows, H, d] in the cache dtype, new_len [batch, H] int32\n"
      "out; source key_norm, supplied (scores [batch, H, max_candidates] float32) or snapkv\n"
      "(q [rows, query heads, d]; q_lse [rows, query heads] float32, the layer's\n"
      "prefill_attention lse: every logit once, on tensor cores for 16-bit and fp8 caches unless\n"
      "tensor_cores=False); elastic plans pass stage_keys (uint32 [words]) and stage_key_base\n"
      "(int64 [batch * G]) device tensors, both from mirror.stage_key_layout(), which returns\n"
      "(base, words) for the mirror's batch after prepare_chunk: upload base, give keys exactly\n"
      "`words` elements (laid out like the staged groups' page lists, no padding; contents do\n"
      "not matter; the same two for every layer of the chunk), and finish with evict_elastic. fp8 caches: k_scale / v_scale float32\n"
      "device tensors of 1 or H elements (the append's; built-in scores read K as stored * s).\n"
      "workspace: at least mirror.eviction_workspace_bytes(max_candidates, source, obs_window,\n"
      "from_lse) bytes.");

  m.def(
      "evict_elastic",
      [](device_mirror const& m, nb::handle chunk_indptr, nb::handle stage_keys,
         nb::handle stage_key_base, nb::handle wanted, nb::handle page_limit, nb::handle new_len, nb::handle workspace,
         std::int32_t max_candidates, nb::handle pages_out, nb::handle stream) {
        auto const& view = m.view();
        auto const& plan = m.plan();
        expect_elastic_plan(plan, "evict_elastic");
        std::int64_t B = view.batch_size, LH = std::int64_t{view.num_layers} * view.num_kv_heads;
        auto ti = tensor_arg(m, chunk_indptr, "chunk_indptr", {B + 1}, is_i32, "int32");
        auto [tk, tb] = stage_key_args(m, stage_keys, stage_key_base, false);
        auto tw = tensor_arg(m, wanted, "wanted", {B}, is_i64, "int64");
        auto tl = tensor_arg(m, page_limit, "page_limit", {B}, is_i64, "int64");
        auto tn = tensor_arg(m, new_len, "new_len", {B, LH}, is_i32, "int32", true);
        elastic_eviction_params e;
        e.kv             = view;
        e.rules          = m.rules.get<head_rule>();
        e.sink           = plan.profile.sink_tokens;
        e.chunk_indptr   = static_cast<std::int32_t const*>(ti.data);
        e.max_candidates = max_candidates;
        e.stage_keys     = static_cast<std::uint32_t const*>(tk.data);
        e.stage_key_base = static_cast<std::int64_t const*>(tb.data);
        e.wanted         = static_cast<std::int64_t const*>(tw.data);
        e.page_limit     = static_cast<std::int64_t const*>(tl.data);
        e.new_len        = static_cast<std::int32_t*>(tn.data);
        std::optional<device_tensor> tp;
        if (!pages_out.is_none()) {
          tp          = tensor_arg(m, pages_out, "pages_out", {B}, is_i64, "int64", true);
          e.pages_out = static_cast<std::int64_t*>(tp->data);
        }
        e.validate();
        auto ws = workspace_of(m, workspace, elastic_workspace_bytes(e));
        evict_elastic(e, ws.data, static_cast<std::size_t>(ws.bytes()), stream_from(stream));
      },
      nb::arg("mirror"), nb::arg("chunk_indptr"), nb::arg("stage_keys"),
      nb::arg("stage_key_base"), nb::arg("wanted"),
      nb::arg("page_limit"), nb::arg("new_len"), nb::kw_only(), nb::arg("workspace"),
      nb::arg("max_candidates"), nb::arg("pages_out") = nb::none(), nb::arg("stream") = nb::none(),
      "The elastic eviction's request-wide step after every layer's evict_chunk staged the\n"
      "chunk into stage_keys (uint32 [words]) with stage_key_base (int64 [batch * G]), the same\n"
      "device tensors (mirror.stage_key_layout()): wanted\n"
      "[batch] int64 (KVCacheManager.elastic_wanted_tokens per member) and page_limit [batch]\n"
      "int64 (elastic_page_limit) on the device, new_len [batch, layers * H]\n"
      "int32 out (commit_chunk's kept counts), pages_out [batch] int64 optional. workspace: at\n"
      "least mirror.elastic_workspace_bytes() bytes.");
}

}  // namespace tangram::python
