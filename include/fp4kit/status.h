// fp4kit/status.h: the error model.
//
// Every fallible call returns a Status. A failed Status carries a code and a message that names the
// offending argument and the rule it broke ("K: must be a multiple of the group size 16 (got 2881)").
// fp4kit never aborts, exits or throws across its API.
#pragma once
#include <string>
#include <utility>

namespace fp4kit {

enum class Code : int {
  kOk = 0,
  kInvalidArgument = 1,  // a shape, dtype, pointer or alignment rule is broken
  kNotSupported = 2,     // valid request that this build / device cannot serve
  kCudaError = 3,        // the CUDA runtime reported an error
  kInternal = 4,
};

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }
  static Status Invalid(std::string msg) { return Status(Code::kInvalidArgument, std::move(msg)); }
  static Status Unsupported(std::string msg) { return Status(Code::kNotSupported, std::move(msg)); }

  bool ok() const { return code_ == Code::kOk; }
  explicit operator bool() const { return ok(); }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

const char* code_name(Code c);

}  // namespace fp4kit

// Propagate a failed Status to the caller.
#define FP4KIT_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::fp4kit::Status _st = (expr);            \
    if (!_st.ok()) return _st;                \
  } while (0)
