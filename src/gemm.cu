// gemm.cu: dispatch: the launch plan, the instantiated decode kernels (one per decode entry of the config
// table x format x activation dtype; the prefill kernel's host side is prefill.cu) and the entry points.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <utility>
#include <string>
#include <vector>

#include "configs.h"
#include "fp4kit/gemm.h"
#include "fp4kit/tuning.h"
#include "gemm_internal.h"
#include "decode_kernels.cuh"
#include "launch.h"
#include "prefill.h"
#include "repack_common.h"

namespace fp4kit {
namespace {

using KernelFn = detail::DecodeKernelFn;

// The config table, instantiated: entry I of kKernelConfigs becomes one kernel per (format, dtype).
template <Format F, typename T, size_t... I>
KernelFn kernel_for_impl(int id, std::index_sequence<I...>) {
  KernelFn fns[] = {detail::decode_kernel_of<F, T, I>()...};
  for (size_t i = 0; i < sizeof...(I); ++i)
    if (kKernelConfigs[i].id == id) return fns[i];
  return nullptr;
}
template <Format F, typename T>
KernelFn kernel_for(int id) {
  return kernel_for_impl<F, T>(id, std::make_index_sequence<size_t(kNumKernelConfigs)>{});
}

KernelFn select_kernel(Format f, DType act, int id) {
  if (f == Format::kNVFP4)
    return act == DType::kBF16 ? kernel_for<Format::kNVFP4, __nv_bfloat16>(id) : kernel_for<Format::kNVFP4, __half>(id);
  return act == DType::kBF16 ? kernel_for<Format::kMXFP4, __nv_bfloat16>(id) : kernel_for<Format::kMXFP4, __half>(id);
}

// Device facts and kernel occupancy, cached per (device, kernel): queried once, read on every call.
struct DeviceFacts {
  int sms = 0, major = 0, minor = 0;
  int smem_optin = 0;  // shared memory per block with opt-in, bytes
  std::string name;    // for tuning-table lookups
  // The compute capability dispatch reads the table with: major, except 8 on a Hopper device whose image
  // of this build is compute_80 code JIT-compiled (the sm_90-only code compiled out: the wgmma prefill
  // kernel; the decode kernel's cluster reduction, without which each CTA of a cluster would run its row
  // group's whole K), which then runs what an sm_80-89 device would run.
  int dispatch_major = 0;
};
std::mutex g_mu;
std::vector<DeviceFacts> g_devices;
struct Occupancy {
  int dev;
  const void* kernel;
  int blocks;       // CTAs per SM
  int max_cluster;  // cluster kernels: the largest cluster the device can schedule (0: not asked)
};
std::vector<Occupancy> g_occupancy;

Status device_facts(int* dev, DeviceFacts* out) {
  cudaError_t e = cudaGetDevice(dev);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status(Code::kCudaError, std::string("device: no usable CUDA device (") + cudaGetErrorString(e) + ")");
  }
  std::lock_guard<std::mutex> lock(g_mu);
  if (int(g_devices.size()) <= *dev) g_devices.resize(*dev + 1);
  if (g_devices[*dev].sms == 0) {
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, *dev);
    if (e != cudaSuccess) return Status(Code::kCudaError, std::string("device: ") + cudaGetErrorString(e));
    g_devices[*dev].sms = prop.multiProcessorCount;
    g_devices[*dev].major = prop.major;
    g_devices[*dev].minor = prop.minor;
    g_devices[*dev].smem_optin = int(prop.sharedMemPerBlockOptin);
    g_devices[*dev].name = prop.name;
    g_devices[*dev].dispatch_major = prop.major == 9 && !detail::prefill_runs_here() ? 8 : prop.major;
  }
  *out = g_devices[*dev];
  return Status::Ok();
}

}  // namespace

namespace detail {

Status resident_per_sm(const void* kernel, int threads, int smem, int* dev_out, int* sms, int* blocks,
                       int* max_cluster) {
  int dev = 0;
  DeviceFacts facts;
  FP4KIT_RETURN_IF_ERROR(device_facts(&dev, &facts));
  if (dev_out) *dev_out = dev;
  if (sms) *sms = facts.sms;
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Occupancy& o : g_occupancy)
    if (o.dev == dev && o.kernel == kernel && (!max_cluster || o.max_cluster > 0)) {
      *blocks = o.blocks;
      if (max_cluster) *max_cluster = o.max_cluster;
      return Status::Ok();
    }
  Occupancy o{dev, kernel, 0, 0};
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o.blocks, kernel, threads, size_t(smem));
  if (e == cudaSuccess && max_cluster) {
    // Clusters above the portable 8 CTAs where the device schedules them (Hopper: 16); the largest size it
    // can place for this kernel caps every plan's cluster (a partition or part with smaller GPCs gets
    // smaller clusters, not a failed launch).
    o.max_cluster = facts.major >= 9 ? 8 : 1;  // no clusters before sm_90
    if (facts.major >= 9 && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(unsigned(kernels::kMaxCluster));
      cfg.blockDim = dim3(unsigned(threads));
      cfg.dynamicSmemBytes = size_t(smem);
      int size = 0;
      if (cudaOccupancyMaxPotentialClusterSize(&size, kernel, &cfg) == cudaSuccess && size > 0) o.max_cluster = size;
    }
    cudaGetLastError();  // a refused query leaves the portable size, not a sticky error for the caller
    o.max_cluster = std::min(o.max_cluster, kernels::kMaxCluster);
  }
  if (e != cudaSuccess || o.blocks < 1)
    return Status(Code::kCudaError, std::string("kernel: cannot be resident on this device (") +
                                        (e != cudaSuccess ? cudaGetErrorString(e) : "occupancy 0") + ")");
  g_occupancy.push_back(o);
  *blocks = o.blocks;
  if (max_cluster) *max_cluster = o.max_cluster;
  return Status::Ok();
}

Status make_plan(int64_t m, const PackedWeight& w, DType act, int config, DecodePlan* plan) {
  FP4KIT_RETURN_IF_ERROR(check_shape(w.format, w.n, w.k));
  if (m < 1) return Status::Invalid("m: must be >= 1 (got " + str(m) + ")");
  if (act != DType::kBF16 && act != DType::kF16)
    return Status::Invalid(std::string("act: must be bfloat16 or float16 (got ") + dtype_name(act) + ")");
  int dev = 0;
  DeviceFacts facts;
  FP4KIT_RETURN_IF_ERROR(device_facts(&dev, &facts));
  if (facts.major < 8)
    return Status::Unsupported("device: fp4kit needs compute capability >= 8.0 (got " + std::to_string(facts.major) +
                               "." + std::to_string(facts.minor) + ")");
  int id = config >= 0 ? config
                       : dispatch_config(w.format, act, m, w.n, w.k, facts.name, nullptr, facts.dispatch_major, facts.sms);
  const KernelConfig* cfg = find_config(id);
  if (!cfg) return Status::Invalid("config: " + std::to_string(config) + " is not in the kernel config table");
  if (config < 0 && cfg->pipeline == kMma && mma_prefill_smem(*cfg) > facts.smem_optin) {
    // The 128-token ring does not fit this device's shared memory (sm_86 / sm_89: 99 KB): the 64-token
    // entry of the same K-split kind.
    for (int i = 0; i < kNumKernelConfigs; ++i) {
      const KernelConfig& c = kKernelConfigs[i];
      if (c.pipeline == kMma && c.max_splits == cfg->max_splits && mma_prefill_smem(c) <= facts.smem_optin) {
        cfg = &c;
        break;
      }
    }
  }
  if (!config_supported(*cfg, facts.major))
    return Status::Unsupported(std::string("config: ") + cfg->name + " needs a compute capability 9.x (Hopper) device (got " +
                               std::to_string(facts.major) + "." + std::to_string(facts.minor) + ")");
  if (is_prefill(*cfg)) {
    FP4KIT_RETURN_IF_ERROR(plan_prefill(m, w, act, *cfg, facts.sms, plan));
    // The wgmma kernel after its lane-order pass with programmatic dependent launch: its launch and the
    // first stages' weight requests overlap the pass (configs.h, prefill_pdl_default).
    plan->pdl = cfg->pipeline == kWgmma &&
                pdl_enabled(facts.major, prefill_pdl_default(m, plan->pass_m, plan->grid, facts.sms, cfg->min_blocks));
    return Status::Ok();
  }
  PackedLayout l;
  FP4KIT_RETURN_IF_ERROR(packed_layout(w.format, w.n, w.k, &l));
  KernelFn fn = select_kernel(w.format, act, id);
  if (!fn) return Status(Code::kInternal, "config " + std::to_string(id) + " has no instantiated kernel");
  int per_sm = 0;
  const int threads = launch_threads(*cfg), smem = launch_smem_bytes(*cfg);
  int max_cluster = 0;
  FP4KIT_RETURN_IF_ERROR(resident_per_sm(reinterpret_cast<const void*>(fn), threads, smem, nullptr, nullptr, &per_sm,
                                         cfg->pipeline == kCluster ? &max_cluster : nullptr));

  DecodePlan p;
  p.cfg = cfg;
  p.kernel = reinterpret_cast<const void*>(fn);
  p.threads = threads;
  p.smem_bytes = smem;
  p.layout = l;
  p.m_block = 8 * cfg->n_tiles;
  const int64_t rows_per_group = int64_t(cfg->warps) * cfg->row_tiles;
  p.row_groups = int((l.row_tiles + rows_per_group - 1) / rows_per_group);
  p.units = int64_t(p.row_groups) * l.k_macros;
  const int64_t resident = int64_t(facts.sms) * per_sm;
  p.grid = int(std::min<int64_t>(p.units, resident));
  if (cfg->balanced) {
    const int64_t per_cta = (p.units + resident - 1) / resident;
    p.grid = int((p.units + per_cta - 1) / per_cta);
  }
  if (cfg->pipeline == kCluster) {
    // Each row group's K over a cluster of S CTAs: about one wave of resident CTAs in all, every CTA at
    // least one K slice, at most the largest cluster the device schedules (resident_per_sm: 16 on the
    // H200, non-portable above 8). No workspace.
    const int64_t s = std::llround(double(resident) / double(p.row_groups));
    p.cluster = int(std::max<int64_t>(1, std::min<int64_t>({s, int64_t(max_cluster), l.k_macros})));
    p.grid = p.row_groups * p.cluster;
    p.pdl = pdl_enabled(facts.major, false);
    *plan = p;
    return Status::Ok();
  }
  // Split row groups exist only when some CTA's range does not cover whole row groups.
  const bool split = p.units % p.grid != 0 || (p.units / p.grid) % l.k_macros != 0;
  if (split) {
    p.counters_bytes = counters_region(p.row_groups);
    p.partials_bytes = size_t(p.grid) * 2 * partial_slot_bytes(*cfg);
  }
  p.workspace_bytes = p.counters_bytes + p.partials_bytes;
  p.pdl = pdl_enabled(facts.major, false);  // dense GEMM: opt-in (no measured gain)
  *plan = p;
  return Status::Ok();
}

bool env_not_zero(const char* name) {
  const char* v = std::getenv(name);
  return !(v != nullptr && std::string(v) == "0");
}

// FP4KIT_PDL: "1" on, "0" off, anything else (or unset) the caller's default. Read once.
static int pdl_env() {
  static const int env = [] {
    const char* v = std::getenv("FP4KIT_PDL");
    if (v == nullptr) return -1;
    if (std::string(v) == "1") return 1;
    if (std::string(v) == "0") return 0;
    return -1;
  }();
  return env;
}

bool pdl_enabled(int cc_major, bool by_default) {
  const int env = pdl_env();
  return cc_major == 9 && (env == 1 || (env == -1 && by_default));
}

bool pdl_enabled_here(bool by_default) {
  int dev = 0;
  DeviceFacts facts;
  return device_facts(&dev, &facts).ok() && pdl_enabled(facts.major, by_default);
}

}  // namespace detail

namespace {
// A workspace query: the plan's field `what` (its total, or the counters that lead it).
Status workspace_query(int64_t m, const PackedWeight& w, DType act, int config, size_t detail::DecodePlan::*what,
                       size_t* bytes) {
  if (!bytes) return Status::Invalid("bytes: must not be null");
  detail::DecodePlan plan;
  FP4KIT_RETURN_IF_ERROR(detail::make_plan(m, w, act, config, &plan));
  *bytes = plan.*what;
  return Status::Ok();
}
}  // namespace

Status gemm_workspace_bytes(int64_t m, const PackedWeight& w, DType act, size_t* bytes, int config) {
  return workspace_query(m, w, act, config, &detail::DecodePlan::workspace_bytes, bytes);
}

// The counters come first in every plan's workspace.
Status gemm_workspace_zero_bytes(int64_t m, const PackedWeight& w, DType act, size_t* bytes, int config) {
  return workspace_query(m, w, act, config, &detail::DecodePlan::counters_bytes, bytes);
}

Status gemm(const GemmArgs& a, cudaStream_t stream) {
  detail::DecodePlan plan;
  FP4KIT_RETURN_IF_ERROR(detail::validate(a, &plan));
  if (is_prefill(*plan.cfg)) return detail::launch_prefill(a, plan, stream);
  const PackedLayout& l = plan.layout;
  const KernelFn fn = reinterpret_cast<KernelFn>(const_cast<void*>(plan.kernel));

  const uint8_t* base = static_cast<const uint8_t*>(a.w.data);
  kernels::DecodeParams p = kernels::shape_params(l, plan.row_groups);
  p.bias = a.bias;
  p.weights = reinterpret_cast<const uint4*>(base + l.weights_offset);
  p.scales = base + l.scales_offset;
  p.out_scale = reinterpret_cast<const float*>(base + l.out_scale_offset);
  p.units = plan.units;
  uint8_t* ws = static_cast<uint8_t*>(a.workspace);
  p.counters = plan.workspace_bytes ? reinterpret_cast<int*>(ws) : nullptr;
  p.partials = plan.workspace_bytes ? reinterpret_cast<float*>(ws + plan.counters_bytes) : nullptr;
  p.pdl = plan.pdl;

  // m beyond one launch's tokens: consecutive launches over blocks of m_block tokens (stream-ordered, so
  // they share the workspace safely).
  for (int64_t m0 = 0; m0 < a.m; m0 += plan.m_block) {
    p.m = int(std::min<int64_t>(plan.m_block, a.m - m0));
    p.x = static_cast<const uint8_t*>(a.x) + m0 * a.w.k * 2;
    p.y = static_cast<uint8_t*>(a.y) + m0 * a.w.n * 2;
    detail::launch_kernel_cluster(fn, dim3(plan.grid), dim3(plan.threads), size_t(plan.smem_bytes), stream, plan.pdl,
                                  plan.cluster, p);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return Status(Code::kCudaError, std::string("gemm launch: ") + cudaGetErrorString(e));
  return Status::Ok();
}

}  // namespace fp4kit
