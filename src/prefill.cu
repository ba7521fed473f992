// prefill.cu: host side of the Hopper prefill GEMM: its launch plan (kernel per token tile, K splits,
// workspace), the X tensor map, the launch.
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
#include "kernels/lane_order.cuh"
#include "kernels/moe_bf16_mma.cuh"
#include "kernels/moe_bf16_wgmma.cuh"
#include "kernels/prefill_gemm_sm80.cuh"
#include "kernels/prefill_gemm_sm90.cuh"
#include "launch.h"
#include "prefill.h"
#include "repack_common.h"

namespace fp4kit {
namespace detail {
namespace {

namespace pk = kernels::prefill;
namespace mk = kernels::mma80;
using PrefillFn = void (*)(const CUtensorMap, const pk::NarrowX, const CUtensorMap, const pk::PrefillParams);
using MmaFn = void (*)(const pk::PrefillParams);

// The kernel of a token tile (wgmma: a PrefillFn; mma.sync: an MmaFn): its dynamic shared memory, ring
// stages and one split's partial-tile floats.
struct PrefillKernel {
  const void* fn = nullptr;
  int smem = 0, stages = 0, partial_floats = 0;
};
template <Format F, typename T, int BN, bool kGrouped, int kBlocks = 1>
PrefillKernel kernel_of() {
  using G = pk::Geometry<BN, kBlocks>;
  return {reinterpret_cast<const void*>(&pk::prefill_gemm_kernel<F, T, BN, kGrouped, kBlocks>), G::kSmem, G::kStages,
          G::kPartialFloats};
}
// The mma.sync kernels (configs.h, the kMma entries): one CTA per SM, a ring of 4 stages.
constexpr int kMmaStages = 4;
template <Format F, typename T, int BN, bool kGrouped>
PrefillKernel mma_kernel_of() {
  using G = mk::Geometry<BN, kMmaStages>;
  return {reinterpret_cast<const void*>(&mk::prefill_mma_kernel<F, T, BN, kMmaStages, kGrouped>), G::kSmem,
          G::kStages, G::kPartialFloats};
}
template <Format F, typename T, bool kGrouped>
PrefillKernel mma_kernel_for_tile(int bn) {
  return bn == 64 ? mma_kernel_of<F, T, 64, kGrouped>() : bn == 128 ? mma_kernel_of<F, T, 128, kGrouped>()
                                                                    : PrefillKernel{};
}
template <bool kGrouped>
PrefillKernel select_mma_kernel(Format f, DType act, int bn) {
  if (f == Format::kNVFP4)
    return act == DType::kBF16 ? mma_kernel_for_tile<Format::kNVFP4, __nv_bfloat16, kGrouped>(bn)
                               : mma_kernel_for_tile<Format::kNVFP4, __half, kGrouped>(bn);
  return act == DType::kBF16 ? mma_kernel_for_tile<Format::kMXFP4, __nv_bfloat16, kGrouped>(bn)
                             : mma_kernel_for_tile<Format::kMXFP4, __half, kGrouped>(bn);
}

// blocks: CTAs per SM (the entry's min_blocks); two only at BN = 64.
template <Format F, typename T, bool kGrouped>
PrefillKernel kernel_for_tile(int bn, int blocks) {
  if (blocks == 2) return bn == 64 ? kernel_of<F, T, 64, kGrouped, 2>() : PrefillKernel{};
  if (blocks != 1) return {};
  switch (bn) {
    case 64: return kernel_of<F, T, 64, kGrouped>();
    case 128: return kernel_of<F, T, 128, kGrouped>();
    case 256: return kernel_of<F, T, 256, kGrouped>();
    default: return {};
  }
}
template <bool kGrouped>
PrefillKernel select_kernel(Format f, DType act, int bn, int blocks = 1) {
  if (f == Format::kNVFP4)
    return act == DType::kBF16 ? kernel_for_tile<Format::kNVFP4, __nv_bfloat16, kGrouped>(bn, blocks)
                               : kernel_for_tile<Format::kNVFP4, __half, kGrouped>(bn, blocks);
  return act == DType::kBF16 ? kernel_for_tile<Format::kMXFP4, __nv_bfloat16, kGrouped>(bn, blocks)
                             : kernel_for_tile<Format::kMXFP4, __half, kGrouped>(bn, blocks);
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

// Per (device, kernel): whether the binary carries sm_90a code for it, checked once.
std::mutex g_mu;
std::vector<std::pair<std::pair<int, const void*>, bool>> g_checked;

Status check_image(const void* key) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status(Code::kCudaError, std::string("device: no usable CUDA device (") + cudaGetErrorString(e) + ")");
  }
  bool ok = false, known = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (auto& r : g_checked)
      if (r.first.first == dev && r.first.second == key) known = true, ok = r.second;
  }
  if (!known) {
    cudaFuncAttributes attr{};
    e = cudaFuncGetAttributes(&attr, key);
    if (e != cudaSuccess) cudaGetLastError();
    // A compute_80 PTX JIT-compiled for an sm_90 device would run the empty (trapping) body.
    ok = e == cudaSuccess && attr.ptxVersion >= 90;
    std::lock_guard<std::mutex> lock(g_mu);
    g_checked.push_back({{dev, key}, ok});
  }
  if (!ok)
    return Status::Unsupported("device: this build has no sm_90a code for the prefill kernel; build with CUDA "
                               "architecture 90a");
  return Status::Ok();
}

}  // namespace

bool prefill_runs_here() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9 && check_image(select_kernel<false>(Format::kNVFP4, DType::kBF16, 64).fn).ok();
}

bool sm90_code_here(const void* kernel) { return check_image(kernel).ok(); }

int mma_prefill_smem(const KernelConfig& cfg) {
  return cfg.pipeline == kMma ? select_mma_kernel<false>(Format::kNVFP4, DType::kBF16, 8 * cfg.n_tiles).smem
                              : 0;
}

namespace {

// The kernel of the kMma table entry `cfg` (dense or grouped), checked against the entry, its dynamic
// shared memory attribute set (which fails where the device has less shared memory per block than it
// needs); sms: the device's SM count.
Status mma_kernel_for_config(const KernelConfig& cfg, Format f, DType act, bool grouped, PrefillKernel* k, int* sms) {
  const int bn = 8 * cfg.n_tiles;
  *k = grouped ? select_mma_kernel<true>(f, act, bn) : select_mma_kernel<false>(f, act, bn);
  if (!k->fn) return Status(Code::kInternal, std::string("config ") + cfg.name + " has no mma.sync prefill kernel");
  if (k->stages != cfg.stages || cfg.warps != mk::kWarps || cfg.row_tiles != mk::kWarpRowTiles || cfg.min_blocks != 1 ||
      cfg.chunks != mk::kStageChunks)
    return Status(Code::kInternal, std::string("config ") + cfg.name + " does not describe its mma.sync prefill kernel");
  int per_sm = 0;
  return resident_per_sm(k->fn, mk::kThreads, k->smem, nullptr, sms, &per_sm);
}

// The kernel of the kWgmma table entry `cfg` (dense or grouped), checked against the entry, present in this
// build for this device, its dynamic shared memory attribute set; sms: the device's SM count.
Status kernel_for_config(const KernelConfig& cfg, Format f, DType act, bool grouped, PrefillKernel* k, int* sms) {
  if (cfg.pipeline == kMma) return mma_kernel_for_config(cfg, f, act, grouped, k, sms);
  const int bn = 8 * cfg.n_tiles;
  *k = grouped ? select_kernel<true>(f, act, bn, cfg.min_blocks) : select_kernel<false>(f, act, bn, cfg.min_blocks);
  if (!k->fn)
    return Status(Code::kInternal, std::string("config ") + cfg.name + " has no " + (grouped ? "grouped " : "") +
                                       "prefill kernel");
  if (k->stages != cfg.stages || cfg.warps != 4 * pk::kConsumerWarpgroups || cfg.row_tiles != 1 ||
      cfg.chunks != pk::kStageChunks)
    return Status(Code::kInternal, std::string("config ") + cfg.name + " does not describe its prefill kernel (" +
                                       std::to_string(k->stages) + " stages)");
  FP4KIT_RETURN_IF_ERROR(check_image(k->fn));
  int per_sm = 0;  // also sets the kernel's dynamic shared memory attribute, once per device
  FP4KIT_RETURN_IF_ERROR(resident_per_sm(k->fn, pk::kThreads, k->smem, nullptr, sms, &per_sm));
  if (per_sm < cfg.min_blocks)
    return Status(Code::kInternal, std::string("config ") + cfg.name + ": " + std::to_string(per_sm) +
                                       " CTAs per SM fit, the entry needs " + std::to_string(cfg.min_blocks));
  return Status::Ok();
}

}  // namespace

// Split K in a pair (plan_prefill): FP4KIT_PREFILL_PAIRS=0 turns it off, set_prefill_pairs overrides.
static int g_prefill_pairs = -1;  // -1: the environment decides
static bool prefill_pairs_enabled() {
  static const bool env = env_not_zero("FP4KIT_PREFILL_PAIRS");
  return g_prefill_pairs < 0 ? env : g_prefill_pairs != 0;
}
void set_prefill_pairs(int on) { g_prefill_pairs = on; }

Status plan_prefill(int64_t m, const PackedWeight& w, DType act, const KernelConfig& cfg, int sms, DecodePlan* out) {
  const int bn = 8 * cfg.n_tiles;
  PrefillKernel k;
  FP4KIT_RETURN_IF_ERROR(kernel_for_config(cfg, w.format, act, false, &k, nullptr));
  PackedLayout l;
  FP4KIT_RETURN_IF_ERROR(packed_layout(w.format, w.n, w.k, &l));

  const bool mma = cfg.pipeline == kMma;
  DecodePlan p;
  p.cfg = &cfg;
  p.kernel = k.fn;
  p.threads = mma ? mk::kThreads : pk::kThreads;
  p.smem_bytes = k.smem;
  p.layout = l;
  p.m_block = m;
  // wgmma: passes of equal size (whole token tiles) whose lane-ordered X fits lane_x_pass_bytes; mma.sync
  // reads X in place, one pass.
  const int64_t row_bytes = l.k_pad * 2;
  const int64_t cap = std::max<int64_t>(bn, lane_x_pass_bytes / row_bytes / bn * bn);
  const int64_t passes = mma ? 1 : (m + cap - 1) / cap;
  p.pass_m = std::min(m, ((m + passes - 1) / passes + bn - 1) / bn * bn);
  p.row_groups = int((l.row_tiles + pk::kRowTilesPerCta - 1) / pk::kRowTilesPerCta);
  p.token_tiles = int((p.pass_m + bn - 1) / bn);
  // The schedule keeps splits <= ceil(k / 512) = k_macros and split_tiles <= its tiles, which are units.
  const PrefillSchedule sc = prefill_schedule(cfg, p.pass_m, w.n, w.k, sms);
  p.splits = sc.splits;
  p.units = int64_t(p.row_groups) * p.token_tiles;
  p.split_tiles = sc.split_tiles;
  if (p.units + p.split_tiles * (p.splits - 1) > INT32_MAX)
    return Status::Invalid("m: the prefill grid holds at most 2^31 - 1 CTAs");
  p.grid = int(p.units + p.split_tiles * (p.splits - 1));
  if (p.splits > 1) {
    p.counters_bytes = counters_region(p.split_tiles);
    p.partials_bytes = size_t(p.split_tiles) * p.splits * k.partial_floats * sizeof(float);
  }
  if (mma) {
    p.workspace_bytes = p.counters_bytes + p.partials_bytes;  // X is read in place
  } else {
    // Lane-ordered X after the counter region even without splits: other shapes' counters there stay zero.
    p.lane_x_offset = (std::max(kCounterRegionBytes, p.counters_bytes) + p.partials_bytes + 255) / 256 * 256;
    p.workspace_bytes = p.lane_x_offset + size_t(p.pass_m) * size_t(row_bytes);
  }
  p.lane_x_sms = sms;
  // Two splits of tiles of >= kPairMinBn tokens: each split tile's CTAs finish it through each other's shared
  // memory, launched as 2-CTA clusters (prefill_gemm_sm90.cuh, "split K in a pair"; same-run A/B on the H200:
  // Llama-3.3-70B o at m = 128 5% faster, down at m = 128-256 1-1.5%). FP4KIT_PREFILL_PAIRS=0 keeps the
  // workspace path everywhere (A/B runs).
  p.cluster = !mma && p.splits == 2 && bn >= pk::kPairMinBn && prefill_pairs_enabled() ? 2 : 0;
  *out = p;
  return Status::Ok();
}

// The shape fields of a launch over `m` tokens and a weight of layout `l` (pointers and workspace are the
// caller's).
static pk::PrefillParams shape_params(const PackedLayout& l, int64_t m, int row_blocks, int token_tiles, int splits,
                                      int split_from) {
  pk::PrefillParams p{};
  p.m = int(m);
  p.n = int(l.n);
  p.k = int(l.k);
  p.row_tiles = int(l.row_tiles);
  p.k_chunks = int(l.k_chunks);
  p.k_macros = int(l.k_macros);
  p.row_blocks = row_blocks;
  p.token_tiles = token_tiles;
  p.splits = splits;
  p.split_from = split_from;
  return p;
}

// One cuTensorMapEncodeTiled call: unit element strides, no interleave, 256-byte L2 promotion, zero fill
// out of bounds; `what` names the tensor in the error.
static Status encode_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, const void* base,
                           const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                           CUtensorMapSwizzle swizzle, const char* what) {
  EncodeTiledFn encode = nullptr;
  FP4KIT_RETURN_IF_ERROR(encode_fn(&encode));
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r = encode(map, type, rank, const_cast<void*>(base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status(Code::kCudaError, std::string(what) + ": cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")");
  return Status::Ok();
}

// X as a TMA tensor: {k, rows} elements, rows k * 2 bytes apart, boxes of {64 K, `bn` tokens} with the
// 128-byte swizzle wgmma's descriptor expects; out-of-bounds elements (past k, past rows) read as zero.
static Status x_tensor_map(const void* x, int64_t k, int64_t rows, DType act, int bn, CUtensorMap* map) {
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(k) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(bn)};
  return encode_tiled(map, act == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, x,
                      dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B, "prefill (X)");
}
// The three maps of a grouped launch's X: boxes of a whole, a half and a quarter tile (narrow tiles load
// only theirs).
static Status x_tensor_maps(const void* x, int64_t k, int64_t rows, DType act, int bn, CUtensorMap* map,
                            pk::NarrowX* narrow) {
  FP4KIT_RETURN_IF_ERROR(x_tensor_map(x, k, rows, act, bn, map));
  FP4KIT_RETURN_IF_ERROR(x_tensor_map(x, k, rows, act, bn / 2, &narrow->half));
  return x_tensor_map(x, k, rows, act, bn / 4, &narrow->quarter);
}

// The prepacked weight records as a TMA tensor of bytes {256, 2 k_chunks, row_tiles, experts}: 256-byte
// pieces (two per 64-K chunk), row tiles k_chunks * 512 bytes apart, experts `stride` bytes apart; boxes of
// {256, 4, 8, 1}, one stage's records of a CTA's 8 row tiles, landing as [row tile][1 KB] as the kernel
// reads them. Pieces past the chunks and row tiles past the matrix read as zero.
static Status w_tensor_map(const void* weights, const PackedLayout& l, int experts, size_t stride, CUtensorMap* map) {
  const cuuint64_t row_tile_bytes = cuuint64_t(l.k_chunks) * 512;
  const cuuint64_t dims[4] = {256, cuuint64_t(2 * l.k_chunks), cuuint64_t(l.row_tiles), cuuint64_t(experts)};
  const cuuint64_t strides[3] = {256, row_tile_bytes, experts > 1 ? cuuint64_t(stride) : row_tile_bytes * l.row_tiles};
  const cuuint32_t box[4] = {256, 2 * pk::kStageChunks, pk::kRowTilesPerCta, 1};
  return encode_tiled(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, weights, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE,
                      "prefill (weights)");
}

// The weight, bias and split-K workspace fields of a dense launch (either kernel).
static void dense_operands(const GemmArgs& a, const DecodePlan& plan, pk::PrefillParams& p) {
  const PackedLayout& l = plan.layout;
  const uint8_t* base = static_cast<const uint8_t*>(a.w.data);
  uint8_t* ws = static_cast<uint8_t*>(a.workspace);
  p.bias = a.bias;
  p.weights = base + l.weights_offset;
  p.scales = base + l.scales_offset;
  p.out_scale = reinterpret_cast<const float*>(base + l.out_scale_offset);
  p.counters = plan.splits > 1 ? reinterpret_cast<int*>(ws) : nullptr;
  p.partials = plan.splits > 1 ? reinterpret_cast<float*>(ws + plan.counters_bytes) : nullptr;
}

// The mma.sync kernel: one launch over all m tokens, X in place.
static Status launch_prefill_mma(const GemmArgs& a, const DecodePlan& plan, cudaStream_t stream) {
  const int64_t tiles = int64_t(plan.row_groups) * plan.token_tiles;
  pk::PrefillParams p =
      shape_params(plan.layout, a.m, plan.row_groups, plan.token_tiles, plan.splits, int(tiles - plan.split_tiles));
  p.x = a.x;
  p.y = a.y;
  dense_operands(a, plan, p);
  const MmaFn fn = reinterpret_cast<MmaFn>(const_cast<void*>(plan.kernel));
  fn<<<unsigned(plan.grid), plan.threads, plan.smem_bytes, stream>>>(p);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return Status(Code::kCudaError, std::string("prefill launch: ") + cudaGetErrorString(e));
  return Status::Ok();
}

Status launch_prefill(const GemmArgs& a, const DecodePlan& plan, cudaStream_t stream) {
  if (plan.cfg->pipeline == kMma) return launch_prefill_mma(a, plan, stream);
  const PackedLayout& l = plan.layout;
  const int bn = 8 * plan.cfg->n_tiles;
  uint8_t* ws = static_cast<uint8_t*>(a.workspace);
  const PrefillFn fn = reinterpret_cast<PrefillFn>(const_cast<void*>(plan.kernel));
  const size_t eb = size_t(dtype_bytes(a.act));
  CUtensorMap wmap;
  FP4KIT_RETURN_IF_ERROR(w_tensor_map(static_cast<const uint8_t*>(a.w.data) + l.weights_offset, l, 1, 0, &wmap));
  for (int64_t t0 = 0; t0 < a.m; t0 += plan.pass_m) {
    const int64_t m = std::min(plan.pass_m, a.m - t0);
    const void* x = static_cast<const uint8_t*>(a.x) + size_t(t0) * size_t(a.w.k) * eb;
    // X of this pass into lane order (the kernel's K order, kernels/lane_order.cuh) in the workspace.
    void* xl = ws + plan.lane_x_offset;
    launch_lane_order(x, nullptr, nullptr, m, l.format, l.k, l.k_pad, xl, plan.lane_x_sms, stream, plan.pdl);
    CUtensorMap map;
    FP4KIT_RETURN_IF_ERROR(x_tensor_map(xl, l.k_pad, m, a.act, bn, &map));
    const int token_tiles = int((m + bn - 1) / bn);
    // A short last token tile runs narrow wgmmas on a narrow X box (layout::tile_width; m = 9-32: a single
    // such tile), as the MoE's short tiles do: its two narrow maps only then.
    pk::NarrowX narrow{};
    const bool narrow_last =
        bn == layout::kDenseNarrowBn && layout::tile_width(bn, m - int64_t(token_tiles - 1) * bn) < bn;
    if (narrow_last) {
      FP4KIT_RETURN_IF_ERROR(x_tensor_map(xl, l.k_pad, m, a.act, bn / 2, &narrow.half));
      FP4KIT_RETURN_IF_ERROR(x_tensor_map(xl, l.k_pad, m, a.act, bn / 4, &narrow.quarter));
    }
    // The plan's split tail, in every pass (a short last pass splits at most all of its tiles).
    const int64_t tiles = int64_t(plan.row_groups) * token_tiles;
    const int64_t split_tiles = std::min(plan.split_tiles, tiles);
    pk::PrefillParams p = shape_params(l, m, plan.row_groups, token_tiles, plan.splits, int(tiles - split_tiles));
    p.y = static_cast<uint8_t*>(a.y) + size_t(t0) * size_t(l.n) * eb;
    p.narrow = narrow_last;
    dense_operands(a, plan, p);
    // A pass whose split tail starts on an even CTA runs it in pairs (plan.cluster): every cluster of two is
    // then one split tile's two CTAs, or two whole-K tiles.
    p.pairs = plan.cluster == 2 && split_tiles > 0 && (tiles - split_tiles) % 2 == 0;
    // With PDL (plan.pdl) the GEMM's CTAs start as the lane-order pass's leave and wait for X inside.
    launch_kernel_cluster(fn, dim3(unsigned(tiles + split_tiles * (plan.splits - 1))), dim3(plan.threads),
                          size_t(plan.smem_bytes), stream, plan.pdl, p.pairs ? 2 : 1, map, narrow, wmap, p);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return Status(Code::kCudaError, std::string("prefill launch: ") + cudaGetErrorString(e));
  return Status::Ok();
}

dim3 row_vector_grid(int64_t max_rows, int64_t row_vecs, int sms) {
  const int64_t y = std::max<int64_t>(1, (row_vecs + kRowVectorThreads - 1) / kRowVectorThreads);
  const int64_t x = std::max<int64_t>(1, std::min<int64_t>(max_rows, std::max<int64_t>(1, int64_t(std::max(sms, 1)) * 16 / y)));
  return dim3(unsigned(x), unsigned(y));
}

cudaError_t launch_lane_order(const void* src, const int* map, const int* n_rows, int64_t rows, Format f, int64_t k,
                              int64_t k_pad, void* dst, int sms, cudaStream_t stream, bool pdl, bool natural,
                              bool late_trigger) {
  return launch_kernel(&kernels::lane_order_kernel, row_vector_grid(rows, k_pad / 8, sms), dim3(kRowVectorThreads),
                       0, stream, pdl, static_cast<const uint32_t*>(src), map, n_rows, rows, f, int(k), int(k_pad),
                       natural, late_trigger, static_cast<uint4*>(dst));
}

cudaError_t launch_split_rows(const void* src, const int* map, const int* n_rows, int64_t rows, int64_t k, void* dst,
                              int sms, cudaStream_t stream, bool pdl, bool late_trigger) {
  const int64_t kx = split_x_row(k) / 2;
  return launch_kernel(&kernels::split_rows_kernel, row_vector_grid(rows, kx / 8, sms), dim3(kRowVectorThreads), 0,
                       stream, pdl, static_cast<const uint4*>(src), map, n_rows, rows, int(k), int(kx), late_trigger,
                       static_cast<uint4*>(dst));
}

Status plan_prefill_grouped(Format f, DType act, int64_t n, int64_t k, const KernelConfig& cfg,
                            GroupedPrefillPlan* out) {
  GroupedPrefillPlan p;
  PrefillKernel kn;
  FP4KIT_RETURN_IF_ERROR(kernel_for_config(cfg, f, act, true, &kn, &p.sms));
  FP4KIT_RETURN_IF_ERROR(packed_layout(f, n, k, &p.layout));
  p.kernel = kn.fn;
  p.mma = cfg.pipeline == kMma;
  p.threads = p.mma ? mk::kThreads : pk::kThreads;
  p.smem_bytes = kn.smem;
  p.bn = 8 * cfg.n_tiles;
  p.row_blocks = int((p.layout.row_tiles + pk::kRowTilesPerCta - 1) / pk::kRowTilesPerCta);
  *out = p;
  return Status::Ok();
}

// mma.sync (moe_bf16_mma.cuh): 64-token tiles one CTA per SM with a 4-stage ring, 128-token tiles two CTAs
// per SM (3 stages, 128 registers: one CTA's ring fill and epilogue overlap the other's main loop). Both
// take 96 KB of shared memory, which every sm_80+ device has per block. gpt-oss-120b at T = 8192 (H200,
// docs/moe-notes.md): 128-token tiles two per SM 6.4 ms, one per SM 7.2 ms, 256-token tiles one per SM 6.7
// ms; 64-token tiles two per SM 1-3% slower than one. wgmma (moe_bf16_wgmma.cuh): one CTA per SM.
Status plan_grouped_bf16(int64_t n, int64_t k, int bn, bool wgmma, GroupedPrefillPlan* out) {
  namespace bm = kernels::bf16mma;
  namespace bw = kernels::bf16wgmma;
  GroupedPrefillPlan p;
  if (wgmma) {
    switch (bn) {
      case 64: p.kernel = reinterpret_cast<const void*>(&bw::moe_bf16_wgmma_kernel<64>), p.smem_bytes = bw::Geometry<64>::kSmem; break;
      case 128: p.kernel = reinterpret_cast<const void*>(&bw::moe_bf16_wgmma_kernel<128>), p.smem_bytes = bw::Geometry<128>::kSmem; break;
      case 256: p.kernel = reinterpret_cast<const void*>(&bw::moe_bf16_wgmma_kernel<256>), p.smem_bytes = bw::Geometry<256>::kSmem; break;
      default: return Status(Code::kInternal, "fused_moe: BF16 experts' wgmma kernel has no " + std::to_string(bn) + "-token tile");
    }
    FP4KIT_RETURN_IF_ERROR(check_image(p.kernel));
    p.threads = bw::kThreads;
    p.bf16_wgmma = true;
  } else {
    p.mma = true;
    if (bn != 64 && bn != 128)
      return Status(Code::kInternal, "fused_moe: BF16 experts' mma.sync kernel has no " + std::to_string(bn) + "-token tile");
    const bool wide = bn == 128;
    p.kernel = wide ? reinterpret_cast<const void*>(&bm::moe_bf16_mma_kernel<128, 3, 2>)
                    : reinterpret_cast<const void*>(&bm::moe_bf16_mma_kernel<64, 4, 1>);
    p.threads = bm::kThreads;
    p.smem_bytes = wide ? bm::Geometry<128, 3>::kSmem : bm::Geometry<64, 4>::kSmem;
  }
  p.bn = bn;
  p.row_blocks = int((n + bm::kRows - 1) / bm::kRows);
  p.layout.n = n;
  p.layout.k = k;
  int per_sm = 0;
  FP4KIT_RETURN_IF_ERROR(resident_per_sm(p.kernel, p.threads, p.smem_bytes, nullptr, &p.sms, &per_sm));
  if (per_sm < 1)
    return Status::Unsupported("fused_moe: the BF16 experts' tensor-core kernel (" + std::to_string(p.smem_bytes / 1024) +
                               " KB of shared memory per block) does not fit this device");
  *out = p;
  return Status::Ok();
}

// The experts' BF16 weights as a TMA tensor {k, n, experts} (rows k * 2 bytes apart, experts `stride`
// bytes apart), boxes of {64 K, 128 rows, 1 expert} with the 128-byte swizzle; past k and n read as zero.
static Status bf16_w_tensor_map(const void* base, int64_t n, int64_t k, int experts, size_t stride, CUtensorMap* map) {
  const cuuint64_t dims[3] = {cuuint64_t(k), cuuint64_t(n), cuuint64_t(experts)};
  const cuuint64_t strides[2] = {cuuint64_t(k) * 2, cuuint64_t(experts > 1 ? stride : size_t(n * k * 2))};
  const cuuint32_t box[3] = {uint32_t(kernels::bf16wgmma::kStageK), uint32_t(kernels::bf16wgmma::kRows), 1};
  return encode_tiled(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B,
                      "fused_moe (BF16 experts)");
}

Status launch_prefill_grouped(const GroupedPrefillPlan& plan, const GroupedPrefillArgs& a, cudaStream_t stream) {
  const PackedLayout& l = plan.layout;
  const int64_t grid = int64_t(plan.row_blocks) * a.max_tiles;
  if (grid > INT32_MAX) return Status::Invalid("tokens: the grouped prefill grid holds at most 2^31 - 1 CTAs");
  pk::PrefillParams p = shape_params(l, a.rows, plan.row_blocks, a.max_tiles, 1, 0);
  p.y = a.y;
  p.group = pk::PrefillGroup{a.n_tiles, a.tile_expert, a.tile_row, kernels::expert_stack(a.base, a.stride, a.bias, l)};
  p.x_split = a.x_split ? int(split_x_row(l.k) / 128) : 0;
  p.early_w = a.early_w;
  p.early_trigger = a.early_trigger;
  p.one = a.one;
  if (plan.bf16_wgmma) {
    // Natural order, rows k long (x_split: hi and lo chunks, split_x_row(k) long); both operands by TMA.
    CUtensorMap map, wmap;
    pk::NarrowX narrow;
    FP4KIT_RETURN_IF_ERROR(x_tensor_maps(a.x, a.x_split ? split_x_row(l.k) : l.k, a.rows, a.act, plan.bn, &map, &narrow));
    FP4KIT_RETURN_IF_ERROR(bf16_w_tensor_map(a.base, l.n, l.k, a.experts, a.stride, &wmap));
    launch_kernel(reinterpret_cast<PrefillFn>(const_cast<void*>(plan.kernel)), dim3(unsigned(grid)), dim3(plan.threads),
                  size_t(plan.smem_bytes), stream, a.pdl, map, narrow, wmap, p);
  } else if (plan.mma) {
    p.x = a.x;  // natural order, rows k long (the FP4 and the BF16 experts' mma.sync kernels)
    reinterpret_cast<MmaFn>(const_cast<void*>(plan.kernel))<<<unsigned(grid), plan.threads, plan.smem_bytes, stream>>>(p);
  } else {
    // Lane order, rows k_pad long.
    CUtensorMap map;
    pk::NarrowX narrow;
    FP4KIT_RETURN_IF_ERROR(x_tensor_maps(a.x, l.k_pad, a.rows, a.act, plan.bn, &map, &narrow));
    CUtensorMap wmap;
    FP4KIT_RETURN_IF_ERROR(w_tensor_map(static_cast<const uint8_t*>(a.base) + l.weights_offset, l, a.experts, a.stride,
                                        &wmap));
    launch_kernel(reinterpret_cast<PrefillFn>(const_cast<void*>(plan.kernel)), dim3(unsigned(grid)), dim3(plan.threads),
                  size_t(plan.smem_bytes), stream, a.pdl, map, narrow, wmap, p);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return Status(Code::kCudaError, std::string("grouped prefill launch: ") + cudaGetErrorString(e));
  return Status::Ok();
}

}  // namespace detail
}  // namespace fp4kit
