// Status: the result of every waveboost call, with a readable message.
#pragma once

#include <string>
#include <utility>

namespace waveboost {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // the caller's arguments are wrong (shape, dtype, stride, value)
  kNotSupported = 2,     // valid arguments this backend, build or device cannot run
  kCudaError = 3,        // the CUDA runtime reported an error; message carries CUDA's text
  kInternal = 4,
};

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) { return Status(StatusCode::kInvalidArgument, std::move(msg)); }
  static Status NotSupported(std::string msg) { return Status(StatusCode::kNotSupported, std::move(msg)); }
  static Status CudaError(std::string msg) { return Status(StatusCode::kCudaError, std::move(msg)); }
  static Status Internal(std::string msg) { return Status(StatusCode::kInternal, std::move(msg)); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(StatusCode code, std::string msg) : code_(code), message_(std::move(msg)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace waveboost
