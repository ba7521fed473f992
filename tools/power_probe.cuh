// power_probe.cuh: the board's energy, power and SM clock while one call runs back to back (fp4kit-bench
// --energy on). On the H200 large calls run at the board's 700 W limit, where a kernel's speed is set by the
// energy it spends per call rather than by its cycles (docs/architecture.md, "What bounds the kernels on the
// H200"); this is how the benchmark puts a number on it.
//
// Contract
//   PowerProbe p;  p.ok() is false (and p.why() says why) where NVML cannot be loaded or does not know the
//   device; then sustain() returns an empty Sustained (calls == 0) and nothing else happens.
//   sustain(s, calls, fn, ms): captures fn(0 .. calls - 1) in a CUDA graph, replays it for about `ms` of
//   wall time after one untimed replay (in batches of ~20 ms between host synchronisations), and returns the calls run, us per call (wall, over the window), mJ
//   per call (NVML's total-energy counter across the window), and the mean board power, mean SM clock and
//   the share of samples at the software power cap (a sampler thread, every 10 ms).
//   NVML is opened with dlopen (libnvidia-ml.so.1, part of the driver), so the tools link nothing new and
//   build where there is no driver.
#pragma once
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "bench_common.cuh"

namespace fp4bench {

struct Sustained {
  long calls = 0;
  double us = 0, mj = 0, watts = 0, mhz = 0, capped = 0;
};

// Two sustained runs of one call as one: the calls summed, the rest averaged.
inline Sustained mean(const Sustained& a, const Sustained& b) {
  Sustained r;
  r.calls = a.calls + b.calls;
  r.us = (a.us + b.us) / 2;
  r.mj = (a.mj + b.mj) / 2;
  r.watts = (a.watts + b.watts) / 2;
  r.mhz = (a.mhz + b.mhz) / 2;
  r.capped = (a.capped + b.capped) / 2;
  return r;
}

class PowerProbe {
 public:
  // open = false makes a probe that is not ok() and touches nothing (the benchmark without --energy).
  explicit PowerProbe(bool open, int cuda_device = 0) {
    if (!open) { why_ = "not opened"; return; }
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) { why_ = "libnvidia-ml.so.1 not found"; return; }
    auto sym = [&](const char* name) { return dlsym(lib_, name); };
    init_ = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
    by_bus_ = reinterpret_cast<int (*)(const char*, void**)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
    energy_ = reinterpret_cast<int (*)(void*, unsigned long long*)>(sym("nvmlDeviceGetTotalEnergyConsumption"));
    power_ = reinterpret_cast<int (*)(void*, unsigned*)>(sym("nvmlDeviceGetPowerUsage"));
    clock_ = reinterpret_cast<int (*)(void*, int, unsigned*)>(sym("nvmlDeviceGetClockInfo"));
    reasons_ = reinterpret_cast<int (*)(void*, unsigned long long*)>(sym("nvmlDeviceGetCurrentClocksThrottleReasons"));
    if (!init_ || !by_bus_ || !energy_ || !power_ || !clock_ || !reasons_) { why_ = "NVML lacks a needed entry point"; return; }
    if (init_() != 0) { why_ = "nvmlInit failed"; return; }
    char bus[32] = {0};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), cuda_device) != cudaSuccess || by_bus_(bus, &dev_) != 0) {
      why_ = "NVML does not know the CUDA device";
      return;
    }
    unsigned long long e = 0;
    if (energy_(dev_, &e) != 0) { why_ = "the device reports no energy counter"; return; }
    ok_ = true;
  }
  PowerProbe(const PowerProbe&) = delete;
  PowerProbe& operator=(const PowerProbe&) = delete;
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }

  template <typename Fn>
  Sustained sustain(cudaStream_t s, int calls, Fn fn, double ms) {
    Sustained r;
    if (!ok_) return r;
    CallGraph g(s, calls, fn);
    // One untimed replay, which also sizes the batches between host synchronisations (~20 ms each, so the
    // GPU never waits for the host).
    const auto w0 = std::chrono::steady_clock::now();
    g.launch();
    CK(cudaStreamSynchronize(s));
    const double replay_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count();
    const int batch = std::max(1, std::min(1000, int(20.0 / std::max(1e-3, replay_ms))));
    // The sampler: SM clock, board power, and whether the software power cap (NVML's reason bit 0x4) holds.
    std::atomic<bool> stop{false};
    double sum_w = 0, sum_mhz = 0;
    long samples = 0, capped = 0;
    std::thread sampler([&] {
      while (!stop.load()) {
        unsigned mw = 0, mhz = 0;
        unsigned long long why = 0;
        if (power_(dev_, &mw) == 0 && clock_(dev_, 1 /* NVML_CLOCK_SM */, &mhz) == 0 && reasons_(dev_, &why) == 0) {
          sum_w += mw * 1e-3;
          sum_mhz += mhz;
          capped += (why & 0x4ull) ? 1 : 0;
          ++samples;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
    unsigned long long e0 = 0, e1 = 0;
    energy_(dev_, &e0);
    const auto t0 = std::chrono::steady_clock::now();
    double el_ms = 0;
    long replays = 0;
    while (el_ms < ms) {
      for (int j = 0; j < batch; ++j, ++replays) g.launch();
      CK(cudaStreamSynchronize(s));
      el_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    energy_(dev_, &e1);
    stop = true;
    sampler.join();
    r.calls = replays * calls;
    r.us = el_ms * 1e3 / double(r.calls);
    r.mj = double(e1 - e0) / double(r.calls);
    if (samples) {
      r.watts = sum_w / samples;
      r.mhz = sum_mhz / samples;
      r.capped = double(capped) / samples;
    }
    return r;
  }

 private:
  void* lib_ = nullptr;
  void* dev_ = nullptr;
  bool ok_ = false;
  std::string why_;
  int (*init_)() = nullptr;
  int (*by_bus_)(const char*, void**) = nullptr;
  int (*energy_)(void*, unsigned long long*) = nullptr;
  int (*power_)(void*, unsigned*) = nullptr;
  int (*clock_)(void*, int, unsigned*) = nullptr;
  int (*reasons_)(void*, unsigned long long*) = nullptr;
};

}  // namespace fp4bench
