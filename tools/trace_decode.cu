// fp4kit-trace-decode: where one decode GEMM call's time goes, from timestamps taken inside the kernel.
//
//   fp4kit-trace-decode [--shapes N:K,N:K,...] [--m 1] [--runs 20] [--config ID]
//                       [--ablate 0,1,2,3 [--json FILE --commit HASH]]
//
// The register-ring decode kernel is compiled here with FP4KIT_DECODE_TRACE (the library's copy has no
// timestamps); launches use the library's own plan (grid, row groups, workspace). Thread 0 of every CTA
// records clock64 at: entry (0), its first stage multiplied (1), end of its first segment's main loop (2),
// after the stream-K arrival count (3), end of the first segment (4), end of the second segment's main loop
// (5), after its arrival count (6), exit (7); and %globaltimer at entry and exit. Weights rotate over copies
// past 2x L2 (cold), NVFP4, m = 1 (config m8_r1_w8_b3_c8x1) or m = 16 (m16_r1_w8_b2_c4x2).
// Printed per shape (medians over runs; per-CTA phases as medians over CTAs): graph per-call time of the
// same kernel, the kernel's span (first entry to last exit), CTA entry spread, exit spread, and the phases.
// --ablate instead times the same kernel (graph per-call time, best of 3 graphs) with parts switched off
// (decode_gemm.cuh, g_decode_ablate): 1 no dequantise-and-multiply (the loads stay), 2 no stream-K fixup
// (split segments write their partial results: wrong output), 3 both; each row also the time of the weight
// bytes at 4.25 TB/s. --json writes those rows with device, commit and date.
#define FP4KIT_DECODE_TRACE 1
#include <cuda_runtime.h>

#include <algorithm>
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
#include "kernels/decode_gemm.cuh"

using namespace fp4kit;
using namespace fp4bench;

namespace {

using Fn = void (*)(const kernels::DecodeParams);
template <int NT, int RW, int W, int MINB, int CH, int D>
Fn trace_kernel() {
  return &kernels::decode_gemm_kernel<Format::kNVFP4, __nv_bfloat16, NT, RW, W, MINB, CH, D, false>;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> opt = {
      {"shapes", "10240:8192,8192:8192,57344:8192,8192:28672,6144:4096,4096:4096,28672:4096,4096:14336"},
      {"m", "1"},
      {"runs", "20"},
      {"config", ""},
      {"ablate", ""},
      {"json", ""},
      {"commit", "unknown"}};
  for (int i = 1; i + 1 < argc; i += 2) opt[std::string(argv[i]).substr(2)] = argv[i + 1];
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("No CUDA GPU found: fp4kit-trace-decode needs an NVIDIA GPU\n");
    return 0;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int khz = 0;
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  const double ghz = khz * 1e-6;  // clock64 ticks per ns
  const int m = std::atoi(opt["m"].c_str());
  const int runs = std::atoi(opt["runs"].c_str());
  // The traced kernels (those of entries 0, 1, 4); --config may name any table entry with the same
  // template parameters.
  struct Traced { int id; Fn fn; };
  const Traced traced[] = {{0, trace_kernel<1, 1, 8, 3, 8, 1>()}, {1, trace_kernel<1, 1, 8, 3, 4, 2>()},
                           {4, trace_kernel<2, 1, 8, 2, 4, 2>()}};
  const int cfg_id = opt["config"].empty() ? (m <= 8 ? 0 : 4) : std::atoi(opt["config"].c_str());
  const KernelConfig* cfg = find_config(cfg_id);
  auto same = [](const KernelConfig* a, const KernelConfig* b) {
    return a && b && a->n_tiles == b->n_tiles && a->row_tiles == b->row_tiles && a->warps == b->warps &&
           a->min_blocks == b->min_blocks && a->chunks == b->chunks && a->stages == b->stages &&
           a->pipeline == b->pipeline;
  };
  Fn fn = nullptr;
  for (const Traced& tk : traced)
    if (same(cfg, find_config(tk.id))) fn = tk.fn;
  if (!fn) {
    std::fprintf(stderr, "fp4kit-trace-decode: --config must be a variant of table entries 0, 1 or 4\n");
    return 2;
  }
  if (8 * cfg->n_tiles < m) {
    std::fprintf(stderr, "fp4kit-trace-decode: config %s serves m <= %d\n", cfg->name, 8 * cfg->n_tiles);
    return 2;
  }
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  std::printf("# %s, m = %d, config %s, SM clock %.2f GHz; times in us (medians)\n", prop.name, m, cfg->name, ghz);
  const bool ablate = !opt["ablate"].empty();
  if (ablate)
    std::printf("%-12s %6s %7s  then graph us per ablation\n", "shape", "grid", "roof us");
  else
    std::printf("%-12s %6s %7s %7s %7s %7s | %7s %7s %7s %7s %7s %7s\n", "shape", "grid", "graph", "span", "entry",
              "exit", "first", "loop0", "count0", "fin0", "seg1", "tail");

  // The timeline of one shape: `runs` traced calls after two warm-ups, per-CTA phases as medians.
  auto trace_shape = [&](const std::string& sh, int grid, double graph_us, auto&& launch) {
    unsigned long long* dtrace = nullptr;
    CK(cudaMalloc(&dtrace, size_t(grid) * 16 * 8));
    CK(cudaMemcpyToSymbol(kernels::g_decode_trace, &dtrace, sizeof(dtrace)));
    std::vector<unsigned long long> h(size_t(grid) * 16);
    std::vector<double> span, entry, exitv, first, loop0, count0, fin0, seg1, tail;
    for (int r = 0; r < runs + 2; ++r) {
      CK(cudaMemset(dtrace, 0, size_t(grid) * 16 * 8));
      launch(r);
      CK(cudaStreamSynchronize(s));
      if (r < 2) continue;  // warm-up
      CK(cudaMemcpy(h.data(), dtrace, h.size() * 8, cudaMemcpyDeviceToHost));
      unsigned long long g0 = ~0ull, g1 = 0, e1 = 0, x0 = ~0ull;
      std::vector<double> f, l0, c0, f0, s1, tl;
      for (int b = 0; b < grid; ++b) {
        const unsigned long long* t = &h[size_t(b) * 16];
        g0 = std::min(g0, t[8]);
        e1 = std::max(e1, t[8]);
        g1 = std::max(g1, t[9]);
        x0 = std::min(x0, t[9]);
        auto d = [&](int a, int z) { return double(t[z] - t[a]) / ghz * 1e-3; };
        if (t[1]) f.push_back(d(0, 1));
        if (t[1] && t[2]) l0.push_back(d(1, 2));
        if (t[3]) c0.push_back(d(2, 3));
        if (t[4]) f0.push_back(d(t[3] ? 3 : 2, 4));
        if (t[5]) s1.push_back(d(4, 5));
        tl.push_back(d(t[5] ? 5 : 4, 7));
      }
      span.push_back(double(g1 - g0) * 1e-3);
      entry.push_back(double(e1 - g0) * 1e-3);
      exitv.push_back(double(g1 - x0) * 1e-3);
      first.push_back(median(f));
      loop0.push_back(median(l0));
      count0.push_back(median(c0));
      fin0.push_back(median(f0));
      seg1.push_back(median(s1));
      tail.push_back(median(tl));
    }
    std::printf("%-12s %6d %7.1f %7.1f %7.2f %7.2f | %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f\n", sh.c_str(), grid,
                graph_us, median(span), median(entry), median(exitv), median(first), median(loop0), median(count0), median(fin0), median(seg1),
                median(tail));
    std::fflush(stdout);
    CK(cudaFree(dtrace));
  };
  std::vector<std::string> rows;  // --ablate: JSON rows
  for (const std::string& sh : split(opt["shapes"])) {
    long long n = 0, k = 0;
    if (std::sscanf(sh.c_str(), "%lld:%lld", &n, &k) != 2) {
      std::fprintf(stderr, "fp4kit-trace-decode: --shapes entries are N:K (got '%s')\n", sh.c_str());
      return 2;
    }
    PackedLayout l;
    CKS(packed_layout(Format::kNVFP4, n, k, &l));
    const int copies = int(std::max<size_t>(2, (2 * size_t(prop.l2CacheSize)) / l.total_bytes + 2));
    // Random codes, E4M3 scales and small activations (bench_common's fills); out_scale a constant.
    const std::vector<void*> wp = random_prepacked_copies(l, copies);
    void *x = nullptr, *y = nullptr;
    CK(cudaMalloc(&x, size_t(m) * k * 2));
    CK(cudaMalloc(&y, size_t(m) * n * 2));
    fill16(x, size_t(m) * k, 7u, true);
    detail::DecodePlan plan;
    CKS(detail::make_plan(m, PackedWeight{Format::kNVFP4, n, k, wp[0]}, DType::kBF16, cfg_id, &plan));
    void* ws = nullptr;
    if (plan.workspace_bytes) {
      CK(cudaMalloc(&ws, plan.workspace_bytes));
      CK(cudaMemset(ws, 0, plan.workspace_bytes));
    }
    CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.smem_bytes));
    auto launch = [&](int i) {
      kernels::DecodeParams p = kernels::shape_params(l, plan.row_groups);
      const uint8_t* base = static_cast<const uint8_t*>(wp[size_t(i % copies)]);
      p.weights = reinterpret_cast<const uint4*>(base + l.weights_offset);
      p.scales = base + l.scales_offset;
      p.out_scale = reinterpret_cast<const float*>(base + l.out_scale_offset);
      p.units = plan.units;
      p.counters = plan.workspace_bytes ? static_cast<int*>(ws) : nullptr;
      p.partials = plan.workspace_bytes ? reinterpret_cast<float*>(static_cast<uint8_t*>(ws) + plan.counters_bytes) : nullptr;
      p.m = m;
      p.x = x;
      p.y = y;
      fn<<<plan.grid, plan.threads, plan.smem_bytes, s>>>(p);
    };
    unsigned long long* null_trace = nullptr;  // graph times without timestamps
    CK(cudaMemcpyToSymbol(kernels::g_decode_trace, &null_trace, sizeof(null_trace)));
    if (ablate) {
      const double roof_us = double(l.weights_bytes + l.scales_bytes) / 4.25e6;
      std::printf("%-12s %6d %7.1f roof", sh.c_str(), plan.grid, roof_us);
      for (const std::string& a : split(opt["ablate"])) {
        const int bits = std::atoi(a.c_str());
        CK(cudaMemcpyToSymbol(kernels::g_decode_ablate, &bits, sizeof(bits)));
        double best = 1e30;
        for (int r = 0; r < 3; ++r) best = std::min(best, graph_time_us(s, std::max(copies, 8), 100, launch));
        std::printf(" %7.1f a%d", best, bits);
        char row[256];
        std::snprintf(row, sizeof row,
                      "{\"n\": %lld, \"k\": %lld, \"m\": %d, \"config\": \"%s\", \"grid\": %d, \"ablate\": %d, "
                      "\"us\": %.3f, \"roofline_us\": %.3f}",
                      n, k, m, cfg->name, plan.grid, bits, best, roof_us);
        rows.push_back(row);
      }
      const int zero = 0;
      CK(cudaMemcpyToSymbol(kernels::g_decode_ablate, &zero, sizeof(zero)));
      std::printf("\n");
    } else {
      trace_shape(sh, plan.grid, graph_time_us(s, std::max(copies, 8), 100, launch), launch);
    }
    for (void* p : wp) CK(cudaFree(p));
    CK(cudaFree(x));
    CK(cudaFree(y));
    if (ws) CK(cudaFree(ws));
  }
  if (ablate) {
    std::printf("a0: the kernel; a1: no dequantise-and-multiply; a2: no stream-K fixup; a3: neither; roof: weight\n"
                "bytes at 4.25 TB/s (graph per-call times, best of 3 graphs of 100 replays)\n");
    if (!opt["json"].empty()) {
      std::string j = "{\"tool\": \"fp4kit-trace-decode --ablate\", \"device\": \"" + json_escape(prop.name) +
                      "\", \"commit\": \"" + json_escape(opt["commit"]) + "\", \"date\": \"" + utc_now() + "\", \"rows\": [\n";
      for (size_t i = 0; i < rows.size(); ++i) j += "  " + rows[i] + (i + 1 < rows.size() ? ",\n" : "\n");
      if (!write_file(opt["json"], j + "]}\n", "fp4kit-trace-decode")) return 2;
    }
    return 0;
  }
  std::printf("graph: per-call time in a CUDA graph; span: first CTA entry to last CTA exit (globaltimer);\n"
              "entry/exit: spread of CTA entry/exit times; first: entry to first stage multiplied; loop0: rest of\n"
              "the first segment's main loop; count0: partial stores + arrival count; fin0: last arrival's\n"
              "partial sum + epilogue (or the epilogue); seg1: second segment; tail: end of last segment to exit.\n");
  return 0;
}
