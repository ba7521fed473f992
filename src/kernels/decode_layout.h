// decode_layout.h: where every FP4 value lives in the prepacked buffer (host and device).
//
// The decode kernel computes the transposed product Y^T = W * X^T with mma.m16n8k16: 16 weight rows are
// the A operand (from registers), 8 tokens the B operand. One lane loads 16 bytes per chunk of 16 rows x
// 64 K, and those 16 bytes are already its A fragments for four k16 steps. Because the MMA sums over k,
// the K order inside an mma step is ours to choose as long as X follows it: lane t of a quad takes 16
// consecutive K (one NVFP4 group; half an MXFP4 group), so it needs one block scale per row per chunk and
// reads its X slice with two 16-byte loads.
//
//   lane = 4*g + t        g = lane/4 selects rows g and g+8 of the row tile, t = lane%4 the K slice
//   chunk c (64 K):       NVFP4  kbase = 64c + 16t
//                         MXFP4  kbase = 128*(c/2) + 32t + 16*(c%2)   (a lane's two chunks = one group)
//   word s (k16 step):    K = kbase + 4s + {0,1,2,3}
//   pair p of word s:     p0 = row g   (K+0, K+1) -> mma a0a1      p1 = row g+8 (K+0, K+1) -> a2a3
//                         p2 = row g   (K+2, K+3) -> a4a5          p3 = row g+8 (K+2, K+3) -> a6a7
//
// Bit layout of a word. Each value's 3 magnitude bits (E2M1 code & 7) and sign bit are placed so that the
// kernel turns a pair into a BF16x2 with a mask: magnitude at bf16 bits 6..8 (exponent low two bits and
// mantissa top bit) and sign at bit 15 give e2m1 * 2^-126 exactly, subnormal 0.5 included. Three of the
// four pairs are the same pattern shifted by 0, 3 and 6 bits; the fourth fills the 8 bits left over:
//   p0: mag 6,7,8   sign 15 | hi: mag 22,23,24 sign 31      bf16: q & 0x81C081C0
//   p1: mag 3,4,5   sign 12 | hi: mag 19,20,21 sign 28      bf16: (q << 3) & 0x81C081C0
//   p2: mag 0,1,2   sign 9  | hi: mag 16,17,18 sign 25      bf16: (q << 6) & 0x81C081C0
//   p3: mag 10,11,13 sign 14| hi: mag 26,27,29 sign 30      bf16: three masked shifts
// ("lo" is the pair's first K, "hi" its second; bit i of the magnitude goes to the i-th listed position.)
// The pattern {6,7,8,15, 22,23,24,31} tiles no 32-, 64- or 128-bit word by rotations, so some pair always
// takes more than a shift and a mask. A layout of three rotations and one two-part pair (9 integer
// instructions per word against 11 here) measured no faster in a dequantisation loop and 1.1% slower in
// the GEMMs (docs/decode-gemm-notes.md): fewer instructions is not what this step needs.
#pragma once
#include <cstdint>

#include "fp4kit/formats.h"

namespace fp4kit {
namespace layout {

constexpr int kRowsPerTile = 16;
constexpr int kChunkK = 64;        // K per 16-byte lane load
constexpr int kChunksPerMacro = 8; // chunks per scale load
constexpr int kMacroK = kChunkK * kChunksPerMacro;

FP4KIT_HD int k_align(Format f) { return f == Format::kNVFP4 ? 64 : 128; }
FP4KIT_HD int scale_bytes_per_lane(Format f) { return f == Format::kNVFP4 ? 16 : 8; }

// First K of lane t's 16-wide slice in chunk c.
FP4KIT_HD int64_t lane_kbase(Format f, int64_t c, int t) {
  return f == Format::kNVFP4 ? 64 * c + 16 * t : 128 * (c / 2) + 32 * t + 16 * (c % 2);
}

// Bit position (0..31) inside word s of value (pair p, half h in {0: lo, 1: hi}, bit b in 0..3; b = 3 is
// the sign). The word index s does not change positions: every word has the same layout.
FP4KIT_HD int bit_position(int p, int h, int b) {
  // positions of magnitude bits 0,1,2 and the sign, for the lo half; hi = lo + 16.
  constexpr int kLo[4][4] = {{6, 7, 8, 15}, {3, 4, 5, 12}, {0, 1, 2, 9}, {10, 11, 13, 14}};
  return kLo[p][b] + 16 * h;
}

// Pair p of a word as the 16x2 bit patterns the kernels multiply by the block scales (host and device, so
// that test_repack checks them against bit_position for every code): BF16 {lo, hi} = sign << 15 | mag << 6
// (e2m1 * 2^-126), FP16 sign << 15 | mag << 9 (e2m1 * 2^-14).
template <int P> FP4KIT_HD uint32_t bf16_pair(uint32_t q) {
  if (P == 0) return q & 0x81C081C0u;
  if (P == 1) return (q << 3) & 0x81C081C0u;
  if (P == 2) return (q << 6) & 0x81C081C0u;
  return ((q >> 4) & 0x00C000C0u) | ((q >> 5) & 0x01000100u) | ((q << 1) & 0x80008000u);
}
template <int P> FP4KIT_HD uint32_t f16_pair(uint32_t q) {
  if (P == 0) return ((q << 3) & 0x0E000E00u) | (q & 0x80008000u);
  if (P == 1) return ((q << 6) & 0x0E000E00u) | ((q << 3) & 0x80008000u);
  if (P == 2) return ((q << 9) & 0x0E000E00u) | ((q << 6) & 0x80008000u);
  return ((q >> 1) & 0x06000600u) | ((q >> 2) & 0x08000800u) | ((q << 1) & 0x80008000u);
}

// Row (within the tile) and K offset (within the lane's 16-wide slice) of (word s, pair p, half h).
FP4KIT_HD int pair_row(int g, int p) { return (p & 1) ? g + 8 : g; }
FP4KIT_HD int pair_k(int s, int p, int h) { return 4 * s + ((p & 2) ? 2 : 0) + h; }

// Lane order of X: the K order in which lane t's own records meet wgmma's natural k16 steps. The prefill
// kernel's A fragment of lane t in a k16 step holds k {2t, 2t+1, 2t+8, 2t+9}; word s of lane t's record
// holds K = lane_kbase + 4s + {0, 1, 2, 3} (pairs p0/p1 then p2/p3). So if step s of chunk c reads the 16
// K {lane_kbase(c, t) + 4s + 2h + e : t, h, e} with k = 8h + 2t + e, every lane dequantises its own
// record word s for step s, as the decode kernel does. A row of X in lane order holds, at 2-element
// (4-byte) position q, the natural pair natural_pair(q): q = 32c + 8s + 4h + t within chunk c's 32 pairs.
// Rows are k_pad long (the K padding of the weights: chunk pairs of MXFP4 interleave over 128 K); pairs
// past K are zero.
FP4KIT_HD int64_t natural_pair(Format f, int64_t q) {
  const int r = int(q & 31);
  return lane_kbase(f, q >> 5, r & 3) / 2 + 2 * (r >> 3) + ((r >> 2) & 1);
}

// The mma.sync prefill kernel's X tile (kernels/prefill_gemm_sm80.cuh): a stage holds 128 K of each token,
// 256 bytes, as 16 units of 16 bytes; unit u (K 8u .. 8u + 7) of token row `tok` is stored at unit
// mma_x_unit(tok, u). Lane t of a quad reads unit (lane_kbase(c, t) mod 128) / 8 + sp of tokens g, so the
// eight lanes of a quarter warp (two tokens of opposite parity, four t) meet units 2t + 8i + sp (NVFP4) or
// 4t + 2i + sp (MXFP4): XOR-ing bit 1 with bit 3 and bit 0 with the token's parity spreads both over eight
// distinct 16-byte bank groups (test_repack checks it).
FP4KIT_HD int mma_x_unit(int tok, int u) { return u ^ ((u >> 2) & 2) ^ (tok & 1); }

// The BF16 experts' tensor-core kernel's stage buffers (kernels/moe_bf16_mma.cuh): rows of 64 K, 128 bytes,
// as 8 units of 16 bytes; unit u of row r is stored at unit bf16_unit(r, u). An ldmatrix phase reads one
// unit of eight consecutive rows (r0 a multiple of 8): XOR-ing the unit with the row's low three bits puts
// them in eight distinct 16-byte bank groups (test_repack checks it), and a row's eight units stay a
// permutation, so the eight threads that copy one row write eight distinct groups too.
FP4KIT_HD int bf16_unit(int r, int u) { return u ^ (r & 7); }

// The Hopper prefill kernel's narrow tiles (kernels/prefill_gemm_sm90.cuh; the launch, dispatch's time model):
// a token tile of `valid` >= 1 tokens runs its wgmmas, and loads X, a quarter or half of its BN wide where
// that covers it. Grouped (MoE) launches do so at every BN; dense ones only at kDenseNarrowBn, where m = 9-32
// is one such tile per row block (a larger BN's tile is narrow only as a large m's last one: not worth two
// more copies of the main loop).
constexpr int kDenseNarrowBn = 64;
FP4KIT_HD int tile_width(int bn, int64_t valid) { return valid <= bn / 4 ? bn / 4 : valid <= bn / 2 ? bn / 2 : bn; }

// Scale byte index inside a lane's SB bytes for chunk cc of the macro (0..7) and row half (0: g, 1: g+8).
// Each 32-bit word holds two scale "units" u0, u1 (NVFP4: chunks; MXFP4: chunk pairs) as bytes
// [u0 g, u1 g, u0 g+8, u1 g+8]: the even bytes of a word are one unit's two rows, so one mask turns them
// into a BF16x2 {row g, row g+8}, and the odd bytes with one more shift.
FP4KIT_HD int scale_byte(Format f, int cc, int row_half) {
  const int unit = f == Format::kNVFP4 ? cc : cc / 2;
  return 4 * (unit / 2) + 2 * row_half + (unit % 2);
}
// The checkpoint group of that scale.
FP4KIT_HD int64_t scale_group(Format f, int64_t c, int t) { return lane_kbase(f, c, t) / (f == Format::kNVFP4 ? 16 : 32); }

}  // namespace layout
}  // namespace fp4kit
