// The POSIX store: objects are regular files under a root folder, a key's
// '/'-separated components being folders.
//
// Put is atomic and durable the classic way: the bytes go to a temporary file
// in the object's folder, which is fsync'ed and renamed over the object, and
// then the folder is fsync'ed. Temporary names start with '.' (".NAME.tmp.PID.N"),
// and no key component may start with '.' (ValidateKey), so a temporary file
// can never be addressed, listed or mistaken for an object, also when a killed
// writer leaves one behind.
//
// Reads go through one of two engines behind ReadQueue: io_uring, or a thread
// pool running pread when io_uring is unavailable (see NewPosixStore).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <system_error>

#include "core/aligned_memory.h"
#include "core/file_mapping.h"
#include "core/stream_copy.h"
#include "store/posix_internal.h"
#include "store/store_internal.h"

namespace stoker {

namespace {

using posix::EnsureDir;
using posix::IsLocalFileSystem;
using posix::JoinPath;
using posix::ParentOf;
using posix::SyncDir;
using posix::SysError;
using posix::WriteAll;
using store_internal::Quote;

enum class Engine { kIoUring, kThreads };

// Distinguishes temporary files of concurrent Puts within one process; the
// pid distinguishes processes.
std::atomic<uint64_t> g_temp_counter{0};

// Objects at least this large are written with O_DIRECT when the store has
// StoreOptions::direct_writes; smaller ones are not worth a second path.
constexpr size_t kDirectPutMin = 1ull << 20;

// One open file; ReadV is preadv, from any thread (the file offset is not
// used). Reads the same inode to the end: a Put replaces the object by
// rename, never in place.
class PosixObjectReader final : public ObjectReader {
 public:
  PosixObjectReader(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  // `mappings`: where Map keeps the file mapped after this reader closes,
  // for the next reader of the same file; `st`: the open file's.
  PosixObjectReader(int fd, std::string path, std::shared_ptr<internal::MappingCache> mappings,
                    const struct stat& st)
      : fd_(fd), path_(std::move(path)), mapping_(std::move(mappings), internal::IdentityOf(st)) {}
  ~PosixObjectReader() override { ::close(fd_); }
  PosixObjectReader(const PosixObjectReader&) = delete;
  PosixObjectReader& operator=(const PosixObjectReader&) = delete;

  Result<size_t> ReadV(uint64_t offset, std::span<const std::span<std::byte>> dsts) override {
    constexpr size_t kMaxIov = 64;
    struct iovec iov[kMaxIov];
    size_t done = 0, piece = 0, into = 0;  // into: bytes of dsts[piece] already read
    while (piece < dsts.size()) {
      size_t n = 0;
      for (size_t k = piece; k < dsts.size() && n < kMaxIov; ++k) {
        const size_t skip = k == piece ? into : 0;
        if (dsts[k].size() == skip) continue;
        iov[n].iov_base = dsts[k].data() + skip;
        iov[n].iov_len = dsts[k].size() - skip;
        ++n;
      }
      if (n == 0) break;
      const ssize_t got = ::preadv(fd_, iov, int(n), static_cast<off_t>(offset + done));
      if (got < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return posix::ReadErrorStatus(errno, path_, /*direct=*/false);
      }
      if (got == 0) break;  // the end of the file
      done += size_t(got);
      // Step over what landed.
      size_t left = size_t(got);
      while (left > 0 && piece < dsts.size()) {
        const size_t room = dsts[piece].size() - into;
        if (left < room) {
          into += left;
          left = 0;
        } else {
          left -= room;
          ++piece;
          into = 0;
        }
      }
      while (piece < dsts.size() && dsts[piece].size() == into) {
        ++piece;
        into = 0;
      }
    }
    return done;
  }

  Result<std::span<const std::byte>> Map() override { return mapping_.Get(fd_, path_); }

  void WillNeed(uint64_t offset, uint64_t length) override {
    // Advice only: an error here changes nothing that a read would not report.
    (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(length),
                          POSIX_FADV_WILLNEED);
  }

 private:
  const int fd_;
  const std::string path_;
  internal::FileMapping mapping_;
};

// Opens an object's file for reading and stats it; a folder is NotFound.
Result<int> OpenObject(const std::string& path, struct stat* st) {
  STOKER_ASSIGN_OR_RETURN(int fd, posix::OpenForRead(path, /*direct=*/false));
  if (::fstat(fd, st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, "fstat " + path);
  }
  if (S_ISDIR(st->st_mode)) {
    ::close(fd);
    return NotFound(path + ": is a folder, not an object");
  }
  return fd;
}

class PosixStore final : public Store {
 public:
  PosixStore(std::string root, std::string uri, Engine engine, uint32_t io_threads,
             bool direct_writes, uint64_t keep_mapped_bytes)
      : root_(std::move(root)),
        uri_(std::move(uri)),
        engine_(engine),
        io_threads_(io_threads),
        direct_writes_(direct_writes),
        mappings_(internal::MappingCache::ForMachine(keep_mapped_bytes)) {}
  ~PosixStore() override {
    if (sync_fd_ >= 0) ::close(sync_fd_);
  }
  PosixStore(const PosixStore&) = delete;
  PosixStore& operator=(const PosixStore&) = delete;

  const std::string& uri() const override { return uri_; }
  StoreDescription Describe() const override {
    StoreDescription d;
    d.kind = "posix";
    d.location = root_;
    d.engine = engine_ == Engine::kIoUring ? "io_uring" : "threads";
    return d;
  }

  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& options) override {
    STOKER_RETURN_IF_ERROR(store_internal::ValidateQueueOptions(options));
#ifdef STOKER_HAVE_IO_URING
    if (engine_ == Engine::kIoUring) return posix::NewUringReadQueue(root_, options);
#endif
    STOKER_ASSIGN_OR_RETURN(std::shared_ptr<posix::IoThreadPool> pool, Pool());
    return posix::NewThreadReadQueue(std::move(pool), root_, options);
  }

  // Straight pread: a queue (an io_uring ring) per call would cost more than
  // the read, and the result is the same.
  Result<size_t> Read(std::string_view key, uint64_t offset, std::span<std::byte> dst) override {
    ReadCompletion c = posix::ReadRange(root_, key, offset, dst, 0, /*direct=*/false);
    if (!c.status.ok()) return c.status;
    return c.bytes;
  }

  Result<std::unique_ptr<ObjectReader>> OpenReader(std::string_view key) override {
    STOKER_RETURN_IF_ERROR(ValidateKey(key));
    const std::string path = JoinPath(root_, key);
    struct stat st;
    STOKER_ASSIGN_OR_RETURN(int fd, OpenObject(path, &st));
    if (!S_ISREG(st.st_mode)) {
      return std::unique_ptr<ObjectReader>(std::make_unique<PosixObjectReader>(fd, path));
    }
    return std::unique_ptr<ObjectReader>(
        std::make_unique<PosixObjectReader>(fd, path, mappings_, st));
  }

  // Size and bytes from one open file: a Put replaces the object by rename,
  // never in place, so the open inode cannot change size under us.
  Result<std::vector<std::byte>> ReadAll(std::string_view key) override {
    STOKER_RETURN_IF_ERROR(ValidateKey(key));
    const std::string path = JoinPath(root_, key);
    struct stat st;
    STOKER_ASSIGN_OR_RETURN(int fd, OpenObject(path, &st));
    const auto size = static_cast<size_t>(st.st_size);
    std::vector<std::byte> data(size + 1);  // +1: notices growth by an outside writer
    Result<size_t> n = posix::PreadFully(fd, 0, data, /*direct=*/false, path);
    ::close(fd);
    if (!n.ok()) return n.status();
    if (*n != size) {
      return IoError(path + ": object changed size while read (" + std::to_string(size) +
                         " bytes at open, read " + std::to_string(*n) +
                         "); modified in place by another program?",
                     /*retryable=*/true);
    }
    data.resize(size);
    return data;
  }

  // Deferred: the file and directory fsyncs are left to Sync() where it
  // covers the file (DeferTarget). If absent: the object is written to a
  // synced temporary file as a durable Put's is, then link(2)ed to its name,
  // which fails (EEXIST) if the name exists: the file system lets exactly
  // one link win, also over NFS.
  using Store::Put;
  Status Put(std::string_view key, std::span<const std::byte> data,
             const WriteOptions& options) override {
    return Write(key, data, options.observer, options.durability == Durability::kDeferred,
                 options.if_absent);
  }

  StoreCapabilities capabilities() const override {
    return {.local_reads = IsLocalFileSystem(root_),
            .prefix_listing = true,
            .mapped_reads = true,
            .exclusive_create = true};
  }

  Status Sync() override {
    int fd;
    {
      std::lock_guard<std::mutex> l(sync_mu_);
      fd = sync_fd_;
    }
    if (fd < 0) return Status::Ok();  // nothing was deferred
    if (::syncfs(fd) != 0) {
      return SysError("syncfs", root_).WithContext("making deferred writes durable");
    }
    return Status::Ok();
  }
  Result<ObjectInfo> Stat(std::string_view key) override {
    STOKER_RETURN_IF_ERROR(ValidateKey(key));
    const std::string path = JoinPath(root_, key);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return SysError("stat", path);
    if (S_ISDIR(st.st_mode)) return NotFound(path + ": is a folder, not an object");
    if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file");
    return ObjectInfo{std::string(key), static_cast<uint64_t>(st.st_size)};
  }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    return ListUnder(prefix, /*sizes=*/true);
  }

  // A folder entry that says it is a file or a folder (d_type; ext4, xfs,
  // btrfs, tmpfs do) needs no stat: on a network file system each is a
  // round trip.
  Result<std::vector<std::string>> ListKeys(std::string_view prefix) override {
    STOKER_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, ListUnder(prefix, /*sizes=*/false));
    std::vector<std::string> keys;
    keys.reserve(objects.size());
    for (ObjectInfo& o : objects) keys.push_back(std::move(o.key));
    return keys;
  }

  Result<std::vector<ObjectInfo>> ListUnder(std::string_view prefix, bool sizes) {
    STOKER_RETURN_IF_ERROR(store_internal::ValidatePrefix(prefix));
    // Walk only the folder the prefix ends in, filtering its entries by the
    // prefix's last, partial component; everything below a match matches.
    const size_t slash = prefix.rfind('/');
    const std::string_view dir_part =
        slash == std::string_view::npos ? std::string_view() : prefix.substr(0, slash);
    const std::string_view name_filter =
        slash == std::string_view::npos ? prefix : prefix.substr(slash + 1);
    const std::string dir =
        dir_part.empty() ? (root_.empty() ? "/" : root_) : JoinPath(root_, dir_part);
    std::vector<ObjectInfo> out;
    int fd;
    do {
      fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      // No root yet (nothing was ever Put), or no such folder: no objects.
      if (errno == ENOENT || errno == ENOTDIR) return out;
      return SysError("open", dir);
    }
    const std::string rel = dir_part.empty() ? "" : std::string(dir_part) + "/";
    STOKER_RETURN_IF_ERROR(Walk(fd, dir, rel, name_filter, sizes, &out));
    std::sort(out.begin(), out.end(),
              [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return out;
  }

  Status Remove(std::string_view key) override {
    STOKER_RETURN_IF_ERROR(ValidateKey(key));
    const std::string path = JoinPath(root_, key);
    // Not fsync'ed: a removal lost in a crash leaves a whole, valid object.
    if (::unlink(path.c_str()) != 0) {
      const int err = errno;
      if (err == EISDIR || err == EPERM) {
        struct stat st;
        if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
          return NotFound(path + ": is a folder, not an object");
        }
      }
      return ErrnoToStatus(err, "unlink " + path);
    }
    return Status::Ok();
  }

  // The folder itself: its objects, the hidden temporary files of Puts that
  // were killed part way, and its sub-folders. remove_all does not follow
  // symbolic links (it removes the link).
  Status RemoveFolder(std::string_view folder) override {
    STOKER_RETURN_IF_ERROR(store_internal::ValidateFolder(folder));
    const std::string path = JoinPath(root_, folder.substr(0, folder.size() - 1));
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec && ec.value() != ENOENT) return ErrnoToStatus(ec.value(), "remove folder " + path);
    return Status::Ok();
  }

  // Folders only, none changed within `idle`, removed deepest first with
  // rmdir, which fails on a folder a writer has just put a file into: then
  // the folder is in use after all, and what remains is left alone.
  Result<bool> RemoveEmptyFolder(std::string_view folder, std::chrono::seconds idle) override {
    STOKER_RETURN_IF_ERROR(store_internal::ValidateFolder(folder));
    namespace fs = std::filesystem;
    const std::string path = JoinPath(root_, folder.substr(0, folder.size() - 1));
    std::error_code ec;
    if (!fs::is_directory(fs::symlink_status(path, ec))) {
      return NotFound("no folder " + Quote(folder) + " at " + uri_);
    }
    const auto cutoff = fs::file_time_type::clock::now() - idle;
    // Folders, and temporary files (".NAME.tmp.PID.N": never an object) of
    // writers killed before their rename; anything else keeps the folder.
    std::vector<std::string> dirs = {path}, temps;
    for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::end(it);
         it.increment(ec)) {
      if (it->is_symlink(ec)) return false;
      if (it->is_directory(ec)) {
        dirs.push_back(it->path().string());
        continue;
      }
      const std::string name = it->path().filename().string();
      if (!it->is_regular_file(ec) || !name.starts_with(".") ||
          name.find(".tmp.") == std::string::npos) {
        return false;  // an object, or not this store's
      }
      temps.push_back(it->path().string());
    }
    if (ec) return ErrnoToStatus(ec.value(), "list folder " + path);
    for (const auto* list : {&dirs, &temps}) {
      for (const std::string& p : *list) {
        const auto t = fs::last_write_time(p, ec);
        if (ec) return ErrnoToStatus(ec.value(), "stat " + p);
        if (t > cutoff) return false;
      }
    }
    // A writer idle that long is dead (or its rename will fail, naming the
    // object, and it writes again): its temporary files go first.
    for (const std::string& p : temps) {
      if (::unlink(p.c_str()) != 0 && errno != ENOENT) return SysError("unlink", p);
    }
    for (auto d = dirs.rbegin(); d != dirs.rend(); ++d) {
      if (::rmdir(d->c_str()) == 0 || errno == ENOENT) continue;
      if (errno == ENOTEMPTY || errno == EEXIST) return false;
      return SysError("rmdir", *d);
    }
    STOKER_RETURN_IF_ERROR(SyncDir(ParentOf(path)));
    return true;
  }

 private:
  // The file system Sync() syncs: the root's, opened on the first
  // deferred Put, before its writes (syncfs reports the writeback errors
  // since the open), and only where it is local: a network file system's
  // syncfs need not reach its server, so there every Put stays durable on
  // its own. Returns the device whose files a deferred Put may leave to
  // Sync(), or nullopt.
  std::optional<dev_t> DeferTarget() {
    std::lock_guard<std::mutex> l(sync_mu_);
    if (!sync_decided_) {
      sync_decided_ = true;
      if (IsLocalFileSystem(root_)) {
        int fd;
        do {
          fd = ::open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        } while (fd < 0 && errno == EINTR);
        struct stat st;
        if (fd >= 0 && ::fstat(fd, &st) == 0) {
          sync_fd_ = fd;
          sync_dev_ = st.st_dev;
        } else if (fd >= 0) {
          ::close(fd);
        }
      }
    }
    if (sync_fd_ < 0) return std::nullopt;
    return sync_dev_;
  }

  // Put, showing each piece to `see` if set (WriteOptions::observer); with
  // `defer`, the file and directory fsyncs are left to Sync() where it covers the
  // file (the root's local file system, not a mount below it).
  Status Write(std::string_view key, std::span<const std::byte> data, const PutObserver* see,
               bool defer, bool exclusive = false) {
    STOKER_RETURN_IF_ERROR(ValidateKey(key));
    const std::string path = JoinPath(root_, key);
    const std::string dir = ParentOf(path);
    STOKER_RETURN_IF_ERROR(EnsureDir(dir, key));
    const std::optional<dev_t> sync_dev = defer ? DeferTarget() : std::nullopt;

    // Base name cut to keep the temporary name within NAME_MAX (255).
    const std::string_view base = std::string_view(path).substr(path.rfind('/') + 1);
    const std::string tmp = dir + (dir == "/" ? "." : "/.") + std::string(base.substr(0, 200)) +
                            ".tmp." + std::to_string(::getpid()) + "." +
                            std::to_string(g_temp_counter.fetch_add(1));
    // Direct writes where asked for and worth it; a filesystem without
    // O_DIRECT (EINVAL at open) gets buffered writes instead.
    bool direct = direct_writes_ && data.size() >= kDirectPutMin;
    auto open_tmp = [&tmp](bool o_direct) {
      int fd;
      do {
        fd = ::open(tmp.c_str(),
                    O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | (o_direct ? O_DIRECT : 0), 0644);
      } while (fd < 0 && errno == EINTR);
      return fd;
    };
    int fd = open_tmp(direct);
    if (fd < 0 && direct && errno == EINVAL) {
      // Some kernels refuse O_DIRECT only after creating the file.
      ::unlink(tmp.c_str());
      direct = false;
      fd = open_tmp(false);
    }
    if (fd < 0 && errno == ENOENT) {
      // The folder was removed since EnsureDir, as an empty leftover
      // (RemoveEmptyFolder, by another process): make it again.
      STOKER_RETURN_IF_ERROR(EnsureDir(dir, key));
      fd = open_tmp(direct);
    }
    if (fd < 0) return SysError("open", tmp).WithContext("put " + Quote(key));

    Status st;
    if (direct) {
      // Reserve the whole object first: a direct write allocates blocks as
      // it goes, so files written side by side would interleave their
      // extents (measured: 2-3 extents per 16 MiB chunk, and slower reads
      // back); one fallocate gives each file contiguous extents, and a full
      // disk fails here, before any data is written. Filesystems without
      // fallocate just skip it.
      // (Linux fallocate, not posix_fallocate: glibc's emulation would write
      // the whole object twice where the filesystem lacks it.)
      int rc;
      do {
        rc = ::fallocate(fd, 0, 0, static_cast<off_t>(data.size()));
      } while (rc != 0 && errno == EINTR);
      if (rc != 0 && errno != EOPNOTSUPP && errno != ENOSYS && errno != EINVAL) {
        st = SysError("fallocate", tmp);
      }
    }
    if (st.ok()) st = WriteAll(fd, data, tmp, direct, see);
    bool deferred = false;
    if (sync_dev) {
      struct stat fst;
      deferred = ::fstat(fd, &fst) == 0 && fst.st_dev == *sync_dev;
    }
    if (st.ok() && !deferred && ::fsync(fd) != 0) st = SysError("fsync", tmp);
    // close reports deferred write errors on some filesystems (NFS).
    if (::close(fd) != 0 && st.ok() && errno != EINTR) st = SysError("close", tmp);
    if (st.ok() && exclusive) {
      if (::link(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        st = err == EEXIST ? AlreadyExists(path + ": exists")
                           : ErrnoToStatus(err, "link " + tmp + " to " + path);
      }
      ::unlink(tmp.c_str());
      if (!st.ok()) return st.WithContext("create " + Quote(key));
    } else if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      st = ErrnoToStatus(err, "rename " + tmp + " to " + path);
    }
    if (!st.ok()) {
      ::unlink(tmp.c_str());
      return st.WithContext("put " + Quote(key));
    }
    if (deferred) return Status::Ok();
    return SyncDir(dir).WithContext("put " + Quote(key));
  }

  // Lists regular files (and symlinks to them) under the open folder `fd`
  // (which it takes over), skipping dot-names: temporary files and anything
  // that is not a valid key. Symlinked folders are not followed (no loops).
  // Without `sizes`, sizes are 0 and entries whose type the folder gives are
  // not stat'ed.
  static Status Walk(int fd, const std::string& dir, const std::string& rel,
                     std::string_view name_filter, bool sizes, std::vector<ObjectInfo>* out) {
    DIR* d = ::fdopendir(fd);
    if (d == nullptr) {
      const int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, "fdopendir " + dir);
    }
    Status st;
    while (st.ok()) {
      errno = 0;
      const dirent* e = ::readdir(d);
      if (e == nullptr) {
        if (errno != 0) st = SysError("readdir", dir);
        break;
      }
      const std::string_view name = e->d_name;
      if (name.empty() || name.front() == '.' || !name.starts_with(name_filter)) continue;
      if (!sizes && e->d_type == DT_REG) {
        out->push_back({rel + std::string(name), 0});
        continue;
      }
      struct stat sb;
      if (::fstatat(::dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;  // removed while we walk
        const int err = errno;
        st = ErrnoToStatus(err, "stat " + dir + "/" + std::string(name));
        break;
      }
      if (S_ISLNK(sb.st_mode) && ::fstatat(::dirfd(d), e->d_name, &sb, 0) != 0) continue;
      if (S_ISREG(sb.st_mode)) {
        out->push_back({rel + std::string(name), sizes ? static_cast<uint64_t>(sb.st_size) : 0});
      } else if (S_ISDIR(sb.st_mode) && !S_ISLNK(sb.st_mode)) {
        const int child =
            ::openat(::dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (child < 0) {
          if (errno == ENOENT || errno == ELOOP || errno == ENOTDIR) continue;
          const int err = errno;
          st = ErrnoToStatus(err, "open " + dir + "/" + std::string(name));
          break;
        }
        st = Walk(child, dir + "/" + std::string(name), rel + std::string(name) + "/", "", sizes,
                  out);
      }
    }
    ::closedir(d);
    return st;
  }

  Result<std::shared_ptr<posix::IoThreadPool>> Pool() {
    std::lock_guard lock(pool_mu_);
    if (pool_ == nullptr) {
      try {
        pool_ = std::make_shared<posix::IoThreadPool>(io_threads_);
      } catch (const std::system_error& e) {
        return ErrnoToStatus(e.code().value(), "starting " + std::to_string(io_threads_) +
                                                   " I/O threads for " + uri_);
      }
    }
    return pool_;
  }

  const std::string root_;  // absolute, no trailing '/'; "" for "/"
  const std::string uri_;
  const Engine engine_;
  const uint32_t io_threads_;
  const bool direct_writes_;
  // Readers' mappings, kept across opens (read_unit "map": a shard read
  // again next epoch is not mapped, faulted in and unmapped again).
  const std::shared_ptr<internal::MappingCache> mappings_;
  std::mutex pool_mu_;
  std::shared_ptr<posix::IoThreadPool> pool_;  // guarded by pool_mu_; made on first use
  std::mutex sync_mu_;                         // guards the three below (DeferTarget)
  bool sync_decided_ = false;
  int sync_fd_ = -1;
  dev_t sync_dev_ = 0;
};

Result<Engine> ChooseEngine(const StoreOptions& options) {
  std::string name = options.posix_engine;
  std::string origin = "StoreOptions::posix_engine";
  if (name == "auto") {
    const char* env = std::getenv("STOKER_POSIX_ENGINE");
    if (env != nullptr && *env != '\0') {
      name = env;
      origin = "STOKER_POSIX_ENGINE";
    }
  }
  if (name == "threads") return Engine::kThreads;
  if (name == "auto" || name == "io_uring") {
#ifdef STOKER_HAVE_IO_URING
    Status probe = posix::ProbeIoUring();
    if (probe.ok()) return Engine::kIoUring;
    if (name == "auto") return Engine::kThreads;
    return Unsupported("io_uring is not available (" + probe.message() + "); " + origin +
                       "=threads uses a thread pool instead");
#else
    if (name == "auto") return Engine::kThreads;
    return Unsupported("stoker was built without io_uring (-DSTOKER_WITH_IO_URING=ON); " + origin +
                       "=threads uses a thread pool instead");
#endif
  }
  return InvalidArgument("unknown POSIX engine " + Quote(name) + " in " + origin +
                         " (known: auto, io_uring, threads)");
}

}  // namespace

namespace store_internal {

Result<std::shared_ptr<Store>> NewPosixStoreForUri(std::string root, std::string uri,
                                                   const StoreOptions& options) {
  if (root.empty()) return InvalidArgument("empty POSIX store root");
  if (root.find('\0') != std::string::npos) {
    return InvalidArgument("POSIX store root " + Quote(root) + " contains NUL");
  }
  // Absolute now, so that a later chdir does not move the store.
  std::error_code ec;
  std::string abs = std::filesystem::absolute(root, ec).lexically_normal().string();
  if (ec) return ErrnoToStatus(ec.value(), "resolving store root " + root);
  while (!abs.empty() && abs.back() == '/') abs.pop_back();

  STOKER_ASSIGN_OR_RETURN(Engine engine, ChooseEngine(options));
  uint32_t threads = options.io_threads;
  if (threads == 0) threads = std::max(4u, 2 * std::thread::hardware_concurrency());
  return std::shared_ptr<Store>(std::make_shared<PosixStore>(std::move(abs), std::move(uri), engine,
                                                             threads, options.direct_writes,
                                                             options.keep_mapped_bytes));
}

}  // namespace store_internal

Result<std::shared_ptr<Store>> NewPosixStore(std::string root, const StoreOptions& options) {
  std::string uri = root;
  return store_internal::NewPosixStoreForUri(std::move(root), std::move(uri), options);
}

}  // namespace stoker
