// SPDX-License-Identifier: Apache-2.0
// Owning device allocations shared by the GPU tests (test/gpu) and the GPU benchmarks (bench/gpu):
// a device buffer, and the set of device arrays a kv_cache_view points to.
// A failing CUDA call throws std::runtime_error naming the call: Catch2 reports it as a failed
// test, Google Benchmark as a failed run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tangram/core/kv_view.hpp"

namespace tangram::test {

/// Throws std::runtime_error("what: <CUDA error string>") unless `e` is cudaSuccess.
inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// Owning device allocation (cudaMalloc: 256-byte aligned). Move-only; frees on destruction.
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) cuda_check(cudaMalloc(&ptr_, bytes_), "cudaMalloc");
  }
  /// A buffer holding a copy of `host`.
  template <class T>
  explicit device_buffer(std::vector<T> const& host) : device_buffer(host.size() * sizeof(T)) {
    upload(host.data(), bytes_);
  }
  device_buffer(device_buffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_   = nullptr;
    o.bytes_ = 0;
  }
  device_buffer& operator=(device_buffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  device_buffer(device_buffer const&)            = delete;
  device_buffer& operator=(device_buffer const&) = delete;
  ~device_buffer() {
    if (ptr_) (void)cudaFree(ptr_);
  }
  /// Synchronous copy of `bytes` host bytes to the start of the buffer.
  void upload(const void* src, std::size_t bytes) {
    if (bytes) cuda_check(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  /// Synchronous copy of the whole buffer to the host as bytes() / sizeof(T) values.
  template <class T>
  std::vector<T> download() const {
    std::vector<T> out(bytes_ / sizeof(T));
    if (bytes_)
      cuda_check(cudaMemcpy(out.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return out;
  }
  template <class T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_         = nullptr;
  std::size_t bytes_ = 0;
};

/// The device arrays behind a kv_cache_view (everything but the scalars), each owned here.
struct device_kv_arrays {
  device_buffer pool, head_slots, window, ring, page_offset, pages, base_len, appended, seq_tokens,
      batch_slots;
  device_buffer pinned;  ///< optional (empty: the view's pinned_tokens is null)

  /// Points every array field of `view` at these buffers; scalars are left as they are.
  void attach(kv_cache_view& view) const {
    view.pool             = pool.get<std::byte>();
    view.head_slots       = head_slots.get<head_slot>();
    view.group_window     = window.get<std::int32_t>();
    view.group_ring_pages = ring.get<std::int32_t>();
    view.page_offset      = page_offset.get<std::int32_t>();
    view.pages            = pages.get<std::int32_t>();
    view.head_base_len    = base_len.get<std::int32_t>();
    view.appended         = appended.get<std::int32_t>();
    view.seq_tokens       = seq_tokens.get<std::int32_t>();
    view.batch_slots      = batch_slots.get<std::int32_t>();
    view.pinned_tokens    = pinned.bytes() > 0 ? pinned.get<std::int32_t>() : nullptr;
  }
};

}  // namespace tangram::test
