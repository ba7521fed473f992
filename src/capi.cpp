// The C ABI: a thin shell over the C++ API that turns Status into an int and a thread-local message.
#include "fp4kit/fp4kit.h"

#include <string>

#include "fp4kit/gemm.h"
#include "fp4kit/quant.h"
#include "fp4kit/repack.h"
#include "fp4kit/routing.h"

namespace {
thread_local std::string g_last_error;

int report(const fp4kit::Status& s) {
  g_last_error = s.ok() ? std::string() : s.message();
  return static_cast<int>(s.code());
}
fp4kit::Format to_format(fp4kit_format f) { return static_cast<fp4kit::Format>(f); }
fp4kit::DType to_dtype(fp4kit_dtype d) { return static_cast<fp4kit::DType>(d); }
bool format_ok(fp4kit_format f) { return f == FP4KIT_NVFP4 || f == FP4KIT_MXFP4; }
bool dtype_ok(fp4kit_dtype d) { return d == FP4KIT_F32 || d == FP4KIT_BF16 || d == FP4KIT_F16; }
int bad_enum(const char* what) {
  return report(fp4kit::Status::Invalid(std::string(what) + ": not a valid enumerator"));
}
}  // namespace

extern "C" {

const char* fp4kit_last_error(void) { return g_last_error.c_str(); }
const char* fp4kit_version(void) { return "0.1.0"; }

int fp4kit_quantize_cpu(fp4kit_format format, const void* w, fp4kit_dtype w_dtype, int64_t n, int64_t k,
                        uint8_t* packed, uint8_t* scales, float* tensor_scale) {
  if (!format_ok(format)) return bad_enum("format");
  if (!dtype_ok(w_dtype)) return bad_enum("w_dtype");
  fp4kit::QuantizeArgs a;
  a.format = to_format(format);
  a.w = w;
  a.w_dtype = to_dtype(w_dtype);
  a.n = n;
  a.k = k;
  a.packed = packed;
  a.scales = scales;
  a.tensor_scale = tensor_scale;
  return report(fp4kit::quantize_cpu(a));
}

int fp4kit_dequantize_cpu(fp4kit_format format, const uint8_t* packed, const uint8_t* scales,
                          float tensor_scale, int64_t n, int64_t k, float* out) {
  if (!format_ok(format)) return bad_enum("format");
  fp4kit::DequantizeArgs a;
  a.format = to_format(format);
  a.packed = packed;
  a.scales = scales;
  a.tensor_scale = tensor_scale;
  a.n = n;
  a.k = k;
  a.out = out;
  return report(fp4kit::dequantize_cpu(a));
}

int fp4kit_packed_bytes(fp4kit_format format, int64_t n, int64_t k, size_t* bytes) {
  if (!format_ok(format)) return bad_enum("format");
  if (!bytes) return report(fp4kit::Status::Invalid("bytes: must not be null"));
  fp4kit::PackedLayout l;
  fp4kit::Status s = fp4kit::packed_layout(to_format(format), n, k, &l);
  if (s.ok()) *bytes = l.total_bytes;
  return report(s);
}

int fp4kit_prepack(fp4kit_format format, int64_t n, int64_t k, const uint8_t* packed, const uint8_t* scales,
                   const float* tensor_scale, void* dst, fp4kit_stream_t stream) {
  if (!format_ok(format)) return bad_enum("format");
  fp4kit::PrepackArgs a;
  a.format = to_format(format);
  a.n = n;
  a.k = k;
  a.packed = packed;
  a.scales = scales;
  a.tensor_scale = tensor_scale;
  a.dst = dst;
  return report(fp4kit::prepack_gpu(a, stream));
}

namespace {
using WorkspaceQuery = fp4kit::Status (*)(int64_t, const fp4kit::PackedWeight&, fp4kit::DType, size_t*, int);
int workspace_query(WorkspaceQuery q, int64_t m, fp4kit_format format, int64_t n, int64_t k, fp4kit_dtype act,
                    size_t* bytes) {
  if (!format_ok(format)) return bad_enum("format");
  if (!dtype_ok(act)) return bad_enum("act");
  if (!bytes) return report(fp4kit::Status::Invalid("bytes: must not be null"));
  fp4kit::PackedWeight w;
  w.format = to_format(format);
  w.n = n;
  w.k = k;
  return report(q(m, w, to_dtype(act), bytes, -1));
}
}  // namespace

int fp4kit_gemm_workspace_bytes(int64_t m, fp4kit_format format, int64_t n, int64_t k, fp4kit_dtype act,
                                size_t* bytes) {
  return workspace_query(&fp4kit::gemm_workspace_bytes, m, format, n, k, act, bytes);
}

int fp4kit_gemm_workspace_zero_bytes(int64_t m, fp4kit_format format, int64_t n, int64_t k, fp4kit_dtype act,
                                     size_t* bytes) {
  return workspace_query(&fp4kit::gemm_workspace_zero_bytes, m, format, n, k, act, bytes);
}

int fp4kit_gemm(int64_t m, fp4kit_dtype act, const void* x, fp4kit_format format, int64_t n, int64_t k,
                const void* w_packed, const void* bias, void* y, void* workspace, size_t workspace_bytes,
                fp4kit_stream_t stream) {
  if (!format_ok(format)) return bad_enum("format");
  if (!dtype_ok(act)) return bad_enum("act");
  fp4kit::GemmArgs a;
  a.m = m;
  a.act = to_dtype(act);
  a.x = x;
  a.w.format = to_format(format);
  a.w.n = n;
  a.w.k = k;
  a.w.data = w_packed;
  a.bias = bias;
  a.y = y;
  a.workspace = workspace;
  a.workspace_bytes = workspace_bytes;
  return report(fp4kit::gemm(a, stream));
}

int fp4kit_route(fp4kit_routing_mode mode, int64_t tokens, int num_experts, int top_k, const void* logits,
                 fp4kit_dtype logits_dtype, int renormalize, int n_group, int topk_group,
                 float routed_scaling_factor, const float* correction_bias, int32_t* topk_ids, float* topk_weights,
                 fp4kit_stream_t stream) {
  if (mode != FP4KIT_ROUTE_SOFTMAX && mode != FP4KIT_ROUTE_SIGMOID_GROUPED) return bad_enum("mode");
  if (!dtype_ok(logits_dtype)) return bad_enum("logits_dtype");
  fp4kit::RouteArgs a;
  a.tokens = tokens;
  a.num_experts = num_experts;
  a.top_k = top_k;
  a.routing.mode = static_cast<fp4kit::RoutingMode>(mode);
  a.routing.logits = logits;
  a.routing.logits_dtype = to_dtype(logits_dtype);
  a.routing.renormalize = renormalize != 0;
  a.routing.n_group = n_group;
  a.routing.topk_group = topk_group;
  a.routing.routed_scaling_factor = routed_scaling_factor;
  a.routing.correction_bias = correction_bias;
  a.topk_ids = topk_ids;
  a.topk_weights = topk_weights;
  return report(fp4kit::route(a, stream));
}

}  // extern "C"
