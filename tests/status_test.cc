// Status and Result (include/stoker/status.h): codes and their names, the
// retryable flag of each constructor, context, the propagation macros, and
// the one errno map (ENOENT is NotFound everywhere).
#include "stoker/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

namespace stoker {
namespace {

TEST(StatusTest, OkIsTheDefaultAndPrintsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), Code::kOk);
  EXPECT_FALSE(s.retryable());
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_EQ(s, Status::Ok());
  EXPECT_TRUE(s.WithContext("ignored").ok()) << "context never turns OK into an error";
}

TEST(StatusTest, EachConstructorHasItsCodeAndRetryableFlag) {
  struct Case {
    Status s;
    Code code;
    bool retryable;
  };
  const std::vector<Case> cases = {
      {InvalidArgument("m"), Code::kInvalidArgument, false},
      {NotFound("m"), Code::kNotFound, false},
      {AlreadyExists("m"), Code::kAlreadyExists, false},
      {PermissionDenied("m"), Code::kPermissionDenied, false},
      {Corruption("m"), Code::kCorruption, false},
      {Unsupported("m"), Code::kUnsupported, false},
      {IoError("m"), Code::kIoError, false},
      {IoError("m", true), Code::kIoError, true},
      {TimedOut("m"), Code::kTimedOut, true},
      {Unavailable("m"), Code::kUnavailable, true},
      {NoSpace("m"), Code::kNoSpace, false},
      {Cancelled("m"), Code::kCancelled, false},
      {OutOfRange("m"), Code::kOutOfRange, false},
      {Internal("m"), Code::kInternal, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(CodeName(c.code)));
    EXPECT_FALSE(c.s.ok());
    EXPECT_EQ(c.s.code(), c.code);
    EXPECT_EQ(c.s.retryable(), c.retryable);
    EXPECT_EQ(c.s.message(), "m");
    EXPECT_EQ(c.s.ToString(), std::string(CodeName(c.code)) + ": m");
  }
}

TEST(StatusTest, CodesAreStableAndNamed) {
  // The numbers are exit codes of the CLI (offset by 10) and part of the
  // Python exception mapping: they never change.
  EXPECT_EQ(int(Code::kNotFound), 2);
  EXPECT_EQ(int(Code::kCorruption), 5);
  EXPECT_EQ(int(Code::kInternal), 13);
  for (int c = 0; c <= int(Code::kInternal); ++c) {
    EXPECT_NE(CodeName(Code(c)), "Unknown") << c;
  }
  EXPECT_EQ(CodeName(Code(99)), "Unknown");
}

TEST(StatusTest, WithContextPrefixesAndKeepsCodeAndRetryable) {
  Status s = TimedOut("read x").WithContext("batch 3").WithContext("epoch 1");
  EXPECT_EQ(s.code(), Code::kTimedOut);
  EXPECT_TRUE(s.retryable());
  EXPECT_EQ(s.message(), "epoch 1: batch 3: read x");
  EXPECT_NE(s, TimedOut("read x")) << "equality compares the message too";
}

TEST(StatusTest, ErrnoMap) {
  struct Case {
    int err;
    Code code;
    bool retryable;
  };
  const std::vector<Case> cases = {
      {ENOENT, Code::kNotFound, false},
      {ENOTDIR, Code::kNotFound, false},
      {EEXIST, Code::kAlreadyExists, false},
      {EPERM, Code::kPermissionDenied, false},
      {EACCES, Code::kPermissionDenied, false},
      {EROFS, Code::kPermissionDenied, false},
      {ENOSPC, Code::kNoSpace, false},
      {EDQUOT, Code::kNoSpace, false},
      {EINVAL, Code::kInvalidArgument, false},
      {ENAMETOOLONG, Code::kInvalidArgument, false},
      {EISDIR, Code::kInvalidArgument, false},
      {ETIMEDOUT, Code::kTimedOut, true},
      {EAGAIN, Code::kIoError, true},
      {EINTR, Code::kIoError, true},
      {EBUSY, Code::kIoError, true},
      {ECONNREFUSED, Code::kUnavailable, true},
      {EHOSTUNREACH, Code::kUnavailable, true},
      {ENETUNREACH, Code::kUnavailable, true},
      {ESHUTDOWN, Code::kUnavailable, true},
      {ENOTCONN, Code::kUnavailable, true},
      {ECANCELED, Code::kCancelled, false},
      {ENOSYS, Code::kUnsupported, false},
      {EOPNOTSUPP, Code::kUnsupported, false},
      {EIO, Code::kIoError, false},
      {EMFILE, Code::kIoError, false},
  };
  for (const Case& c : cases) {
    Status s = ErrnoToStatus(c.err, "open /x/y");
    SCOPED_TRACE(s.ToString());
    EXPECT_EQ(s.code(), c.code);
    EXPECT_EQ(s.retryable(), c.retryable);
    EXPECT_EQ(s.message().rfind("open /x/y: ", 0), 0u) << "the message names the call first";
  }
  EXPECT_TRUE(ErrnoToStatus(0, "x").ok());
}

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument(std::to_string(x) + " is odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  STOKER_ASSIGN_OR_RETURN(int h, Half(x));
  STOKER_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  STOKER_RETURN_IF_ERROR(Half(x).status());
  return Status::Ok();
}

TEST(ResultTest, HoldsAValueOrTheStatusAndMacrosPropagate) {
  Result<int> r = Quarter(12);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 3);
  EXPECT_TRUE(r.status().ok());
  Result<int> bad = Quarter(6);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "3 is odd");
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).code(), Code::kInvalidArgument);
  // Move-only values move out.
  Result<std::unique_ptr<int>> p = std::make_unique<int>(7);
  std::unique_ptr<int> got = std::move(p).value();
  EXPECT_EQ(*got, 7);
  Result<std::string> s = std::string("abc");
  EXPECT_EQ(s->size(), 3u);
}

}  // namespace
}  // namespace stoker
