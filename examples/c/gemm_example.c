/* gemm_example.c: fp4kit from C, end to end (NVFP4 weights, BF16 activations).
 *
 * Contract
 *   What:    builds random W [n, k] and X [m, k] (fp32, fixed seed), quantizes W to NVFP4 on the CPU
 *            (fp4kit_quantize_cpu), dequantizes it again (fp4kit_dequantize_cpu) and computes the reference
 *            Y_ref = bf16(X) * Wq^T in double. Then on the GPU: prepacks W (fp4kit_prepack) and runs
 *            fp4kit_gemm with BF16 X and Y; compares rel-L2(Y, Y_ref) < 1e-2.
 *   Layouts: row-major X [m, k] and Y [m, n]; W [n, k] (rows = output channels); checkpoint layout
 *            packed uint8 [n, k/2], scales uint8 [n, k/16] (E4M3), one fp32 tensor scale.
 *   Limits:  k % 16 == 0 (the NVFP4 group); any n >= 1, m >= 1.
 *   Command: gemm_example [m n k]        (default: 16 200 2880)
 *   Exit:    0 PASS; 1 FAIL or error (fp4kit_last_error() / the CUDA error is printed);
 *            77 "SKIPPED: no CUDA device" (the code ctest and automake treat as skipped).
 */
#include <fp4kit/fp4kit.h>

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every call is checked; on failure print where and why, then leave through `fail` (frees everything). */
#define CHECK_FP4(call)                                                                              \
  do {                                                                                               \
    int rc_ = (call);                                                                                \
    if (rc_ != 0) {                                                                                  \
      fprintf(stderr, "%s:%d: %s failed (status %d): %s\n", __FILE__, __LINE__, #call, rc_,         \
              fp4kit_last_error());                                                                  \
      goto fail;                                                                                     \
    }                                                                                                \
  } while (0)
#define CHECK_CUDA(call)                                                                             \
  do {                                                                                               \
    cudaError_t e_ = (call);                                                                         \
    if (e_ != cudaSuccess) {                                                                         \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      goto fail;                                                                                     \
    }                                                                                                \
  } while (0)
#define CHECK_ALLOC(p)                                                                               \
  do {                                                                                               \
    if (!(p)) {                                                                                      \
      fprintf(stderr, "%s:%d: out of host memory\n", __FILE__, __LINE__);                            \
      goto fail;                                                                                     \
    }                                                                                                \
  } while (0)

/* fp32 -> bf16 bits, round to nearest even (NaN stays a quiet NaN). */
static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* xorshift64*: a fixed, portable stream of uniform floats in [-1, 1). */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float uniform(void) {
  g_rng ^= g_rng >> 12, g_rng ^= g_rng << 25, g_rng ^= g_rng >> 27;
  return (float)((g_rng * 0x2545F4914F6CDD1Dull) >> 40) / 8388608.0f - 1.0f;
}

int main(int argc, char** argv) {
  long long m = 16, n = 200, k = 2880;
  if (argc == 4) {
    m = atoll(argv[1]), n = atoll(argv[2]), k = atoll(argv[3]);
  } else if (argc != 1) {
    fprintf(stderr, "usage: %s [m n k]   (k %% 16 == 0)\n", argv[0]);
    return 1;
  }
  if (m < 1 || n < 1 || k < 16 || k % 16 != 0) {
    fprintf(stderr, "bad shape m=%lld n=%lld k=%lld: need m, n >= 1 and k a positive multiple of 16\n", m, n, k);
    return 1;
  }

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("SKIPPED: no CUDA device\n");
    return 77;
  }

  int status = 1;
  const size_t mk = (size_t)(m * k), nk = (size_t)(n * k), mn = (size_t)(m * n);
  float *w = NULL, *wq = NULL, *x = NULL, tensor_scale = 0.0f;
  uint8_t *packed = NULL, *scales = NULL;
  uint16_t *xb = NULL, *yb = NULL;
  void *d_packed = NULL, *d_scales = NULL, *d_ts = NULL, *d_w = NULL, *d_x = NULL, *d_y = NULL, *d_ws = NULL;
  size_t w_bytes = 0, ws_bytes = 0;

  w = malloc(nk * sizeof *w), wq = malloc(nk * sizeof *wq), x = malloc(mk * sizeof *x);
  packed = malloc(nk / 2), scales = malloc(nk / 16);
  xb = malloc(mk * sizeof *xb), yb = malloc(mn * sizeof *yb);
  CHECK_ALLOC(w && wq && x && packed && scales && xb && yb);
  for (size_t i = 0; i < nk; ++i) w[i] = uniform();
  for (size_t i = 0; i < mk; ++i) {
    xb[i] = f32_to_bf16(uniform());
    x[i] = bf16_to_f32(xb[i]); /* the reference sees exactly what the GPU sees */
  }

  /* 1. Quantize on the CPU, and dequantize for the reference. */
  CHECK_FP4(fp4kit_quantize_cpu(FP4KIT_NVFP4, w, FP4KIT_F32, n, k, packed, scales, &tensor_scale));
  CHECK_FP4(fp4kit_dequantize_cpu(FP4KIT_NVFP4, packed, scales, tensor_scale, n, k, wq));

  /* 2. Upload the checkpoint layout and prepack it into the kernel layout (once per weight). */
  CHECK_FP4(fp4kit_packed_bytes(FP4KIT_NVFP4, n, k, &w_bytes));
  CHECK_CUDA(cudaMalloc(&d_packed, nk / 2));
  CHECK_CUDA(cudaMalloc(&d_scales, nk / 16));
  CHECK_CUDA(cudaMalloc(&d_ts, sizeof(float)));
  CHECK_CUDA(cudaMalloc(&d_w, w_bytes));
  CHECK_CUDA(cudaMemcpy(d_packed, packed, nk / 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_scales, scales, nk / 16, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_ts, &tensor_scale, sizeof(float), cudaMemcpyHostToDevice));
  CHECK_FP4(fp4kit_prepack(FP4KIT_NVFP4, n, k, d_packed, d_scales, d_ts, d_w, NULL));

  /* 3. GEMM: workspace zero-filled once, output poisoned with NaN (0xFFFF) so that a missed element shows. */
  CHECK_FP4(fp4kit_gemm_workspace_bytes(m, FP4KIT_NVFP4, n, k, FP4KIT_BF16, &ws_bytes));
  if (ws_bytes) {
    CHECK_CUDA(cudaMalloc(&d_ws, ws_bytes));
    CHECK_CUDA(cudaMemset(d_ws, 0, ws_bytes));
  }
  CHECK_CUDA(cudaMalloc(&d_x, mk * 2));
  CHECK_CUDA(cudaMalloc(&d_y, mn * 2));
  CHECK_CUDA(cudaMemcpy(d_x, xb, mk * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(d_y, 0xFF, mn * 2));
  CHECK_FP4(fp4kit_gemm(m, FP4KIT_BF16, d_x, FP4KIT_NVFP4, n, k, d_w, NULL, d_y, d_ws, ws_bytes, NULL));
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaMemcpy(yb, d_y, mn * 2, cudaMemcpyDeviceToHost)); /* synchronises the legacy stream */

  /* 4. Compare with the double-precision reference. */
  {
    double num = 0.0, den = 0.0;
    long long bad = 0;
    for (long long i = 0; i < m; ++i)
      for (long long j = 0; j < n; ++j) {
        double ref = 0.0;
        for (long long t = 0; t < k; ++t) ref += (double)x[i * k + t] * (double)wq[j * k + t];
        const double got = bf16_to_f32(yb[i * n + j]);
        if (!isfinite(got)) ++bad;
        num += (got - ref) * (got - ref), den += ref * ref;
      }
    const double rel = den > 0.0 ? sqrt(num / den) : sqrt(num);
    const int pass = bad == 0 && rel < 1e-2;
    printf("fp4kit %s  NVFP4 x BF16  m=%lld n=%lld k=%lld  rel-L2 %.3e  non-finite %lld  %s\n", fp4kit_version(), m,
           n, k, rel, bad, pass ? "PASS" : "FAIL");
    status = pass ? 0 : 1;
  }

fail:
  cudaFree(d_packed), cudaFree(d_scales), cudaFree(d_ts), cudaFree(d_w);
  cudaFree(d_x), cudaFree(d_y), cudaFree(d_ws);
  free(w), free(wq), free(x), free(packed), free(scales), free(xb), free(yb);
  return status;
}
