// lane_order.cuh: copy rows of X into lane order, the K order the prefill kernel reads (decode_layout.h,
// layout::natural_pair).
//
// Contract
//   dst row r (k_pad elements of 2 bytes, 16-byte aligned) = src row map[r] (k elements; map null: row r)
//   with its 2-element pairs permuted: dst pair q = src pair natural_pair(f, q), zero where that pair is
//   past k (natural: no permutation, dst pair q = src pair q: a plain row gather, k_pad = k, for the
//   mma.sync kernel, which reads X in natural order). Rows r < rows, where rows = *n_rows when n_rows is given (written by an earlier kernel: the
//   MoE's align), else `rows`. Grid (x, y) (row_vector_grid): thread i of CTA (x, y) writes vector
//   y * blockDim.x + i of rows x, x + gridDim.x, ...; the grid's y must cover k_pad / 8 vectors. Under
//   programmatic dependent launch it waits for the previous kernel before reading anything.
//
// Why: the prefill kernel's lanes then dequantise only their own weight records (prefill_gemm_sm90.cuh).
// The permutation moves 4-byte pairs inside 64-K chunks (NVFP4) or 128-K blocks (MXFP4), finer than a
// TMA box can gather, so it is a pass over X: 2 m k_pad bytes written, 2 m k read, each destination
// vector's four pairs read as four 4-byte loads from one 128-256 byte stretch of the source row. A thread
// keeps one vector position over its rows: no per-vector 64-bit index division (which, with one 16-byte
// vector per thread of a flat grid-stride loop, ran the MoE's gather at ~45% of the HBM bandwidth).
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/decode_gemm.cuh"  // griddep_*, layout::natural_pair

namespace fp4kit {
namespace kernels {

// late_trigger (both gathers): the next kernel may launch only once this one's wait has returned, i.e. the
// kernels before it are complete (BF16 experts' wgmma kernel then reads the schedule before its own wait;
// moe_bf16_wgmma.cuh, PrefillParams::early_w).
__global__ void lane_order_kernel(const uint32_t* src, const int* map, const int* n_rows, int64_t rows, Format f,
                                  int k, int k_pad, bool natural, bool late_trigger, uint4* dst) {
  griddep_trigger_and_wait(late_trigger);
  if (n_rows) rows = *n_rows;
  const int pairs = k / 2, vecs = k_pad / 8;  // pairs of a source row, 16-byte vectors of a destination row
  const int v = blockIdx.y * blockDim.x + threadIdx.x;
  if (v >= vecs) return;
  int pn[4];  // the source pairs of this vector, the same in every row
#pragma unroll
  for (int j = 0; j < 4; ++j) pn[j] = natural ? 4 * v + j : int(layout::natural_pair(f, 4 * v + j));
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint32_t* row = src + (map ? int64_t(map[r]) : r) * pairs;
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = pn[j] < pairs ? row[pn[j]] : 0u;
    dst[r * vecs + v] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// The gather for BF16 experts with FP16 activations (moe.cu; prefill::PrefillParams::x_split): dst row r
// holds the k FP16 values of src row map[r] (map null: row r) as two BF16 terms, hi = x rounded to BF16 and
// lo = x - hi (exact), 64-K chunk by chunk: [hi_0 | lo_0 | hi_1 | lo_1 | ...], 2 kx values (kx: k rounded up
// to 64), zero past k; an infinite x gives lo = 0 (so that W x is W hi, not NaN). Rows as
// lane_order_kernel's; grid y covers the kx / 8 source vectors.
__global__ void split_rows_kernel(const uint4* src, const int* map, const int* n_rows, int64_t rows, int k, int kx,
                                  bool late_trigger, uint4* dst) {
  griddep_trigger_and_wait(late_trigger);
  if (n_rows) rows = *n_rows;
  const int vecs = kx / 8, src_vecs = k / 8;  // k % 8 == 0 (the BF16 experts' rule)
  const int v = blockIdx.y * blockDim.x + threadIdx.x;
  if (v >= vecs) return;
  const int hi_at = (v / 8) * 16 + v % 8;  // chunk v / 8's hi vectors, then its lo vectors
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint4 in = v < src_vecs ? src[(map ? int64_t(map[r]) : r) * src_vecs + v] : make_uint4(0, 0, 0, 0);
    const uint32_t w[4] = {in.x, in.y, in.z, in.w};
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
      const __nv_bfloat162 h = __floats2bfloat162_rn(f.x, f.y);
      const float2 hf = __bfloat1622float2(h);
      const __nv_bfloat162 l = __floats2bfloat162_rn(isinf(f.x) ? 0.0f : f.x - hf.x, isinf(f.y) ? 0.0f : f.y - hf.y);
      hi[j] = *reinterpret_cast<const uint32_t*>(&h);
      lo[j] = *reinterpret_cast<const uint32_t*>(&l);
    }
    dst[r * 2 * vecs + hi_at] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    dst[r * 2 * vecs + hi_at + 8] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }
}

}  // namespace kernels
}  // namespace fp4kit
