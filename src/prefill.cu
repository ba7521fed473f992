// prefill.cu: host side of the Hopper prefill GEMM: argument checks, the X tensor map, the kernel table.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fp4kit/repack.h"
#include "kernels/prefill_gemm_sm90.cuh"
#include "prefill.h"
#include "repack_common.h"

namespace fp4kit {
namespace detail {
namespace {

namespace pk = kernels::prefill;
using PrefillFn = void (*)(const CUtensorMap, const pk::PrefillParams);

template <Format F, typename T>
PrefillFn kernel_for_tile(int bn, int* smem) {
  switch (bn) {
    case 64: *smem = pk::Geometry<64>::kSmem; return pk::prefill_gemm_kernel<F, T, 64>;
    case 128: *smem = pk::Geometry<128>::kSmem; return pk::prefill_gemm_kernel<F, T, 128>;
    case 256: *smem = pk::Geometry<256>::kSmem; return pk::prefill_gemm_kernel<F, T, 256>;
    default: return nullptr;
  }
}
PrefillFn select_kernel(Format f, DType act, int bn, int* smem) {
  if (f == Format::kNVFP4)
    return act == DType::kBF16 ? kernel_for_tile<Format::kNVFP4, __nv_bfloat16>(bn, smem)
                               : kernel_for_tile<Format::kNVFP4, __half>(bn, smem);
  return act == DType::kBF16 ? kernel_for_tile<Format::kMXFP4, __nv_bfloat16>(bn, smem)
                             : kernel_for_tile<Format::kMXFP4, __half>(bn, smem);
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda), resolved once.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
Status encode_fn(EncodeTiledFn* out) {
  static std::once_flag once;
  static EncodeTiledFn fn = nullptr;
  static std::string err;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p)
      err = std::string("driver: cuTensorMapEncodeTiled unavailable (") + cudaGetErrorString(e) + ")";
    else fn = reinterpret_cast<EncodeTiledFn>(p);
  });
  if (!fn) return Status(Code::kCudaError, err);
  *out = fn;
  return Status::Ok();
}

// Per (device, kernel): the dynamic shared memory attribute is set and the binary checked once.
std::mutex g_mu;
std::vector<std::pair<std::pair<int, const void*>, bool>> g_ready;

Status prepare_kernel(int dev, PrefillFn fn, int smem) {
  const void* key = reinterpret_cast<const void*>(fn);
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& r : g_ready)
    if (r.first.first == dev && r.first.second == key) return Status::Ok();
  cudaFuncAttributes attr{};
  cudaError_t e = cudaFuncGetAttributes(&attr, key);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status::Unsupported(std::string("device: the prefill kernel has no image for this device (") +
                               cudaGetErrorString(e) + "); build with CUDA architecture 90a");
  }
  // A compute_80 PTX JIT-compiled for an sm_90 device would run the empty (trapping) body.
  if (attr.ptxVersion < 90)
    return Status::Unsupported("device: this build has no sm_90a code for the prefill kernel (PTX " +
                               std::to_string(attr.ptxVersion) + "); build with CUDA architecture 90a");
  e = cudaFuncSetAttribute(key, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status(Code::kCudaError, std::string("prefill: cannot reserve ") + std::to_string(smem) +
                                        " bytes of shared memory (" + cudaGetErrorString(e) + ")");
  }
  g_ready.push_back({{dev, key}, true});
  return Status::Ok();
}

bool aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

PrefillConfig default_prefill_config(int64_t m, int64_t n, int sms) {
  const int64_t row_blocks = (n + pk::kRowsPerCta - 1) / pk::kRowsPerCta;
  PrefillConfig best{256};
  double best_cost = 0;
  for (int bn : {256, 128, 64}) {
    const int64_t ctas = row_blocks * ((m + bn - 1) / bn);
    const int64_t waves = (ctas + sms - 1) / std::max(sms, 1);
    // A CTA's time is ~ BN + 300 (H200, K = 8192: 95, 73, 63 us for BN = 256, 128, 64): the weight
    // dequantisation per chunk is the same for every BN, the MMA work scales with it.
    const double cost = double(waves) * (bn + 300);
    if (bn == 256 || cost < best_cost) {
      best_cost = cost;
      best.token_tile = bn;
    }
  }
  return best;
}

Status launch_prefill(const GemmArgs& a, const PrefillConfig& cfg_in, cudaStream_t stream) {
  // ---- arguments (the gemm() rules that apply; no workspace, no config table)
  if (a.m < 1) return Status::Invalid("m: must be >= 1 (got " + str(a.m) + ")");
  if (a.m > INT32_MAX) return Status::Invalid("m: must be < 2^31 (got " + str(a.m) + ")");
  if (a.act != DType::kBF16 && a.act != DType::kF16)
    return Status::Invalid(std::string("act: must be bfloat16 or float16 (got ") + dtype_name(a.act) + ")");
  FP4KIT_RETURN_IF_ERROR(check_shape(a.w.format, a.w.n, a.w.k));
  if (!a.x) return Status::Invalid("x: must not be null");
  if (!aligned(a.x, 16)) return Status::Invalid("x: must be 16-byte aligned");
  if (!a.y) return Status::Invalid("y: must not be null");
  if (!aligned(a.y, 16)) return Status::Invalid("y: must be 16-byte aligned");
  if (!a.w.data) return Status::Invalid("w.data: must not be null (prepack the weight first)");
  if (!aligned(a.w.data, 16)) return Status::Invalid("w.data: must be 16-byte aligned");
  if (a.bias && !aligned(a.bias, 2)) return Status::Invalid("bias: must be 2-byte aligned");
  if (a.m * a.w.n >= (int64_t(1) << 40) || a.m * a.w.k >= (int64_t(1) << 40))
    return Status::Invalid("m: m*k and m*n must be < 2^40 elements (got m=" + str(a.m) + ")");

  // ---- device
  int dev = 0, major = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status(Code::kCudaError, std::string("device: no usable CUDA device (") + cudaGetErrorString(e) + ")");
  }
  if (major != 9)
    return Status::Unsupported("device: the prefill kernel needs compute capability 9.x (got " + std::to_string(major) +
                               ".x)");

  PrefillConfig cfg = cfg_in.token_tile ? cfg_in : default_prefill_config(a.m, a.w.n, sms);
  int smem = 0;
  const PrefillFn fn = select_kernel(a.w.format, a.act, cfg.token_tile, &smem);
  if (!fn) return Status::Invalid("token_tile: must be 64, 128 or 256 (got " + std::to_string(cfg.token_tile) + ")");
  if ((a.w.n + pk::kRowsPerCta - 1) / pk::kRowsPerCta * ((a.m + cfg.token_tile - 1) / cfg.token_tile) > INT32_MAX)
    return Status::Invalid("m: the prefill grid holds at most 2^31 - 1 CTAs");
  FP4KIT_RETURN_IF_ERROR(prepare_kernel(dev, fn, smem));

  PackedLayout l;
  FP4KIT_RETURN_IF_ERROR(packed_layout(a.w.format, a.w.n, a.w.k, &l));

  // ---- X as a TMA tensor: {K, m} elements, rows K*2 bytes apart, boxes of {64 K, BN tokens} with the
  // 128-byte swizzle wgmma's descriptor expects; out-of-bounds elements (past K, past m) read as zero.
  EncodeTiledFn encode = nullptr;
  FP4KIT_RETURN_IF_ERROR(encode_fn(&encode));
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(a.w.k), cuuint64_t(a.m)};
  const cuuint64_t strides[1] = {cuuint64_t(a.w.k) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(cfg.token_tile)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(&map, a.act == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                            2, const_cast<void*>(a.x), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return Status(Code::kCudaError, "prefill: cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")");

  const uint8_t* base = static_cast<const uint8_t*>(a.w.data);
  pk::PrefillParams p{};
  p.y = a.y;
  p.bias = a.bias;
  p.weights = base + l.weights_offset;
  p.scales = base + l.scales_offset;
  p.out_scale = reinterpret_cast<const float*>(base + l.out_scale_offset);
  p.m = int(a.m);
  p.n = int(l.n);
  p.row_tiles = int(l.row_tiles);
  p.k_chunks = int(l.k_chunks);
  p.k_macros = int(l.k_macros);
  p.row_blocks = int((l.row_tiles + pk::kRowTilesPerCta - 1) / pk::kRowTilesPerCta);
  p.token_tiles = int((a.m + cfg.token_tile - 1) / cfg.token_tile);

  fn<<<unsigned(int64_t(p.row_blocks) * p.token_tiles), pk::kThreads, smem, stream>>>(map, p);
  e = cudaGetLastError();
  if (e != cudaSuccess) return Status(Code::kCudaError, std::string("prefill launch: ") + cudaGetErrorString(e));
  return Status::Ok();
}

}  // namespace detail
}  // namespace fp4kit
