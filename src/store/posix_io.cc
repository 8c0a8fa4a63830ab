// The POSIX store's file I/O (posix_internal.h): reads of a range, for
// PosixStore::Read and the thread engine, and the write side of a Put
// (folders made durable, whole writes, direct writes through a bounce
// buffer), and which file systems serve reads locally (for the loader's
// read unit, also asked by the node cache).
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/aligned_memory.h"
#include "core/stream_copy.h"
#include "store/posix_internal.h"
#include "store/store_internal.h"

namespace stoker::posix {

using store_internal::Quote;

std::string JoinPath(std::string_view root, std::string_view key) {
  std::string path;
  path.reserve(root.size() + 1 + key.size());
  path.append(root);
  path.push_back('/');
  path.append(key);
  return path;
}

Status CheckReadRequest(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                        bool direct) {
  STOKER_RETURN_IF_ERROR(ValidateKey(key));
  constexpr uint64_t kMaxOffset = std::numeric_limits<off_t>::max();
  if (offset > kMaxOffset || dst.size() > kMaxOffset - offset) {
    return InvalidArgument(Quote(key) + ": read range [" + std::to_string(offset) + ", +" +
                           std::to_string(dst.size()) + ") is beyond the largest file offset");
  }
  if (direct) {
    const auto address = reinterpret_cast<uintptr_t>(dst.data());
    if (address % kDirectIoAlignment != 0 || offset % kDirectIoAlignment != 0) {
      return InvalidArgument(Quote(key) + ": direct_io read needs dst and offset aligned to " +
                             std::to_string(kDirectIoAlignment) + " bytes (offset " +
                             std::to_string(offset) + ", dst at address % " +
                             std::to_string(kDirectIoAlignment) + " = " +
                             std::to_string(address % kDirectIoAlignment) + ")");
    }
  }
  return Status::Ok();
}

namespace {

Status NotAnObject(const std::string& path) {
  return NotFound(path + ": is a folder, not an object");
}

}  // namespace

int OpenFlags(bool direct) { return O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0); }

Status OpenErrorStatus(int err, const std::string& path, bool direct) {
  if (direct && err == EINVAL) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return NotAnObject(path);
    return Unsupported("open " + path +
                       ": the filesystem does not support O_DIRECT (ReadQueueOptions::direct_io)");
  }
  return ErrnoToStatus(err, "open " + path);
}

Result<int> OpenForRead(const std::string& path, bool direct) {
  int fd;
  do {
    fd = ::open(path.c_str(), OpenFlags(direct));
  } while (fd < 0 && errno == EINTR);
  if (fd >= 0) return fd;
  return OpenErrorStatus(errno, path, direct);
}

Status ReadErrorStatus(int err, const std::string& path, bool direct) {
  if (err == EISDIR) return NotAnObject(path);
  Status st = ErrnoToStatus(err, "read " + path);
  if (direct && err == EINVAL) {
    return st.WithContext("direct_io (does the device need more than " +
                          std::to_string(kDirectIoAlignment) + "-byte alignment?)");
  }
  return st;
}

namespace {

// One pread, retried on EINTR/EAGAIN. Returns bytes (0 at EOF) or -errno.
ssize_t PreadOnce(int fd, void* dst, size_t length, uint64_t offset) {
  while (true) {
    const ssize_t n = ::pread(fd, dst, std::min(length, kMaxReadChunk), static_cast<off_t>(offset));
    if (n >= 0) return n;
    if (errno != EINTR && errno != EAGAIN) return -errno;
  }
}

}  // namespace

Result<size_t> PreadFully(int fd, uint64_t offset, std::span<std::byte> dst, bool direct,
                          const std::string& path) {
  const size_t main = DirectMainLength(dst.size(), direct);
  size_t done = 0;
  while (done < main) {
    const ssize_t n = PreadOnce(fd, dst.data() + done, main - done, offset + done);
    if (n < 0) return ReadErrorStatus(static_cast<int>(-n), path, direct);
    if (n == 0) return done;  // end of file
    done += static_cast<size_t>(n);
    // Direct I/O returns an unaligned count only at end of file, and a
    // continuation from an unaligned offset would fail with EINVAL.
    if (direct && n % kDirectIoAlignment != 0) return done;
  }
  if (done == dst.size()) return done;
  // A kDirectIoAlignment-aligned block for the unaligned tail.
  internal::AlignedPtr block = internal::AllocateAligned(kDirectIoAlignment, kDirectIoAlignment);
  if (block == nullptr) return IoError("read " + path + ": out of memory for bounce buffer");
  const ssize_t n = PreadOnce(fd, block.get(), kDirectIoAlignment, offset + done);
  if (n < 0) return ReadErrorStatus(static_cast<int>(-n), path, direct);
  const size_t take = std::min(static_cast<size_t>(n), dst.size() - done);
  std::memcpy(dst.data() + done, block.get(), take);
  return done + take;
}

ReadCompletion ReadRange(const std::string& root, std::string_view key, uint64_t offset,
                         std::span<std::byte> dst, uint64_t tag, bool direct) {
  ReadCompletion c;
  c.tag = tag;
  c.status = CheckReadRequest(key, offset, dst, direct);
  if (!c.status.ok()) return c;
  const std::string path = JoinPath(root, key);
  Result<int> fd = OpenForRead(path, direct);
  if (!fd.ok()) {
    c.status = fd.status();
    return c;
  }
  Result<size_t> n = PreadFully(*fd, offset, dst, direct, path);
  ::close(*fd);
  if (n.ok()) {
    c.bytes = *n;
  } else {
    c.status = n.status();
  }
  return c;
}

// ---- writes ----

// The Status of the failed system call `call` on `path`, from errno. errno is
// read first thing: building a message allocates, which may clobber it, so
// callers pass names that already exist.
Status SysError(std::string_view call, std::string_view path) {
  const int err = errno;
  std::string what(call);
  what += ' ';
  what += path;
  return ErrnoToStatus(err, what);
}


// The folder part of an absolute path ("/a/b" -> "/a", "/a" -> "/").
std::string ParentOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == 0 || slash == std::string::npos) return "/";
  return path.substr(0, slash);
}

// fsync of a folder, so that an entry created, renamed or removed in it
// survives a crash.
Status SyncDir(const std::string& dir) {
  int fd;
  do {
    fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return SysError("open", dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoToStatus(err, "fsync " + dir);
  return Status::Ok();
}

// Creates `dir` and any missing parents, fsync'ing each new entry's parent so
// that the path to a durable object is durable too.
Status EnsureDir(const std::string& dir, std::string_view key) {
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return Status::Ok();
    return InvalidArgument("put " + Quote(key) + ": " + dir +
                           " is an object, so it cannot also be a folder");
  }
  if (errno != ENOENT && errno != ENOTDIR) return SysError("stat", dir);
  const std::string parent = ParentOf(dir);
  if (parent != dir) STOKER_RETURN_IF_ERROR(EnsureDir(parent, key));
  if (::mkdir(dir.c_str(), 0755) != 0) {
    if (errno != EEXIST) return SysError("mkdir", dir);
    // Lost a race with another Put; fine if the winner made a folder.
    return EnsureDir(dir, key);
  }
  return SyncDir(parent);
}

// pwrite of all of `data` at `offset`, retried on EINTR/EAGAIN and short
// writes. Returns 0 or errno.
int PwriteAll(int fd, std::span<const std::byte> data, uint64_t offset) {
  size_t done = 0;
  while (done < data.size()) {
    const size_t chunk = std::min(data.size() - done, kMaxReadChunk);
    const ssize_t n = ::pwrite(fd, data.data() + done, chunk, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return errno;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

// One direct write: large enough to keep the device streaming, small enough
// that the per-thread bounce buffer for unaligned memory costs little.
constexpr size_t kDirectPutBlock = 8ull << 20;

// A thread's aligned bounce buffer for direct writes from unaligned memory.
std::byte* DirectBounce() {
  thread_local internal::AlignedPtr buffer =
      internal::AllocateAligned(kDirectPutBlock, kDirectIoAlignment);
  return buffer.get();
}

// Pieces shown to a Put's observer: small enough to be still in L2 when they
// are copied (into the page cache or the bounce buffer) right after.
constexpr size_t kSeePiece = 256 << 10;

// Writes `data` to `fd` from offset 0, showing each piece to `see` (if set)
// just before it is copied. With `direct` (fd opened O_DIRECT), the aligned
// body goes in kDirectPutBlock writes, straight from `data` where it is
// aligned and through a bounce buffer where not; then O_DIRECT is cleared and
// the unaligned tail written through the page cache. A direct write the
// filesystem refuses (EINVAL: an alignment it needs beyond 4 KiB) drops to
// buffered writes for the rest, with the same result.
Status WriteAll(int fd, std::span<const std::byte> data, const std::string& path, bool direct,
                const PutObserver* see) {
  // Shows data[at, at + n) to `see`, less what it has seen already (a
  // direct write refused after its block was shown is redone buffered).
  size_t shown = 0;
  auto show = [&](size_t at, size_t n) {
    if (see == nullptr || at + n <= shown) return;
    const size_t from = std::max(at, shown);
    (*see)(data.subspan(from, at + n - from));
    shown = at + n;
  };
  auto buffered = [&](size_t from) -> Status {
    if (direct) {
      const int flags = ::fcntl(fd, F_GETFL);
      if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) != 0) {
        return SysError("fcntl(O_DIRECT off)", path);
      }
      direct = false;
    }
    const size_t step = see != nullptr ? kSeePiece : data.size();
    for (size_t at = from; at < data.size(); at += step) {
      const std::span<const std::byte> piece = data.subspan(at, std::min(step, data.size() - at));
      show(at, piece.size());
      const int err = PwriteAll(fd, piece, at);
      if (err != 0) return ErrnoToStatus(err, "write " + path);
    }
    return Status::Ok();
  };
  if (!direct) return buffered(0);
  const size_t body = DirectMainLength(data.size(), true);
  for (size_t at = 0; at < body; at += kDirectPutBlock) {
    const size_t n = std::min(kDirectPutBlock, body - at);
    std::span<const std::byte> src = data.subspan(at, n);
    if (reinterpret_cast<uintptr_t>(src.data()) % kDirectIoAlignment != 0) {
      std::byte* bounce = DirectBounce();
      if (bounce == nullptr) return buffered(at);
      // Each piece is read from memory once: shown while it comes into
      // cache, then copied from there with streaming stores (the bounce
      // buffer is read next by the device, not by this core).
      for (size_t k = 0; k < n; k += kSeePiece) {
        const size_t m = std::min(kSeePiece, n - k);
        show(at + k, m);
        StreamCopy(bounce + k, src.data() + k, m);
      }
      StreamFence();
      src = {bounce, n};
    } else {
      show(at, n);
    }
    const int err = PwriteAll(fd, src, at);
    if (err == EINVAL) return buffered(at);
    if (err != 0) return ErrnoToStatus(err, "write " + path);
  }
  return buffered(body);
}

// File systems whose reads are served by this machine: disks and memory.
// Network file systems (NFS, CephFS, anything through FUSE) are not: there a
// small read may be a round trip.
// A root not created yet is judged by the folder it will be created in.
bool IsLocalFileSystem(std::string path) {
  struct statfs fs;
  while (true) {
    int rc;
    do {
      rc = ::statfs(path.c_str(), &fs);
    } while (rc != 0 && errno == EINTR);
    if (rc == 0) break;
    const size_t slash = path.find_last_of('/');
    if (errno != ENOENT || slash == std::string::npos || path == "/") return false;
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
  switch (static_cast<unsigned long>(fs.f_type)) {
    case EXT4_SUPER_MAGIC:  // also ext2 and ext3
    case XFS_SUPER_MAGIC:
    case BTRFS_SUPER_MAGIC:
    case TMPFS_MAGIC:
    case F2FS_SUPER_MAGIC:
    case OVERLAYFS_SUPER_MAGIC:  // containers; its layers are local
      return true;
    default:
      return false;
  }
}

}  // namespace stoker::posix
