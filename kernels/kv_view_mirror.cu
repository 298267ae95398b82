// SPDX-License-Identifier: Apache-2.0
// kv_view_mirror: the device copy of a manager's view, through the CUDA runtime only (no libcuda
// link). What to copy is decided by detail::mirror_stager (host-only, tested on the CPU); this
// file only allocates, waits, copies and records.
#include <cuda_runtime_api.h>

#include <cstring>
#include <utility>

#include "detail/device_guard.cuh"
#include "detail/runtime_checks.cuh"
#include "tangram/device/kv_view_mirror.hpp"

namespace tangram {

namespace {

[[noreturn]] void fail(char const* what, cudaError_t err) {
  detail::runtime_fail("kv_view_mirror", what, err);
}

void check(cudaError_t err, char const* what) {
  if (err != cudaSuccess) fail(what, err);
}

}  // namespace

kv_view_mirror::kv_view_mirror(kv_cache_manager const& kv, std::int32_t device_id)
    : manager_(&kv),
      device_id_(device_id),
      pool_kind_(kv.pool().kind()),
      stager_(kv.view_extents(), kv.options().max_view_changes) {
  detail::check_device_id("kv_view_mirror", device_id);
  detail::device_guard guard(device_id);
  if (guard.status() != cudaSuccess) fail("cudaSetDevice", guard.status());

  // A device pool on another GPU is almost surely a wiring mistake: the kernels would read it
  // through peer access at best.
  if (pool_kind_ == memory_kind::device && kv.pool().base() != nullptr) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, kv.pool().base()) == cudaSuccess) {
      TANGRAM_EXPECTS(attr.type != cudaMemoryTypeDevice || attr.device == device_id,
                      invalid_argument,
                      "kv_view_mirror: the manager's pool is device memory on device ",
                      attr.device,
                      " but device_id is ",
                      device_id);
    } else {
      (void)cudaGetLastError();  // not a pointer the runtime knows: nothing to compare
    }
  }

  auto const& layout = stager_.layout();
  auto total         = static_cast<std::size_t>(layout.total);
  try {
    if (total > 0) {
      void* p = nullptr;
      check(cudaMalloc(&p, total), "cudaMalloc of the mirror's device block");
      device_ = static_cast<std::byte*>(p);
      check(cudaMemset(device_, 0, total), "cudaMemset of the mirror's device block");
      p = nullptr;
      check(cudaHostAlloc(&p, 2 * total, cudaHostAllocDefault),
            "cudaHostAlloc of the mirror's pinned shadows");
      shadow_[0] = static_cast<std::byte*>(p);
      shadow_[1] = shadow_[0] + total;
      std::memset(shadow_[0], 0, 2 * total);  // padding stays zero in every copy
    }
    check(detail::create_events(uploaded_), "cudaEventCreateWithFlags");
  } catch (...) {
    release();
    throw;
  }
  for (std::size_t k = 0; k < batch_kind_count; ++k) {
    auto& v        = views_[k];
    v.pool         = kv.pool().base();
    v.geometry     = kv.plan().geometry;
    v.num_layers   = kv.plan().num_layers;
    v.num_kv_heads = kv.plan().num_kv_heads;
    v.num_groups   = kv.num_groups();
    v.batch_size   = 0;
    v.padding_slot = kv.max_sequences();
    if (device_) layout.attach(v, device_, static_cast<batch_kind>(k));
  }
}

kv_view_mirror::~kv_view_mirror() {
  release();
}

void kv_view_mirror::release() noexcept {
  if (device_id_ < 0) return;
  detail::device_guard guard(device_id_);
  // An upload may still read a shadow: wait for both before freeing the pinned memory.
  for (auto& e : uploaded_) {
    if (e) {
      (void)cudaEventSynchronize(e);
      (void)cudaEventDestroy(e);
    }
    e = nullptr;
  }
  if (shadow_[0]) (void)cudaFreeHost(shadow_[0]);
  if (device_) (void)cudaFree(device_);
  (void)cudaGetLastError();
  shadow_[0] = shadow_[1] = nullptr;
  device_                 = nullptr;
}

void kv_view_mirror::swap(kv_view_mirror& other) noexcept {
  std::swap(manager_, other.manager_);
  std::swap(device_id_, other.device_id_);
  std::swap(pool_kind_, other.pool_kind_);
  std::swap(stager_, other.stager_);
  std::swap(device_, other.device_);
  std::swap(shadow_, other.shadow_);
  std::swap(uploaded_, other.uploaded_);
  std::swap(next_, other.next_);
  std::swap(last_copies_, other.last_copies_);
  std::swap(last_bytes_, other.last_bytes_);
  std::swap(views_, other.views_);
}

kv_view_mirror::kv_view_mirror(kv_view_mirror&& other) noexcept {
  swap(other);
}

kv_view_mirror& kv_view_mirror::operator=(kv_view_mirror&& other) noexcept {
  if (this != &other) {
    kv_view_mirror dead(std::move(other));  // takes other's resources; ours die with `dead`
    swap(dead);
  }
  return *this;
}

void kv_view_mirror::sync(kv_cache_manager& kv, cuda_stream_t stream) {
  TANGRAM_EXPECTS(manager_ != nullptr, logic_error, "kv_view_mirror::sync: moved-from mirror");
  TANGRAM_EXPECTS(&kv == manager_,
                  logic_error,
                  "kv_view_mirror::sync: kv is not the manager this mirror was built for");
  // May throw (a freed batch member): nothing done yet.
  kv_cache_view host = kv.view(batch_kind::decode), prefill = kv.view(batch_kind::prefill);
  detail::device_guard guard(device_id_);
  if (guard.status() != cudaSuccess) fail("sync: cudaSetDevice", guard.status());
  int const b = next_;
  // The upload that last read this shadow was enqueued two syncs ago: usually long done, so ask
  // first (never a wait) and wait only when the host runs more than one step ahead.
  cudaError_t done = cudaEventQuery(uploaded_[b]);
  if (done == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: clear it
    check(cudaEventSynchronize(uploaded_[b]), "sync: cudaEventSynchronize");
  } else {
    check(done, "sync: cudaEventQuery");
  }
  if (device_) {
    stager_.stage(kv.changes(), host, prefill, shadow_[b], shadow_[1 - b]);
    for (auto r : stager_.uploads()) {
      cudaError_t err = cudaMemcpyAsync(device_ + r.begin,
                                        shadow_[b] + r.begin,
                                        static_cast<std::size_t>(r.end - r.begin),
                                        cudaMemcpyHostToDevice,
                                        stream);
      if (err != cudaSuccess) {
        stager_.invalidate();
        // Copies already enqueued may still read this shadow, which the next sync rewrites.
        (void)cudaStreamSynchronize(stream);
        fail("sync: cudaMemcpyAsync", err);
      }
    }
  }
  cudaError_t err = cudaEventRecord(uploaded_[b], stream);
  if (err != cudaSuccess) {
    stager_.invalidate();
    (void)cudaStreamSynchronize(stream);
    fail("sync: cudaEventRecord", err);
  }
  last_copies_ = device_ ? static_cast<std::int64_t>(stager_.uploads().size()) : 0;
  last_bytes_  = device_ ? stager_.upload_bytes() : 0;
  if (device_) stager_.commit();
  kv.clear_view_changes();
  views_[static_cast<std::size_t>(batch_kind::decode)].batch_size  = host.batch_size;
  views_[static_cast<std::size_t>(batch_kind::prefill)].batch_size = prefill.batch_size;
  next_                                                            = 1 - b;
}

}  // namespace tangram
