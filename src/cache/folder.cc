#include "cache/folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace stoker::cache_internal {

MappedFile::~MappedFile() {
  if (data_) munmap(data_, bytes_);
  if (fd_ >= 0) close(fd_);
}

Status MappedFile::Open(const std::string& path, uint64_t bytes) {
  fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0) return ErrnoToStatus(errno, "open " + path);
  struct stat st;
  if (fstat(fd_, &st) != 0) return ErrnoToStatus(errno, "fstat " + path);
  // Only ever grown: another process may have it mapped. A new file is all
  // zeros, which every table reads as "nothing there yet". Allocated, not
  // sparse: a page of a sparse file that a full disk cannot back would be
  // SIGBUS at the first store through the mapping, not an error here.
  fresh_ = st.st_size == 0;
  if (uint64_t(st.st_size) < bytes) {
    const int err = posix_fallocate(fd_, 0, off_t(bytes));
    if (err != 0)
      return ErrnoToStatus(err, "allocate " + std::to_string(bytes) + " bytes for " + path);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) return ErrnoToStatus(errno, "mmap " + path);
  data_ = p;
  bytes_ = bytes;
  return Status::Ok();
}

namespace {

int SetLock(int fd, uint64_t at, short type, bool wait) {
  struct flock fl = {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = off_t(at);
  fl.l_len = 1;
  while (true) {
    if (fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0) return 0;
    if (errno != EINTR) return errno;
  }
}

}  // namespace

Result<bool> ByteLock::Lock(const std::string& path, uint64_t at, bool exclusive, bool wait) {
  Release();
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return ErrnoToStatus(errno, "open " + path);
  const int err = SetLock(fd, at, exclusive ? F_WRLCK : F_RDLCK, wait);
  if (err == EAGAIN || err == EACCES) {
    close(fd);
    return false;
  }
  if (err != 0) {
    close(fd);
    return ErrnoToStatus(err, "lock byte " + std::to_string(at) + " of " + path);
  }
  fd_ = fd;
  return true;
}

void ByteLock::Release() {
  if (fd_ >= 0) close(fd_);  // the last close of the description drops its locks
  fd_ = -1;
}

Status FolderTables::Open(const std::string& dir, const std::string& ds_dir, uint64_t shards) {
  shards_ = shards;
  STOKER_RETURN_IF_ERROR(folder_.Open(dir + "/stoker-cache.table", 4096));
  STOKER_RETURN_IF_ERROR(table_.Open(ds_dir + "/table", DatasetTableBytes(shards)));
  Locked l(*this);
  FolderHeader& h = header();
  if (h.magic != kFolderMagic) {
    h.used = 0;
    h.tick = 0;
    h.magic = kFolderMagic;
  }
  DatasetHeader& d = dataset();
  // A table this process made is all zeros already: writing them again
  // would dirty every page of it (112 MB at 10^6 shards) for nothing.
  if ((d.magic != kDatasetMagic || d.shards != shards) && !table_.fresh()) {
    for (uint64_t i = 0; i < shards; ++i) {
      At(uint32_t(i)).soon = 0;
      At(uint32_t(i)).unused = 0;
    }
    // An older layout's progress and marks lie where the slots are now.
    std::byte* jobs = Base() + sizeof(DatasetHeader) + shards * sizeof(Entry);
    std::memset(jobs, 0, DatasetTableBytes(shards) - uint64_t(jobs - Base()));
  }
  if (d.magic != kDatasetMagic || d.shards != shards) {
    d.shards = shards;
    d.magic = kDatasetMagic;
  }
  return Status::Ok();
}

Result<std::vector<uint32_t>> FolderTables::NotAbsent() const {
  std::vector<uint32_t> out;
  constexpr uint64_t kChunk = 65536;  // entries a read (3 MiB)
  std::vector<Entry> buf(kChunk);
  for (uint64_t first = 0; first < shards_; first += kChunk) {
    const uint64_t n = std::min(kChunk, shards_ - first);
    const off_t at = off_t(sizeof(DatasetHeader) + first * sizeof(Entry));
    uint64_t got = 0;
    while (got < n * sizeof(Entry)) {
      const ssize_t r = pread(table_.fd(), reinterpret_cast<char*>(buf.data()) + got,
                              n * sizeof(Entry) - got, at + off_t(got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return ErrnoToStatus(r < 0 ? errno : EIO, "read the cache table");
      got += uint64_t(r);
    }
    for (uint64_t i = 0; i < n; ++i) {
      if (buf[i].state != kAbsent) out.push_back(uint32_t(first + i));
    }
  }
  return out;
}

void FolderTables::ClearJob(uint32_t job) const {
  std::memset(&Progress(job, 0), 0, kTableRanks * sizeof(RankProgress));
  std::memset(&Marks(job, 0), 0, shards_ * sizeof(ReadMarks));
}

FolderTables::Locked::Locked(const FolderTables& t) : t_(t), lock_(t.mu_) {
  while (flock(t_.folder_.fd(), LOCK_EX) != 0 && errno == EINTR) {
  }
}

FolderTables::Locked::~Locked() { flock(t_.folder_.fd(), LOCK_UN); }

Status CheckOfdLocks(const std::string& path) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return ErrnoToStatus(errno, "open " + path);
  const int err = SetLock(fd, uint64_t(1) << 40, F_WRLCK, /*wait=*/false);
  close(fd);
  if (err == EINVAL || err == ENOSYS || err == ENOLCK) {
    return Unsupported(path + ": the file system offers no OFD record locks");
  }
  if (err != 0 && err != EAGAIN && err != EACCES) return ErrnoToStatus(err, "lock " + path);
  return Status::Ok();
}

}  // namespace stoker::cache_internal
