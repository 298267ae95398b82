// SPDX-License-Identifier: Apache-2.0
// Helpers for the GPU tests: owning device buffers and a device mirror of a test_cache view.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "../reference/kv_test_cache.hpp"
#include "tangram/memory/kv_view.hpp"

namespace tangram::test {

#define TANGRAM_TEST_CUDA(call)                              \
  do {                                                       \
    cudaError_t tangram_err_ = (call);                       \
    INFO(#call << ": " << cudaGetErrorString(tangram_err_)); \
    REQUIRE(tangram_err_ == cudaSuccess);                    \
  } while (0)

/// Owning device allocation (cudaMalloc: 256-byte aligned).
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) TANGRAM_TEST_CUDA(cudaMalloc(&ptr_, bytes_));
  }
  template <class T>
  explicit device_buffer(std::vector<T> const& host) : device_buffer(host.size() * sizeof(T)) {
    upload(host.data(), bytes_);
  }
  device_buffer(device_buffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
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
  void upload(const void* src, std::size_t bytes) {
    if (bytes) TANGRAM_TEST_CUDA(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice));
  }
  template <class T>
  std::vector<T> download() const {
    std::vector<T> out(bytes_ / sizeof(T));
    if (bytes_) TANGRAM_TEST_CUDA(cudaMemcpy(out.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
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

/// The arrays of a test_cache's view, copied to the device, and the device view over them.
struct device_cache {
  device_buffer pool, head_slots, window, ring, page_offset, pages, base_len, appended, seq_tokens,
      batch_slots;
  kv_cache_view view;

  explicit device_cache(test_cache& c, kv_cache_view const& host)
      : pool(c.pool()),
        head_slots(c.head_slots()),
        window(c.layout().group_window),
        ring(c.layout().group_ring_pages),
        page_offset(c.page_offset()),
        pages(c.pages()),
        base_len(c.base_len()),
        appended(c.appended()),
        seq_tokens(c.seq_tokens()),
        batch_slots(c.batch_slots()) {
    view                  = host;
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
  }
};

}  // namespace tangram::test
