// SPDX-License-Identifier: Apache-2.0
// stream_epochs: the stream-ordered release of a manager's deferred pages, through the CUDA
// runtime only (events: create, record, query, synchronize, destroy; cudaStreamWaitEvent when
// the ring is full). The epoch bookkeeping itself is the manager's (memory/page_pool.hpp).
#include <cuda_runtime_api.h>

#include <utility>

#include "detail/device_guard.cuh"
#include "detail/runtime_checks.cuh"
#include "tangram/device/stream_epochs.hpp"

namespace tangram {

namespace {

[[noreturn]] void epochs_fail(char const* what, cudaError_t err) {
  detail::runtime_fail("stream_epochs", what, err);
}

}  // namespace

stream_epochs::stream_epochs(kv_cache_manager const& kv,
                             std::int32_t max_in_flight,
                             std::int32_t device_id)
    : manager_(&kv), device_id_(device_id), capacity_(max_in_flight) {
  TANGRAM_EXPECTS(max_in_flight >= 1 && max_in_flight <= max_events,
                  invalid_argument,
                  "stream_epochs.max_in_flight: must be in [1, ",
                  max_events,
                  "], got ",
                  max_in_flight);
  detail::check_device_id("stream_epochs", device_id);
  events_.assign(static_cast<std::size_t>(max_in_flight), nullptr);
  epochs_.assign(static_cast<std::size_t>(max_in_flight), -1);
  detail::device_guard guard(device_id);
  if (guard.status() != cudaSuccess) epochs_fail("cudaSetDevice", guard.status());
  if (cudaError_t err = detail::create_events(events_); err != cudaSuccess) {
    destroy();
    epochs_fail("cudaEventCreateWithFlags", err);
  }
}

stream_epochs::~stream_epochs() {
  destroy();
}

stream_epochs::stream_epochs(stream_epochs&& other) noexcept {
  swap(other);
}

stream_epochs& stream_epochs::operator=(stream_epochs&& other) noexcept {
  if (this != &other) {
    destroy();
    swap(other);
  }
  return *this;
}

void stream_epochs::destroy() noexcept {
  for (auto& e : events_) {
    if (e) (void)cudaEventDestroy(e);  // does not wait: CUDA frees it once its work completed
    e = nullptr;
  }
  events_.clear();
  epochs_.clear();
  manager_  = nullptr;
  capacity_ = count_ = head_ = 0;
}

void stream_epochs::swap(stream_epochs& other) noexcept {
  std::swap(manager_, other.manager_);
  std::swap(device_id_, other.device_id_);
  std::swap(capacity_, other.capacity_);
  events_.swap(other.events_);
  epochs_.swap(other.epochs_);
  std::swap(head_, other.head_);
  std::swap(count_, other.count_);
  std::swap(merged_, other.merged_);
}

void stream_epochs::check_manager(kv_cache_manager const& kv, char const* op) const {
  TANGRAM_EXPECTS(manager_ != nullptr,
                  logic_error,
                  "stream_epochs::",
                  op,
                  ": the object was moved from (it owns no events)");
  TANGRAM_EXPECTS(&kv == manager_,
                  logic_error,
                  "stream_epochs::",
                  op,
                  ": kv is not the manager this object was built for");
}

std::int64_t stream_epochs::release_oldest(kv_cache_manager& kv, std::int32_t done) {
  if (done == 0) return 0;
  auto newest = epochs_[static_cast<std::size_t>((head_ + done - 1) % capacity_)];
  auto pages  = kv.release_epochs_through(newest);  // validated: a closed epoch
  head_       = (head_ + done) % capacity_;
  count_ -= done;
  return pages;
}

std::int64_t stream_epochs::poll(kv_cache_manager& kv) {
  check_manager(kv, "poll");
  std::int32_t done = 0;
  for (; done < count_; ++done) {
    auto* e         = events_[static_cast<std::size_t>((head_ + done) % capacity_)];
    cudaError_t err = cudaEventQuery(e);
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();  // "not ready" is a status, not an error to carry on
      break;
    }
    if (err != cudaSuccess) epochs_fail("cudaEventQuery", err);
  }
  return release_oldest(kv, done);
}

std::int64_t stream_epochs::drain(kv_cache_manager& kv) {
  check_manager(kv, "drain");
  if (count_ == 0) return 0;
  // Events complete in stream order only on one stream: wait for each.
  for (std::int32_t k = 0; k < count_; ++k) {
    cudaError_t err =
        cudaEventSynchronize(events_[static_cast<std::size_t>((head_ + k) % capacity_)]);
    if (err != cudaSuccess) epochs_fail("cudaEventSynchronize", err);
  }
  return release_oldest(kv, count_);
}

std::int64_t stream_epochs::end_step(kv_cache_manager& kv, cuda_stream_t stream) {
  check_manager(kv, "end_step");
  if (count_ == capacity_) (void)poll(kv);
  detail::device_guard guard(device_id_);
  if (guard.status() != cudaSuccess) epochs_fail("cudaSetDevice", guard.status());
  if (count_ == capacity_) {
    // Full: merge into the newest event. The stream first waits for that event's work (it may
    // have been recorded on another stream), then the event is recorded again behind this step.
    auto at         = static_cast<std::size_t>((head_ + count_ - 1) % capacity_);
    cudaError_t err = cudaStreamWaitEvent(stream, events_[at], 0);
    if (err != cudaSuccess) epochs_fail("cudaStreamWaitEvent", err);
    err = cudaEventRecord(events_[at], stream);
    if (err != cudaSuccess) epochs_fail("cudaEventRecord", err);
    epochs_[at] = kv.advance_epoch();
    ++merged_;
    return epochs_[at];
  }
  auto at         = static_cast<std::size_t>((head_ + count_) % capacity_);
  cudaError_t err = cudaEventRecord(events_[at], stream);
  if (err != cudaSuccess) epochs_fail("cudaEventRecord", err);
  epochs_[at] = kv.advance_epoch();
  ++count_;
  return epochs_[at];
}

}  // namespace tangram
