// repack_cpu.cpp: the prepacked layout, and the CPU prepack/unpack (the oracle for the GPU prepack).
#include <cmath>
#include <cstring>
#include <vector>

#include "fp4kit/repack.h"
#include "kernels/decode_layout.h"
#include "repack_common.h"

namespace fp4kit {

namespace {
size_t align256(size_t v) { return (v + 255) / 256 * 256; }

uint8_t code_at(const uint8_t* packed, int64_t k, int64_t row, int64_t col) {
  const uint8_t b = packed[row * (k / 2) + col / 2];
  return (col & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xF);
}
}  // namespace

Status packed_layout(Format format, int64_t n, int64_t k, PackedLayout* out) {
  FP4KIT_RETURN_IF_ERROR(detail::check_shape(format, n, k));
  if (!out) return Status::Invalid("out: must not be null");
  PackedLayout l;
  l.format = format;
  l.n = n;
  l.k = k;
  l.n_pad = (n + 15) / 16 * 16;
  const int ka = layout::k_align(format);
  l.k_pad = (k + ka - 1) / ka * ka;
  l.row_tiles = l.n_pad / 16;
  l.k_chunks = l.k_pad / layout::kChunkK;
  l.k_macros = (l.k_chunks + layout::kChunksPerMacro - 1) / layout::kChunksPerMacro;
  l.scale_bytes_per_lane = layout::scale_bytes_per_lane(format);
  l.weights_offset = 0;
  l.weights_bytes = size_t(l.row_tiles) * size_t(l.k_chunks) * 32 * 16;
  l.scales_offset = align256(l.weights_offset + l.weights_bytes);
  l.scales_bytes = size_t(l.row_tiles) * size_t(l.k_macros) * 32 * size_t(l.scale_bytes_per_lane);
  l.out_scale_offset = align256(l.scales_offset + l.scales_bytes);
  l.out_scale_bytes = size_t(l.n_pad) * sizeof(float);
  l.total_bytes = align256(l.out_scale_offset + l.out_scale_bytes);
  *out = l;
  return Status::Ok();
}

Status prepack_cpu(const PrepackArgs& a) {
  FP4KIT_RETURN_IF_ERROR(detail::check_prepack(a));
  PackedLayout l;
  FP4KIT_RETURN_IF_ERROR(packed_layout(a.format, a.n, a.k, &l));
  uint8_t* dst = static_cast<uint8_t*>(a.dst);
  std::memset(dst, 0, l.total_bytes);
  const int64_t groups = a.k / group_size(a.format);

  // Per-row factor and, for MXFP4, the re-based exponents.
  std::vector<int> emax(size_t(a.n), 127);
  float* out_scale = reinterpret_cast<float*>(dst + l.out_scale_offset);
  for (int64_t r = 0; r < a.n; ++r) {
    if (a.format == Format::kNVFP4) {
      const float ts = a.row_tensor_scale ? a.row_tensor_scale[r] : a.tensor_scale ? *a.tensor_scale : 1.0f;
      out_scale[r] = ts * 512.0f;
      for (int64_t gi = 0; gi < groups; ++gi)
        if (E4M3::is_nan(a.scales[r * groups + gi])) out_scale[r] = detail::quiet_nan();
    } else {
      int m = -1;
      for (int64_t gi = 0; gi < groups; ++gi) {
        const uint8_t e = a.scales[r * groups + gi];
        if (e != 0xFF && int(e) > m) m = e;
      }
      emax[size_t(r)] = m < 0 ? 127 : m;
      out_scale[r] = std::ldexp(1.0f, emax[size_t(r)] - 128);
      for (int64_t gi = 0; gi < groups; ++gi)
        if (a.scales[r * groups + gi] == 0xFF) out_scale[r] = detail::mx_nan_row(emax[size_t(r)]);
    }
  }

  // Weights: one 16-byte record per (row tile, chunk, lane).
  uint8_t* wdst = dst + l.weights_offset;
  for (int64_t rt = 0; rt < l.row_tiles; ++rt)
    for (int64_t c = 0; c < l.k_chunks; ++c)
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        const int64_t kbase = layout::lane_kbase(a.format, c, t);
        uint32_t words[4] = {0, 0, 0, 0};
        for (int s = 0; s < 4; ++s)
          for (int p = 0; p < 4; ++p)
            for (int h = 0; h < 2; ++h) {
              const int64_t row = rt * 16 + layout::pair_row(g, p);
              const int64_t col = kbase + layout::pair_k(s, p, h);
              if (row >= a.n || col >= a.k) continue;  // padding stays zero
              uint8_t code = code_at(a.packed, a.k, row, col);
              if (a.format == Format::kNVFP4) code = detail::nvfp4_block_code(code, a.scales[row * groups + col / 16]);
              for (int b = 0; b < 4; ++b)
                if ((code >> b) & 1) words[s] |= 1u << layout::bit_position(p, h, b);
            }
        std::memcpy(wdst + ((rt * l.k_chunks + c) * 32 + lane) * 16, words, 16);
      }

  // Scales: SB bytes per (row tile, macro, lane).
  const int sb = l.scale_bytes_per_lane;
  uint8_t* sdst = dst + l.scales_offset;
  for (int64_t rt = 0; rt < l.row_tiles; ++rt)
    for (int64_t j = 0; j < l.k_macros; ++j)
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        uint8_t* rec = sdst + ((rt * l.k_macros + j) * 32 + lane) * sb;
        for (int cc = 0; cc < layout::kChunksPerMacro; ++cc) {
          const int64_t c = j * layout::kChunksPerMacro + cc;
          const int64_t grp = layout::scale_group(a.format, c, t);
          if (c >= l.k_chunks || grp >= groups) continue;
          for (int half = 0; half < 2; ++half) {
            const int64_t row = rt * 16 + g + 8 * half;
            if (row >= a.n) continue;
            uint8_t v = a.scales[row * groups + grp];
            v = a.format == Format::kMXFP4 ? uint8_t(detail::mx_rebase(v, emax[size_t(row)])) : detail::nvfp4_scale_code(v);
            rec[layout::scale_byte(a.format, cc, half)] = v;
          }
        }
      }
  return Status::Ok();
}

Status unpack_cpu(Format format, int64_t n, int64_t k, const void* src, uint8_t* packed, uint8_t* scales) {
  FP4KIT_RETURN_IF_ERROR(detail::check_shape(format, n, k));
  if (!src) return Status::Invalid("src: must not be null");
  if (!packed) return Status::Invalid("packed: must not be null");
  if (!scales) return Status::Invalid("scales: must not be null");
  PackedLayout l;
  FP4KIT_RETURN_IF_ERROR(packed_layout(format, n, k, &l));
  const uint8_t* s8 = static_cast<const uint8_t*>(src);
  const int64_t groups = k / group_size(format);
  std::memset(packed, 0, size_t(n) * size_t(k / 2));
  const float* out_scale = reinterpret_cast<const float*>(s8 + l.out_scale_offset);
  for (int64_t rt = 0; rt < l.row_tiles; ++rt)
    for (int64_t c = 0; c < l.k_chunks; ++c)
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        uint32_t words[4];
        std::memcpy(words, s8 + l.weights_offset + ((rt * l.k_chunks + c) * 32 + lane) * 16, 16);
        const int64_t kbase = layout::lane_kbase(format, c, t);
        for (int s = 0; s < 4; ++s)
          for (int p = 0; p < 4; ++p)
            for (int h = 0; h < 2; ++h) {
              const int64_t row = rt * 16 + layout::pair_row(g, p);
              const int64_t col = kbase + layout::pair_k(s, p, h);
              if (row >= n || col >= k) continue;
              uint8_t code = 0;
              for (int b = 0; b < 4; ++b) code |= uint8_t(((words[s] >> layout::bit_position(p, h, b)) & 1u) << b);
              packed[row * (k / 2) + col / 2] |= uint8_t((col & 1) ? code << 4 : code);
            }
      }
  // MXFP4 rows: emax from out_scale = 2^(emax-128), or from the payload of a NaN row's out_scale.
  std::vector<int> mx_emax(size_t(n), 127);
  if (format == Format::kMXFP4)
    for (int64_t r = 0; r < n; ++r) mx_emax[size_t(r)] = detail::mx_emax_of(out_scale[r]);
  const int sb = l.scale_bytes_per_lane;
  for (int64_t rt = 0; rt < l.row_tiles; ++rt)
    for (int64_t j = 0; j < l.k_macros; ++j)
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        const uint8_t* rec = s8 + l.scales_offset + ((rt * l.k_macros + j) * 32 + lane) * sb;
        for (int cc = 0; cc < layout::kChunksPerMacro; ++cc) {
          const int64_t c = j * layout::kChunksPerMacro + cc;
          const int64_t grp = layout::scale_group(format, c, t);
          if (c >= l.k_chunks || grp >= groups) continue;
          for (int half = 0; half < 2; ++half) {
            const int64_t row = rt * 16 + g + 8 * half;
            if (row >= n) continue;
            uint8_t v = rec[layout::scale_byte(format, cc, half)];
            if (format == Format::kMXFP4 && v != 0xFF) v = uint8_t(int(v) + mx_emax[size_t(row)] - 254);
            if (format == Format::kNVFP4) v = detail::nvfp4_scale_byte(v);
            scales[row * groups + grp] = v;
          }
        }
      }
  return Status::Ok();
}

}  // namespace fp4kit
