// Private to the POSIX store: what its two read engines (io_uring in
// posix_uring.cc, a thread pool in posix_threads.cc) share with it, so that
// both check requests, open files and name errors the same way, and the
// file I/O of reads and Puts (posix_io.cc).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "stoker/status.h"
#include "stoker/store.h"

namespace stoker::posix {

// root + "/" + key. The root is kept without a trailing '/', and as "" for
// the filesystem root, so the result is always a well-formed path.
std::string JoinPath(std::string_view root, std::string_view key);

// Whether reads under `path` are served by this machine (a disk or memory
// file system, not NFS, CephFS or FUSE). A path not created yet is judged by
// the folder it will be created in.
bool IsLocalFileSystem(std::string path);

// Checks one read before any I/O: the key, that the range fits in off_t, and
// for direct I/O that dst and offset are aligned to kDirectIoAlignment. The
// length need not be aligned: an unaligned tail is read through a bounce
// buffer (see DirectMainLength), which is what lets a read end at an object's
// unaligned end.
Status CheckReadRequest(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                        bool direct);

// How many bytes of a `length`-byte read go straight into dst: all of them,
// or for direct I/O the aligned part; the rest (< kDirectIoAlignment) is read
// as one aligned block into a bounce buffer and copied.
inline size_t DirectMainLength(size_t length, bool direct) {
  return direct ? length - length % kDirectIoAlignment : length;
}

// Largest single read(2)/SQE: Linux transfers at most 0x7ffff000 bytes per
// call, and an SQE's length is 32 bits. Aligned, so direct reads stay aligned.
inline constexpr size_t kMaxReadChunk = size_t{1} << 30;

// Flags of every open for reading: O_RDONLY | O_CLOEXEC, plus O_DIRECT.
int OpenFlags(bool direct);

// The Status of an open for reading that failed with `err`. ENOENT is
// NotFound naming the path; a filesystem refusing O_DIRECT (EINVAL, e.g. old
// tmpfs) is Unsupported naming the path.
Status OpenErrorStatus(int err, const std::string& path, bool direct);

// open(2) with OpenFlags, retried on EINTR; errors as OpenErrorStatus.
Result<int> OpenForRead(const std::string& path, bool direct);

// The Status of a read that failed with `err`. EISDIR (the key names a
// folder) is NotFound, as in Stat.
Status ReadErrorStatus(int err, const std::string& path, bool direct);

// Reads dst.size() bytes at `offset` from `fd` (pread, continuing short reads,
// retrying EINTR/EAGAIN); fewer only at end of file.
Result<size_t> PreadFully(int fd, uint64_t offset, std::span<std::byte> dst, bool direct,
                          const std::string& path);

// One whole read of a range of an object, synchronously: check, open, read,
// close. The thread-pool engine runs this; so does PosixStore::Read.
ReadCompletion ReadRange(const std::string& root, std::string_view key, uint64_t offset,
                         std::span<std::byte> dst, uint64_t tag, bool direct);

// ---- the write side of a Put (posix_io.cc) ----

// The Status of the failed system call `call` on `path`, from errno (read
// first thing, before a message is built).
Status SysError(std::string_view call, std::string_view path);
// The folder part of an absolute path ("/a/b" -> "/a", "/a" -> "/").
std::string ParentOf(const std::string& path);
// fsync of a folder, so that an entry created, renamed or removed in it
// survives a crash.
Status SyncDir(const std::string& dir);
// Creates `dir` and any missing parents, fsync'ing each new entry's parent;
// `key` names the Put in messages.
Status EnsureDir(const std::string& dir, std::string_view key);
// Writes `data` to `fd` from offset 0, showing each piece to `see` (if set)
// just before it is copied; with `direct` (fd opened O_DIRECT) the aligned
// body bypasses the page cache (see posix_io.cc).
Status WriteAll(int fd, std::span<const std::byte> data, const std::string& path, bool direct,
                const PutObserver* see);

// The store-wide pool of the thread engine. Clients (read queues) post
// themselves; a worker calls RunOne, which serves one request and returns
// whether the client wants another turn (it then goes to the back of the
// line, so busy queues share the pool fairly).
class IoThreadPool final {
 public:
  class Client {
   public:
    virtual ~Client() = default;
    virtual bool RunOne() = 0;
  };

  // Starts `threads` workers. Throws std::system_error if a thread cannot be
  // started (callers convert).
  explicit IoThreadPool(uint32_t threads);
  // Stops and joins the workers; clients still in line are dropped unrun.
  ~IoThreadPool();
  IoThreadPool(const IoThreadPool&) = delete;
  IoThreadPool& operator=(const IoThreadPool&) = delete;

  void Post(std::shared_ptr<Client> client);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Client>> line_;  // guarded by mu_
  bool stop_ = false;                         // guarded by mu_
  std::vector<std::thread> threads_;
};

Result<std::unique_ptr<ReadQueue>> NewThreadReadQueue(std::shared_ptr<IoThreadPool> pool,
                                                      std::string root,
                                                      const ReadQueueOptions& options);

#ifdef STOKER_HAVE_IO_URING
// Whether this process may use io_uring with what the engine needs
// (IORING_OP_READ, IORING_FEAT_EXT_ARG: kernel 5.11+). Probed once, cached;
// fails under seccomp (EPERM), with io_uring disabled (sysctl), on old kernels.
Status ProbeIoUring();

Result<std::unique_ptr<ReadQueue>> NewUringReadQueue(std::string root,
                                                     const ReadQueueOptions& options);
#endif

}  // namespace stoker::posix
