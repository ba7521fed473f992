// prefill.h: the Hopper prefill GEMM launcher (kernels/prefill_gemm_sm90.cuh), internal for now: the
// dispatcher does not call it yet (first milestone of issue 5); tests and tools call it directly.
#pragma once
#include <cstdint>

#include "fp4kit/gemm.h"
#include "fp4kit/status.h"

namespace fp4kit {
namespace detail {

struct PrefillConfig {
  int token_tile = 0;  // BN: 64, 128 or 256 tokens per CTA; 0: pick (default_prefill_config)
};

// The token tile that fills the device best for m tokens over n rows: least CTA waves x per-CTA time
// (modelled as BN + 300, fitted on the H200), ties to the larger tile.
PrefillConfig default_prefill_config(int64_t m, int64_t n, int sms);

// Y = X W^T (+ bias) with the prefill kernel, from the same GemmArgs as gemm() (workspace and config are
// ignored: the kernel needs none). Needs a compute capability 9.0 device and a build with sm_90a code;
// fails with kNotSupported otherwise. Asynchronous on `stream`; no allocation, no host synchronisation
// (the X tensor map is built on the host and passed by value, so graph capture works).
Status launch_prefill(const GemmArgs& a, const PrefillConfig& cfg, cudaStream_t stream);

}  // namespace detail
}  // namespace fp4kit
