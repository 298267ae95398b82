// SPDX-License-Identifier: Apache-2.0
// A fake CUDA runtime for running the runtime-only sources of tangram::kernels (no kernels:
// kernels/kv_view_mirror.cu, kernels/stream_epochs.cu) on the CPU, in test/fake_cuda. Just the
// calls those sources make.
//
// "Device" memory is host memory. Work enqueued on a stream (cudaMemcpyAsync, cudaEventRecord,
// cudaLaunchHostFunc, which test code uses to enqueue kernels' CPU stand-ins in stream order)
// does NOT run when enqueued: it waits in one queue (streams are not told apart, a stricter
// order than CUDA's) until cudaEventSynchronize of an event recorded in it, cudaStreamSynchronize,
// cudaDeviceSynchronize, or fake_cuda::run(n); cudaEventQuery never runs any (it answers
// cudaErrorNotReady until the record ran), as a GPU busy with earlier work would. A copy reads its
// source when it runs, as a DMA engine does, so a host buffer rewritten before its pending copy ran
// shows up as wrong data. Failures can be injected per call kind. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>

enum cudaError_t {
  cudaSuccess               = 0,
  cudaErrorInvalidValue     = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNoDevice         = 100,
  cudaErrorInvalidDevice    = 101,
  cudaErrorNotReady         = 600,
  cudaErrorLaunchFailure    = 719,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost     = 0,
  cudaMemcpyHostToDevice   = 1,
  cudaMemcpyDeviceToHost   = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault        = 4,
};
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost         = 1,
  cudaMemoryTypeDevice       = 2,
  cudaMemoryTypeManaged      = 3,
};
struct cudaPointerAttributes {
  cudaMemoryType type = cudaMemoryTypeUnregistered;
  int device          = 0;
  void* devicePointer = nullptr;
  void* hostPointer   = nullptr;
};
struct CUstream_st;
typedef CUstream_st* cudaStream_t;
/// Defined here (the real runtime keeps it opaque): the fake's events.
struct CUevent_st {
  std::int64_t last_record = -1;  ///< queue position of its last record, -1: never recorded
};
typedef CUevent_st* cudaEvent_t;

#define cudaHostAllocDefault   0x00
#define cudaEventDisableTiming 0x02
#define CUDART_CB

typedef void (*cudaHostFn_t)(void*);

namespace fake_cuda {

struct op {
  void* dst             = nullptr;  ///< a copy, or (dst == nullptr) an event record or host fn
  void const* src       = nullptr;
  std::size_t bytes     = 0;
  CUevent_st* event     = nullptr;
  cudaHostFn_t fn       = nullptr;  ///< cudaLaunchHostFunc: called when the op runs
  void* user            = nullptr;
  std::int64_t position = 0;
};

struct state_t {
  int devices = 1, current = 0;
  cudaError_t sticky = cudaSuccess;
  std::deque<op> queue;
  std::int64_t enqueued = 0;  ///< ops ever enqueued (queue positions)
  std::int64_t executed = 0;  ///< ops ever run
  std::map<void const*, std::pair<std::size_t, int>> device_blocks;  ///< base -> (bytes, device)
  std::map<void const*, std::size_t> pinned_blocks;
  std::int64_t copies = 0, copy_bytes = 0;  ///< cudaMemcpyAsync calls that succeeded
  std::int64_t waits_that_ran_work = 0;     ///< event waits that had to run queued work
  int fail_memcpy_async_in         = -1;    ///< fail the n-th next cudaMemcpyAsync (0: next)
  int fail_malloc_in               = -1;    ///< fail the n-th next cudaMalloc
  int fail_event_create_in         = -1;    ///< fail the n-th next cudaEventCreateWithFlags
  int fail_event_record_in         = -1;    ///< fail the n-th next cudaEventRecord
  int fail_event_query_in          = -1;    ///< fail the n-th next cudaEventQuery
  std::int64_t events_live         = 0;     ///< events created and not yet destroyed
  std::int64_t event_queries = 0, event_syncs = 0, stream_waits = 0;  ///< calls made
  /// Blocking calls made: cudaStreamSynchronize, cudaDeviceSynchronize, synchronous cudaMemcpy.
  std::int64_t stream_syncs = 0, device_syncs = 0, blocking_copies = 0;
  std::function<void(CUevent_st*)> on_record_run;  ///< called when an event record runs
};

inline state_t& state() {
  static state_t s;
  return s;
}

/// Runs the oldest `n` queued ops (all when n < 0).
inline void run(std::int64_t n = -1) {
  auto& s = state();
  while (!s.queue.empty() && n-- != 0) {
    op o = s.queue.front();
    s.queue.pop_front();
    ++s.executed;
    if (o.dst)
      std::memcpy(o.dst, o.src, o.bytes);
    else if (o.fn)
      o.fn(o.user);
    else if (s.on_record_run && o.event)
      s.on_record_run(o.event);
  }
}

/// Calls that make the host wait for the device: cudaEventSynchronize, cudaStreamSynchronize,
/// cudaDeviceSynchronize and the synchronous cudaMemcpy (the "sync counter" of the engine-loop
/// checks: a loop that never waits leaves it unchanged).
inline std::int64_t host_waits() {
  auto const& s = state();
  return s.event_syncs + s.stream_syncs + s.device_syncs + s.blocking_copies;
}

inline bool consume(int& countdown) {
  if (countdown < 0) return false;
  return countdown-- == 0;
}

}  // namespace fake_cuda

inline cudaError_t cudaGetLastError() {
  auto e                    = fake_cuda::state().sticky;
  fake_cuda::state().sticky = cudaSuccess;
  return e;
}
inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    default:
      return "cudaErrorLaunchFailure";
  }
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "fake failure";
}
inline cudaError_t fake_fail(cudaError_t e) {
  fake_cuda::state().sticky = e;
  return e;
}
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = fake_cuda::state().devices;
  return *n > 0 ? cudaSuccess : fake_fail(cudaErrorNoDevice);
}
inline cudaError_t cudaGetDevice(int* d) {
  if (fake_cuda::state().devices == 0) return fake_fail(cudaErrorNoDevice);
  *d = fake_cuda::state().current;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= fake_cuda::state().devices) return fake_fail(cudaErrorInvalidDevice);
  fake_cuda::state().current = d;
  return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  if (fake_cuda::consume(fake_cuda::state().fail_malloc_in))
    return fake_fail(cudaErrorMemoryAllocation);
  *p                                   = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  fake_cuda::state().device_blocks[*p] = {bytes, fake_cuda::state().current};
  return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) {
  fake_cuda::run();  // cudaFree synchronises
  fake_cuda::state().device_blocks.erase(p);
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int v, std::size_t bytes) {
  fake_cuda::run();
  std::memset(p, v, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned) {
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  // Garbage, not zeros: the code must initialise what it uploads.
  std::memset(*p, 0xCD, bytes);
  fake_cuda::state().pinned_blocks[*p] = bytes;
  return cudaSuccess;
}
inline cudaError_t cudaFreeHost(void* p) {
  fake_cuda::run();
  fake_cuda::state().pinned_blocks.erase(p);
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, void const* p) {
  *a = {};
  for (auto const& [base, info] : fake_cuda::state().device_blocks) {
    auto const* b = static_cast<char const*>(base);
    if (p >= base && static_cast<char const*>(p) < b + info.first) {
      a->type   = cudaMemoryTypeDevice;
      a->device = info.second;
    }
  }
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  if (fake_cuda::consume(fake_cuda::state().fail_event_create_in))
    return fake_fail(cudaErrorMemoryAllocation);
  *e = new CUevent_st;
  ++fake_cuda::state().events_live;
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  // A record still queued would name a dead event: drop its pointer (the record then only marks
  // a queue position, as CUDA releases a destroyed event once its work completed).
  for (auto& o : fake_cuda::state().queue)
    if (o.event == e) o.event = nullptr;
  delete e;
  --fake_cuda::state().events_live;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  auto& s = fake_cuda::state();
  if (fake_cuda::consume(s.fail_event_record_in)) return fake_fail(cudaErrorLaunchFailure);
  fake_cuda::op o;
  o.event        = e;
  o.position     = s.enqueued++;
  e->last_record = o.position;
  s.queue.push_back(o);
  return cudaSuccess;
}
/// cudaSuccess once the event's last record ran (or when never recorded), cudaErrorNotReady
/// before; runs nothing.
inline cudaError_t cudaEventQuery(cudaEvent_t e) {
  auto& s = fake_cuda::state();
  ++s.event_queries;
  if (fake_cuda::consume(s.fail_event_query_in)) return fake_fail(cudaErrorLaunchFailure);
  return e->last_record >= s.executed ? cudaErrorNotReady : cudaSuccess;
}
/// The fake has one queue, already in order: a wait on an event orders nothing more.
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) {
  ++fake_cuda::state().stream_waits;
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  auto& s = fake_cuda::state();
  ++s.event_syncs;
  if (e->last_record >= s.executed) {
    ++s.waits_that_ran_work;
    fake_cuda::run(e->last_record + 1 - s.executed);
  }
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(
    void* dst, void const* src, std::size_t bytes, cudaMemcpyKind, cudaStream_t) {
  auto& s = fake_cuda::state();
  if (fake_cuda::consume(s.fail_memcpy_async_in)) return fake_fail(cudaErrorLaunchFailure);
  fake_cuda::op o;
  o.dst      = dst;
  o.src      = src;
  o.bytes    = bytes;
  o.position = s.enqueued++;
  s.queue.push_back(o);
  ++s.copies;
  s.copy_bytes += static_cast<std::int64_t>(bytes);
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
  ++fake_cuda::state().stream_syncs;
  fake_cuda::run();
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
  ++fake_cuda::state().device_syncs;
  fake_cuda::run();
  return cudaSuccess;
}
// What test/gpu/kv_view_mirror_test.cpp calls besides (run here by gpu_mirror_main.cpp).
inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
  static int streams = 0;
  *s                 = reinterpret_cast<cudaStream_t>(&streams);  // never dereferenced
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) {
  fake_cuda::run();
  return cudaSuccess;
}
/// Enqueued like any work: `fn(user)` runs when the queue reaches it (after the work before it).
inline cudaError_t cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t fn, void* user) {
  auto& s = fake_cuda::state();
  fake_cuda::op o;
  o.fn       = fn;
  o.user     = user;
  o.position = s.enqueued++;
  s.queue.push_back(o);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, void const* src, std::size_t bytes, cudaMemcpyKind) {
  ++fake_cuda::state().blocking_copies;
  fake_cuda::run();  // synchronous: after the work before it
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
