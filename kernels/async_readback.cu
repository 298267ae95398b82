// SPDX-License-Identifier: Apache-2.0
// async_readback: device-to-host copies into pinned slots, polled without waiting, through the
// CUDA runtime only (cudaHostAlloc, cudaMemcpyAsync, events). The engine-side protocol is in
// docs/integration.md (the sync-free elastic loop).
#include <cuda_runtime_api.h>

#include <utility>

#include "detail/device_guard.cuh"
#include "detail/runtime_checks.cuh"
#include "tangram/core/error.hpp"
#include "tangram/device/async_readback.hpp"

namespace tangram {

namespace {

[[noreturn]] void readback_fail(char const* what, cudaError_t err) {
  detail::runtime_fail("async_readback", what, err);
}

}  // namespace

async_readback::async_readback(std::size_t slot_bytes, std::int32_t slots, std::int32_t device_id)
    : slot_bytes_(slot_bytes), slots_(slots), device_id_(device_id) {
  TANGRAM_EXPECTS(slot_bytes >= 1 && slot_bytes <= (std::size_t{1} << 40),
                  invalid_argument,
                  "async_readback.slot_bytes: must be in [1, 2^40], got ",
                  slot_bytes);
  TANGRAM_EXPECTS(slots >= 1 && slots <= (1 << 16),
                  invalid_argument,
                  "async_readback.slots: must be in [1, 65536], got ",
                  slots);
  detail::check_device_id("async_readback", device_id);
  detail::device_guard guard(device_id);
  if (guard.status() != cudaSuccess) readback_fail("cudaSetDevice", guard.status());
  events_.assign(static_cast<std::size_t>(slots), nullptr);
  info_.assign(static_cast<std::size_t>(slots), slot_info{});
  void* p = nullptr;
  cudaError_t err =
      cudaHostAlloc(&p, slot_bytes * static_cast<std::size_t>(slots), cudaHostAllocDefault);
  if (err != cudaSuccess) {
    destroy();
    readback_fail("cudaHostAlloc of the pinned slots", err);
  }
  pinned_ = static_cast<std::byte*>(p);
  if (err = detail::create_events(events_); err != cudaSuccess) {
    destroy();
    readback_fail("cudaEventCreateWithFlags", err);
  }
}

async_readback::~async_readback() {
  destroy();
}

async_readback::async_readback(async_readback&& other) noexcept {
  swap(other);
}

async_readback& async_readback::operator=(async_readback&& other) noexcept {
  if (this != &other) {
    destroy();
    swap(other);
  }
  return *this;
}

void async_readback::destroy() noexcept {
  if (device_id_ >= 0) {
    detail::device_guard guard(device_id_);
    // A copy still in flight writes its slot: wait for it before the pinned block goes.
    for (std::size_t i = 0; i < events_.size(); ++i) {
      if (events_[i] && info_[i].state == slot_state::pending)
        (void)cudaEventSynchronize(events_[i]);
      if (events_[i]) (void)cudaEventDestroy(events_[i]);
    }
    if (pinned_) (void)cudaFreeHost(pinned_);
    (void)cudaGetLastError();
  }
  events_.clear();
  info_.clear();
  pinned_     = nullptr;
  slot_bytes_ = 0;
  slots_ = next_ = in_use_ = 0;
  device_id_               = -1;
}

void async_readback::swap(async_readback& other) noexcept {
  std::swap(slot_bytes_, other.slot_bytes_);
  std::swap(slots_, other.slots_);
  std::swap(device_id_, other.device_id_);
  std::swap(next_, other.next_);
  std::swap(in_use_, other.in_use_);
  std::swap(uses_, other.uses_);
  std::swap(pinned_, other.pinned_);
  events_.swap(other.events_);
  info_.swap(other.info_);
}

std::optional<readback_ticket> async_readback::enqueue(readback_part const* parts,
                                                       std::int32_t count,
                                                       cuda_stream_t stream) {
  TANGRAM_EXPECTS(pinned_ != nullptr, logic_error, "async_readback::enqueue: moved-from object");
  TANGRAM_EXPECTS(count >= 1 && count <= max_parts && parts != nullptr,
                  invalid_argument,
                  "async_readback::enqueue.count: must be in [1, ",
                  max_parts,
                  "] with parts set, got ",
                  count);
  std::size_t offset[max_parts] = {};
  std::size_t end               = 0;
  for (std::int32_t i = 0; i < count; ++i) {
    TANGRAM_EXPECTS(parts[i].src != nullptr || parts[i].bytes == 0,
                    invalid_argument,
                    "async_readback::enqueue.parts[",
                    i,
                    "].src: null with ",
                    parts[i].bytes,
                    " bytes");
    offset[i] = (end + part_alignment - 1) / part_alignment * part_alignment;
    TANGRAM_EXPECTS(offset[i] <= slot_bytes_ && parts[i].bytes <= slot_bytes_ - offset[i],
                    invalid_argument,
                    "async_readback::enqueue.parts[",
                    i,
                    "].bytes: ",
                    parts[i].bytes,
                    " bytes at offset ",
                    offset[i],
                    " exceed the slot's ",
                    slot_bytes_,
                    " bytes");
    end = offset[i] + parts[i].bytes;
  }
  if (in_use_ == slots_) return std::nullopt;
  std::int32_t s = next_;
  while (info_[static_cast<std::size_t>(s)].state != slot_state::free) s = (s + 1) % slots_;
  detail::device_guard guard(device_id_);
  if (guard.status() != cudaSuccess) readback_fail("enqueue: cudaSetDevice", guard.status());
  std::byte* base = pinned_ + static_cast<std::size_t>(s) * slot_bytes_;
  // On a failure the slot stays free: copies already enqueued into it must land before anyone
  // reuses it, so the error path waits for the stream (an error path, not the loop's).
  auto fail_after_enqueue = [&](char const* what, cudaError_t err) {
    (void)cudaStreamSynchronize(stream);
    readback_fail(what, err);
  };
  for (std::int32_t i = 0; i < count; ++i) {
    if (parts[i].bytes == 0) continue;
    cudaError_t err = cudaMemcpyAsync(
        base + offset[i], parts[i].src, parts[i].bytes, cudaMemcpyDeviceToHost, stream);
    if (err != cudaSuccess) fail_after_enqueue("enqueue: cudaMemcpyAsync", err);
  }
  cudaError_t err = cudaEventRecord(events_[static_cast<std::size_t>(s)], stream);
  if (err != cudaSuccess) fail_after_enqueue("enqueue: cudaEventRecord", err);
  auto& info = info_[static_cast<std::size_t>(s)];
  info.state = slot_state::pending;
  info.use   = ++uses_;
  info.parts = count;
  for (std::int32_t i = 0; i < count; ++i) info.offset[i] = offset[i];
  ++in_use_;
  next_ = (s + 1) % slots_;
  return readback_ticket{s, info.use};
}

async_readback::slot_info const& async_readback::checked(readback_ticket t, char const* op) const {
  TANGRAM_EXPECTS(t.slot >= 0 && t.slot < slots_ &&
                      info_[static_cast<std::size_t>(t.slot)].state != slot_state::free &&
                      info_[static_cast<std::size_t>(t.slot)].use == t.use,
                  logic_error,
                  "async_readback::",
                  op,
                  ": ticket (slot ",
                  t.slot,
                  ", use ",
                  t.use,
                  ") is not in flight (released, stale or from another object)");
  return info_[static_cast<std::size_t>(t.slot)];
}

bool async_readback::ready(readback_ticket t) {
  auto const& c = checked(t, "ready");
  if (c.state == slot_state::ready) return true;
  detail::device_guard guard(device_id_);
  cudaError_t err = cudaEventQuery(events_[static_cast<std::size_t>(t.slot)]);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  if (err != cudaSuccess) readback_fail("ready: cudaEventQuery", err);
  info_[static_cast<std::size_t>(t.slot)].state = slot_state::ready;
  return true;
}

async_readback::slot_info const& async_readback::checked_ready(readback_ticket t,
                                                               char const* op) const {
  auto const& c = checked(t, op);
  TANGRAM_EXPECTS(c.state == slot_state::ready,
                  logic_error,
                  "async_readback::",
                  op,
                  ": ticket (slot ",
                  t.slot,
                  ") is not ready yet (ask ready() first: its copy may still write the slot)");
  return c;
}

void const* async_readback::part(readback_ticket t, std::int32_t i) const {
  auto const& c = checked_ready(t, "part");
  TANGRAM_EXPECTS(i >= 0 && i < c.parts,
                  invalid_argument,
                  "async_readback::part.i: must be in [0, ",
                  c.parts,
                  "), got ",
                  i);
  return pinned_ + static_cast<std::size_t>(t.slot) * slot_bytes_ + c.offset[i];
}

void async_readback::release(readback_ticket t) {
  (void)checked_ready(t, "release");
  info_[static_cast<std::size_t>(t.slot)].state = slot_state::free;
  --in_use_;
}

void async_readback::drain() {
  detail::device_guard guard(device_id_);
  for (std::size_t i = 0; i < info_.size(); ++i) {
    if (info_[i].state != slot_state::pending) continue;
    cudaError_t err = cudaEventSynchronize(events_[i]);
    if (err != cudaSuccess) readback_fail("drain: cudaEventSynchronize", err);
    info_[i].state = slot_state::ready;
  }
}

}  // namespace tangram
