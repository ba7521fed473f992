// The C ABI: a thin shell over the C++ API that turns Status into an int and a thread-local message.
#include "fp4kit/fp4kit.h"

#include <string>

#include "fp4kit/gemm.h"
#include "fp4kit/moe.h"
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
// The C routing fields as fp4kit::Routing (mode already checked); the C++ validator checks the values.
fp4kit::Status routing_of(fp4kit_routing_mode mode, const void* logits, fp4kit_dtype logits_dtype, int renormalize,
                          int n_group, int topk_group, float routed_scaling_factor, const float* correction_bias,
                          fp4kit::Routing* r) {
  if (!dtype_ok(logits_dtype)) return fp4kit::Status::Invalid("logits_dtype: not a valid enumerator");
  r->mode = static_cast<fp4kit::RoutingMode>(mode);
  r->logits = logits;
  r->logits_dtype = to_dtype(logits_dtype);
  r->renormalize = renormalize != 0;
  r->n_group = n_group;
  r->topk_group = topk_group;
  r->routed_scaling_factor = routed_scaling_factor;
  r->correction_bias = correction_bias;
  return fp4kit::Status::Ok();
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
  fp4kit::RouteArgs a;
  fp4kit::Status s = routing_of(mode, logits, logits_dtype, renormalize, n_group, topk_group, routed_scaling_factor,
                                correction_bias, &a.routing);
  if (!s.ok()) return report(s);
  a.tokens = tokens;
  a.num_experts = num_experts;
  a.top_k = top_k;
  a.topk_ids = topk_ids;
  a.topk_weights = topk_weights;
  return report(fp4kit::route(a, stream));
}

}  // extern "C"

namespace {
// fp4kit_moe_args -> MoEArgs; the enums checked here (the C++ validator checks the rest).
fp4kit::Status moe_args_of(const fp4kit_moe_args* c, fp4kit::MoEArgs* a) {
  using fp4kit::Status;
  if (!c) return Status::Invalid("args: must not be null");
  auto experts = [&](const fp4kit_experts& e, const char* nm, int64_t n, int64_t k, fp4kit::ExpertWeights* w) {
    if (e.kind != FP4KIT_EXPERTS_FP4 && e.kind != FP4KIT_EXPERTS_BF16)
      return Status::Invalid(std::string(nm) + ".kind: not a valid enumerator");
    if (e.kind == FP4KIT_EXPERTS_FP4 && !format_ok(e.format))
      return Status::Invalid(std::string(nm) + ".format: not a valid enumerator");
    w->format = e.kind == FP4KIT_EXPERTS_FP4 ? to_format(e.format) : fp4kit::Format::kMXFP4;
    w->kind = e.kind == FP4KIT_EXPERTS_FP4 ? fp4kit::ExpertKind::kFP4 : fp4kit::ExpertKind::kBF16;
    w->n = n;
    w->k = k;
    w->data = e.data;
    w->stride = e.stride;
    w->bias = e.bias;
    return Status::Ok();
  };
  if (!dtype_ok(c->act)) return Status::Invalid("act: not a valid enumerator");
  a->tokens = c->tokens;
  a->hidden = c->hidden;
  a->inter = c->inter;
  a->num_experts = c->num_experts;
  a->top_k = c->top_k;
  a->act = to_dtype(c->act);
  a->x = c->x;
  a->topk_ids = c->topk_ids;
  a->topk_weights = c->topk_weights;
  FP4KIT_RETURN_IF_ERROR(experts(c->gate_up, "gate_up", 2 * c->inter, c->hidden, &a->gate_up));
  FP4KIT_RETURN_IF_ERROR(experts(c->down, "down", c->hidden, c->inter, &a->down));
  a->activation = static_cast<fp4kit::MoEActivation>(c->activation);
  a->layout = static_cast<fp4kit::GateUpLayout>(c->layout);
  a->alpha = c->alpha;
  a->limit = c->limit;
  a->y = c->y;
  a->workspace = c->workspace;
  a->workspace_bytes = c->workspace_bytes;
  a->path = static_cast<fp4kit::MoEPath>(c->path);
  if (c->routing_mode != 0) {
    if (c->routing_mode != FP4KIT_ROUTE_SOFTMAX && c->routing_mode != FP4KIT_ROUTE_SIGMOID_GROUPED)
      return Status::Invalid("routing_mode: must be 0, FP4KIT_ROUTE_SOFTMAX or FP4KIT_ROUTE_SIGMOID_GROUPED (got " +
                             std::to_string(c->routing_mode) + ")");
    return routing_of(static_cast<fp4kit_routing_mode>(c->routing_mode), c->router_logits, c->logits_dtype,
                      c->renormalize, c->n_group, c->topk_group, c->routed_scaling_factor, c->correction_bias,
                      &a->routing);
  }
  return Status::Ok();
}
}  // namespace

extern "C" {

void fp4kit_moe_args_init(fp4kit_moe_args* args) {
  if (!args) return;
  const fp4kit::MoEArgs d;
  *args = fp4kit_moe_args{};
  args->act = FP4KIT_BF16;
  args->gate_up.kind = args->down.kind = FP4KIT_EXPERTS_FP4;
  args->gate_up.format = args->down.format = FP4KIT_MXFP4;
  args->activation = FP4KIT_SILU_AND_MUL;
  args->layout = FP4KIT_GATE_UP_CONCATENATED;
  args->alpha = d.alpha;
  args->limit = d.limit;
  args->logits_dtype = FP4KIT_F32;
  args->renormalize = d.routing.renormalize ? 1 : 0;
  args->n_group = d.routing.n_group;
  args->topk_group = d.routing.topk_group;
  args->routed_scaling_factor = d.routing.routed_scaling_factor;
}

int fp4kit_moe_workspace_bytes(const fp4kit_moe_args* args, size_t* bytes) {
  if (!bytes) return report(fp4kit::Status::Invalid("bytes: must not be null"));
  fp4kit::MoEArgs a;
  fp4kit::Status s = moe_args_of(args, &a);
  if (s.ok()) s = fp4kit::moe_workspace_bytes(a, bytes);
  return report(s);
}

int fp4kit_fused_moe(const fp4kit_moe_args* args, fp4kit_stream_t stream) {
  fp4kit::MoEArgs a;
  fp4kit::Status s = moe_args_of(args, &a);
  if (s.ok()) s = fp4kit::fused_moe(a, stream);
  return report(s);
}

}  // extern "C"
