// Status and StatusOr: how every trainguard module reports an error.
//
// A Status is OK or carries one of a few codes plus a human-readable message.
// Subsystem detail goes in the message, never in a new code. What a caller
// does with each code:
//   kInvalidArgument    the input (flag, config, file content) is wrong; report it,
//                       do not retry.
//   kNotFound           the named thing does not exist; report or create it.
//   kUnavailable        a peer or resource is unreachable right now; retry with
//                       backoff or treat the peer as failed.
//   kDeadlineExceeded   an operation did not finish in time; same as kUnavailable.
//   kFailedPrecondition the system is not in a state that allows the call
//                       (e.g. protocol version mismatch); report, do not retry.
//   kIoError            the OS refused (disk full, permission); report with the path.
//   kInternal           a bug of ours; report it.
// Exceptions never cross module boundaries; the Python binding turns a non-OK
// Status into a Python exception.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace trainguard {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kUnavailable,
  kDeadlineExceeded,
  kFailedPrecondition,
  kIoError,
  kInternal,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE: message", or "OK".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T value() && { return std::move(*value_); }  // by value: no dangling into a temporary
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace trainguard

#define TG_RETURN_IF_ERROR(expr)            \
  do {                                      \
    ::trainguard::Status tg_status_ = (expr); \
    if (!tg_status_.ok()) return tg_status_; \
  } while (0)
