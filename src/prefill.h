// prefill.h: the Hopper prefill GEMM's host side (kernels/prefill_gemm_sm90.cuh): its part of the launch
// plan and its launch. gemm() runs it when the chosen config is a kWgmma entry of the config table.
#pragma once
#include <cstdint>

#include "configs.h"
#include "fp4kit/gemm.h"
#include "fp4kit/status.h"
#include "gemm_internal.h"

namespace fp4kit {
namespace detail {

// make_plan's prefill part, for the kWgmma entry `cfg`: kernel, block, shared memory, token tiles, K
// splits (prefill_splits for the device's `sms`), grid and workspace (split K: arrival counters and the
// partial tiles). Fails with kNotSupported when this build carries no sm_90a code for the kernel.
Status plan_prefill(int64_t m, const PackedWeight& w, DType act, const KernelConfig& cfg, int sms, DecodePlan* plan);

// One launch of a planned prefill GEMM over all m tokens (a validated GemmArgs and its plan): X as a TMA
// tensor map built on the host and passed by value, so graph capture works; no allocation, no host
// synchronisation.
Status launch_prefill(const GemmArgs& a, const DecodePlan& plan, cudaStream_t stream);

// Whether this build runs the prefill kernel on the current device (sm_90a code present); cached. The
// dispatcher falls back to the decode kernel where it does not.
bool prefill_runs_here();

}  // namespace detail
}  // namespace fp4kit
