#include "wds/tar.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <new>
#include <utility>

namespace stoker::wds {
namespace {

// Read size per call into the file: large enough that a multi-MiB member
// costs a handful of system calls.
constexpr size_t kReadBlock = size_t{1} << 20;
// Bytes libarchive gathers per write(2). The archive's bytes do not depend
// on it: the last block is not padded (bytes_in_last_block 1), so a tar is
// its members' headers and data whatever the block. 1 MiB rather than tar's
// classic 10 KiB record: a hundredth of the system calls.
constexpr int kWriteBlock = 1 << 20;

std::string Quoted(std::string_view s) {
  std::string q = "'";
  q += s;
  q += '\'';
  return q;
}

// libarchive reports format problems with its own codes (EILSEQ, -1, and
// EINVAL for a bad header checksum) and I/O failures with the errno of the
// failed call, which is what must reach the caller (EIO, ESTALE, ...).
bool IsSystemError(int err) { return err > 0 && err != EILSEQ && err != EINVAL; }

const char* ArchiveMessage(struct archive* a) {
  const char* m = archive_error_string(a);
  return m != nullptr ? m : "no detail from libarchive";
}

// Why `name` is not KEY.EXT, or "" if it is. WebDataset's base_plus_ext:
// the key is the folder plus the basename up to its first dot.
std::string NameProblem(std::string_view name, std::string* key, std::string* ext) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == std::string_view::npos || dot + 1 == name.size()) {
    return "member " + Quoted(name) + " has no extension: WebDataset keys are NAME.EXT";
  }
  if (dot == base) {
    return "member " + Quoted(name) +
           " has no name before its extension: " + "WebDataset keys are NAME.EXT";
  }
  *key = std::string(name.substr(0, dot));
  *ext = std::string(name.substr(dot + 1));
  return "";
}

// WebDataset ignores top-level members named __NAME__ (shard metadata).
bool IsMetadataName(std::string_view name) {
  return name.find('/') == std::string_view::npos && name.size() >= 4 &&
         name.substr(0, 2) == "__" && name.substr(name.size() - 2) == "__";
}

// What a member that is neither a regular file nor a folder is, for messages.
const char* SpecialKind(struct archive_entry* entry) {
  if (archive_entry_hardlink(entry) != nullptr) return "a hard link";
  switch (archive_entry_filetype(entry)) {
    case AE_IFLNK:
      return "a symlink";
    case AE_IFCHR:
      return "a character device";
    case AE_IFBLK:
      return "a block device";
    case AE_IFIFO:
      return "a FIFO";
    case AE_IFSOCK:
      return "a socket";
    default:
      return "not a regular file";
  }
}

// The stored name. A pax UTF-8 name that the C locale cannot represent is
// still returned as its bytes (libarchive warns); the UTF-8 form is the
// fallback for a build of libarchive that gives nothing then.
std::string EntryName(struct archive_entry* entry) {
  const char* name = archive_entry_pathname(entry);
  if (name == nullptr) name = archive_entry_pathname_utf8(entry);
  return name != nullptr ? name : "";
}

}  // namespace

// ---- TarSampleReader --------------------------------------------------------

// One tar entry, classified.
struct TarSampleReader::Entry {
  enum class Kind {
    kMember,  // a field of sample `key`
    kBad,     // a bad member: of sample `key`, or alone when `key` is ""
    kIgnore,  // a folder, metadata, or (skip_non_regular) a link or device
    kBroken,  // the tar cannot be read on (truncated, damaged, I/O): `bad`
              // says why; `key` is its member's, where the header was read
    kEnd,     // the end of the tar
  };
  Kind kind = Kind::kEnd;
  std::string name;
  uint64_t index = 0;
  std::string key;
  Member member;
  Status bad;
};

TarSampleReader::TarSampleReader(std::string path, const TarReadOptions& options, struct archive* a)
    : path_(std::move(path)), options_(options), archive_(a) {}

TarSampleReader::~TarSampleReader() { archive_read_free(archive_); }

Result<std::unique_ptr<TarSampleReader>> TarSampleReader::Open(const std::string& path,
                                                               const TarReadOptions& options) {
  struct archive* a = archive_read_new();
  if (a == nullptr) return IoError(path + ": out of memory for a tar reader");
  // tar covers ustar, GNU and pax. Of the filters only gzip: .tar.gz shards
  // are common, and filter_all may run external programs (lrzip, lzop).
  archive_read_support_format_tar(a);
  archive_read_support_filter_gzip(a);
  const int rc = archive_read_open_filename(a, path.c_str(), kReadBlock);
  if (rc != ARCHIVE_OK && rc != ARCHIVE_WARN) {
    const int err = archive_errno(a);
    Status st = IsSystemError(err) ? ErrnoToStatus(err, "open " + path)
                                   : Corruption(path + ": not a tar archive");
    archive_read_free(a);
    return st;
  }
  return std::unique_ptr<TarSampleReader>(new TarSampleReader(path, options, a));
}

Result<bool> TarSampleReader::Next(Sample* out) {
  if (!error_.ok()) return error_;
  while (!done_) {
    std::unique_ptr<Entry> e = std::move(lookahead_);
    if (e == nullptr) e = std::make_unique<Entry>(NextEntry());
    switch (e->kind) {
      case Entry::Kind::kEnd:
        done_ = true;
        return FlushPending(out);
      case Entry::Kind::kIgnore:
        continue;
      default:
        break;
    }
    // A new key completes the pending sample; the entry waits for the next
    // call, so that a good sample is returned before the next one's error.
    const bool ends_pending = have_pending_ && !e->key.empty() && e->key != pending_.key;
    if (e->kind == Entry::Kind::kBroken && !ends_pending) return EndBroken(e->bad);
    if (e->key.empty()) {
      STOKER_RETURN_IF_ERROR(Reject(e->bad, /*whole_sample=*/false));
      continue;
    }
    if (ends_pending) {
      lookahead_ = std::move(e);
      if (FlushPending(out)) return true;
      continue;
    }
    STOKER_RETURN_IF_ERROR(AddToPending(std::move(*e)));
  }
  return false;
}

// Reads the next entry's header and, for a member, its data.
TarSampleReader::Entry TarSampleReader::NextEntry() {
  struct archive_entry* entry = nullptr;
  Entry e;
  const int rc = archive_read_next_header(archive_, &entry);
  if (rc == ARCHIVE_EOF) return e;
  // ARCHIVE_RETRY is a header that fails its checksum: the tar is damaged.
  if (rc != ARCHIVE_OK && rc != ARCHIVE_WARN) {
    e.kind = Entry::Kind::kBroken;
    e.bad = Broken(last_name_.empty() ? "the first header"
                                      : "the header after member " + Quoted(last_name_));
    return e;
  }
  e.index = entries_++;
  e.name = EntryName(entry);
  last_name_ = e.name;
  Classify(entry, &e);
  if (e.kind == Entry::Kind::kMember) {
    e.bad = ReadData(e.name, static_cast<uint64_t>(archive_entry_size(entry)), &e.member.data);
    if (!e.bad.ok()) e.kind = Entry::Kind::kBroken;
  }
  return e;
}

// Sorts an entry into ignored, bad or member, naming the problem of a bad
// one. Leaves a member's data unread.
void TarSampleReader::Classify(struct archive_entry* entry, Entry* e) {
  const bool regular =
      archive_entry_filetype(entry) == AE_IFREG && archive_entry_hardlink(entry) == nullptr;
  if (archive_entry_filetype(entry) == AE_IFDIR || IsMetadataName(e->name) ||
      (!regular && options_.skip_non_regular)) {
    e->kind = Entry::Kind::kIgnore;
    return;
  }
  e->kind = Entry::Kind::kBad;
  const std::string problem = NameProblem(e->name, &e->key, &e->member.ext);
  if (!regular) {
    e->bad = InvalidArgument(path_ + ": member " + Quoted(e->name) + " is " + SpecialKind(entry) +
                             ": WebDataset members are regular files");
  } else if (!problem.empty()) {
    e->bad = Corruption(path_ + ": " + problem);
  } else if (static_cast<uint64_t>(archive_entry_size(entry)) > kMaxMemberBytes) {
    e->bad = Unsupported(path_ + ": member " + Quoted(e->name) + " is " +
                         std::to_string(archive_entry_size(entry)) +
                         " bytes, over the 4 GiB - 1 of a field");
  } else {
    e->kind = Entry::Kind::kMember;
  }
}

// One large read per member, straight into its buffer.
Status TarSampleReader::ReadData(const std::string& name, uint64_t size,
                                 std::vector<std::byte>* data) {
  try {
    data->resize(size);
  } catch (const std::bad_alloc&) {
    return IoError(path_ + ": member " + Quoted(name) + ": out of memory for " +
                   std::to_string(size) + " bytes");
  }
  size_t got = 0;
  while (got < size) {
    const la_ssize_t n = archive_read_data(archive_, data->data() + got, size - got);
    if (n < 0) return Broken("member " + Quoted(name));
    if (n == 0) return Corruption(path_ + ": truncated in member " + Quoted(name));
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// The Status of libarchive's last failure while reading `where`.
Status TarSampleReader::Broken(const std::string& where) {
  const int err = archive_errno(archive_);
  if (IsSystemError(err)) return ErrnoToStatus(err, "read " + path_ + ", " + where);
  const std::string detail = ArchiveMessage(archive_);
  const bool truncated = detail.find("runcated") != std::string::npos;
  return Corruption(path_ + (truncated ? ": truncated in " : ": damaged tar in ") + where + " (" +
                    detail + ")");
}

// A tar that cannot be read on: with skip_bad a corrupt one just ends (the
// sample in progress may be missing members, so it goes too).
Result<bool> TarSampleReader::EndBroken(Status why) {
  if (!options_.skip_bad || why.code() != Code::kCorruption) {
    error_ = why;
    return why;
  }
  have_pending_ = false;
  pending_bad_ = false;
  Count(why.message());
  done_ = true;
  return false;
}

// Adds one entry of the pending sample's key (or of a new sample).
Status TarSampleReader::AddToPending(Entry&& e) {
  if (!have_pending_) STOKER_RETURN_IF_ERROR(StartPending(e));
  if (e.kind == Entry::Kind::kBad) return Reject(e.bad, /*whole_sample=*/true);
  for (const Member& m : pending_.members) {
    if (m.ext == e.member.ext) {
      return Reject(Corruption(path_ + ": duplicate field " + Quoted(m.ext) + " in sample " +
                               Quoted(pending_.key) + " (member " + Quoted(e.name) + ")"),
                    /*whole_sample=*/true);
    }
  }
  if (!pending_bad_) pending_.members.push_back(std::move(e.member));
  return Status::Ok();
}

Status TarSampleReader::StartPending(const Entry& e) {
  pending_ = Sample{e.key, {}, path_, e.index};
  have_pending_ = true;
  pending_bad_ = false;
  if (seen_keys_.insert(e.key).second) return Status::Ok();
  return Reject(
      Corruption(path_ + ": sample " + Quoted(e.key) + " appears again at member " +
                 Quoted(e.name) + " after other samples: members of a sample must be adjacent"),
      /*whole_sample=*/true);
}

// Hands the pending sample out; false when there is none or it was bad.
bool TarSampleReader::FlushPending(Sample* out) {
  if (!have_pending_) return false;
  have_pending_ = false;
  if (pending_bad_) {
    pending_bad_ = false;
    Count(pending_reason_);
    return false;
  }
  *out = std::move(pending_);
  return true;
}

// Without skip_bad, the error ends the reading; with it, the member (or its
// whole sample, counted when the sample ends) is dropped.
Status TarSampleReader::Reject(Status why, bool whole_sample) {
  if (!options_.skip_bad) {
    error_ = why;
    return why;
  }
  if (!whole_sample) {
    Count(why.message());
  } else if (!pending_bad_) {
    pending_bad_ = true;
    pending_reason_ = why.message();
    pending_.members.clear();
  }
  return Status::Ok();
}

void TarSampleReader::Count(std::string reason) {
  ++skipped_;
  last_skip_reason_ = std::move(reason);
}

// ---- TarWriter --------------------------------------------------------------

namespace {

struct EntryDeleter {
  void operator()(struct archive_entry* e) const { archive_entry_free(e); }
};

// The folder of `path`, for the fsync that makes a rename durable.
std::string FolderOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status SyncFolder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open " + dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? Status::Ok() : ErrnoToStatus(err, "fsync " + dir);
}

}  // namespace

TarWriter::TarWriter(std::string path, int fd, struct archive* a)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), fd_(fd), archive_(a) {}

TarWriter::~TarWriter() {
  if (!closed_) Abandon();
}

Result<std::unique_ptr<TarWriter>> TarWriter::Create(const std::string& path) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "create " + tmp);
  struct archive* a = archive_write_new();
  // Restricted pax is ustar unless a name does not fit. The block settings
  // are explicit because libarchive's defaults depend on the output's file
  // type: whole blocks, but no padding after the last one.
  const bool ok = a != nullptr && archive_write_set_format_pax_restricted(a) == ARCHIVE_OK &&
                  archive_write_set_bytes_per_block(a, kWriteBlock) == ARCHIVE_OK &&
                  archive_write_set_bytes_in_last_block(a, 1) == ARCHIVE_OK &&
                  archive_write_open_fd(a, fd) == ARCHIVE_OK;
  if (!ok) {
    Status st = IoError(
        tmp + ": cannot start a tar: " + (a != nullptr ? ArchiveMessage(a) : "out of memory"));
    if (a != nullptr) archive_write_free(a);
    ::close(fd);
    ::unlink(tmp.c_str());
    return st;
  }
  return std::unique_ptr<TarWriter>(new TarWriter(path, fd, a));
}

Status TarWriter::Add(std::string_view name, std::span<const std::byte> data) {
  if (!error_.ok()) return error_;
  if (closed_) return InvalidArgument(path_ + ": Add after Close");
  if (name.empty() || name.back() == '/' || name.find('\0') != std::string_view::npos) {
    return InvalidArgument(path_ + ": member name " + Quoted(name) +
                           " is empty, ends in '/' or holds a NUL");
  }
  std::unique_ptr<struct archive_entry, EntryDeleter> entry(archive_entry_new());
  if (entry == nullptr) return IoError(path_ + ": out of memory for member " + Quoted(name));
  // Fixed metadata: the same members always make the same bytes.
  archive_entry_set_pathname(entry.get(), std::string(name).c_str());
  archive_entry_set_filetype(entry.get(), AE_IFREG);
  archive_entry_set_perm(entry.get(), 0644);
  archive_entry_set_uid(entry.get(), 0);
  archive_entry_set_gid(entry.get(), 0);
  archive_entry_set_mtime(entry.get(), 0, 0);
  archive_entry_set_size(entry.get(), static_cast<la_int64_t>(data.size()));
  // ARCHIVE_WARN: a name the C locale cannot call UTF-8, written as bytes.
  const int rc = archive_write_header(archive_, entry.get());
  if (rc != ARCHIVE_OK && rc != ARCHIVE_WARN) {
    return error_ = WriteError(name);
  }
  size_t done = 0;
  while (done < data.size()) {
    const la_ssize_t n = archive_write_data(archive_, data.data() + done, data.size() - done);
    if (n <= 0) return error_ = WriteError(name);
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// The Status of libarchive's last write failure, `name` being the member.
Status TarWriter::WriteError(std::string_view name) {
  const int err = archive_errno(archive_);
  const std::string what = "write " + tmp_path_ + (name.empty() ? "" : ", member " + Quoted(name));
  if (err > 0) return ErrnoToStatus(err, what);
  return IoError(what + ": " + ArchiveMessage(archive_));
}

Status TarWriter::Close() {
  if (closed_) return error_;
  closed_ = true;
  if (error_.ok()) error_ = Finish();
  if (!error_.ok()) Abandon();
  return error_;
}

// End blocks, fsync, rename, fsync of the folder: a crash at any point
// leaves PATH either as it was or whole.
Status TarWriter::Finish() {
  if (archive_write_close(archive_) != ARCHIVE_OK) return WriteError("");
  archive_write_free(archive_);
  archive_ = nullptr;
  if (::fsync(fd_) != 0) return ErrnoToStatus(errno, "fsync " + tmp_path_);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) return ErrnoToStatus(errno, "close " + tmp_path_);
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    return ErrnoToStatus(errno, "rename " + tmp_path_ + " to " + path_);
  }
  return SyncFolder(FolderOf(path_));
}

// Drops the unfinished tar. archive_write_fail keeps archive_write_free from
// writing the end blocks into a file about to be removed.
void TarWriter::Abandon() {
  if (archive_ != nullptr) {
    archive_write_fail(archive_);
    archive_write_free(archive_);
    archive_ = nullptr;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_path_.c_str());
}

}  // namespace stoker::wds
