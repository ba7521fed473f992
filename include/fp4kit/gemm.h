// fp4kit/gemm.h: Y[m, n] = X[m, k] * W[n, k]^T (+ bias[n]), W in FP4 (prepacked), X/Y in BF16 or FP16,
// accumulation in fp32, block and tensor scales applied in fp32 before the output cast.
//
// Contract:
//   - x: [m, k] row-major, y: [m, n] row-major, both of dtype `act` (kBF16 or kF16), 16-byte aligned.
//   - w: a PackedWeight written by prepack_* (16-byte aligned), k % group_size(format) == 0, any n, m >= 1.
//   - bias: [n] of dtype `act`, or null.
//   - workspace: gemm_workspace_bytes() bytes of device memory, zero-filled once before its first use
//     (strictly: its first gemm_workspace_zero_bytes() bytes). Calls of any shape may share one (the
//     largest they need): fp4kit keeps the arrival counters in its first 64 KiB (more only past 16384
//     counters: n beyond 2M rows) and leaves them zeroed after every call; the rest is scratch. One workspace per
//     stream: calls that may run concurrently need their own. May be null when the query returns 0.
//   - No allocation, no host synchronisation: safe inside CUDA graph capture.
//   - Every argument is validated before anything is launched; a failed Status names the argument and
//     the rule.
//   - A NaN block scale (E4M3 0x7F/0xFF, E8M0 0xFF) makes the outputs of the rows it touches NaN.
#pragma once
#include <cstddef>
#include <cstdint>

#include "fp4kit/formats.h"
#include "fp4kit/repack.h"
#include "fp4kit/status.h"

typedef struct CUstream_st* cudaStream_t;

namespace fp4kit {

struct GemmArgs {
  int64_t m = 0;
  DType act = DType::kBF16;
  const void* x = nullptr;
  PackedWeight w;
  const void* bias = nullptr;
  void* y = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int config = -1;  // -1: dispatch picks; otherwise an index into the kernel config table (configs.h)
};

// Bytes of workspace gemm() needs for this problem on the current device (0 if none).
Status gemm_workspace_bytes(int64_t m, const PackedWeight& w, DType act, size_t* bytes, int config = -1);

// Of those, the leading bytes that must be zero when a call starts (the arrival counters; 0 if none).
// fp4kit leaves them zero after every call; every other byte is scratch that a call writes before it
// reads. A workspace allocated fresh for a call (e.g. per CUDA graph capture) needs only these cleared.
Status gemm_workspace_zero_bytes(int64_t m, const PackedWeight& w, DType act, size_t* bytes, int config = -1);

// Checks every argument; gemm() calls it first.
Status gemm_validate(const GemmArgs& a);

Status gemm(const GemmArgs& a, cudaStream_t stream);

}  // namespace fp4kit
