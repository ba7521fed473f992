// repack_gpu.cu: the prepack on the GPU. Same output as prepack_cpu, byte for byte (tested).
//
// Three small kernels, each writing every byte of its region (padding included, so the GEMM never reads
// uninitialised memory): per-row factors, weight records, scale records. Offline work: clarity over speed.
#include <cuda_runtime.h>

#include "fp4kit/repack.h"
#include "kernels/decode_layout.h"
#include "repack_common.h"

namespace fp4kit {
namespace {

__device__ __forceinline__ uint8_t code_at(const uint8_t* packed, int64_t k, int64_t row, int64_t col) {
  const uint8_t b = packed[row * (k / 2) + col / 2];
  return (col & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xF);
}

// out_scale[r] for every padded row (see repack.h).
__global__ void row_factor_kernel(Format f, int64_t n, int64_t n_pad, int64_t groups, const uint8_t* scales,
                                  const float* ts, const float* row_ts, float* out_scale) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= n_pad) return;
  if (r >= n) { out_scale[r] = 0.0f; return; }
  if (f == Format::kNVFP4) {
    const float t = row_ts ? row_ts[r] : ts ? *ts : 1.0f;
    bool nan = false;
    for (int64_t gi = 0; gi < groups; ++gi) nan = nan || E4M3::is_nan(scales[r * groups + gi]);
    out_scale[r] = nan ? detail::quiet_nan() : t * 512.0f;
  } else {
    int m = -1;
    bool nan = false;
    for (int64_t gi = 0; gi < groups; ++gi) {
      const uint8_t e = scales[r * groups + gi];
      nan = nan || e == 0xFF;
      if (e != 0xFF && int(e) > m) m = e;
    }
    const int emax = m < 0 ? 127 : m;
    out_scale[r] = nan ? detail::mx_nan_row(emax) : ldexpf(1.0f, emax - 128);
  }
}

__global__ void weight_kernel(Format f, int64_t n, int64_t k, int64_t row_tiles, int64_t k_chunks,
                              const uint8_t* packed, const uint8_t* scales, uint4* wdst) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // (rt, c, lane)
  if (idx >= row_tiles * k_chunks * 32) return;
  const int lane = int(idx & 31);
  const int64_t c = (idx >> 5) % k_chunks, rt = (idx >> 5) / k_chunks;
  const int g = lane >> 2, t = lane & 3;
  const int64_t kbase = layout::lane_kbase(f, c, t);
  uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int p = 0; p < 4; ++p)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = rt * 16 + layout::pair_row(g, p), col = kbase + layout::pair_k(s, p, h);
        if (row >= n || col >= k) continue;
        uint32_t code = code_at(packed, k, row, col);
        if (f == Format::kNVFP4) code = detail::nvfp4_block_code(uint8_t(code), scales[row * (k / 16) + col / 16]);
#pragma unroll
        for (int b = 0; b < 4; ++b) w[s] |= ((code >> b) & 1u) << layout::bit_position(p, h, b);
      }
  wdst[idx] = make_uint4(w[0], w[1], w[2], w[3]);
}

__global__ void scale_kernel(Format f, int64_t n, int64_t groups, int64_t row_tiles, int64_t k_chunks,
                             int64_t k_macros, const uint8_t* scales, const float* out_scale, uint8_t* sdst) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // (rt, j, lane)
  if (idx >= row_tiles * k_macros * 32) return;
  const int lane = int(idx & 31);
  const int64_t j = (idx >> 5) % k_macros, rt = (idx >> 5) / k_macros;
  const int g = lane >> 2, t = lane & 3;
  const int sb = layout::scale_bytes_per_lane(f);
  uint8_t rec[16] = {0};
  for (int cc = 0; cc < layout::kChunksPerMacro; ++cc) {
    const int64_t c = j * layout::kChunksPerMacro + cc;
    const int64_t grp = layout::scale_group(f, c, t);
    if (c >= k_chunks || grp >= groups) continue;
    for (int half = 0; half < 2; ++half) {
      const int64_t row = rt * 16 + g + 8 * half;
      if (row >= n) continue;
      uint8_t v = scales[row * groups + grp];
      v = f == Format::kMXFP4 ? uint8_t(detail::mx_rebase(v, detail::mx_emax_of(out_scale[row])))
                              : detail::nvfp4_scale_code(v);
      rec[layout::scale_byte(f, cc, half)] = v;
    }
  }
  for (int i = 0; i < sb; ++i) sdst[idx * sb + i] = rec[i];
}

unsigned blocks_for(int64_t items, int threads) { return unsigned((items + threads - 1) / threads); }

}  // namespace

Status prepack_gpu(const PrepackArgs& a, cudaStream_t stream) {
  FP4KIT_RETURN_IF_ERROR(detail::check_prepack(a));
  PackedLayout l;
  FP4KIT_RETURN_IF_ERROR(packed_layout(a.format, a.n, a.k, &l));
  uint8_t* dst = static_cast<uint8_t*>(a.dst);
  float* out_scale = reinterpret_cast<float*>(dst + l.out_scale_offset);
  const int64_t groups = a.k / group_size(a.format);
  constexpr int kThreads = 256;
  row_factor_kernel<<<blocks_for(l.n_pad, kThreads), kThreads, 0, stream>>>(
      a.format, a.n, l.n_pad, groups, a.scales, a.tensor_scale, a.row_tensor_scale, out_scale);
  weight_kernel<<<blocks_for(l.row_tiles * l.k_chunks * 32, kThreads), kThreads, 0, stream>>>(
      a.format, a.n, a.k, l.row_tiles, l.k_chunks, a.packed, a.scales, reinterpret_cast<uint4*>(dst + l.weights_offset));
  scale_kernel<<<blocks_for(l.row_tiles * l.k_macros * 32, kThreads), kThreads, 0, stream>>>(
      a.format, a.n, groups, l.row_tiles, l.k_chunks, l.k_macros, a.scales, out_scale, dst + l.scales_offset);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return Status(Code::kCudaError, std::string("prepack launch: ") + cudaGetErrorString(e));
  return Status::Ok();
}

}  // namespace fp4kit
