#include "fp4kit/status.h"

#include "fp4kit/formats.h"

namespace fp4kit {

const char* code_name(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kNotSupported: return "not supported";
    case Code::kCudaError: return "cuda error";
    case Code::kInternal: return "internal error";
  }
  return "unknown";
}

const char* format_name(Format f) { return f == Format::kNVFP4 ? "nvfp4" : "mxfp4"; }

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
  }
  return "unknown";
}

}  // namespace fp4kit
