// fp4kit/tuning.h: per-GPU tuning tables, loaded at run time (no recompilation).
//
// A tuning table maps (format, activation dtype, N, K, m bucket) to a kernel config name of the config
// table. The dispatcher uses an entry when the current device's name matches the table's `device` line
// and the shape matches exactly; otherwise it falls back to the analytic default (print it with
// describe_dispatch). `fp4kit-bench --tune PATH` measures every config and writes such a table.
//
// File format (text, one record per line, '#' starts a comment):
//   fp4kit-tuning 1
//   device <device name as cudaGetDeviceProperties reports it>
//   <format> <act> <n> <k> <m_max> <config name>      e.g.  nvfp4 bf16 8192 8192 16 m16_r2_w8_b2_c4x2
//                                                           nvfp4 bf16 8192 8192 4096 p256_w8_s3
// An entry serves every m with previous-bucket m_max < m <= m_max; m_max is in [1, 2^31 - 1]. A decode
// config must cover its bucket in one launch (8 * n_tiles >= m_max; for m_max > 64 the 64-token configs,
// which run larger m in 64-token blocks); a prefill config (wgmma on Hopper, mma.sync on any device; any m
// in one launch) may serve any bucket. Entries the current device cannot run are skipped. Above a shape's
// largest m_max the analytic default applies (from 65 tokens a prefill kernel, except on sm_80-89 where
// the rules of src/configs.h keep the decode kernel's 64-token blocks: layers of >= 2^28 weights, and
// one-token-tile whole-K mma.sync plans that fill less than 3/4 of the SMs).
// The environment variable FP4KIT_TUNING_TABLE names a table to load at the first GEMM; a missing file
// there means the analytic default.
#pragma once
#include <cstdint>
#include <string>

#include "fp4kit/formats.h"
#include "fp4kit/status.h"

namespace fp4kit {

// Parse and install a table (replacing any loaded one). A malformed table is rejected as a whole with a
// message naming the file, the line and the rule; the previous table then stays in place.
Status load_tuning_table(const std::string& path);
// Same, from the text itself (`origin` names it in messages).
Status load_tuning_table_text(const std::string& text, const std::string& origin);
void clear_tuning_table();

// The config the dispatcher picks for this problem on a device named `device_name` of compute capability
// major `cc_major` with `sms` SMs (0: 132, an H100 SXM / H200), and why (the tuning-table entry or the
// analytic rule; only configs the device runs). Needs no GPU.
int dispatch_config(Format f, DType act, int64_t m, int64_t n, int64_t k, const std::string& device_name,
                    std::string* why = nullptr, int cc_major = 9, int sms = 0);

// The name of a kernel config id (from dispatch_config), or "unknown".
const char* kernel_config_name(int id);

}  // namespace fp4kit
