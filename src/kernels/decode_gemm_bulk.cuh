// decode_gemm_bulk.cuh: the decode GEMM with the weight stream in a shared-memory ring (sm_90).
//
// Contract
//   Exactly decode_gemm_kernel's (decode_gemm.cuh): same DecodeParams, prepacked layout, stream-K split,
//   deterministic fixup, epilogue and grouped (MoE) mode; only how the weights reach the registers differs.
//   Launch with (WARPS + 1) * 32 threads and bulk_smem_bytes(WARPS, RW, S, NT) bytes of dynamic shared
//   memory. The kernel body exists for sm_90 only; the dispatcher never picks it elsewhere.
//
// Why it is shaped this way
//   The register-ring kernel issues its loads from the same warps that dequantise: a warp's next loads
//   wait for its current compute, each segment starts with an empty pipeline (one DRAM round trip before the
//   first MMA), and the stream-K fixup at a segment's end stops the CTA's stream altogether. Fitting its
//   times (docs/decode-gemm-notes.md) gave ~11 us of fixed cost per call against cuBLAS's ~6.
//   - Here one producer lane streams whole K slices (each row tile's 8 chunks, 4 KB, are contiguous in the
//     prepacked layout: one cp.async.bulk per row tile, plus one for its scale record) into S ring
//     stages, completing on an mbarrier with a byte count. It follows the CTA's segments in order and runs
//     up to S slices ahead of the consumers, through segment boundaries and fixups, so the CTA's share of
//     HBM bandwidth never idles while the consumers finish a segment.
//   - Consumer warps read their 512-byte records with one 16-byte shared load per lane (consecutive lanes,
//     consecutive 16 bytes: conflict-free), then run the decode kernel's dequantisation and MMAs unchanged.
//     A warp releases a stage with one arrive on the stage's "empty" barrier.
//   - Two accumulator sets (even and odd halves of a slice) halve the chain of dependent MMAs per warp:
//     with 8 (not 24) consumer warps per SM the MMA latency is no longer hidden by other warps alone.
//   - X staging (cp.async, one slice ahead) and the fixup are the decode kernel's, over a named barrier of
//     the consumer warps only (the producer never joins a barrier after the ring is set up).
#pragma once
#include "kernels/decode_gemm.cuh"

namespace fp4kit {
namespace kernels {

// Bytes of one ring stage: per row tile, 8 chunks x 512 B of records, then 32 lanes x 16 B of scale record
// (NVFP4; MXFP4 uses half of it).
constexpr int kBulkTileBytes = layout::kChunksPerMacro * 512;
constexpr int kBulkScaleBytes = 32 * 16;
__host__ __device__ constexpr int bulk_stage_bytes(int warps, int rw) { return warps * rw * (kBulkTileBytes + kBulkScaleBytes); }
// Dynamic shared memory of a launch: the ring, then the two X slice buffers.
__host__ __device__ constexpr int bulk_smem_bytes(int warps, int rw, int stages, int n_tiles) {
  return stages * bulk_stage_bytes(warps, rw) + x_stage_bytes_for(n_tiles);
}

// ---- mbarrier and bulk-copy wrappers (sm_90) -----------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// Wait until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      " .reg .pred done;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// Global -> shared bulk copy completing `bytes` on `bar`; L2 evict-first (the weights are read once).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t pol) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(pol)
      : "memory");
}
__device__ __forceinline__ uint4 lds128(const void* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(smem_addr(p)) : "memory");
  return v;
}
__device__ __forceinline__ uint2 lds64(const void* p) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(smem_addr(p)) : "memory");
  return v;
}
template <int kThreads> __device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory");
}

template <Format F, typename T, int NT, int RW, int WARPS, int MINB, int CH, int S, bool kGrouped = false>
__global__ void __launch_bounds__((WARPS + 1) * 32, MINB) decode_gemm_bulk_kernel(const DecodeParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(layout::kChunksPerMacro % CH == 0, "a compute step must not straddle two K slices");
  constexpr int kTiles = WARPS * RW;                   // row tiles per row group
  constexpr int kSB = F == Format::kNVFP4 ? 16 : 8;    // scale bytes per lane
  constexpr int kStage = bulk_stage_bytes(WARPS, RW);
  constexpr int kScaleOff = kTiles * kBulkTileBytes;   // scale records after the weights in a stage
  constexpr int kConsumers = WARPS * 32;
  constexpr int kXBuf = 8 * NT * kXRowElems;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  __shared__ uint64_t full[S], empty[S];
  __shared__ int s_last;
  extern __shared__ __align__(128) uint8_t bulk_smem[];
  uint8_t* ring = bulk_smem;                                    // [S][kStage]
  T* x_smem = reinterpret_cast<T*>(bulk_smem + S * kStage);     // [2][8*NT][kXRowElems]

  int64_t units, G, u_begin, u_end;
  if (!cta_range<kGrouped>(p, units, G, u_begin, u_end)) return;
  const int64_t b = blockIdx.x;
  const int first_rg = int(u_begin / p.k_macros);

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 1);          // the producer's arrive (+ the copies' bytes)
      mbar_init(&empty[s], WARPS);     // one arrive per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == WARPS) {
    // Producer: one lane walks the CTA's segments slice by slice and fills the ring.
    if (lane != 0) return;
    const uint64_t pol = evict_first_policy();
    int it = 0;
    for (int64_t u = u_begin; u < u_end;) {
      int rg, j0, j1, lrg;
      next_segment(u, u_end, p.k_macros, rg, j0, j1);
      DecodeParams q;
      segment_problem<T, kGrouped>(p, rg, q, lrg);
      const int rt0 = lrg * kTiles;
      const int tiles = max(0, min(kTiles, q.row_tiles - rt0));  // the last row group may be partial
      for (int j = j0; j < j1; ++j, ++it) {
        const int s = it % S;
        mbar_wait(&empty[s], ((it / S) & 1) ^ 1);  // a fresh barrier passes parity 1 at once
        uint8_t* st = ring + s * kStage;
        const int c0 = j * layout::kChunksPerMacro;
        const int nch = min(layout::kChunksPerMacro, q.k_chunks - c0);
        mbar_expect_tx(&full[s], uint32_t(tiles * (nch * 512 + 32 * kSB)));
        for (int i = 0; i < tiles; ++i) {
          const int64_t rt = rt0 + i;
          bulk_load(st + i * kBulkTileBytes, q.weights + (rt * q.k_chunks + c0) * 32, uint32_t(nch * 512), &full[s], pol);
          bulk_load(st + kScaleOff + i * 32 * kSB, q.scales + (rt * q.k_macros + j) * 32 * kSB, 32 * kSB, &full[s], pol);
        }
      }
    }
    return;
  }

  // Consumers: X and the workspace may come from the previous kernel (the producer streams weights only).
  griddep_wait();
  int it = 0;
  for (int64_t u = u_begin; u < u_end;) {
    int rg, j0, j1, lrg;
    next_segment(u, u_end, p.k_macros, rg, j0, j1);
    DecodeParams q;
    segment_problem<T, kGrouped>(p, rg, q, lrg);

    int rt[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) rt[r] = (lrg * WARPS + warp) * RW + r;
    float acc[2][RW][NT][4];
    zero_acc(acc[0]);
    zero_acc(acc[1]);

    const int c_end = min(j1 * layout::kChunksPerMacro, p.k_chunks);
    consumer_sync<kConsumers>();  // the previous segment's last slice is no longer read from either X buffer
    stage_x<T, NT>(x_smem + (j0 & 1) * kXBuf, q, j0, threadIdx.x, kConsumers);
    for (int j = j0; j < j1; ++j, ++it) {
      cp_async_wait_all();
      consumer_sync<kConsumers>();  // slice j's X is visible; every warp is done with slice j-1's buffer
      if (j + 1 < j1) stage_x<T, NT>(x_smem + ((j + 1) & 1) * kXBuf, q, j + 1, threadIdx.x, kConsumers);
      const int s = it % S;
      mbar_wait(&full[s], (it / S) & 1);
      const uint8_t* st = ring + s * kStage;
      Scales<F, T> sc[RW];
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        const bool ok = rt[r] < q.row_tiles;  // rows past the matrix: stale shared memory, never read
        const uint8_t* src = st + kScaleOff + ((warp * RW + r) * 32 + lane) * kSB;
        if constexpr (F == Format::kNVFP4) sc[r].decode(ok ? lds128(src) : make_uint4(0, 0, 0, 0));
        else sc[r].decode(ok ? lds64(src) : make_uint2(0, 0));
      }
      const T* xs = x_smem + (j & 1) * kXBuf;
      const int c0 = j * layout::kChunksPerMacro;
#pragma unroll
      for (int h = 0; h < layout::kChunksPerMacro / CH; ++h) {
        const int cs = c0 + h * CH;
        if (cs >= c_end) break;
        Stage<RW, CH> w;
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          const bool ok = rt[r] < q.row_tiles;
#pragma unroll
          for (int i = 0; i < CH; ++i)
            w.w[r][i] = ok ? lds128(st + (warp * RW + r) * kBulkTileBytes + (h * CH + i) * 512 + lane * 16)
                           : make_uint4(0, 0, 0, 0);
        }
        compute_stage<F, T, NT, RW, CH, true>(w, sc, xs, q, cs, c_end, g, t, acc[h & 1]);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);  // this warp no longer reads stage s
    }
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][r][nt][e] += acc[1][r][nt][e];

    if (j0 == 0 && j1 == p.k_macros) {  // the whole K: finish here
      epilogue<T, NT, RW>(q, rt, g, t, acc[0]);
      continue;
    }
    finish_split<T, NT, RW, WARPS>(p, q, b, G, units, rg, first_rg, rt, g, t, acc[0], &s_last,
                                   [] { consumer_sync<kConsumers>(); });
  }
#endif
}

}  // namespace kernels
}  // namespace fp4kit
