// SPDX-License-Identifier: Apache-2.0
/**
 * @file kernels/detail/decode_attention.cuh
 * @brief Device code of ragged paged decode attention (see kernels/decode_attention.hpp).
 *
 * Split kernel: one CTA per split-map CTA (grid = N_CTA). A CTA finds its KV head (binary search
 * over the layer's CTA boundaries), computes the head's length prefix over the batch in shared
 * memory (block scan; no host planning), derives its stream range `[j W / S, (j+1) W / S)` and
 * walks the requests it overlaps. For each piece it streams the K/V tokens through a 4-stage
 * cp.async pipeline of 16-byte copies (each element loaded once for the whole GQA group), and
 * `groups = 128 / bdx` token groups of `bdx = D / vec` lanes each own `vec` dims of every query
 * head: scores are lane-partial dot products reduced with shuffles, softmax is online per tile
 * (one rescale per tile), and the groups' states merge through shared memory in a fixed order.
 * A piece that is a whole request is written to the output; others go to partial slot `j + r`.
 *
 * Merge kernel: one CTA per (request, KV head); combines the partials of the CTAs that covered
 * the request in CTA order (log-sum-exp, sink in the denominator).
 *
 * bf16/f16 K/V at group buckets 4 and 8 run the tensor-core split kernel instead
 * (kernels/detail/decode_mma.cuh; launch_decode_split_with picks it), which shares the CTA work
 * and the piece store with this one (kernels/detail/decode_common.cuh).
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "tangram/core/config.hpp"
#include "tangram/kernels/decode_attention.hpp"
#include "tangram/kernels/detail/decode_common.cuh"
#include "tangram/kernels/detail/decode_mma.cuh"
#include "tangram/kernels/detail/vec.cuh"
#include "tangram/kernels/head_cursor.hpp"
#include "tangram/kernels/math.hpp"

namespace tangram::detail {

/// Compile-time shape of the split kernel for storage type T and head dim D.
template <class T, int D>
struct decode_config {
  static constexpr int threads    = 128;
  static constexpr int elem_bytes = static_cast<int>(sizeof(T));
  /// dims per lane: one 16-byte vector but at most 8 values, more when D / 32 is larger
  /// (bdx <= 32 lanes per token). The cap gives fp8 the 16-bit types' lane layout (8 dims, an
  /// 8-byte shared-memory read; the cp.async copies stay 16 bytes, see row_chunks): 16 dims per
  /// lane would double the GB * vec floats of q and o per thread and the groups * GB * D floats
  /// of the merge buffer (64 KiB, over the smem_bytes limit below).
  static constexpr int per_vector  = 16 / elem_bytes < 8 ? 16 / elem_bytes : 8;
  static constexpr int vec         = per_vector > (D / 32) ? per_vector : (D / 32);
  static constexpr int bdx         = D / vec;        ///< lanes per token
  static constexpr int groups      = threads / bdx;  ///< tokens processed side by side
  static constexpr int stage_bytes = 8192;           ///< K + V bytes per pipeline stage
  static constexpr int stages      = 4;
  static constexpr int tile        =  // tokens per stage, a multiple of `groups`
      stage_bytes / (2 * D * elem_bytes) > groups ? stage_bytes / (2 * D * elem_bytes) : groups;
  static constexpr int per_group    = tile / groups;  ///< tokens per token group per tile
  static constexpr int row_bytes    = D * elem_bytes;
  static constexpr int row_chunks   = row_bytes / 16;
  static constexpr int stage_chunks = 2 * tile * row_chunks;
  /// Tokens whose K and V chunks one thread copies per tile: chunk tid + u * threads of a stage's
  /// K rows is chunk tid % row_chunks of token token_of(tid, u) (the same chunk of each).
  static constexpr int thread_tokens = tile * row_chunks / threads;
  TANGRAM_HOST_DEVICE static constexpr int token_of(int tid, int i) {
    return tid / row_chunks + i * (threads / row_chunks);
  }
  static constexpr int pipeline_bytes = stages * 2 * tile * D * elem_bytes;
  static constexpr int prefix_bytes   = decode_max_batch * 8;
  static constexpr int merge_bytes    = groups * decode_max_group * D * 4;
  static constexpr int smem_bytes     = pipeline_bytes > prefix_bytes
                                            ? (pipeline_bytes > merge_bytes ? pipeline_bytes
                                                                            : merge_bytes)
                                            : (prefix_bytes > merge_bytes ? prefix_bytes : merge_bytes);
  static constexpr int scan_items     = 4;  ///< requests per thread per prefix tile

  static_assert(bdx >= 1 && bdx <= 32 && (bdx & (bdx - 1)) == 0,
                "lanes per token: power of 2 <= 32");
  static_assert(tile % groups == 0, "tile must be a multiple of the token groups");
  static_assert(stage_chunks % threads == 0, "every thread copies the same number of chunks");
  static_assert(threads % row_chunks == 0 && thread_tokens >= 1,
                "a thread copies the same chunk of whole tokens");
  static_assert(smem_bytes <= 48 * 1024 - 2048, "dynamic shared memory must not need an opt-in");
};

/// Resident CTAs per SM the CUDA-core split kernel is compiled for (registers per thread at most
/// 65536 / (128 x this)): what the kernel reached before the batch-invariant and fold paths,
/// which otherwise let the compiler use more registers for the same work. Both variants (plain
/// and folded merge) get it, so that a plan made with one runs at the same occupancy with the
/// other (checked from the built objects by scripts/kernel_stats.sh --check).
constexpr int decode_min_ctas_per_sm(int group_bucket) {
  return group_bucket == 1 ? 5 : group_bucket == 2 ? 4 : group_bucket == 4 ? 3 : 1;
}

template <class T, int D, int GB, bool Fold, bool Stream>
TANGRAM_KERNEL __launch_bounds__(128, decode_min_ctas_per_sm(GB)) void decode_split_kernel(
    decode_args const a) {
  using cfg            = decode_config<T, D>;
  constexpr int vec    = cfg::vec;
  constexpr int bdx    = cfg::bdx;
  constexpr int groups = cfg::groups;
  constexpr int tile   = cfg::tile;
  constexpr int stages = cfg::stages;
  TANGRAM_DYNAMIC_SMEM(smem);
  __shared__ float s_m[groups][GB], s_s[groups][GB];

  decode_params const& p     = a.p;
  kv_cache_view const& kv    = p.kv;
  const int tid              = static_cast<int>(threadIdx.x);
  const int tx               = tid % bdx;
  const int tz               = tid / bdx;
  const int layer            = p.layer;
  const int group            = p.group;
  // One KV head's pieces (a per-head map's CTA serves one head; a layer stream's those it meets).
  auto serve_head = [&](int head) {
    const decode_cta_work work = decode_locate_work<cfg::threads, Fold, Stream>(a, smem, head);
    if (work.empty) return;  // uniform across the CTA
    const int h = work.h, r_first = work.r_first, r_last = work.r_last;
    std::int64_t pre = work.pre;
    // fp8 scales (kv_scales.hpp), folded once per CTA: q . (s_k k) = (s_k q) . k, so the K scale
    // joins the query's pre-scale; the V scale multiplies the normalised output
    // (decode_store_piece).
    const float q_scale = a.scale2 * p.scales.k_of(h);

    T* stage_base = reinterpret_cast<T*>(smem);
    float* merge  = reinterpret_cast<float*>(smem);
    for (int r = r_first; r <= r_last; ++r) {
      const std::int64_t len = kv.head_len(r, layer, h);
      decode_for_each_piece(a, work, r, len, pre, [&](decode_piece const& piece) {
        const head_cursor cur = make_head_cursor(kv, r, layer, h);
        const int t0 = static_cast<int>(piece.begin), t1 = static_cast<int>(piece.end);

        float q[GB][vec], o[GB][vec], m[GB], s[GB];
        // The lane's `vec` dims of each head's query (0 past the group): one dtype dispatch and
        // one alignment test for all of them, vector loads where aligned (load_runs).
        load_runs(p.q,
                  p.q_dtype,
                  r * p.q_row_stride() + static_cast<std::int64_t>(h * group) * D + tx * vec,
                  D,
                  group,
                  q);
#pragma unroll
        for (int g = 0; g < GB; ++g) {
          m[g] = -INFINITY;
          s[g] = 0.f;
#pragma unroll
          for (int i = 0; i < vec; ++i) {
            o[g][i] = 0.f;
            q[g][i] = g < group ? q[g][i] * q_scale : 0.f;
          }
        }

        const int n_tiles = (t1 - t0 + tile - 1) / tile;
        // The thread's copies: 16-byte chunk `part` of the K and V rows of its `thread_tokens`
        // tokens of every tile (chunk tid + u * threads of the stage, as the lanes read them), each
        // token a lane stream that advances one tile per issue: one page-table entry per token and
        // tile, loaded a tile ahead, and no division. Tiles are issued in order, once each.
        decode_lane_stream ls[cfg::thread_tokens];
#pragma unroll
        for (int i = 0; i < cfg::thread_tokens; ++i)
          ls[i].start(cur, t0 + cfg::token_of(tid, i), tile, t1, cfg::elem_bytes);
        const std::int64_t v_delta = (cur.v_offset - cur.k_offset) * cfg::elem_bytes;
        const int part_bytes       = (tid % cfg::row_chunks) * 16;
        auto load_tile             = [&](int ti) {
          unsigned char* st =
              reinterpret_cast<unsigned char*>(stage_base + (ti % stages) * (2 * tile * D)) +
              part_bytes;
#pragma unroll
          for (int i = 0; i < cfg::thread_tokens; ++i) {
            const bool ok            = ls[i].t < t1;
            const unsigned char* src = ls[i].next(tile, t1) + part_bytes;
            if (!ok) src = ls[i].base;  // any mapped address; the copy reads nothing
            unsigned char* dst = st + cfg::token_of(tid, i) * cfg::row_bytes;
            copy16_async_zfill(dst, src, ok ? 16u : 0u);
            copy16_async_zfill(dst + tile * cfg::row_bytes, src + v_delta, ok ? 16u : 0u);
          }
        };
#pragma unroll
        for (int st = 0; st < stages - 1; ++st) {
          if (st < n_tiles) load_tile(st);
          copy_async_commit();
        }
        for (int ti = 0; ti < n_tiles; ++ti) {
          if (ti + stages - 1 < n_tiles) load_tile(ti + stages - 1);
          copy_async_commit();
          copy_async_wait<stages - 1>(sync_site::decode_tile_wait);
          sync_block(sync_site::decode_tile_ready);
          const T* ks                  = stage_base + (ti % stages) * (2 * tile * D);
          const T* vs                  = ks + tile * D;
          float sc[cfg::per_group][GB] = {};  // (rows g >= group stay unused)
#pragma unroll
          for (int u = 0; u < cfg::per_group; ++u) {
            const int lt  = u * groups + tz;
            const bool ok = t0 + ti * tile + lt < t1;
            float kf[vec];
            load_widen<T, vec>(ks + lt * D + tx * vec, kf);
#pragma unroll
            for (int g = 0; g < GB; ++g) {
              if (g < group) {
                float dot = 0.f;
#pragma unroll
                for (int i = 0; i < vec; ++i) dot = fmaf(q[g][i], kf[i], dot);
#pragma unroll
                for (int off = bdx / 2; off > 0; off /= 2)
                  dot += __shfl_xor_sync(0xffffffffu, dot, off);
                sc[u][g] = ok ? dot : -INFINITY;
              }
            }
          }
#pragma unroll
          for (int g = 0; g < GB; ++g) {
            if (g < group) {
              float mt = m[g];
#pragma unroll
              for (int u = 0; u < cfg::per_group; ++u) mt = fmaxf(mt, sc[u][g]);
              float alpha = exp2_shifted(m[g], mt);  // 0 while m is -inf
              s[g] *= alpha;
#pragma unroll
              for (int i = 0; i < vec; ++i) o[g][i] *= alpha;
#pragma unroll
              for (int u = 0; u < cfg::per_group; ++u) {
                sc[u][g] = exp2_shifted(sc[u][g], mt);
                s[g] += sc[u][g];
              }
              m[g] = mt;
            }
          }
#pragma unroll
          for (int u = 0; u < cfg::per_group; ++u) {
            float vf[vec];
            load_widen<T, vec>(vs + (u * groups + tz) * D + tx * vec, vf);
#pragma unroll
            for (int g = 0; g < GB; ++g)
              if (g < group)
#pragma unroll
                for (int i = 0; i < vec; ++i) o[g][i] = fmaf(sc[u][g], vf[i], o[g][i]);
          }
          __syncthreads();  // the stage is refilled next iteration
        }
        copy_async_wait<0>();
        __syncthreads();

      // Merge the token groups' states (fixed order) and store.
#pragma unroll
        for (int g = 0; g < GB; ++g) {
          if (g < group) {
            if (tx == 0) {
              s_m[tz][g] = m[g];
              s_s[tz][g] = s[g];
            }
#pragma unroll
            for (int i = 0; i < vec; ++i) merge[(tz * GB + g) * D + tx * vec + i] = o[g][i];
          }
        }
        __syncthreads();
        decode_store_piece<D, groups, cfg::threads, Fold>(
            a,
            work,
            r,
            len,
            piece,
            [&](int z, int g) { return s_m[z][g]; },
            [&](int z, int g) { return s_s[z][g]; },
            [&](int z, int g, int x) { return merge[(z * GB + g) * D + x]; });
        __syncthreads();  // shared memory is reused by the next piece
      });
      pre += len;
    }
    decode_finish_merges<cfg::threads, Fold>(a, work);
  };
  if constexpr (Stream) {
    decode_start_walk<cfg::threads>(a, smem);
    for (int head = decode_first_head<true>(a); head >= 0; head = decode_next_head<true>()) {
      serve_head(head);
      __syncthreads();  // the next head's scan reuses shared memory
    }
  } else {
    serve_head(decode_first_head<false>(a));
  }
}

/// Merge of the partials of one (request, KV head); also writes heads that hold no tokens.
/// (A template only so that every translation unit may instantiate it.)
template <class Unused = void>
TANGRAM_KERNEL __launch_bounds__(128) void decode_merge_kernel(decode_args const a) {
  decode_params const& p = a.p;
  const int H = p.kv.num_kv_heads, B = p.kv.batch_size;
  const int r = static_cast<int>(blockIdx.x) / H, h = static_cast<int>(blockIdx.x) % H;
  grid_dependency_launch_dependents();  // (PDL) the next kernel may be scheduled
  grid_dependency_wait();               // (PDL) the split kernel's partials and prefix are visible
  // Stream positions: the head's own (per-head map) or the layer's, whose total is where the
  // last head's prefix ends (layer stream).
  const std::int64_t* pre_h = a.prefix + static_cast<std::int64_t>(h) * (B + 1);
  const std::int64_t pre = pre_h[r], len = pre_h[r + 1] - pre;
  const std::int64_t W =
      p.splits.layer_stream ? a.prefix[static_cast<std::int64_t>(H - 1) * (B + 1) + B] : pre_h[B];
  const std::int64_t share = p.splits.head_ctas(p.layer, h);
  if (len > 0) {  // a request of one piece is written by the split kernel
    const bool single = p.invariant_pieces > 0 ? invariant_piece_count(len, p.invariant_pieces) == 1
                                               : request_ctas(pre, len, share, W).single();
    if (single) return;
  }
  decode_merge_request<128>(a, r, h, pre, len, W, share, p.splits.head_first_cta(p.layer, h));
}

/// The kernels' arguments for validated parameters and a workspace of decode_workspace_bytes(p).
inline decode_args make_decode_args(decode_params const& p, void* workspace) {
  auto const& g = p.kv.geometry;
  auto layout   = decode_workspace(p.splits.num_ctas,
                                 p.kv.num_kv_heads,
                                 p.kv.batch_size,
                                 p.group,
                                 g.head_dim,
                                 p.invariant_pieces);
  auto* base    = static_cast<unsigned char*>(workspace);
  decode_args a;
  a.p           = p;
  a.partial_o   = reinterpret_cast<float*>(base + layout.partial_o);
  a.partial_lse = reinterpret_cast<float*>(base + layout.partial_lse);
  a.prefix      = reinterpret_cast<std::int64_t*>(base + layout.prefix);
  a.scale2      = p.scale() * log2e;
  return a;
}

/// A decode split kernel as launched: its entry point, block size and dynamic shared memory.
struct decode_split_launch {
  void (*kernel)(decode_args) = nullptr;
  int threads                 = 0;
  int smem_bytes              = 0;
};

/**
 * The split kernel a launch of (T, D, GB) runs: the tensor-core kernel where
 * decode_uses_mma<T, GB> and `tensor_cores`, else the CUDA-core one; the folded-merge variant
 * (`Fold`) when `fold` (decode_params::merge_counters is set); the layer-stream variant
 * (`Stream`, a loop over the heads a CTA meets) when `stream` (split_map_view::layer_stream), so
 * that the per-head kernels carry no loop state. The launcher and the occupancy
 * query (decode_device_limits, decode_split_occupancy: the lowest of the four variants') both take
 * the kernels from here, so the plan's CTAs per SM are at most those of the kernel that runs.
 */
template <class T, int D, int GB>
decode_split_launch decode_split_kernel_of(bool tensor_cores, bool fold, bool stream) {
  if constexpr (decode_uses_mma<T, GB>) {
    if (tensor_cores) {
      using cfg = decode_mma_config<T, D>;
      return {fold ? (stream ? decode_mma_kernel<T, D, GB, true, true>
                             : decode_mma_kernel<T, D, GB, true, false>)
                   : (stream ? decode_mma_kernel<T, D, GB, false, true>
                             : decode_mma_kernel<T, D, GB, false, false>),
              cfg::threads,
              cfg::smem_bytes};
    }
  }
  using cfg = decode_config<T, D>;
  return {fold ? (stream ? decode_split_kernel<T, D, GB, true, true>
                         : decode_split_kernel<T, D, GB, true, false>)
               : (stream ? decode_split_kernel<T, D, GB, false, true>
                         : decode_split_kernel<T, D, GB, false, false>),
          cfg::threads,
          cfg::smem_bytes};
}

/// Enqueues the split kernel for (T, D, GB) through the launch policy `launch` (vec.cuh).
template <class T, int D, int GB, class Launch>
void launch_decode_split_with(decode_args const& a, Launch const& launch) {
  const decode_split_launch k = decode_split_kernel_of<T, D, GB>(
      a.p.tensor_cores, a.p.merge_counters != nullptr, a.p.splits.layer_stream);
  launch(k.kernel, dim3(static_cast<unsigned>(a.p.splits.num_ctas)), k.threads, k.smem_bytes, a);
}

/// Enqueues the merge kernel through the launch policy `launch`; nothing with merge_counters (the
/// split kernel merges).
template <class Launch>
void launch_decode_merge_with(decode_args const& a, Launch const& launch) {
  if (a.p.merge_counters != nullptr) return;
  launch(decode_merge_kernel<>,
         dim3(static_cast<unsigned>(a.p.kv.batch_size * a.p.kv.num_kv_heads)),
         128,
         0,
         a);
}

#if !defined(TANGRAM_EMULATION)
/// Launches the split kernel for (T, D, GB) (defined per dtype in kernels/decode_attention_*.cu).
template <class T, int D, int GB>
cudaError_t launch_decode_split(decode_args const& a, cudaStream_t stream) {
  launch_decode_split_with<T, D, GB>(a, stream_launch{stream, a.p.pdl});
  return cudaGetLastError();
}

/// Resident CTAs per SM, on the current device, of the split kernel a launch of (T, D, GB) with
/// `tensor_cores` runs (decode_split_kernel_of): the lowest of its plain and folded-merge variants,
/// each on a per-head map and on a layer stream.
/// The launch bounds cap both variants' registers at the same occupancy, but
/// a variant under the cap may hold more CTAs (sm_90: f32 d 64 / 128 group bucket 4, plain 140
/// registers = 3 CTAs, folded 128 = 4; sm_100: f32 group bucket 1, plain 6, folded 5), and a plan
/// made with the higher figure would run an extra wave of the other variant. With the lower one,
/// a plan made with either query fits both launches.
template <class T, int D, int GB>
cudaError_t decode_split_occupancy(int* ctas_per_sm, bool tensor_cores) {
  int lowest = 0;
  for (int v = 0; v < 4; ++v) {  // plain, folded merge; each per-head and layer-stream
    const decode_split_launch k = decode_split_kernel_of<T, D, GB>(tensor_cores, v & 1, v & 2);
    int ctas                    = 0;
    const cudaError_t err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, k.kernel, k.threads, k.smem_bytes);
    if (err != cudaSuccess) return err;
    lowest = v == 0 || ctas < lowest ? ctas : lowest;
  }
  *ctas_per_sm = lowest;
  return cudaSuccess;
}

// clang-format off
/// Declares (with `extern`) or defines (empty) the explicit instantiations for one storage type:
/// every head dim and query-group bucket of the list in core/kv_shape.hpp.
#define TANGRAM_DECODE_INSTANTIATE_ONE(EXT, T, D, GB)                                                 \
  EXT template cudaError_t launch_decode_split<T, D, GB>(decode_args const&, cudaStream_t);         \
  EXT template cudaError_t decode_split_occupancy<T, D, GB>(int*, bool);
#define TANGRAM_DECODE_INSTANTIATE_DIM(EXT, T, D)                                                     \
  TANGRAM_KV_SHAPE_QUERY_GROUPS(TANGRAM_DECODE_INSTANTIATE_ONE, EXT, T, D)
#define TANGRAM_DECODE_INSTANTIATE(EXT, T)                                                            \
  TANGRAM_KV_SHAPE_HEAD_DIMS(TANGRAM_DECODE_INSTANTIATE_DIM, EXT, T)
// clang-format on
#endif  // !TANGRAM_EMULATION

}  // namespace tangram::detail
