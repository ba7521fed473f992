// fp4kit-micro: the GEMM kernels' inner steps timed on their own (compute steps with no memory traffic, and the
// prefill kernel's weight copies with no compute), in SM cycles or TB/s.
//
// Contract
//   fp4kit-micro [dequant|wgmma|wstream|all]     (default: all)
//   dequant: the decode kernel's step per 32-bit word of codes (decode_gemm.cuh compute_stage, with its own
//            Act<bf16>::pair, mul2 and mma: four pairs, four bf16x2 scale multiplies, one mma.m16n8k16),
//            and the same step with parts left out, at 2 / 4 / 6 / 8 warps per scheduler (8-warp CTAs,
//            1-4 per SM). Records come from a 4-entry shared-memory ring (random bits), so nothing is
//            loop-invariant; prints cycles per warp and word on one scheduler (the average over CTAs of
//            clock64 around the loop).
//   wgmma:   the prefill kernel's register-A wgmma (m64nNk16, BF16, B from a 128-byte-swizzled tile, one
//            group of four k16 steps committed per iteration, wait_group 1 as its main loop does), by N and
//            warpgroups per SM; prints MAC per clock per SM against the dense peak of 2048. sm_90a only.
//   One CTA grid of 132 x CTAs-per-SM; results go to device memory so that nothing is dead code.
//   wstream: the prefill kernel's weight stream alone (sm_90a): one producer thread per CTA copies the
//            prepacked records of 8 row tiles (a 128-row block) by TMA boxes of {256 B, P pieces, 8 row
//            tiles} into a ring of shared-memory slots with full/empty mbarriers, as the kernel's producer
//            does, and 8 consumer warps only wait for each slot and hand it back. The run per row tile and
//            copy is P x 256 B (1, 2 or 4 KB; the kernel copies 1 KB), the ring holds the same bytes
//            for each run (64 KB per CTA), two CTAs per SM, one CTA per 128-row block of a
//            Llama-3.3-70B gate_up weight (57344 x 8192, 235 MB of codes) over 4 rotating copies;
//            prints TB/s (CUDA events, median of 20 launches) beside a plain 16-byte-load read of the
//            same bytes.
//
// Why: the issue slots a step takes tell whether a kernel that streams the weights can hide its compute
// behind the stream (docs/decode-gemm-notes.md, "The dequantisation by part"), and whether the register-A
// wgmma itself limits the prefill kernel (docs/prefill-notes.md).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/decode_gemm.cuh"
#include "kernels/prefill_gemm_sm90.cuh"

namespace {

constexpr int kSms = 132, kThreads = 256, kRing = 4, kIters = 4096;

// The decode kernel's own pieces (decode_gemm.cuh): pair extraction, the bf16x2 scale multiply, the mma.
using Bf16 = fp4kit::kernels::Act<__nv_bfloat16>;

// Only the variants need these: an accumulating bf16x2 FMA (the "no mma" stand-in) and an mma with a zero
// accumulator (the scale applied after it).
__device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm volatile("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ void mma_zero_c(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// The variants of the decode step (per word).
enum Step { kFull, kNoScale, kScaleAfterMma, kNoMma, kIntOnly, kSteps };
const char* const kStepNames[kSteps] = {"full (pairs, scale, mma)", "no scale multiply",
                                        "scale after the mma (fp32)", "no mma", "pairs only"};

template <int V>
__global__ void __launch_bounds__(kThreads, 4) dequant_kernel(const uint4* recs, float* out, long long* cyc) {
  __shared__ uint4 ring[kRing][kThreads];
  for (int j = 0; j < kRing; ++j) ring[j][threadIdx.x] = recs[(blockIdx.x * kRing + j) * kThreads + threadIdx.x];
  __syncthreads();
  const uint32_t sc = 0x3f803f80u ^ (threadIdx.x & 1), b0 = 0x3f803f80u + threadIdx.x, b1 = b0 ^ 0x10001u;
  float acc[4] = {0, 0, 0, 0};
  uint32_t x[4] = {0, 0, 0, 0};
  const long long t0 = clock64();
  for (int i = 0; i < kIters; ++i) {
    const uint4 r = ring[i % kRing][threadIdx.x];
    const uint32_t q[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t a[4] = {Bf16::pair<0>(q[s]), Bf16::pair<1>(q[s]), Bf16::pair<2>(q[s]), Bf16::pair<3>(q[s])};
      if (V == kFull || V == kNoMma)
#pragma unroll
        for (int p = 0; p < 4; ++p) a[p] = Bf16::mul2(a[p], sc);
      if (V == kFull || V == kNoScale) Bf16::mma(acc, a, b0, b1);
      if (V == kScaleAfterMma) {
        float d[4];
        mma_zero_c(d, a, b0, b1);
#pragma unroll
        for (int p = 0; p < 4; ++p) acc[p] = fmaf(__uint_as_float(sc), d[p], acc[p]);
      }
      if (V == kNoMma)
#pragma unroll
        for (int p = 0; p < 4; ++p) x[p] = fma2(a[p], b0, x[p]);
      if (V == kIntOnly)
#pragma unroll
        for (int p = 0; p < 4; ++p) x[p] ^= a[p];
    }
  }
  const long long t1 = clock64();
  if (threadIdx.x == 0) cyc[blockIdx.x] = t1 - t0;
  out[blockIdx.x * kThreads + threadIdx.x] =
      acc[0] + acc[1] + acc[2] + acc[3] + __uint_as_float(x[0] ^ x[1] ^ x[2] ^ x[3]);
}

double mean_cycles(const long long* d_cyc, int blocks) {
  std::vector<long long> c(blocks);
  cudaMemcpy(c.data(), d_cyc, blocks * sizeof(long long), cudaMemcpyDeviceToHost);
  double m = 0;
  for (long long v : c) m += double(v);
  return m / blocks;
}

template <int V> double time_dequant(const uint4* recs, float* out, long long* cyc, int per_sm) {
  const int blocks = kSms * per_sm;
  for (int rep = 0; rep < 2; ++rep) dequant_kernel<V><<<blocks, kThreads>>>(recs, out, cyc);
  cudaDeviceSynchronize();
  // warp-words per scheduler: per_sm CTAs x 8 warps over 4 schedulers, kIters records of 4 words each
  return mean_cycles(cyc, blocks) / (double(per_sm) * (kThreads / 32) / 4 * kIters * 4);
}

void run_dequant() {
  const int max_per_sm = 4;
  const size_t n = size_t(kSms) * max_per_sm * kRing * kThreads;
  std::vector<uint32_t> h(n * 4);
  uint32_t s = 1;
  for (uint32_t& v : h) v = s = s * 1664525u + 1013904223u;
  uint4* recs;
  float* out;
  long long* cyc;
  cudaMalloc(&recs, n * sizeof(uint4));
  cudaMalloc(&out, size_t(kSms) * max_per_sm * kThreads * sizeof(float));
  cudaMalloc(&cyc, size_t(kSms) * max_per_sm * sizeof(long long));
  cudaMemcpy(recs, h.data(), n * sizeof(uint4), cudaMemcpyHostToDevice);
  printf("decode step, cycles per warp and 32-bit word on one scheduler\n%-28s", "warps per scheduler:");
  for (int per_sm = 1; per_sm <= max_per_sm; ++per_sm) printf("%8d", 2 * per_sm);
  printf("\n");
  double (*const fns[kSteps])(const uint4*, float*, long long*, int) = {
      time_dequant<kFull>, time_dequant<kNoScale>, time_dequant<kScaleAfterMma>, time_dequant<kNoMma>,
      time_dequant<kIntOnly>};
  for (int v = 0; v < kSteps; ++v) {
    printf("%-28s", kStepNames[v]);
    for (int per_sm = 1; per_sm <= max_per_sm; ++per_sm) printf("%8.2f", fns[v](recs, out, cyc, per_sm));
    printf("\n");
  }
  printf("(%s)\n", cudaGetErrorString(cudaGetLastError()));
  cudaFree(recs);
  cudaFree(out);
  cudaFree(cyc);
}

// ---- register-A wgmma rate (sm_90a) ------------------------------------------------------------------
namespace pk = fp4kit::kernels::prefill;
constexpr int kWgmmaIters = 2000, kTileBytes = 32768;

template <int N, int WG>
__global__ void __launch_bounds__(128 * WG, 1) wgmma_kernel(long long* cyc, float* out) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t tile[];
  for (int i = threadIdx.x; i < kTileBytes / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(tile)[i] = 0x3c003c00u ^ ((i * 2654435761u) & 0x00ff00ffu);
  __syncthreads();
  const uint64_t desc = pk::sw128_desc((pk::smem_u32(tile) + 1023u) & ~1023u);
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
  uint32_t a[4][4];
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int j = 0; j < 4; ++j) a[s][j] = 0x3f803f80u ^ (threadIdx.x * 77u + s * 4 + j);
  const long long t0 = clock64();
  for (int it = 0; it < kWgmmaIters; ++it) {
    pk::fence_frag(a);
    pk::fence_acc(acc);
    pk::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) pk::Wgmma<__nv_bfloat16, N>::mma(acc, a[ks], desc + ((ks * 32) >> 4));
    pk::wgmma_commit();
    pk::fence_acc(acc);
    pk::wgmma_wait<1>();
  }
  pk::wgmma_wait<0>();
  pk::fence_acc(acc);
  const long long t1 = clock64();
  if (threadIdx.x == 0) cyc[blockIdx.x] = t1 - t0;
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) sum += acc[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
#else
  if (threadIdx.x == 0) cyc[blockIdx.x] = 0;
#endif
}

template <int N, int WG> void time_wgmma(long long* cyc, float* out) {
  const int smem = kTileBytes + 1024;
  cudaFuncSetAttribute(wgmma_kernel<N, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  for (int rep = 0; rep < 2; ++rep) wgmma_kernel<N, WG><<<kSms, 128 * WG, smem>>>(cyc, out);
  cudaDeviceSynchronize();
  const double cycles = mean_cycles(cyc, kSms);
  const double macs = double(WG) * kWgmmaIters * 4 * 64.0 * N * 16;  // per SM
  printf("m64n%-3dk16, %d warpgroup(s) per SM: %6.0f MAC per clock per SM (%3.0f%% of 2048)  (%s)\n", N, WG,
         cycles > 0 ? macs / cycles : 0.0, cycles > 0 ? 100 * macs / cycles / 2048 : 0.0,
         cudaGetErrorString(cudaGetLastError()));
}

void run_wgmma() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major != 9 || minor != 0) {
    printf("wgmma: skipped (needs sm_90; this device is sm_%d%d)\n", major, minor);
    return;
  }
  long long* cyc;
  float* out;
  cudaMalloc(&cyc, kSms * sizeof(long long));
  cudaMalloc(&out, kSms * 512 * sizeof(float));
  printf("register-A wgmma (BF16, fp32 accumulators)\n");
  time_wgmma<16, 4>(cyc, out);
  time_wgmma<32, 4>(cyc, out);
  time_wgmma<64, 1>(cyc, out);
  time_wgmma<64, 2>(cyc, out);
  time_wgmma<64, 4>(cyc, out);
  time_wgmma<128, 2>(cyc, out);
  time_wgmma<256, 2>(cyc, out);
  cudaFree(cyc);
  cudaFree(out);
}

// ---- wstream ------------------------------------------------------------------------------------------
constexpr int kWsRowTiles = 57344 / 16, kWsChunks = 8192 / 64;  // gate_up: row tiles, 64-K chunks per tile
constexpr size_t kWsTileBytes = size_t(kWsChunks) * 512, kWsBytes = kWsTileBytes * kWsRowTiles;
constexpr int kWsRingBytes = 64 * 1024, kWsCopies = 4;

// P pieces of 256 B per row tile and copy; S = ring slots of 8 row tiles x P x 256 B.
template <int P>
__global__ void __launch_bounds__(288, 2) wstream_kernel(const __grid_constant__ CUtensorMap map, int* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kSlot = 8 * P * 256, S = kWsRingBytes / kSlot, kSteps = 2 * kWsChunks / P;
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[S], empty[S];
  const uint32_t ring = (pk::smem_u32(smem) + 1023u) & ~1023u;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int i = 0; i < S; ++i) {
      pk::mbar_init(pk::smem_u32(&full[i]), 1);
      pk::mbar_init(pk::smem_u32(&empty[i]), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  const int rt0 = blockIdx.x * 8;
  if (warp == 8) {  // the producer
    if (lane != 0) return;
    for (int s = 0; s < kSteps; ++s) {
      const int slot = s % S;
      if (s >= S) pk::mbar_wait(pk::smem_u32(&empty[slot]), ((s / S) & 1) ^ 1);
      const uint32_t bar = pk::smem_u32(&full[slot]);
      pk::mbar_arrive_expect_tx(bar, kSlot);
      pk::tma_load_w(ring + slot * kSlot, &map, s * P, rt0, 0, bar);
    }
    return;
  }
  int acc = 0;
  for (int s = 0; s < kSteps; ++s) {  // each consumer warp reads one word of its row tile, then frees the slot
    const int slot = s % S;
    pk::mbar_wait(pk::smem_u32(&full[slot]), (s / S) & 1);
    acc ^= int(pk::lds128(ring + slot * kSlot + warp * P * 256 + lane * 16).x);
    __syncwarp();
    if (lane == 0) pk::mbar_arrive(pk::smem_u32(&empty[slot]));
  }
  if (acc == 0x12345678) out[blockIdx.x] = acc;
#endif
}

__global__ void plain_read_kernel(const uint4* w, size_t n16, int* out) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n16; i += size_t(gridDim.x) * blockDim.x) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(w + i));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[blockIdx.x] = int(acc);
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The prefill kernel's weight map (prefill.cu w_tensor_map) with a box of P pieces per row tile.
bool ws_map(EncodeTiled enc, void* base, int P, CUtensorMap* map) {
  const cuuint64_t dims[4] = {256, cuuint64_t(2 * kWsChunks), cuuint64_t(kWsRowTiles), 1};
  const cuuint64_t strides[3] = {256, kWsTileBytes, kWsBytes};
  const cuuint32_t box[4] = {256, cuuint32_t(P), 8, 1}, es[4] = {1, 1, 1, 1};
  return enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) ==
         CUDA_SUCCESS;
}

template <typename Launch> double median_tbps(Launch launch) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int it = 0; it < 24; ++it) {
    cudaEventRecord(a);
    launch(it % kWsCopies);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    if (it >= 4) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(kWsBytes) / (ms[ms.size() / 2] * 1e-3) / 1e12;
}

template <int P> void time_wstream(EncodeTiled enc, const std::vector<uint8_t*>& bufs, int* out) {
  std::vector<CUtensorMap> maps(bufs.size());
  for (size_t i = 0; i < bufs.size(); ++i)
    if (!ws_map(enc, bufs[i], P, &maps[i])) {
      printf("wstream: cuTensorMapEncodeTiled failed (P = %d)\n", P);
      return;
    }
  const int smem = kWsRingBytes + 1024;
  cudaFuncSetAttribute(wstream_kernel<P>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const double tbps = median_tbps([&](int c) { wstream_kernel<P><<<kWsRowTiles / 8, 288, smem>>>(maps[size_t(c)], out); });
  printf("TMA boxes of %d KB per row tile (%2d slots of %2d KB): %5.2f TB/s  (%s)\n", P / 4, kWsRingBytes / (8 * P * 256),
         8 * P / 4, tbps, cudaGetErrorString(cudaGetLastError()));
}

void run_wstream() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (major != 9) {
    printf("wstream: skipped (needs sm_90)\n");
    return;
  }
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || !fn) {
    printf("wstream: no cuTensorMapEncodeTiled\n");
    return;
  }
  std::vector<uint8_t*> bufs(kWsCopies);
  for (auto& b : bufs) {
    cudaMalloc(&b, kWsBytes);
    cudaMemset(b, 0x5a, kWsBytes);
  }
  int* out;
  cudaMalloc(&out, 8192 * sizeof(int));
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  printf("weight stream of a 57344 x 8192 weight's codes (%.0f MB), %d CTAs of one 128-row block each\n",
         kWsBytes / 1e6, kWsRowTiles / 8);
  const double plain = median_tbps([&](int c) {
    plain_read_kernel<<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(bufs[size_t(c)]), kWsBytes / 16, out);
  });
  printf("plain 16-byte loads, whole buffer:                 %5.2f TB/s\n", plain);
  const auto enc = reinterpret_cast<EncodeTiled>(fn);
  time_wstream<4>(enc, bufs, out);
  time_wstream<8>(enc, bufs, out);
  time_wstream<16>(enc, bufs, out);
  for (auto b : bufs) cudaFree(b);
  cudaFree(out);
}

}  // namespace

int main(int argc, char** argv) {
  const char* what = argc > 1 ? argv[1] : "all";
  const bool all = !strcmp(what, "all");
  if (!all && strcmp(what, "dequant") && strcmp(what, "wgmma") && strcmp(what, "wstream")) {
    fprintf(stderr, "fp4kit-micro: the argument is dequant, wgmma, wstream or all (got '%s')\n", what);
    return 2;
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    fprintf(stderr, "fp4kit-micro: no CUDA device\n");
    return 1;
  }
  if (all || !strcmp(what, "dequant")) run_dequant();
  if (all || !strcmp(what, "wgmma")) run_wgmma();
  if (all || !strcmp(what, "wstream")) run_wstream();
  return 0;
}
