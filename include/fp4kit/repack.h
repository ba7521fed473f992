// fp4kit/repack.h: offline prepack from the checkpoint layout to the kernel layout.
//
// Run once per weight (on the GPU, or on the CPU for tests); the GEMM never repacks.
//
// Kernel layout ("fp4kit packed", one buffer, three regions at 256-byte aligned offsets):
//   rows are padded to n_pad = ceil(N/16)*16 (one mma row tile), K to k_pad (NVFP4: a multiple of 64,
//   MXFP4: of 128) with zero codes and zero scales, so padding contributes exact zeros.
//   weights [RT = n_pad/16][KC = k_pad/64][32 lanes][16 B]: one 16-byte load per lane per chunk of
//     16 rows x 64 K, already in the register order of mma.m16n8k16's A fragment (see
//     src/kernels/decode_layout.h for the bit layout, chosen so that E2M1 -> BF16 is a mask).
//   scales  [RT][KM = ceil(k_pad/512)][32 lanes][SB] (SB = 16 for NVFP4, 8 for MXFP4): the block
//     scales each lane needs for one 512-wide slice of K.
//     NVFP4 stores each E4M3 scale re-encoded for a two-instruction decode: non-negative, subnormals
//     normalised (a 5-bit exponent and the 3 mantissa bits). A negative scale's sign moves into its
//     block's codes (-s * c = s * -c, exact), and a zero scale zeroes its block's codes.
//     MXFP4 stores e' = e - emax(row) + 254 (255 stays the NaN marker), so that every scale of a row is a
//     representable BF16/FP16 power of two; a block more than 2^120 below its row's largest is flushed
//     to zero (its contribution is below fp32 resolution of the row).
//   out_scale [n_pad] fp32: the per-row factor the epilogue applies in fp32 (NVFP4: tensor scale * 2^9;
//     MXFP4: 2^(emax(row) - 128)).
#pragma once
#include <cstddef>
#include <cstdint>

#include "fp4kit/formats.h"
#include "fp4kit/status.h"

typedef struct CUstream_st* cudaStream_t;

namespace fp4kit {

struct PackedLayout {
  Format format = Format::kNVFP4;
  int64_t n = 0, k = 0;          // logical shape of W [N, K]
  int64_t n_pad = 0, k_pad = 0;  // padded shape
  int64_t row_tiles = 0;         // n_pad / 16
  int64_t k_chunks = 0;          // k_pad / 64
  int64_t k_macros = 0;          // ceil(k_pad / 512)
  int scale_bytes_per_lane = 0;  // SB
  size_t weights_offset = 0, weights_bytes = 0;
  size_t scales_offset = 0, scales_bytes = 0;
  size_t out_scale_offset = 0, out_scale_bytes = 0;
  size_t total_bytes = 0;
};

// Layout of the packed buffer for W [n, k]; fails if k is not a multiple of the group size or a size is
// out of range.
Status packed_layout(Format format, int64_t n, int64_t k, PackedLayout* out);

struct PrepackArgs {
  Format format = Format::kNVFP4;
  int64_t n = 0, k = 0;
  const uint8_t* packed = nullptr;  // [N, K/2] checkpoint layout
  const uint8_t* scales = nullptr;  // [N, K/group]
  // NVFP4 only (both optional, at most one): one tensor scale, or one per row (fused projections whose
  // parts carry different tensor scales). Neither: 1.0.
  const float* tensor_scale = nullptr;
  const float* row_tensor_scale = nullptr;
  void* dst = nullptr;  // packed_layout().total_bytes bytes
};

// A prepacked weight as the GEMM sees it: a view, it owns nothing.
struct PackedWeight {
  Format format = Format::kNVFP4;
  int64_t n = 0, k = 0;
  const void* data = nullptr;  // buffer written by prepack
};

// Host memory in, host memory out (the test oracle for the GPU version).
Status prepack_cpu(const PrepackArgs& a);
// Device memory in and out; asynchronous on `stream`, no host sync, no allocation.
Status prepack_gpu(const PrepackArgs& a, cudaStream_t stream);

// Inverse (CPU): unpack a packed buffer back to the checkpoint layout, with the same dequantised values.
// NVFP4 restores every byte except where prepack rewrote a block exactly: a negative scale comes back
// positive with its block's codes negated, and a zero scale's block comes back with zero codes (the
// zero and NaN scale bytes themselves are restored). MXFP4 restores every byte when no block was flushed.
// Used by the round-trip tests.
Status unpack_cpu(Format format, int64_t n, int64_t k, const void* src, uint8_t* packed, uint8_t* scales);

}  // namespace fp4kit
