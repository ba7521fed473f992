// fp4kit-trace-prefill: where one Hopper prefill GEMM call's time goes, from timestamps taken inside the kernel.
//
//   fp4kit-trace-prefill [--shapes N:K,...] [--m 64] [--config NAME] [--runs 10] [--dump PATH]
//
// --dump PATH writes the last run's records of the last shape as CSV, one line per CTA: its index, SM, and
// in SM cycles its entry, main-loop end, epilogue start (0 where it has none), leave, and warpgroup 0's
// first stage ready (the timeline of each SM's CTAs one after another, e.g. a split tail's second wave).
//
// The question it answers (docs/prefill-notes.md, "Narrow tiles for dense m = 9-32"): at m = 16-64 the
// kernel's time grows by about the tensor pipe's time per token on top of the weight stream, as if the
// MMAs did not overlap the stream. The wgmma kernel (NVFP4, BF16 activations) is compiled here with
// FP4KIT_PREFILL_TRACE as its kTrace = 1 instantiation (the library has only kTrace = 0, without
// timestamps) and launched through the library's own plan and launch (lane-order pass, tensor maps, grid,
// split tail). Per CTA the kernel records (prefill_gemm_sm90.cuh): its SM, entry, the end of its main loop,
// and per ring stage r: when each consumer warpgroup finds the stage's data there ("ready"), when it has
// issued the stage's last wgmma group and the group before it retired ("done"), and when the producer
// requested the stage's weight records ("request"). Printed per shape, medians over CTAs and runs, in SM
// cycles: per stage a warpgroup's work (done - ready), its wait for data (ready - the previous done),
// request to ready; per CTA the first stage's wait (entry to ready 0), the main loop, the split and
// epilogue tail; and the share of main-loop time the warpgroups wait for data, per warpgroup (the more and
// the less waiting one of each CTA) and the skew of the two; per SM the span from its first CTA's entry to
// its last CTA's end and how full its CTA slots stayed. With the MMA cycles one
// stage needs at the SM's full rate beside them: work far above them and little waiting says the
// warpgroups serialise dequantisation and MMAs; much waiting says the ring runs dry (bytes in flight).
// Weights rotate over copies past 2x L2 (cold).
#define FP4KIT_PREFILL_TRACE 1
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "bench_common.cuh"
#include "configs.h"
#include "fp4kit/gemm.h"
#include "fp4kit/repack.h"
#include "gemm_internal.h"
#include "kernels/prefill_gemm_sm90.cuh"
#include "prefill.h"

using namespace fp4kit;
using namespace fp4bench;
namespace pk = kernels::prefill;

namespace {

// The traced kernel of a dense wgmma entry (NVFP4, BF16), or null for another token tile.
const void* traced_kernel(const KernelConfig& c) {
  const int bn = 8 * c.n_tiles;
  using B = __nv_bfloat16;
  if (bn == 64 && c.min_blocks == 2) return reinterpret_cast<const void*>(&pk::prefill_gemm_kernel<Format::kNVFP4, B, 64, false, 2, 1>);
  if (bn == 64) return reinterpret_cast<const void*>(&pk::prefill_gemm_kernel<Format::kNVFP4, B, 64, false, 1, 1>);
  if (bn == 128) return reinterpret_cast<const void*>(&pk::prefill_gemm_kernel<Format::kNVFP4, B, 128, false, 1, 1>);
  if (bn == 256) return reinterpret_cast<const void*>(&pk::prefill_gemm_kernel<Format::kNVFP4, B, 256, false, 1, 1>);
  return nullptr;
}

// One run's trace (grid CTAs of kTraceRecord values) reduced to the printed medians, in SM cycles.
// Per SM (clock64 counts per SM, so spans are compared within an SM only): span, its first CTA's entry to
// its last CTA's end (main loop, or the fixup when split); occupancy, the CTAs' summed entry-to-end time over
// span x CTAs per SM (min_blocks), i.e. how full the SM's CTA slots stayed while it had work.
struct Phases {
  double work = 0, wait = 0, latency = 0, first = 0, loop = 0, tail = 0, wait_share = 0;
  double span_max = 0, span_med = 0, occupancy = 0, ctas_max = 0;
  double wait_hi = 0, wait_lo = 0, skew = 0;  // per CTA the more / less waiting warpgroup's mean wait per
                                              // stage; per stage |ready of warpgroup 0 - ready of 1|
};
Phases reduce(const std::vector<unsigned long long>& h, int grid, int per_sm) {
  std::vector<double> work, wait, latency, first, loop, tail, share, wait_hi, wait_lo, skew;
  std::map<unsigned long long, std::vector<std::pair<unsigned long long, unsigned long long>>> by_sm;
  for (int b = 0; b < grid; ++b) {
    const unsigned long long* t = &h[size_t(b) * pk::kTraceRecord];
    auto ev = [&](int r, int e) { return t[pk::kTraceHeader + r * pk::kTraceEvents + e]; };
    if (t[1] && t[2]) by_sm[t[0]].push_back({t[1], std::max(t[2], t[3])});
    if (!t[1] || !ev(0, 0)) continue;
    first.push_back(double(ev(0, 0) - t[1]));
    if (t[2]) loop.push_back(double(t[2] - t[1]));
    if (t[2] && t[3]) tail.push_back(double(t[3] - t[2]));
    double spent = 0, wg_wait[2] = {0, 0};  // main-loop cycles; each warpgroup's summed wait
    int wg_stages[2] = {0, 0};
    for (int r = 0; r < pk::kTraceStages && ev(r, 0) && ev(r, 2); ++r)
      skew.push_back(std::fabs(double(ev(r, 0)) - double(ev(r, 2))));
    for (int w = 0; w < 2; ++w)
      for (int r = 0; r < pk::kTraceStages && ev(r, 2 * w) && ev(r, 2 * w + 1); ++r) {
        work.push_back(double(ev(r, 2 * w + 1) - ev(r, 2 * w)));
        spent += double(ev(r, 2 * w + 1) - ev(r, 2 * w));
        if (r > 0) {
          const double wt = double(ev(r, 2 * w)) - double(ev(r - 1, 2 * w + 1));
          wait.push_back(wt);
          wg_wait[w] += wt;
          ++wg_stages[w];
          spent += wt;
        }
        if (w == 0 && ev(r, 4)) latency.push_back(double(ev(r, 0)) - double(ev(r, 4)));
      }
    if (spent > 0) share.push_back((wg_wait[0] + wg_wait[1]) / spent);
    if (wg_stages[0] > 0 && wg_stages[1] > 0) {
      const double a = wg_wait[0] / wg_stages[0], b = wg_wait[1] / wg_stages[1];
      wait_hi.push_back(std::max(a, b));
      wait_lo.push_back(std::min(a, b));
    }
  }
  std::vector<double> spans;
  double busy = 0, slots = 0, ctas_max = 0;
  for (const auto& [sm, v] : by_sm) {
    unsigned long long lo = ~0ull, hi = 0;
    for (const auto& [b, e] : v) {
      lo = std::min(lo, b), hi = std::max(hi, e);
      busy += double(e - b);
    }
    spans.push_back(double(hi - lo));
    slots += double(hi - lo) * per_sm;
    ctas_max = std::max(ctas_max, double(v.size()));
  }
  const double span_max = spans.empty() ? 0 : *std::max_element(spans.begin(), spans.end());
  return {median(work), median(wait), median(latency), median(first), median(loop), median(tail), median(share),
          span_max,     median(spans), slots > 0 ? busy / slots : 0, ctas_max,
          median(wait_hi), median(wait_lo), median(skew)};
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> opt = {
      {"shapes", "57344:8192,10240:8192,8192:8192,8192:28672"}, {"m", "64"}, {"config", ""}, {"runs", "10"}, {"dump", ""}};
  for (int i = 1; i + 1 < argc; i += 2) opt[std::string(argv[i]).substr(2)] = argv[i + 1];
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("No CUDA GPU found: fp4kit-trace-prefill needs an NVIDIA GPU\n");
    return 0;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::printf("fp4kit-trace-prefill: the wgmma prefill kernel needs a compute capability 9.x GPU (this is %d.%d)\n",
                prop.major, prop.minor);
    return 0;
  }
  int khz = 0;
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  const double ghz = khz * 1e-6;  // clock64 ticks per ns
  const int m = std::atoi(opt["m"].c_str()), runs = std::atoi(opt["runs"].c_str());
  if (m < 1 || runs < 1) {
    std::fprintf(stderr, "fp4kit-trace-prefill: --m and --runs must be >= 1\n");
    return 2;
  }
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  std::printf("# %s, m = %d, NVFP4, BF16; SM clock %.2f GHz; per stage in SM cycles, per CTA in us (medians)\n",
              prop.name, m, ghz);
  std::printf("%-12s %-16s %5s %7s | %6s %6s %6s %6s %6s | %6s %7s %6s | %7s %7s %5s %3s | %6s %6s %6s\n", "shape",
              "config", "grid", "graph", "mma", "work", "wait", "req", "wait%", "first", "loop", "tail", "span", "span50",
              "occ", "ctas", "waitHi", "waitLo", "skew");
  for (const std::string& sh : split(opt["shapes"])) {
    long long n = 0, k = 0;
    if (std::sscanf(sh.c_str(), "%lld:%lld", &n, &k) != 2 || n < 1 || k < 1) {
      std::fprintf(stderr, "fp4kit-trace-prefill: --shapes entries are N:K (got '%s')\n", sh.c_str());
      return 2;
    }
    int cfg_id = -1;
    if (!opt["config"].empty()) {
      int count = 0;
      const KernelConfig* table = kernel_configs(&count);
      for (int i = 0; i < count; ++i)
        if (opt["config"] == table[i].name) cfg_id = table[i].id;
      if (cfg_id < 0) {
        std::fprintf(stderr, "fp4kit-trace-prefill: --config '%s' is not a table entry\n", opt["config"].c_str());
        return 2;
      }
    }
    PackedLayout l;
    CKS(packed_layout(Format::kNVFP4, n, k, &l));
    const int copies = int(std::max<size_t>(2, (2 * size_t(prop.l2CacheSize)) / l.total_bytes + 2));
    const std::vector<void*> wp = random_prepacked_copies(l, copies);
    detail::DecodePlan plan;
    CKS(detail::make_plan(m, PackedWeight{Format::kNVFP4, n, k, wp[0]}, DType::kBF16, cfg_id, &plan));
    const void* fn = plan.cfg && plan.cfg->pipeline == kWgmma ? traced_kernel(*plan.cfg) : nullptr;
    if (!fn || plan.pass_m < m) {
      std::fprintf(stderr, "fp4kit-trace-prefill: %s at m = %d is not one pass of a wgmma prefill entry (%s)\n",
                   sh.c_str(), m, plan.cfg ? plan.cfg->name : "none");
      return 2;
    }
    plan.kernel = fn;  // the traced twin of the planned kernel: same template arguments, same launch
    CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.smem_bytes));
    void *x = nullptr, *y = nullptr, *ws = nullptr;
    CK(cudaMalloc(&x, size_t(m) * k * 2));
    CK(cudaMalloc(&y, size_t(m) * n * 2));
    fill16(x, size_t(m) * k, 7u, true);
    if (plan.workspace_bytes) {
      CK(cudaMalloc(&ws, plan.workspace_bytes));
      CK(cudaMemset(ws, 0, plan.workspace_bytes));
    }
    CK(cudaDeviceSynchronize());
    auto launch = [&](int i) {
      GemmArgs a;
      a.m = m;
      a.x = x;
      a.y = y;
      a.w = PackedWeight{Format::kNVFP4, n, k, wp[size_t(i % copies)]};
      a.workspace = ws;
      a.workspace_bytes = plan.workspace_bytes;
      CKS(detail::launch_prefill(a, plan, s));
    };
    unsigned long long* dtrace = nullptr;
    CK(cudaMemcpyToSymbol(pk::g_prefill_trace, &dtrace, sizeof(dtrace)));  // null: no timestamps
    const double graph_us = graph_time_us(s, std::max(copies, 8), 100, launch);
    const size_t words = size_t(plan.grid) * pk::kTraceRecord;
    CK(cudaMalloc(&dtrace, words * 8));
    CK(cudaMemcpyToSymbol(pk::g_prefill_trace, &dtrace, sizeof(dtrace)));
    std::vector<unsigned long long> h(words);
    std::vector<Phases> got;
    for (int r = 0; r < runs + 2; ++r) {
      CK(cudaMemsetAsync(dtrace, 0, words * 8, s));
      launch(r);
      CK(cudaStreamSynchronize(s));
      if (r < 2) continue;  // warm-up
      CK(cudaMemcpy(h.data(), dtrace, words * 8, cudaMemcpyDeviceToHost));
      got.push_back(reduce(h, int(plan.grid), plan.cfg->min_blocks));
    }
    if (!opt["dump"].empty()) {
      FILE* f = std::fopen(opt["dump"].c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "fp4kit-trace-prefill: cannot write --dump '%s'\n", opt["dump"].c_str());
        return 2;
      }
      std::fprintf(f, "cta,sm,entry,loop_end,epilogue,leave,ready0\n");
      for (long long b = 0; b < plan.grid; ++b) {
        const unsigned long long* t = &h[size_t(b) * pk::kTraceRecord];
        std::fprintf(f, "%lld,%llu,%llu,%llu,%llu,%llu,%llu\n", b, t[0], t[1], t[2], t[3], t[4], t[pk::kTraceHeader]);
      }
      std::fclose(f);
    }
    unsigned long long* null_trace = nullptr;
    CK(cudaMemcpyToSymbol(pk::g_prefill_trace, &null_trace, sizeof(null_trace)));
    auto pick = [&](double Phases::*f) {
      std::vector<double> v;
      for (const Phases& p : got) v.push_back(p.*f);
      return median(v);
    };
    // One warpgroup's MMAs of one stage at the SM's full rate (2048 MACs per cycle): 2 chunks x 4 k16 steps
    // of 64 rows x the tile's width (narrow at m <= 32 on BN = 64).
    const double mma = 2.0 * 4 * 64 * prefill_width(*plan.cfg, m) * 16 / 2048.0;
    const double us = 1e-3 / ghz;
    std::printf("%-12s %-16s %5lld %7.1f | %6.0f %6.0f %6.0f %6.0f %5.0f%% | %6.2f %7.2f %6.2f | %7.1f %7.1f %4.0f%% %3.0f | %6.0f %6.0f %6.0f\n",
                sh.c_str(), plan.cfg->name, (long long)plan.grid, graph_us, mma, pick(&Phases::work),
                pick(&Phases::wait), pick(&Phases::latency), 100 * pick(&Phases::wait_share),
                pick(&Phases::first) * us, pick(&Phases::loop) * us, pick(&Phases::tail) * us,
                pick(&Phases::span_max) * us, pick(&Phases::span_med) * us, 100 * pick(&Phases::occupancy),
                pick(&Phases::ctas_max), pick(&Phases::wait_hi), pick(&Phases::wait_lo), pick(&Phases::skew));
    std::fflush(stdout);
    CK(cudaFree(dtrace));
    for (void* p : wp) CK(cudaFree(p));
    CK(cudaFree(x));
    CK(cudaFree(y));
    if (ws) CK(cudaFree(ws));
  }
  std::printf("graph: per-call us in a CUDA graph (no timestamps); per stage (SM cycles): mma, one warpgroup's\n"
              "wgmmas at the SM's full rate; work, ready to done; wait, previous done to ready; req, the producer's\n"
              "request to warpgroup 0's ready; wait%%: waiting share of a warpgroup's main loop. Per CTA (us): first,\n"
              "entry to the first stage ready; loop, entry to the end of the main loop; tail, the split fixup (last\n"
              "split only). Per SM (us): span max / median, first entry to last end; occ, CTA time over span x\n"
              "CTAs per SM; ctas, the most CTAs one SM ran. Per CTA (cycles): waitHi / waitLo, the mean wait per stage\n"
              "of its more / less waiting warpgroup; skew, |ready of warpgroup 0 - ready of warpgroup 1| per stage.\n");
  return 0;
}
