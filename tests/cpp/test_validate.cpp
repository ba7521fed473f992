// test_validate.cpp: every GEMM argument rule that needs no device, each with its exact message. The
// checks run before anything touches the GPU, so they hold on a machine without one. (Rules that depend
// on the launch plan, such as the workspace size, are tested in test_gemm_gpu.)
#include <cstdint>
#include <vector>

#include "fp4kit/fp4kit.h"
#include "fp4kit/gemm.h"
#include "testing.h"

using namespace fp4kit;

namespace {
alignas(256) unsigned char g_x[1 << 16];
alignas(256) unsigned char g_y[1 << 16];
alignas(256) unsigned char g_w[1 << 16];

GemmArgs good() {
  GemmArgs a;
  a.m = 4;
  a.act = DType::kBF16;
  a.x = g_x;
  a.y = g_y;
  a.w = PackedWeight{Format::kNVFP4, 64, 128, g_w};
  return a;
}
}  // namespace

TEST(gemm_argument_rules) {
  GemmArgs a = good();
  a.m = 0;
  CHECK_ERROR(gemm_validate(a), "m: must be >= 1 (got 0)");
  a = good();
  a.m = int64_t(1) << 32;
  CHECK_ERROR(gemm_validate(a), "m: must be < 2^31");
  a = good();
  a.act = DType::kF32;
  CHECK_ERROR(gemm_validate(a), "act: must be bfloat16 or float16 (got float32)");
  a = good();
  a.w.k = 120;
  CHECK_ERROR(gemm_validate(a), "k: must be a multiple of the group size 16 for nvfp4 (got 120)");
  a = good();
  a.w.format = Format::kMXFP4;
  a.w.k = 80;
  CHECK_ERROR(gemm_validate(a), "k: must be a multiple of the group size 32 for mxfp4 (got 80)");
  a = good();
  a.w.n = -3;
  CHECK_ERROR(gemm_validate(a), "n: must be >= 1 (got -3)");
  a = good();
  a.w.k = int64_t(1) << 33;
  CHECK_ERROR(gemm_validate(a), "k: must be < 2^31");
  a = good();
  a.x = nullptr;
  CHECK_ERROR(gemm_validate(a), "x: must not be null");
  a = good();
  a.x = g_x + 2;
  CHECK_ERROR(gemm_validate(a), "x: must be 16-byte aligned");
  a = good();
  a.y = nullptr;
  CHECK_ERROR(gemm_validate(a), "y: must not be null");
  a = good();
  a.y = g_y + 8;
  CHECK_ERROR(gemm_validate(a), "y: must be 16-byte aligned");
  a = good();
  a.w.data = nullptr;
  CHECK_ERROR(gemm_validate(a), "w.data: must not be null");
  a = good();
  a.w.data = g_w + 4;
  CHECK_ERROR(gemm_validate(a), "w.data: must be 16-byte aligned");
  a = good();
  a.bias = g_x + 1;
  CHECK_ERROR(gemm_validate(a), "bias: must be 2-byte aligned");
  a = good();
  a.y = g_x + 16;
  CHECK_ERROR(gemm_validate(a), "y: must not overlap x");
  a = good();
  a.config = 1234;
  CHECK_ERROR(gemm_validate(a), "config: 1234 is not in the kernel config table");
  a = good();
  a.w.format = static_cast<Format>(3);
  CHECK_ERROR(gemm_validate(a), "format: must be nvfp4 or mxfp4");
  // gemm() itself validates first: the same message, nothing launched.
  a = good();
  a.m = -1;
  CHECK_ERROR(gemm(a, nullptr), "m: must be >= 1 (got -1)");
}

// The C ABI reports the same rules through a status code and fp4kit_last_error().
TEST(c_abi_errors) {
  size_t bytes = 0;
  CHECK_EQ(fp4kit_packed_bytes(FP4KIT_NVFP4, 10, 24, &bytes), 1);
  CHECK(std::string(fp4kit_last_error()).find("k: must be a multiple of the group size 16") != std::string::npos);
  CHECK_EQ(fp4kit_packed_bytes(static_cast<fp4kit_format>(9), 10, 32, &bytes), 1);
  CHECK(std::string(fp4kit_last_error()).find("format: not a valid enumerator") != std::string::npos);
  CHECK_EQ(fp4kit_packed_bytes(FP4KIT_MXFP4, 10, 64, &bytes), 0);
  CHECK(bytes > 0);
  CHECK_EQ(fp4kit_gemm(0, FP4KIT_BF16, g_x, FP4KIT_NVFP4, 64, 128, g_w, nullptr, g_y, nullptr, 0, nullptr), 1);
  CHECK(std::string(fp4kit_last_error()).find("m: must be >= 1") != std::string::npos);
}

// The C ABI of the fused MoE layer: the defaults, and rules that need no device (the C++ validator's
// messages come through; its device-dependent rules are tested in test_moe_gpu).
TEST(c_abi_moe_errors) {
  auto last_has = [](const char* needle) { return std::string(fp4kit_last_error()).find(needle) != std::string::npos; };
  fp4kit_moe_args a;
  fp4kit_moe_args_init(&a);
  CHECK(a.alpha == 1.702f && a.limit == 7.0f && a.act == FP4KIT_BF16 && a.routing_mode == 0 && a.renormalize == 1 &&
        a.n_group == 1 && a.topk_group == 1 && a.routed_scaling_factor == 1.0f && a.topk_ids == nullptr);
  CHECK_EQ(fp4kit_fused_moe(nullptr, nullptr), 1);
  CHECK(last_has("args: must not be null"));
  size_t bytes = 0;
  CHECK_EQ(fp4kit_moe_workspace_bytes(&a, nullptr), 1);
  CHECK(last_has("bytes: must not be null"));
  a.tokens = 0;
  CHECK_EQ(fp4kit_moe_workspace_bytes(&a, &bytes), 1);
  CHECK(last_has("tokens: must be >= 1 (got 0)"));
  fp4kit_moe_args b = a;
  b.gate_up.kind = static_cast<fp4kit_expert_kind>(7);
  CHECK_EQ(fp4kit_fused_moe(&b, nullptr), 1);
  CHECK(last_has("gate_up.kind: not a valid enumerator"));
  b = a;
  b.down.format = static_cast<fp4kit_format>(7);
  CHECK_EQ(fp4kit_fused_moe(&b, nullptr), 1);
  CHECK(last_has("down.format: not a valid enumerator"));
  b = a;
  b.act = static_cast<fp4kit_dtype>(9);
  CHECK_EQ(fp4kit_fused_moe(&b, nullptr), 1);
  CHECK(last_has("act: not a valid enumerator"));
  b = a;
  b.routing_mode = 5;
  CHECK_EQ(fp4kit_fused_moe(&b, nullptr), 1);
  CHECK(last_has("routing_mode: must be 0, FP4KIT_ROUTE_SOFTMAX or FP4KIT_ROUTE_SIGMOID_GROUPED (got 5)"));
  b = a;
  b.tokens = 1;
  b.num_experts = 4;
  b.top_k = 5;
  CHECK_EQ(fp4kit_fused_moe(&b, nullptr), 1);
  CHECK(last_has("top_k: must be in [1, num_experts = 4] (got 5)"));
}

TEST_MAIN()
