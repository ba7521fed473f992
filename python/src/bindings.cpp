// fp4kit._C: the nanobind module. Deliberately thin: it parses strings into enums, checks host arrays
// (device, dtype, ndim, shape, C-contiguity) so that a bad argument gets a message naming it, calls the
// C++ API and turns a failed Status into a Python exception:
//   kInvalidArgument -> ValueError, kNotSupported -> NotImplementedError, others -> RuntimeError.
// Two halves:
//   - CPU functions on host arrays (numpy, or anything speaking DLPack/the buffer protocol); results are
//     new numpy arrays.
//   - GPU functions on raw device pointers (Python ints) and a raw cudaStream_t (int, 0 = legacy default
//     stream), so that python/fp4kit/torch_ops.py can drive them without the core knowing torch.
//     These only launch; they never synchronise or allocate.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fp4kit/gemm.h"
#include "fp4kit/moe.h"
#include "fp4kit/tuning.h"
#include "fp4kit/quant.h"
#include "fp4kit/repack.h"
#include "fp4kit/routing.h"

#ifndef FP4KIT_VERSION
#define FP4KIT_VERSION "0.0.0"
#endif

namespace nb = nanobind;
using namespace nb::literals;
using fp4kit::DType;
using fp4kit::Format;
using fp4kit::Status;

namespace {

// Any host array, read-only view; all constraints are checked by hand for precise messages.
using HostIn = nb::ndarray<nb::ro>;
template <typename T> using NpOut = nb::ndarray<nb::numpy, T>;

// ---- errors ------------------------------------------------------------------------------------------
void check(const Status& s) {
  if (s.ok()) return;
  switch (s.code()) {
    case fp4kit::Code::kInvalidArgument: throw nb::value_error(s.message().c_str());
    case fp4kit::Code::kNotSupported:
      // nanobind has no C++ type mapping to NotImplementedError: set it and rethrow as a Python error.
      PyErr_SetString(PyExc_NotImplementedError, s.message().c_str());
      throw nb::python_error();
    default: throw std::runtime_error(s.message());
  }
}

// Run a host computation without the GIL (large weights take a while; the arrays it reads stay alive
// through the caller's locals), then raise its Status.
template <typename F>
void check_nogil(F&& f) {
  Status s;
  {
    nb::gil_scoped_release nogil;
    s = f();
  }
  check(s);
}

[[noreturn]] void value_error(const std::string& m) { throw nb::value_error(m.c_str()); }
[[noreturn]] void type_error(const std::string& m) { throw nb::type_error(m.c_str()); }

// ---- enums from strings ------------------------------------------------------------------------------
Format parse_format(const std::string& s) {
  if (s == "nvfp4") return Format::kNVFP4;
  if (s == "mxfp4") return Format::kMXFP4;
  value_error("format: must be \"nvfp4\" or \"mxfp4\" (got \"" + s + "\")");
}
DType parse_dtype(const std::string& s, const char* arg, bool allow_f32) {
  if (s == "bfloat16") return DType::kBF16;
  if (s == "float16") return DType::kF16;
  if (allow_f32 && s == "float32") return DType::kF32;
  value_error(std::string(arg) + ": must be " + (allow_f32 ? "\"float32\", " : "") +
              "\"bfloat16\" or \"float16\" (got \"" + s + "\")");
}

// ---- host array checks -------------------------------------------------------------------------------
std::string dtype_str(nb::dlpack::dtype d) {
  using C = nb::dlpack::dtype_code;
  const char* base = "unknown";
  switch (static_cast<C>(d.code)) {
    case C::Int: base = "int"; break;
    case C::UInt: base = "uint"; break;
    case C::Float: base = "float"; break;
    case C::Bfloat: base = "bfloat"; break;
    case C::Complex: base = "complex"; break;
    case C::Bool: return "bool";
    default: return "an unsupported dtype (DLPack code " + std::to_string(d.code) + ")";
  }
  return base + std::to_string(d.bits);
}
bool is(nb::dlpack::dtype d, nb::dlpack::dtype_code code, int bits) {
  return d.code == static_cast<uint8_t>(code) && d.bits == bits && d.lanes == 1;
}
bool is_f32(nb::dlpack::dtype d) { return is(d, nb::dlpack::dtype_code::Float, 32); }
bool is_u8(nb::dlpack::dtype d) { return is(d, nb::dlpack::dtype_code::UInt, 8); }

// Host memory, `ndim` dimensions, C-contiguous (strides of extent-1 dimensions are irrelevant, as in numpy).
void check_layout(const HostIn& a, const char* name, size_t ndim) {
  if (a.device_type() != nb::device::cpu::value)
    value_error(std::string(name) + ": must be a host (CPU) array; use fp4kit.torch_ops for device tensors");
  if (a.ndim() != ndim)
    value_error(std::string(name) + ": must have " + std::to_string(ndim) + " dimension(s) (got " +
                std::to_string(a.ndim()) + ")");
  bool empty = false;  // no elements: nothing to be contiguous (and DLPack exporters give such arrays any strides)
  for (size_t d = 0; d < ndim; ++d) empty |= a.shape(d) == 0;
  int64_t expect = 1;
  for (size_t d = ndim; !empty && d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expect)
      value_error(std::string(name) + ": must be C-contiguous (e.g. numpy.ascontiguousarray)");
    expect *= static_cast<int64_t>(a.shape(d));
  }
}
[[noreturn]] void bad_dtype(const HostIn& a, const char* name, const char* rule) {
  type_error(std::string(name) + ": dtype must be " + rule + " (got " + dtype_str(a.dtype()) + ")");
}
void check_dtype(const HostIn& a, const char* name, bool ok, const char* rule) {
  if (!ok) bad_dtype(a, name, rule);
}
void check_shape2(const HostIn& a, const char* name, int64_t rows, int64_t cols) {
  if (int64_t(a.shape(0)) != rows || int64_t(a.shape(1)) != cols)
    value_error(std::string(name) + ": shape must be (" + std::to_string(rows) + ", " + std::to_string(cols) +
                ") (got (" + std::to_string(a.shape(0)) + ", " + std::to_string(a.shape(1)) + "))");
}
// Checkpoint-layout pair: packed u8 [N, K/2], scales u8 [N, K/group]; returns K.
int64_t check_checkpoint(Format f, const HostIn& packed, const HostIn& scales) {
  check_layout(packed, "packed", 2);
  check_dtype(packed, "packed", is_u8(packed.dtype()), "uint8");
  check_layout(scales, "scales", 2);
  check_dtype(scales, "scales", is_u8(scales.dtype()), "uint8");
  const int64_t n = packed.shape(0), k = 2 * int64_t(packed.shape(1)), g = fp4kit::group_size(f);
  if (k % g != 0)
    value_error("packed: K = 2 * packed.shape[1] = " + std::to_string(k) + " must be a multiple of the group size " +
                std::to_string(g));
  check_shape2(scales, "scales", n, k / g);
  return k;
}

// The DType of a float32, float16 or bfloat16 host array (else a TypeError naming it).
DType float_dtype(const HostIn& a, const char* name) {
  using C = nb::dlpack::dtype_code;
  if (is_f32(a.dtype())) return DType::kF32;
  if (is(a.dtype(), C::Float, 16)) return DType::kF16;
  if (is(a.dtype(), C::Bfloat, 16)) return DType::kBF16;
  bad_dtype(a, name, "float32, float16 or bfloat16");
}

// A new numpy array that owns zero-initialised storage (zeroed so that nothing uninitialised can leak).
template <typename T> NpOut<T> new_array(std::vector<size_t> shape) {
  size_t count = 1;
  for (size_t s : shape) count *= s;
  T* p = new T[count ? count : 1]();
  nb::capsule owner(p, [](void* q) noexcept { delete[] static_cast<T*>(q); });
  return NpOut<T>(p, shape.size(), shape.data(), owner);
}
template <typename T> T* data_of(NpOut<T>& a) { return static_cast<T*>(a.data()); }

fp4kit::PackedLayout layout_of(Format f, int64_t n, int64_t k) {
  fp4kit::PackedLayout l;
  check(fp4kit::packed_layout(f, n, k, &l));
  return l;
}

template <typename T> T* dev(uintptr_t p) { return reinterpret_cast<T*>(p); }
cudaStream_t stream_of(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// ---- CPU functions -----------------------------------------------------------------------------------
std::tuple<NpOut<uint8_t>, NpOut<uint8_t>, float> quantize_cpu(const HostIn& w, const std::string& format,
                                                                 std::optional<float> tensor_scale) {
  const Format f = parse_format(format);
  check_layout(w, "w", 2);
  const DType wd = float_dtype(w, "w");
  if (tensor_scale && f != Format::kNVFP4) value_error("tensor_scale: only NVFP4 has a tensor scale");
  const int64_t n = w.shape(0), k = w.shape(1), g = fp4kit::group_size(f);
  if (k % g != 0)
    value_error("w: K = w.shape[1] = " + std::to_string(k) + " must be a multiple of the group size " +
                std::to_string(g) + " of " + format);
  auto packed = new_array<uint8_t>({size_t(n), size_t(k / 2)});
  auto scales = new_array<uint8_t>({size_t(n), size_t(k / g)});
  float ts = 1.0f, given = tensor_scale.value_or(0.0f);
  fp4kit::QuantizeArgs a;
  a.format = f;
  a.w = w.data();
  a.w_dtype = wd;
  a.n = n;
  a.k = k;
  a.packed = data_of(packed);
  a.scales = data_of(scales);
  a.tensor_scale = &ts;
  a.given_tensor_scale = tensor_scale ? &given : nullptr;
  check_nogil([&] { return fp4kit::quantize_cpu(a); });
  if (f != Format::kNVFP4) ts = 1.0f;
  return {packed, scales, ts};
}

NpOut<float> dequantize_cpu(const HostIn& packed, const HostIn& scales, float tensor_scale,
                            const std::string& format) {
  const Format f = parse_format(format);
  const int64_t k = check_checkpoint(f, packed, scales), n = packed.shape(0);
  auto out = new_array<float>({size_t(n), size_t(k)});
  fp4kit::DequantizeArgs a;
  a.format = f;
  a.packed = static_cast<const uint8_t*>(packed.data());
  a.scales = static_cast<const uint8_t*>(scales.data());
  a.tensor_scale = tensor_scale;
  a.n = n;
  a.k = k;
  a.out = data_of(out);
  check_nogil([&] { return fp4kit::dequantize_cpu(a); });
  return out;
}

NpOut<double> reference_gemm(const HostIn& x, const HostIn& w, std::optional<HostIn> bias) {
  check_layout(x, "x", 2);
  check_dtype(x, "x", is_f32(x.dtype()), "float32");
  check_layout(w, "w", 2);
  check_dtype(w, "w", is_f32(w.dtype()), "float32");
  const int64_t m = x.shape(0), k = x.shape(1), n = w.shape(0);
  if (int64_t(w.shape(1)) != k)
    value_error("w: w.shape[1] must equal x.shape[1] = " + std::to_string(k) + " (got " +
                std::to_string(w.shape(1)) + ")");
  const float* b = nullptr;
  if (bias) {
    check_layout(*bias, "bias", 1);
    check_dtype(*bias, "bias", is_f32(bias->dtype()), "float32");
    if (int64_t(bias->shape(0)) != n)
      value_error("bias: shape must be (" + std::to_string(n) + ",) (got (" + std::to_string(bias->shape(0)) + ",))");
    b = static_cast<const float*>(bias->data());
  }
  auto y = new_array<double>({size_t(m), size_t(n)});
  check_nogil([&] {
    return fp4kit::reference_gemm(static_cast<const float*>(x.data()), static_cast<const float*>(w.data()), b, m, n,
                                  k, data_of(y));
  });
  return y;
}

nb::dict packed_layout(const std::string& format, int64_t n, int64_t k) {
  const fp4kit::PackedLayout l = layout_of(parse_format(format), n, k);
  nb::dict d;
  d["format"] = format;
  d["n"] = l.n, d["k"] = l.k, d["n_pad"] = l.n_pad, d["k_pad"] = l.k_pad;
  d["row_tiles"] = l.row_tiles, d["k_chunks"] = l.k_chunks, d["k_macros"] = l.k_macros;
  d["scale_bytes_per_lane"] = l.scale_bytes_per_lane;
  d["weights_offset"] = l.weights_offset, d["weights_bytes"] = l.weights_bytes;
  d["scales_offset"] = l.scales_offset, d["scales_bytes"] = l.scales_bytes;
  d["out_scale_offset"] = l.out_scale_offset, d["out_scale_bytes"] = l.out_scale_bytes;
  d["total_bytes"] = l.total_bytes;
  return d;
}

NpOut<uint8_t> prepack_cpu(const std::string& format, const HostIn& packed, const HostIn& scales,
                           std::optional<float> tensor_scale, std::optional<HostIn> row_tensor_scale) {
  const Format f = parse_format(format);
  const int64_t k = check_checkpoint(f, packed, scales), n = packed.shape(0);
  if (f != Format::kNVFP4) {
    // quantize() returns 1.0 for MXFP4; passing it back is harmless, anything else is a mistake.
    if ((tensor_scale && *tensor_scale != 1.0f) || row_tensor_scale)
      value_error("tensor_scale: MXFP4 has no tensor scale (give None or 1.0)");
    tensor_scale.reset();
  }
  if (tensor_scale && row_tensor_scale) value_error("tensor_scale, row_tensor_scale: give at most one");
  const fp4kit::PackedLayout l = layout_of(f, n, k);
  auto out = new_array<uint8_t>({l.total_bytes});
  const float ts = tensor_scale.value_or(1.0f);
  fp4kit::PrepackArgs a;
  a.format = f;
  a.n = n;
  a.k = k;
  a.packed = static_cast<const uint8_t*>(packed.data());
  a.scales = static_cast<const uint8_t*>(scales.data());
  a.tensor_scale = tensor_scale ? &ts : nullptr;
  if (row_tensor_scale) {
    check_layout(*row_tensor_scale, "row_tensor_scale", 1);
    check_dtype(*row_tensor_scale, "row_tensor_scale", is_f32(row_tensor_scale->dtype()), "float32");
    if (int64_t(row_tensor_scale->shape(0)) != n)
      value_error("row_tensor_scale: shape must be (" + std::to_string(n) + ",)");
    a.row_tensor_scale = static_cast<const float*>(row_tensor_scale->data());
  }
  a.dst = data_of(out);
  check_nogil([&] { return fp4kit::prepack_cpu(a); });
  return out;
}

std::tuple<NpOut<uint8_t>, NpOut<uint8_t>> unpack_cpu(const std::string& format, int64_t n, int64_t k,
                                                      const HostIn& buffer) {
  const Format f = parse_format(format);
  const fp4kit::PackedLayout l = layout_of(f, n, k);  // validates n, k
  check_layout(buffer, "buffer", 1);
  check_dtype(buffer, "buffer", is_u8(buffer.dtype()), "uint8");
  if (buffer.shape(0) < l.total_bytes)
    value_error("buffer: must hold packed_layout(...)[\"total_bytes\"] = " + std::to_string(l.total_bytes) +
                " bytes (got " + std::to_string(buffer.shape(0)) + ")");
  const int64_t g = fp4kit::group_size(f);
  auto packed = new_array<uint8_t>({size_t(n), size_t(k / 2)});
  auto scales = new_array<uint8_t>({size_t(n), size_t(k / g)});
  check(fp4kit::unpack_cpu(f, n, k, buffer.data(), data_of(packed), data_of(scales)));
  return {packed, scales};
}

// ---- GPU functions (raw device pointers) -------------------------------------------------------------
void prepack_gpu(const std::string& format, int64_t n, int64_t k, uintptr_t packed, uintptr_t scales,
                 uintptr_t tensor_scale, uintptr_t dst, uintptr_t stream, uintptr_t row_tensor_scale) {
  fp4kit::PrepackArgs a;
  a.format = parse_format(format);
  a.n = n;
  a.k = k;
  a.packed = dev<const uint8_t>(packed);
  a.scales = dev<const uint8_t>(scales);
  a.tensor_scale = dev<const float>(tensor_scale);
  a.row_tensor_scale = dev<const float>(row_tensor_scale);
  a.dst = dev<void>(dst);
  check(fp4kit::prepack_gpu(a, stream_of(stream)));
}

// A workspace query (fp4kit::gemm_workspace_bytes or _zero_bytes) on the current device.
using WorkspaceQuery = fp4kit::Status (*)(int64_t, const fp4kit::PackedWeight&, fp4kit::DType, size_t*, int);
size_t workspace_query(WorkspaceQuery q, int64_t m, const std::string& format, int64_t n, int64_t k,
                       const std::string& act, int config) {
  fp4kit::PackedWeight w;
  w.format = parse_format(format);
  w.n = n;
  w.k = k;
  size_t bytes = 0;
  check(q(m, w, parse_dtype(act, "act", false), &bytes, config));
  return bytes;
}
size_t gemm_workspace_bytes(int64_t m, const std::string& format, int64_t n, int64_t k, const std::string& act,
                            int config) {
  return workspace_query(&fp4kit::gemm_workspace_bytes, m, format, n, k, act, config);
}
size_t gemm_workspace_zero_bytes(int64_t m, const std::string& format, int64_t n, int64_t k, const std::string& act,
                                 int config) {
  return workspace_query(&fp4kit::gemm_workspace_zero_bytes, m, format, n, k, act, config);
}

void gemm(int64_t m, const std::string& act, uintptr_t x, const std::string& format, int64_t n, int64_t k,
          uintptr_t w, uintptr_t bias, uintptr_t y, uintptr_t workspace, size_t workspace_bytes, uintptr_t stream,
          int config) {
  fp4kit::GemmArgs a;
  a.m = m;
  a.act = parse_dtype(act, "act", false);
  a.x = dev<const void>(x);
  a.w.format = parse_format(format);
  a.w.n = n;
  a.w.k = k;
  a.w.data = dev<const void>(w);
  a.bias = dev<const void>(bias);
  a.y = dev<void>(y);
  a.workspace = dev<void>(workspace);
  a.workspace_bytes = workspace_bytes;
  a.config = config;
  check(fp4kit::gemm(a, stream_of(stream)));
}

fp4kit::MoEActivation parse_moe_activation(const std::string& s) {
  if (s == "silu") return fp4kit::MoEActivation::kSiluAndMul;
  if (s == "swiglu_oai") return fp4kit::MoEActivation::kSwigluOAI;
  value_error("activation: must be \"silu\" or \"swiglu_oai\" (got \"" + s + "\")");
}
fp4kit::GateUpLayout parse_gate_up_layout(const std::string& s) {
  if (s == "concatenated") return fp4kit::GateUpLayout::kConcatenated;
  if (s == "interleaved") return fp4kit::GateUpLayout::kInterleaved;
  value_error("layout: must be \"concatenated\" or \"interleaved\" (got \"" + s + "\")");
}
int experts_int(int64_t v, const char* name) {
  if (v < 0 || v > INT32_MAX) value_error(std::string(name) + ": must be in [0, 2^31) (got " + std::to_string(v) + ")");
  return int(v);
}

// The shape fields of MoEArgs (pointers null): what moe_workspace_bytes reads, and fused_moe's starting point.
fp4kit::MoEArgs moe_shape(int64_t tokens, int64_t hidden, int64_t inter, int64_t num_experts, int64_t top_k,
                          const std::string& act, const std::string& format, size_t gate_up_stride,
                          size_t down_stride, const std::string& activation, const std::string& layout) {
  fp4kit::MoEArgs a;
  a.tokens = tokens;
  a.hidden = hidden;
  a.inter = inter;
  a.num_experts = experts_int(num_experts, "num_experts");
  a.top_k = experts_int(top_k, "top_k");
  a.act = parse_dtype(act, "act", false);
  // "bf16": plain row-major [n, k] bfloat16 experts (ExpertKind::kBF16); otherwise an FP4 format.
  const bool bf16 = format == "bf16";
  if (!bf16 && format != "nvfp4" && format != "mxfp4")
    value_error("format: must be \"nvfp4\", \"mxfp4\" or \"bf16\" (got \"" + format + "\")");
  const Format f = bf16 ? Format::kMXFP4 : parse_format(format);
  const fp4kit::ExpertKind kind = bf16 ? fp4kit::ExpertKind::kBF16 : fp4kit::ExpertKind::kFP4;
  a.gate_up.kind = kind;
  a.down.kind = kind;
  a.gate_up.format = f;
  a.gate_up.n = 2 * inter;
  a.gate_up.k = hidden;
  a.gate_up.stride = gate_up_stride;
  a.down.format = f;
  a.down.n = hidden;
  a.down.k = inter;
  a.down.stride = down_stride;
  a.activation = parse_moe_activation(activation);
  a.layout = parse_gate_up_layout(layout);
  return a;
}

size_t moe_workspace_bytes(int64_t tokens, int64_t hidden, int64_t inter, int64_t num_experts, int64_t top_k,
                           const std::string& act, const std::string& format, size_t gate_up_stride,
                           size_t down_stride, const std::string& activation, const std::string& layout) {
  const fp4kit::MoEArgs a = moe_shape(tokens, hidden, inter, num_experts, top_k, act, format, gate_up_stride,
                                      down_stride, activation, layout);
  size_t bytes = 0;
  check(fp4kit::moe_workspace_bytes(a, &bytes));
  return bytes;
}

void fused_moe(int64_t tokens, int64_t hidden, int64_t inter, int64_t num_experts, int64_t top_k,
               const std::string& act, uintptr_t x, uintptr_t topk_ids, uintptr_t topk_weights,
               const std::string& format, uintptr_t gate_up, size_t gate_up_stride, uintptr_t gate_up_bias,
               uintptr_t down, size_t down_stride, uintptr_t down_bias, const std::string& activation,
               const std::string& layout, float alpha, float limit, uintptr_t y, uintptr_t workspace,
               size_t workspace_bytes, uintptr_t stream) {
  fp4kit::MoEArgs a = moe_shape(tokens, hidden, inter, num_experts, top_k, act, format, gate_up_stride,
                                down_stride, activation, layout);
  a.x = dev<const void>(x);
  a.topk_ids = dev<const int32_t>(topk_ids);
  a.topk_weights = dev<const float>(topk_weights);
  a.gate_up.data = dev<const void>(gate_up);
  a.gate_up.bias = dev<const void>(gate_up_bias);
  a.down.data = dev<const void>(down);
  a.down.bias = dev<const void>(down_bias);
  a.alpha = alpha;
  a.limit = limit;
  a.y = dev<void>(y);
  a.workspace = dev<void>(workspace);
  a.workspace_bytes = workspace_bytes;
  check(fp4kit::fused_moe(a, stream_of(stream)));
}

// ---- routing (fp4kit/routing.h) ------------------------------------------------------------------------
fp4kit::Routing routing_of(const std::string& routing, bool renormalize, int64_t n_group, int64_t topk_group,
                           float routed_scaling_factor) {
  fp4kit::Routing r;
  if (routing == "softmax") r.mode = fp4kit::RoutingMode::kSoftmaxTopK;
  else if (routing == "sigmoid_grouped") r.mode = fp4kit::RoutingMode::kSigmoidGroupedTopK;
  else value_error("routing: must be \"softmax\" or \"sigmoid_grouped\" (got \"" + routing + "\")");
  auto small = [](int64_t v, const char* name) {
    if (v < INT32_MIN || v > INT32_MAX) value_error(std::string(name) + ": out of range (got " + std::to_string(v) + ")");
    return int(v);
  };
  r.renormalize = renormalize;
  r.n_group = small(n_group, "n_group");
  r.topk_group = small(topk_group, "topk_group");
  r.routed_scaling_factor = routed_scaling_factor;
  return r;
}

// Python's names for the routing fields: "routing.n_group: ..." -> "n_group: ...", "top_k: ..." -> "k: ...".
Status python_names(const Status& s) {
  if (s.ok()) return s;
  for (const std::string& pre : {std::string("routing."), std::string("top_k: ")}) {
    if (s.message().compare(0, pre.size(), pre) == 0)
      return Status(s.code(), (pre == "top_k: " ? "k: " : "") + s.message().substr(pre.size()));
  }
  return s;
}

// Host logits [T, E] (float32, float16 or bfloat16) -> (ids int32 [T, k], weights float32 [T, k]).
std::tuple<NpOut<int32_t>, NpOut<float>> route_cpu(const HostIn& logits, int64_t k, const std::string& routing,
                                                   bool renormalize, int64_t n_group, int64_t topk_group,
                                                   float routed_scaling_factor,
                                                   std::optional<HostIn> correction_bias) {
  fp4kit::RouteArgs a;
  a.routing = routing_of(routing, renormalize, n_group, topk_group, routed_scaling_factor);
  check_layout(logits, "logits", 2);
  a.routing.logits_dtype = float_dtype(logits, "logits");
  const int64_t t = logits.shape(0), e = logits.shape(1);
  if (e < 1 || e > fp4kit::kRoutingMaxExperts)
    value_error("logits: routing takes 1 to " + std::to_string(fp4kit::kRoutingMaxExperts) +
                " experts (logits.shape[1] = " + std::to_string(e) + ")");
  if (k < 1 || k > std::min<int64_t>(e, fp4kit::kRoutingMaxTopK))
    value_error("k: must be in [1, min(logits.shape[1] = " + std::to_string(e) + ", " +
                std::to_string(fp4kit::kRoutingMaxTopK) + ")] (got " + std::to_string(k) + ")");
  if (correction_bias) {
    check_layout(*correction_bias, "correction_bias", 1);
    check_dtype(*correction_bias, "correction_bias", is_f32(correction_bias->dtype()), "float32");
    if (int64_t(correction_bias->shape(0)) != e)
      value_error("correction_bias: shape must be (" + std::to_string(e) + ",), one per expert (got (" +
                  std::to_string(correction_bias->shape(0)) + ",))");
    a.routing.correction_bias = static_cast<const float*>(correction_bias->data());
  }
  a.tokens = t;
  a.num_experts = int(e);
  a.top_k = int(k);
  a.routing.logits = logits.data();
  auto ids = new_array<int32_t>({size_t(t), size_t(k)});
  auto w = new_array<float>({size_t(t), size_t(k)});
  if (t == 0) return {ids, w};
  a.topk_ids = data_of(ids);
  a.topk_weights = data_of(w);
  check_nogil([&] { return python_names(fp4kit::route_cpu(a)); });
  return {ids, w};
}

void route(int64_t tokens, int64_t num_experts, int64_t k, const std::string& routing, uintptr_t logits,
           const std::string& logits_dtype, bool renormalize, int64_t n_group, int64_t topk_group,
           float routed_scaling_factor, uintptr_t correction_bias, uintptr_t topk_ids, uintptr_t topk_weights,
           uintptr_t stream) {
  fp4kit::RouteArgs a;
  a.routing = routing_of(routing, renormalize, n_group, topk_group, routed_scaling_factor);
  if (num_experts < 1 || num_experts > INT32_MAX || k < 1 || k > num_experts)
    value_error("k: must be in [1, num_experts = " + std::to_string(num_experts) + "] (got " + std::to_string(k) + ")");
  a.tokens = tokens;
  a.num_experts = int(num_experts);
  a.top_k = int(k);
  a.routing.logits = dev<const void>(logits);
  a.routing.logits_dtype = parse_dtype(logits_dtype, "logits_dtype", true);
  a.routing.correction_bias = dev<const float>(correction_bias);
  a.topk_ids = dev<int32_t>(topk_ids);
  a.topk_weights = dev<float>(topk_weights);
  check(python_names(fp4kit::route(a, stream_of(stream))));
}

void quantize_gpu(const std::string& format, uintptr_t w, const std::string& w_dtype, int64_t n, int64_t k,
                  uintptr_t packed, uintptr_t scales, uintptr_t tensor_scale, uintptr_t workspace, uintptr_t stream,
                  uintptr_t given_tensor_scale) {
  fp4kit::QuantizeArgs a;
  a.format = parse_format(format);
  a.w = dev<const void>(w);
  a.w_dtype = parse_dtype(w_dtype, "w_dtype", true);
  a.n = n;
  a.k = k;
  a.packed = dev<uint8_t>(packed);
  a.scales = dev<uint8_t>(scales);
  a.tensor_scale = dev<float>(tensor_scale);
  a.given_tensor_scale = dev<const float>(given_tensor_scale);
  check(fp4kit::quantize_gpu(a, dev<void>(workspace), stream_of(stream)));
}

// 0 when there is no driver, no device or any other failure: callers use it to decide whether to skip.
int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the (non-sticky) error so that later runtime calls start clean
    return 0;
  }
  return count;
}

// Tuning tables (fp4kit/tuning.h): load or clear, and the config the dispatcher would pick.
void load_tuning_table(const std::string& path) { check(fp4kit::load_tuning_table(path)); }
std::string dispatch_config_name(const std::string& format, const std::string& act, int64_t m, int64_t n,
                                 int64_t k, const std::string& device_name, int cc_major, int sms) {
  if (cc_major < 8) throw nb::value_error(("cc_major: must be >= 8 (got " + std::to_string(cc_major) + ")").c_str());
  if (sms < 0) throw nb::value_error(("sms: must be >= 0 (got " + std::to_string(sms) + ")").c_str());
  const fp4kit::Format f = parse_format(format);
  if (act != "bfloat16" && act != "float16")
    throw nb::value_error(("act: must be \"bfloat16\" or \"float16\" (got \"" + act + "\")").c_str());
  const fp4kit::DType d = act == "bfloat16" ? fp4kit::DType::kBF16 : fp4kit::DType::kF16;
  std::string why;
  const int id = fp4kit::dispatch_config(f, d, m, n, k, device_name, &why, cc_major, sms);
  return std::string(fp4kit::kernel_config_name(id)) + ": " + why;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "fp4kit native module (see the fp4kit package for the documented API)";
  m.attr("__version__") = FP4KIT_VERSION;

  m.def("quantize_cpu", &quantize_cpu, "w"_a, "format"_a = "nvfp4", "tensor_scale"_a = nb::none(),
        "Quantize host W [N, K] (float32/float16/bfloat16) -> (packed uint8 [N, K/2], scales uint8 [N, K/g], "
        "tensor_scale).");
  m.def("dequantize_cpu", &dequantize_cpu, "packed"_a, "scales"_a, "tensor_scale"_a = 1.0f, "format"_a = "nvfp4",
        "Dequantize the checkpoint layout -> float32 [N, K].");
  m.def("reference_gemm", &reference_gemm, "x"_a, "w"_a, "bias"_a = nb::none(),
        "x float32 [M, K] @ w float32 [N, K]^T (+ bias [N]) accumulated in float64 -> float64 [M, N].");
  m.def("packed_layout", &packed_layout, "format"_a, "n"_a, "k"_a, "PackedLayout fields as a dict.");
  m.def("prepack_cpu", &prepack_cpu, "format"_a, "packed"_a, "scales"_a, "tensor_scale"_a = nb::none(),
        "row_tensor_scale"_a = nb::none(), "Checkpoint layout -> kernel layout (uint8 [total_bytes]).");
  m.def("unpack_cpu", &unpack_cpu, "format"_a, "n"_a, "k"_a, "buffer"_a,
        "Kernel layout -> checkpoint layout (packed, scales).");

  m.def("prepack_gpu", &prepack_gpu, "format"_a, "n"_a, "k"_a, "packed_ptr"_a, "scales_ptr"_a,
        "tensor_scale_ptr"_a, "dst_ptr"_a, "stream"_a, "row_tensor_scale_ptr"_a = 0,
        "Prepack on the device (raw pointers; 0 = null; asynchronous on `stream`).");
  m.def("gemm_workspace_bytes", &gemm_workspace_bytes, "m"_a, "format"_a, "n"_a, "k"_a, "act"_a,
        "config"_a = -1, "Workspace bytes gemm() needs on the current device.");
  m.def("gemm_workspace_zero_bytes", &gemm_workspace_zero_bytes, "m"_a, "format"_a, "n"_a, "k"_a, "act"_a,
        "config"_a = -1, "Of those, the leading bytes that must be zero when a call starts (the counters).");
  m.def("gemm", &gemm, "m"_a, "act"_a, "x_ptr"_a, "format"_a, "n"_a, "k"_a, "w_ptr"_a, "bias_ptr"_a, "y_ptr"_a,
        "workspace_ptr"_a, "workspace_bytes"_a, "stream"_a, "config"_a = -1,
        "Y[m, n] = X[m, k] W^T (+ bias) on the device (raw pointers; asynchronous on `stream`).");
  m.def("moe_workspace_bytes", &moe_workspace_bytes, "tokens"_a, "hidden"_a, "inter"_a, "num_experts"_a, "top_k"_a,
        "act"_a, "format"_a, "gate_up_stride"_a, "down_stride"_a, "activation"_a = "silu",
        "layout"_a = "concatenated", "Workspace bytes fused_moe() needs for these shapes on the current device.");
  m.def("fused_moe", &fused_moe, "tokens"_a, "hidden"_a, "inter"_a, "num_experts"_a, "top_k"_a, "act"_a, "x_ptr"_a,
        "topk_ids_ptr"_a, "topk_weights_ptr"_a, "format"_a, "gate_up_ptr"_a, "gate_up_stride"_a,
        "gate_up_bias_ptr"_a, "down_ptr"_a, "down_stride"_a, "down_bias_ptr"_a, "activation"_a, "layout"_a,
        "alpha"_a, "limit"_a, "y_ptr"_a, "workspace_ptr"_a, "workspace_bytes"_a, "stream"_a,
        "Fused MoE layer for given routing (fp4kit/moe.h) on the device: experts stacked `stride` bytes apart, "
        "gate_up [2*inter, hidden], down [hidden, inter]; format \"nvfp4\"/\"mxfp4\" (prepacked) or \"bf16\" "
        "(row-major bfloat16) (raw pointers; 0 = null; asynchronous on `stream`).");
  m.def("route_cpu", &route_cpu, "logits"_a, "k"_a, "routing"_a = "softmax", "renormalize"_a = true,
        "n_group"_a = 1, "topk_group"_a = 1, "routed_scaling_factor"_a = 1.0f, "correction_bias"_a = nb::none(),
        "MoE routing on the host (fp4kit/routing.h): logits [T, E] -> (ids int32 [T, k], weights float32 [T, k]).");
  m.def("route", &route, "tokens"_a, "num_experts"_a, "k"_a, "routing"_a, "logits_ptr"_a, "logits_dtype"_a,
        "renormalize"_a, "n_group"_a, "topk_group"_a, "routed_scaling_factor"_a, "correction_bias_ptr"_a,
        "topk_ids_ptr"_a, "topk_weights_ptr"_a, "stream"_a,
        "MoE routing on the device (raw pointers; 0 = null; asynchronous on `stream`).");
  m.def("quantize_workspace_bytes", &fp4kit::quantize_workspace_bytes, "Workspace bytes quantize_gpu() needs.");
  m.def("quantize_gpu", &quantize_gpu, "format"_a, "w_ptr"_a, "w_dtype"_a, "n"_a, "k"_a, "packed_ptr"_a,
        "scales_ptr"_a, "tensor_scale_ptr"_a, "workspace_ptr"_a, "stream"_a, "given_tensor_scale_ptr"_a = 0,
        "Quantize on the device (raw pointers; asynchronous on `stream`).");
  m.def("load_tuning_table", &load_tuning_table, "path"_a, "Load a per-GPU tuning table (fp4kit/tuning.h).");
  m.def("clear_tuning_table", &fp4kit::clear_tuning_table, "Forget the loaded tuning table.");
  m.def("dispatch_config", &dispatch_config_name, "format"_a, "act"_a, "m"_a, "n"_a, "k"_a, "device_name"_a,
        "cc_major"_a = 9, "sms"_a = 0,
        "The kernel config the dispatcher picks on a device of that name, and why.");
  m.def("cuda_device_count", &cuda_device_count, "Number of CUDA devices; 0 without a driver or device.");
}
