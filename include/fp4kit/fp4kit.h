/* fp4kit/fp4kit.h: the C ABI, for engines written in C or bound from other languages.
 *
 * Every function returns 0 on success or a non-zero fp4kit status code (1 invalid argument,
 * 2 not supported, 3 CUDA error, 4 internal); fp4kit_last_error() then gives the message (thread-local,
 * valid until the next fp4kit call on this thread). Pointers are host memory for *_cpu functions and
 * device memory otherwise. Semantics are those of the C++ API (fp4kit/gemm.h, repack.h, quant.h, routing.h,
 * moe.h). */
#ifndef FP4KIT_FP4KIT_H_
#define FP4KIT_FP4KIT_H_
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st* fp4kit_stream_t; /* a cudaStream_t; NULL is the legacy default stream */

typedef enum { FP4KIT_NVFP4 = 0, FP4KIT_MXFP4 = 1 } fp4kit_format;
typedef enum { FP4KIT_F32 = 0, FP4KIT_BF16 = 1, FP4KIT_F16 = 2 } fp4kit_dtype;

const char* fp4kit_last_error(void);
const char* fp4kit_version(void);

/* Quantize W [n, k] (dtype w_dtype) to the checkpoint layout: packed [n, k/2], scales [n, k/group] and,
 * for NVFP4, one fp32 tensor scale. */
int fp4kit_quantize_cpu(fp4kit_format format, const void* w, fp4kit_dtype w_dtype, int64_t n, int64_t k,
                        uint8_t* packed, uint8_t* scales, float* tensor_scale);
/* Dequantize the checkpoint layout to fp32 [n, k]. */
int fp4kit_dequantize_cpu(fp4kit_format format, const uint8_t* packed, const uint8_t* scales,
                          float tensor_scale, int64_t n, int64_t k, float* out);

/* Bytes of the prepacked buffer for W [n, k]. */
int fp4kit_packed_bytes(fp4kit_format format, int64_t n, int64_t k, size_t* bytes);
/* Prepack on the GPU (device pointers; tensor_scale: one device float, NVFP4 only, may be NULL). */
int fp4kit_prepack(fp4kit_format format, int64_t n, int64_t k, const uint8_t* packed, const uint8_t* scales,
                   const float* tensor_scale, void* dst, fp4kit_stream_t stream);

int fp4kit_gemm_workspace_bytes(int64_t m, fp4kit_format format, int64_t n, int64_t k, fp4kit_dtype act,
                                size_t* bytes);
/* Of those, the leading bytes that must be zero when a call starts (fp4kit leaves them zero after each
 * call; the rest is scratch): what a workspace allocated fresh for a call needs cleared. */
int fp4kit_gemm_workspace_zero_bytes(int64_t m, fp4kit_format format, int64_t n, int64_t k, fp4kit_dtype act,
                                     size_t* bytes);
/* Y[m, n] = X[m, k] * W^T (+ bias). x, y, bias (nullable): dtype act (FP4KIT_BF16 or FP4KIT_F16).
 * workspace: fp4kit_gemm_workspace_bytes() bytes, zero-filled once before first use. */
int fp4kit_gemm(int64_t m, fp4kit_dtype act, const void* x, fp4kit_format format, int64_t n, int64_t k,
                const void* w_packed, const void* bias, void* y, void* workspace, size_t workspace_bytes,
                fp4kit_stream_t stream);

/* Mixture-of-Experts routing (fp4kit/routing.h): router logits [tokens, num_experts] (dtype logits_dtype)
 * -> topk_ids int32 [tokens, top_k] and topk_weights float32 [tokens, top_k], device memory.
 * FP4KIT_ROUTE_SOFTMAX: softmax top-k (n_group = topk_group = 1, routed_scaling_factor = 1,
 * correction_bias NULL); FP4KIT_ROUTE_SIGMOID_GROUPED: DeepSeek-V3's grouped top-k (correction_bias:
 * float32 [num_experts] or NULL). */
typedef enum { FP4KIT_ROUTE_SOFTMAX = 1, FP4KIT_ROUTE_SIGMOID_GROUPED = 2 } fp4kit_routing_mode;
int fp4kit_route(fp4kit_routing_mode mode, int64_t tokens, int num_experts, int top_k, const void* logits,
                 fp4kit_dtype logits_dtype, int renormalize, int n_group, int topk_group,
                 float routed_scaling_factor, const float* correction_bias, int32_t* topk_ids, float* topk_weights,
                 fp4kit_stream_t stream);

/* The fused Mixture-of-Experts layer (fp4kit/moe.h): Y [tokens, hidden] from X [tokens, hidden], the
 * experts' gate_up [2 inter, hidden] and down [hidden, inter] matrices stacked `stride` bytes apart, and
 * either topk_ids / topk_weights or router logits (routing_mode != 0). Start from fp4kit_moe_args_init()
 * (the C++ defaults), then set the fields. */
typedef enum { FP4KIT_EXPERTS_FP4 = 0, FP4KIT_EXPERTS_BF16 = 1 } fp4kit_expert_kind;
typedef enum { FP4KIT_SILU_AND_MUL = 0, FP4KIT_SWIGLU_OAI = 1 } fp4kit_moe_activation;
typedef enum { FP4KIT_GATE_UP_CONCATENATED = 0, FP4KIT_GATE_UP_INTERLEAVED = 1 } fp4kit_gate_up_layout;
typedef struct {
  fp4kit_expert_kind kind;
  fp4kit_format format;   /* FP4 experts: prepacked in this format (one packed layout per expert) */
  const void* data;       /* expert e at data + e * stride */
  size_t stride;          /* bytes */
  const void* bias;       /* [num_experts, n] of the activation dtype (BF16 experts: bfloat16), or NULL */
} fp4kit_experts;
typedef struct {
  int64_t tokens, hidden, inter;
  int num_experts, top_k;
  fp4kit_dtype act;                  /* FP4KIT_BF16 or FP4KIT_F16 */
  const void* x;                     /* [tokens, hidden] */
  const int32_t* topk_ids;           /* [tokens, top_k], or NULL when routing from logits */
  const float* topk_weights;         /* [tokens, top_k], or NULL when routing from logits */
  fp4kit_experts gate_up, down;
  fp4kit_moe_activation activation;
  fp4kit_gate_up_layout layout;
  float alpha, limit;                /* FP4KIT_SWIGLU_OAI */
  void* y;                           /* [tokens, hidden] */
  void* workspace;
  size_t workspace_bytes;
  int path;                          /* 0 automatic, 1 decode, 2 tensor core (fp4kit/moe.h MoEPath) */
  /* Routing from router logits [tokens, num_experts] (fp4kit/routing.h); routing_mode 0: none. */
  int routing_mode;                  /* 0, FP4KIT_ROUTE_SOFTMAX or FP4KIT_ROUTE_SIGMOID_GROUPED */
  const void* router_logits;
  fp4kit_dtype logits_dtype;
  int renormalize;
  int n_group, topk_group;
  float routed_scaling_factor;
  const float* correction_bias;      /* float32 [num_experts] or NULL */
} fp4kit_moe_args;

void fp4kit_moe_args_init(fp4kit_moe_args* args);
int fp4kit_moe_workspace_bytes(const fp4kit_moe_args* args, size_t* bytes);
int fp4kit_fused_moe(const fp4kit_moe_args* args, fp4kit_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* FP4KIT_FP4KIT_H_ */
