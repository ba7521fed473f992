// lane_order.cuh: copy rows of X into lane order, the K order the prefill kernel reads (decode_layout.h,
// layout::natural_pair).
//
// Contract
//   dst row r (k_pad elements of 2 bytes, 16-byte aligned) = src row map[r] (k elements; map null: row r)
//   with its 2-element pairs permuted: dst pair q = src pair natural_pair(f, q), zero where that pair is
//   past k. Rows r < rows, where rows = *n_rows when n_rows is given (written by an earlier kernel: the
//   MoE's align), else `rows`. A CTA takes rows in turn, its threads the row's 16-byte destination vectors:
//   any grid and block size work. Under programmatic dependent launch it waits for the previous kernel
//   before reading anything.
//
// Why: the prefill kernel's lanes then dequantise only their own weight records (prefill_gemm_sm90.cuh).
// The permutation moves 4-byte pairs inside 64-K chunks (NVFP4) or 128-K blocks (MXFP4), finer than a
// TMA box can gather, so it is a pass over X: 2 m k_pad bytes written, 2 m k read, each destination
// vector's four pairs read as four 4-byte loads from one 128-256 byte stretch of the source row. Rows per
// CTA (no per-vector 64-bit index division) and two vectors per thread and step keep 32 bytes of loads in
// flight per thread.
#pragma once
#include <cstdint>

#include "kernels/decode_gemm.cuh"  // griddep_*, layout::natural_pair

namespace fp4kit {
namespace kernels {

__global__ void lane_order_kernel(const uint32_t* src, const int* map, const int* n_rows, int64_t rows, Format f,
                                  int k, int k_pad, uint4* dst) {
  griddep_launch_dependents();
  griddep_wait();
  if (n_rows) rows = *n_rows;
  const int pairs = k / 2, vecs = k_pad / 8;  // pairs of a source row, 16-byte vectors of a destination row
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint32_t* row = src + (map ? int64_t(map[r]) : r) * pairs;
    uint4* out = dst + r * vecs;
    for (int v0 = threadIdx.x; v0 < vecs; v0 += 2 * blockDim.x) {
      uint32_t w[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int v = v0 + h * blockDim.x;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int pn = int(layout::natural_pair(f, 4 * v + j));
          w[h][j] = v < vecs && pn < pairs ? row[pn] : 0u;
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (v0 + h * int(blockDim.x) < vecs) out[v0 + h * blockDim.x] = make_uint4(w[h][0], w[h][1], w[h][2], w[h][3]);
    }
  }
}

}  // namespace kernels
}  // namespace fp4kit
