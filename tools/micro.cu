// fp4kit-micro: the GEMM kernels' inner steps timed on their own, with no memory traffic, in SM cycles.
//
// Contract
//   fp4kit-micro [dequant|wgmma|all]     (default: all)
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
//
// Why: the issue slots a step takes tell whether a kernel that streams the weights can hide its compute
// behind the stream (docs/decode-gemm-notes.md, "The dequantisation by part"), and whether the register-A
// wgmma itself limits the prefill kernel (docs/prefill-notes.md).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

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

}  // namespace

int main(int argc, char** argv) {
  const char* what = argc > 1 ? argv[1] : "all";
  const bool all = !strcmp(what, "all");
  if (!all && strcmp(what, "dequant") && strcmp(what, "wgmma")) {
    fprintf(stderr, "fp4kit-micro: the argument is dequant, wgmma or all (got '%s')\n", what);
    return 2;
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    fprintf(stderr, "fp4kit-micro: no CUDA device\n");
    return 1;
  }
  if (all || !strcmp(what, "dequant")) run_dequant();
  if (all || !strcmp(what, "wgmma")) run_wgmma();
  return 0;
}
