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

#include "kernels/decode_gemm.cuh"  // griddep_*, layout::natural_pair

namespace fp4kit {
namespace kernels {

__global__ void lane_order_kernel(const uint32_t* src, const int* map, const int* n_rows, int64_t rows, Format f,
                                  int k, int k_pad, bool natural, uint4* dst) {
  griddep_launch_dependents();
  griddep_wait();
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

}  // namespace kernels
}  // namespace fp4kit
