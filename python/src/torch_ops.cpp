// libfp4kit_torch: the CUDA kernel of torch.ops.fp4kit.gemm, registered with the PyTorch dispatcher in C++.
//
// Why C++: a Python kernel behind torch.ops costs ~8 us per eager call (dispatcher -> Python -> argument
// checks -> nanobind), more than a small decode GEMM takes on the GPU. Here the same call is a few
// microseconds of host time. The schema, the fake (meta) kernel and the CPU kernel stay in
// python/fp4kit/ops.py, which defines the op first and then loads this library (torch.ops.load_library);
// when the library is absent (torch not found at build time) ops.py registers its Python CUDA kernel.
//
// Contract (same as fp4kit.torch_ops.gemm, same messages):
//   gemm(Tensor x, Tensor w, str format, int n, int k, Tensor? bias=None) -> Tensor
//   x [..., k] bf16/fp16 on a CUDA device (made contiguous), w the uint8 buffer of prepack() on that
//   device, bias [n] of x's dtype. The output is new; nothing is mutated. The launch is on the current
//   stream; no host synchronisation. The scratch workspace is one zero-filled buffer per (device,
//   stream) in eager mode (fp4kit leaves it zeroed), and a fresh one from the graph's pool while the
//   stream is capturing (its counters cleared), so that captured graphs never share scratch memory with
//   eager calls.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "fp4kit/gemm.h"
#include "fp4kit/repack.h"

namespace {

fp4kit::Format parse_format(const std::string& s) {
  if (s == "nvfp4") return fp4kit::Format::kNVFP4;
  if (s == "mxfp4") return fp4kit::Format::kMXFP4;
  TORCH_CHECK_VALUE(false, "format: must be 'nvfp4' or 'mxfp4' (got '", s, "')");
  return fp4kit::Format::kNVFP4;
}

void check_status(const fp4kit::Status& s) {
  if (s.ok()) return;
  if (s.code() == fp4kit::Code::kInvalidArgument) TORCH_CHECK_VALUE(false, s.message());
  if (s.code() == fp4kit::Code::kNotSupported) TORCH_CHECK_NOT_IMPLEMENTED(false, s.message());
  TORCH_CHECK(false, s.message());
}

// Layout size and workspace size per problem, cached: both are pure functions of their key.
std::mutex g_mu;
std::map<std::tuple<int, int64_t, int64_t>, size_t> g_total_bytes;
std::map<std::tuple<int, int, int64_t, int, int64_t, int64_t>, std::pair<size_t, size_t>> g_ws_bytes;
std::map<std::pair<int, cudaStream_t>, at::Tensor> g_workspaces;

size_t total_bytes(fp4kit::Format f, int64_t n, int64_t k) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto key = std::make_tuple(int(f), n, k);
  auto it = g_total_bytes.find(key);
  if (it != g_total_bytes.end()) return it->second;
  fp4kit::PackedLayout l;
  check_status(fp4kit::packed_layout(f, n, k, &l));
  g_total_bytes[key] = l.total_bytes;
  return l.total_bytes;
}

// {bytes, leading bytes that must be zero when a call starts} of the GEMM's workspace.
std::pair<size_t, size_t> workspace_bytes(int dev, int64_t m, const fp4kit::PackedWeight& w, fp4kit::DType act) {
  auto key = std::make_tuple(dev, int(w.format), m, int(act), w.n, w.k);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_ws_bytes.find(key);
    if (it != g_ws_bytes.end()) return it->second;
  }
  std::pair<size_t, size_t> b{0, 0};
  check_status(fp4kit::gemm_workspace_bytes(m, w, act, &b.first));
  check_status(fp4kit::gemm_workspace_zero_bytes(m, w, act, &b.second));
  std::lock_guard<std::mutex> lock(g_mu);
  g_ws_bytes[key] = b;
  return b;
}

// While the stream captures a graph: a fresh buffer from the graph's pool with only its leading
// zero_bytes cleared (the arrival counters; the rest is scratch the GEMM writes before it reads), so
// the captured memset is kilobytes, not the megabytes of partials and lane-ordered X.
at::Tensor workspace(const at::Device& device, cudaStream_t stream, std::pair<size_t, size_t> bytes) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TORCH_CHECK(cudaStreamIsCapturing(stream, &capture) == cudaSuccess, "stream: cannot query its capture status");
  const auto opts = at::TensorOptions().dtype(at::kByte).device(device);
  if (capture != cudaStreamCaptureStatusNone) {
    at::Tensor ws = at::empty({int64_t(bytes.first)}, opts);
    if (bytes.second) ws.narrow(0, 0, int64_t(bytes.second)).zero_();
    return ws;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  at::Tensor& ws = g_workspaces[{int(device.index()), stream}];
  // Grown, never shrunk; the old buffer goes back to the caching allocator stream-ordered.
  if (!ws.defined() || size_t(ws.numel()) < bytes.first) ws = at::zeros({int64_t(bytes.first)}, opts);
  return ws;
}

const char* dtype_list = "torch.bfloat16, torch.float16";

at::Tensor gemm_cuda(const at::Tensor& x_in, const at::Tensor& w, c10::string_view format_sv, int64_t n, int64_t k,
                     const std::optional<at::Tensor>& bias) {
  const fp4kit::Format format = parse_format(std::string(format_sv));
  TORCH_CHECK_TYPE(x_in.scalar_type() == at::kBFloat16 || x_in.scalar_type() == at::kHalf, "x: dtype must be one of ",
                   dtype_list, " (got ", x_in.scalar_type(), ")");
  TORCH_CHECK_VALUE(x_in.is_cuda(), "x: must be a CUDA tensor (got ", x_in.device(), ")");
  TORCH_CHECK_VALUE(x_in.dim() >= 1 && x_in.size(-1) == k, "x: last dimension must be k = ", k, " (got shape ",
                    x_in.sizes(), ")");
  const at::Tensor x = x_in.contiguous();
  const at::Device device = x.device();
  TORCH_CHECK_TYPE(w.scalar_type() == at::kByte, "packed_buffer: dtype must be one of torch.uint8 (got ",
                   w.scalar_type(), ")");
  TORCH_CHECK_VALUE(w.device() == device, "packed_buffer: must be on ", device, " (got ", w.device(), ")");
  TORCH_CHECK_VALUE(w.is_contiguous(), "packed_buffer: must be contiguous (call .contiguous() first)");
  TORCH_CHECK_VALUE(n >= 0 && k >= 0, "n, k: must be >= 0 (got n = ", n, ", k = ", k, ")");
  const size_t need = total_bytes(format, n, k);
  TORCH_CHECK_VALUE(size_t(w.numel()) >= need, "packed_buffer: must hold ", need, " bytes for ", std::string(format_sv),
                    " [", n, ", ", k, "] (got ", w.numel(), "); was it prepacked for another shape?");
  if (bias) {
    TORCH_CHECK_TYPE(bias->scalar_type() == x.scalar_type(), "bias: dtype must be one of ", x.scalar_type(), " (got ",
                     bias->scalar_type(), ")");
    TORCH_CHECK_VALUE(bias->device() == device, "bias: must be on ", device, " (got ", bias->device(), ")");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == n, "bias: shape must be (", n, ",) (got ", bias->sizes(),
                      ")");
    TORCH_CHECK_VALUE(bias->is_contiguous(), "bias: must be contiguous (call .contiguous() first)");
  }
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = n;
  at::Tensor y = at::empty(out_shape, x.options());
  const int64_t m = k ? x.numel() / k : 0;
  if (m == 0 || n == 0) return y;

  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  fp4kit::GemmArgs a;
  a.m = m;
  a.act = x.scalar_type() == at::kBFloat16 ? fp4kit::DType::kBF16 : fp4kit::DType::kF16;
  a.x = x.data_ptr();
  a.w.format = format;
  a.w.n = n;
  a.w.k = k;
  a.w.data = w.data_ptr();
  a.bias = bias ? bias->data_ptr() : nullptr;
  a.y = y.data_ptr();
  const std::pair<size_t, size_t> wsb = workspace_bytes(device.index(), m, a.w, a.act);
  a.workspace_bytes = wsb.first;
  at::Tensor ws;
  if (a.workspace_bytes) {
    ws = workspace(device, stream, wsb);
    a.workspace = ws.data_ptr();
  }
  check_status(fp4kit::gemm(a, stream));
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(fp4kit, CUDA, m) { m.impl("gemm", &gemm_cuda); }
