// Status and Result<T>: the one error model of stoker.
//
// Every fallible function in the core returns a Status or a Result<T>. No
// exception crosses a module boundary; the CLI turns a Status into a message
// and an exit code, the Python binding into an exception. A Status carries a
// code from the single table below, a message that names what failed and
// where (object, sample, call), and a retryable flag: a storage timeout is
// retryable, a checksum mismatch is not.
//
// Thread safety: Status and Result are values; distinct objects may be used
// from distinct threads freely, a shared one only for reading.
#pragma once

#include <cassert>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace stoker {

// The one table of error codes. Numbers are stable (they are process exit
// codes of the CLI, offset by 10, and part of the Python exception mapping).
enum class Code : int {
  kOk = 0,
  kInvalidArgument = 1,   // the caller asked for something impossible
  kNotFound = 2,          // an object, file or dataset does not exist (ENOENT)
  kAlreadyExists = 3,     // e.g. pack into a destination holding a dataset
  kPermissionDenied = 4,  // EPERM/EACCES, cephx refusals
  kCorruption = 5,        // bad magic, bad checksum, index out of bounds
  kUnsupported = 6,       // e.g. a format version newer than this build
  kIoError = 7,           // any other I/O failure
  kTimedOut = 8,          // a deadline passed (retryable)
  kUnavailable = 9,       // a service cannot be reached right now (retryable)
  kNoSpace = 10,          // ENOSPC, a full pool
  kCancelled = 11,        // the operation was abandoned by shutdown
  kOutOfRange = 12,       // end of an iteration; not an error for iterators
  kInternal = 13,         // a bug in stoker
};

std::string_view CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message, bool retryable = false)
      : code_(code), retryable_(retryable), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  bool retryable() const { return retryable_; }
  const std::string& message() const { return message_; }

  // "Corruption: shard-000003.stk: sample 17: checksum mismatch"
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  Code code_ = Code::kOk;
  bool retryable_ = false;
  std::string message_;
};

// Constructors for each code, so that call sites read as what they mean.
inline Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {Code::kAlreadyExists, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {Code::kPermissionDenied, std::move(m)}; }
inline Status Corruption(std::string m) { return {Code::kCorruption, std::move(m)}; }
inline Status Unsupported(std::string m) { return {Code::kUnsupported, std::move(m)}; }
inline Status IoError(std::string m, bool retryable = false) {
  return {Code::kIoError, std::move(m), retryable};
}
inline Status TimedOut(std::string m) { return {Code::kTimedOut, std::move(m), true}; }
inline Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m), true}; }
inline Status NoSpace(std::string m) { return {Code::kNoSpace, std::move(m)}; }
inline Status Cancelled(std::string m) { return {Code::kCancelled, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {Code::kOutOfRange, std::move(m)}; }
inline Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }

// Maps an errno value to a Status; `what` names the object and the call,
// e.g. "open /data/ds/manifest". ENOENT is NotFound everywhere.
Status ErrnoToStatus(int err, std::string_view what);

// A value or the Status that explains its absence.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result built from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace stoker

// Propagation helpers. STOKER_RETURN_IF_ERROR(expr) returns the Status of a
// failed expression; STOKER_ASSIGN_OR_RETURN(lhs, expr) unwraps a Result.
#define STOKER_RETURN_IF_ERROR(expr) \
  do {                               \
    ::stoker::Status _st = (expr);   \
    if (!_st.ok()) return _st;       \
  } while (0)

#define STOKER_CONCAT_INNER(a, b) a##b
#define STOKER_CONCAT(a, b) STOKER_CONCAT_INNER(a, b)
#define STOKER_ASSIGN_OR_RETURN(lhs, expr) \
  STOKER_ASSIGN_OR_RETURN_IMPL(STOKER_CONCAT(_res_, __LINE__), lhs, expr)
#define STOKER_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
