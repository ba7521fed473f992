// quant_gpu.cu: the device quantizer, bit-identical to quantize_cpu (both run the block recipes of
// quant_common.h). Asynchronous on the caller's stream, no allocation, no host sync, so it can be
// captured in a CUDA graph.
//
// NVFP4 without a given tensor scale runs three stream operations:
//   1. zero the amax word in the workspace,
//   2. amax over the finite |w| (a grid-stride max, reduced per CTA, then one atomicMax on the float's
//      bits: non-negative floats order like their uint32 bit patterns),
//   3. quantize, one 16/32-value block per thread; every thread derives the tensor scale from the amax
//      word itself (the same division), and thread 0 stores it to *tensor_scale.
// With a given tensor scale, or for MXFP4, only step 3 runs.
#include <cuda_runtime.h>

#include <algorithm>

#include "fp4kit/quant.h"
#include "quant_common.h"

namespace fp4kit {

namespace {

constexpr int kThreads = 256;

int grid_for(int64_t work) {
  // Grid-stride loops cover any size; a few thousand CTAs fill every SM of the largest GPUs.
  return int(std::min<int64_t>((work + kThreads - 1) / kThreads, 4096));
}

template <DType D>
__global__ void __launch_bounds__(kThreads) amax_kernel(const void* w, int64_t count, unsigned* amax_bits) {
  float m = 0.0f;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < count; i += int64_t(gridDim.x) * kThreads) {
    const float v = quant_detail::load_elem<D>(w, i);
    if (detail::is_finite(v)) m = fmaxf(m, fabsf(v));
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ float warp_max[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < kThreads / 32 ? warp_max[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) atomicMax(amax_bits, __float_as_uint(m));
  }
}

// amax_bits: the reduced amax (NVFP4 without a given scale), else null. given_ts: device pointer or null.
template <Format F, DType D>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const void* w, int64_t nblocks, uint8_t* packed, uint8_t* scales, const unsigned* amax_bits,
                    const float* given_ts, float* ts_out) {
  constexpr int G = FormatTraits<F>::kGroup;
  float ts = 1.0f;
  if (F == Format::kNVFP4) {
    ts = given_ts ? *given_ts : quant_detail::tensor_scale_from_amax(__uint_as_float(*amax_bits));
    // When ts_out aliases given_ts this stores the value every thread reads: a benign race.
    if (blockIdx.x == 0 && threadIdx.x == 0) *ts_out = ts;
  }
  float v[G];
  for (int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x; b < nblocks; b += int64_t(gridDim.x) * kThreads) {
#pragma unroll
    for (int i = 0; i < G; ++i) v[i] = quant_detail::load_elem<D>(w, b * G + i);
    if (F == Format::kNVFP4)
      quant_detail::quantize_block_nvfp4(v, ts, packed + b * (G / 2), scales + b);
    else
      quant_detail::quantize_block_mxfp4(v, packed + b * (G / 2), scales + b);
  }
}

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(Code::kCudaError, std::string("quantize_gpu: ") + what + ": " + cudaGetErrorString(e));
}

template <Format F, DType D>
Status launch(const QuantizeArgs& a, void* workspace, cudaStream_t stream) {
  const int64_t count = a.n * a.k, nblocks = count / FormatTraits<F>::kGroup;
  unsigned* amax_bits = nullptr;
  if (F == Format::kNVFP4 && !a.given_tensor_scale) {
    amax_bits = static_cast<unsigned*>(workspace);
    FP4KIT_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(amax_bits, 0, sizeof(unsigned), stream), "zeroing the amax"));
    amax_kernel<D><<<grid_for(count), kThreads, 0, stream>>>(a.w, count, amax_bits);
    FP4KIT_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "amax kernel launch"));
  }
  quantize_kernel<F, D><<<grid_for(nblocks), kThreads, 0, stream>>>(a.w, nblocks, a.packed, a.scales, amax_bits,
                                                                     a.given_tensor_scale, a.tensor_scale);
  return cuda_status(cudaGetLastError(), "quantize kernel launch");
}

template <Format F>
Status launch_format(const QuantizeArgs& a, void* workspace, cudaStream_t stream) {
  switch (a.w_dtype) {
    case DType::kF32: return launch<F, DType::kF32>(a, workspace, stream);
    case DType::kBF16: return launch<F, DType::kBF16>(a, workspace, stream);
    case DType::kF16: return launch<F, DType::kF16>(a, workspace, stream);
  }
  return Status(Code::kInternal, "quantize_gpu: unhandled w_dtype");
}

}  // namespace

// One 4-byte amax word; the rest keeps the workspace a whole 256-byte allocation unit for future use.
size_t quantize_workspace_bytes() { return 256; }

Status quantize_gpu(const QuantizeArgs& a, void* workspace, cudaStream_t stream) {
  FP4KIT_RETURN_IF_ERROR(quant_detail::validate_quantize(a));
  if (a.format == Format::kNVFP4 && !a.given_tensor_scale) {
    if (!workspace)
      return Status::Invalid("workspace: must not be null for nvfp4 without given_tensor_scale (needs " +
                             std::to_string(quantize_workspace_bytes()) + " bytes)");
    if (!quant_detail::aligned(workspace, 4)) return Status::Invalid("workspace: must be 4-byte aligned");
  }
  return a.format == Format::kNVFP4 ? launch_format<Format::kNVFP4>(a, workspace, stream)
                                    : launch_format<Format::kMXFP4>(a, workspace, stream);
}

}  // namespace fp4kit
