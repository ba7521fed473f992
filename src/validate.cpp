// validate.cpp: every GEMM argument rule, checked before anything is launched. Each message names the
// argument and the rule.

#include <string>

#include "configs.h"
#include "fp4kit/gemm.h"
#include "gemm_internal.h"
#include "repack_common.h"

namespace fp4kit {

namespace {
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
}  // namespace

namespace detail {

Status validate(const GemmArgs& a, DecodePlan* plan_out) {
  if (a.m < 1) return Status::Invalid("m: must be >= 1 (got " + str(a.m) + ")");
  if (a.m > INT32_MAX) return Status::Invalid("m: must be < 2^31 (got " + str(a.m) + ")");
  if (a.act != DType::kBF16 && a.act != DType::kF16)
    return Status::Invalid(std::string("act: must be bfloat16 or float16 (got ") + dtype_name(a.act) + ")");
  FP4KIT_RETURN_IF_ERROR(check_shape(a.w.format, a.w.n, a.w.k));
  if (!a.x) return Status::Invalid("x: must not be null");
  if (!aligned16(a.x)) return Status::Invalid("x: must be 16-byte aligned");
  if (!a.y) return Status::Invalid("y: must not be null");
  if (!aligned16(a.y)) return Status::Invalid("y: must be 16-byte aligned");
  if (!a.w.data) return Status::Invalid("w.data: must not be null (prepack the weight first)");
  if (!aligned16(a.w.data)) return Status::Invalid("w.data: must be 16-byte aligned");
  if (a.bias && reinterpret_cast<uintptr_t>(a.bias) % 2 != 0)
    return Status::Invalid("bias: must be 2-byte aligned");
  if (int64_t(a.m) * a.w.k > (int64_t(1) << 40) || int64_t(a.m) * a.w.n > (int64_t(1) << 40))
    return Status::Invalid("m: m*k and m*n must be < 2^40 elements (got m=" + str(a.m) + ")");
  const char* xb = static_cast<const char*>(a.x);
  const char* yb = static_cast<const char*>(a.y);
  const int64_t xbytes = a.m * a.w.k * 2, ybytes = a.m * a.w.n * 2;
  if (xb < yb + ybytes && yb < xb + xbytes) return Status::Invalid("y: must not overlap x");
  if (a.config >= 0 && !find_config(a.config))
    return Status::Invalid("config: " + std::to_string(a.config) + " is not in the kernel config table");
  DecodePlan& plan = *plan_out;
  FP4KIT_RETURN_IF_ERROR(make_plan(a.m, a.w, a.act, a.config, &plan));  // device rules live there
  if (plan.workspace_bytes > 0) {
    if (!a.workspace)
      return Status::Invalid("workspace: must not be null (this problem needs " + std::to_string(plan.workspace_bytes) +
                             " bytes, see gemm_workspace_bytes)");
    if (!aligned16(a.workspace)) return Status::Invalid("workspace: must be 16-byte aligned");
    if (a.workspace_bytes < plan.workspace_bytes)
      return Status::Invalid("workspace_bytes: must be >= " + std::to_string(plan.workspace_bytes) + " (got " +
                             std::to_string(a.workspace_bytes) + ")");
  }
  return Status::Ok();
}

}  // namespace detail

Status gemm_validate(const GemmArgs& a) {
  detail::DecodePlan plan;
  return detail::validate(a, &plan);
}

}  // namespace fp4kit
