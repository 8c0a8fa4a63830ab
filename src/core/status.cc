#include "stoker/status.h"

#include <cerrno>
#include <cstring>

namespace stoker {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidArgument:
      return "Invalid argument";
    case Code::kNotFound:
      return "Not found";
    case Code::kAlreadyExists:
      return "Already exists";
    case Code::kPermissionDenied:
      return "Permission denied";
    case Code::kCorruption:
      return "Corruption";
    case Code::kUnsupported:
      return "Unsupported";
    case Code::kIoError:
      return "I/O error";
    case Code::kTimedOut:
      return "Timed out";
    case Code::kUnavailable:
      return "Unavailable";
    case Code::kNoSpace:
      return "No space";
    case Code::kCancelled:
      return "Cancelled";
    case Code::kOutOfRange:
      return "Out of range";
    case Code::kInternal:
      return "Internal error";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(CodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_, retryable_);
}

Status ErrnoToStatus(int err, std::string_view what) {
  std::string msg = std::string(what) + ": " + std::strerror(err);
  switch (err) {
    case 0:
      return Status::Ok();
    case ENOENT:
    case ENOTDIR:
      return NotFound(std::move(msg));
    case EEXIST:
      return AlreadyExists(std::move(msg));
    case EPERM:
    case EACCES:
    case EROFS:
      return PermissionDenied(std::move(msg));
    case ENOSPC:
    case EDQUOT:
      return NoSpace(std::move(msg));
    case EINVAL:
    case ENAMETOOLONG:
    case EISDIR:
      return InvalidArgument(std::move(msg));
    case ETIMEDOUT:
      return TimedOut(std::move(msg));
    case EAGAIN:
    case EINTR:
    case EBUSY:
      return IoError(std::move(msg), /*retryable=*/true);
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ESHUTDOWN:
    case ENOTCONN:
      return Unavailable(std::move(msg));
    case ECANCELED:
      return Cancelled(std::move(msg));
    case ENOSYS:
    case EOPNOTSUPP:
      return Unsupported(std::move(msg));
    default:
      return IoError(std::move(msg));
  }
}

}  // namespace stoker
