// WebDataset tar archives (internal): a reader that groups a tar's members
// into samples the way WebDataset does, and a writer of deterministic tars,
// for the WebDataset importer and the exporter back to WebDataset.
//
// A WebDataset shard is a plain tar whose regular files are named KEY.EXT:
// KEY is the member's folder plus its basename up to the first dot, EXT the
// rest of the basename ("a/b/000001.seg.png" is field "seg.png" of sample
// "a/b/000001"), and the members of one sample are adjacent in the tar.
//
// Thread safety: a TarSampleReader or TarWriter is used by one thread at a
// time (external synchronisation); distinct objects may be used from
// distinct threads (libarchive keeps no shared state between archives).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "stoker/status.h"

struct archive;
struct archive_entry;

namespace stoker::wds {

// The largest member the reader accepts: a field of a stoker record holds
// at most 4 GiB - 1 bytes (its length is 32 bits).
inline constexpr uint64_t kMaxMemberBytes = (uint64_t{1} << 32) - 1;

// One field of a sample: the member's extension ("seg.png") and its bytes.
struct Member {
  std::string ext;
  std::vector<std::byte> data;
};

struct Sample {
  std::string key;              // "a/b/000001"
  std::vector<Member> members;  // in tar order
  std::string tar;              // the tar's path, for messages
  // Index of the sample's first member among the tar's entries, 0-based,
  // folders included: the line of `tar tf` that names it, counting from 0.
  uint64_t first_member = 0;
};

struct TarReadOptions {
  // Default: false (the first bad member or sample fails the read). When
  // true, a bad sample (one of its members is a link or device, too large,
  // or a duplicate field; or its key appears again after other samples) is
  // skipped whole, a member without an extension is skipped alone, and a
  // truncated or damaged tar ends the tar (the sample in progress is
  // dropped); each counts once in skipped(). I/O errors still fail the read.
  bool skip_bad = false;
  // Default: false (a symlink, hard link, device or FIFO member is bad, see
  // skip_bad). When true such members are ignored like folders, uncounted,
  // as WebDataset's own reader does.
  bool skip_non_regular = false;
};

// Reads one WebDataset tar (ustar, GNU or pax; gzip-compressed too) from
// the local file system, one sample at a time. Every error is a Status
// whose message names the tar and the member. Top-level members named
// __NAME__ (WebDataset's metadata convention) are ignored, as WebDataset
// does. Memory: the current sample's bytes, plus one key per sample seen
// (to find a sample whose members are not adjacent).
class TarSampleReader {
 public:
  static Result<std::unique_ptr<TarSampleReader>> Open(const std::string& path,
                                                       const TarReadOptions& options = {});
  ~TarSampleReader();
  TarSampleReader(const TarSampleReader&) = delete;
  TarSampleReader& operator=(const TarSampleReader&) = delete;

  // The next sample into *out: true, or false at the end of the tar. Errors:
  // Corruption (not a tar, truncated, damaged header, a member without an
  // extension, a duplicate field, members of a sample not adjacent),
  // InvalidArgument (a link or device member), Unsupported (a member over
  // kMaxMemberBytes), or the errno's Status of a failed read. After an
  // error every later call returns the same error.
  Result<bool> Next(Sample* out);

  // Bad members and samples skipped so far (TarReadOptions::skip_bad), and
  // the message of the error the last of them would have been ("" if none).
  uint64_t skipped() const { return skipped_; }
  const std::string& last_skip_reason() const { return last_skip_reason_; }

  const std::string& path() const { return path_; }

 private:
  struct Entry;
  TarSampleReader(std::string path, const TarReadOptions& options, struct archive* a);
  Entry NextEntry();
  void Classify(struct archive_entry* entry, Entry* e);
  Status ReadData(const std::string& name, uint64_t size, std::vector<std::byte>* data);
  Status Broken(const std::string& where);
  Result<bool> EndBroken(Status why);
  Status AddToPending(Entry&& e);
  Status StartPending(const Entry& e);
  bool FlushPending(Sample* out);
  Status Reject(Status why, bool whole_sample);
  void Count(std::string reason);

  std::string path_;
  TarReadOptions options_;
  struct archive* archive_;
  uint64_t entries_ = 0;   // entries read so far, folders included
  std::string last_name_;  // the last entry read, for a truncated header
  // The entry that starts the next sample, read while ending the pending one.
  std::unique_ptr<Entry> lookahead_;
  Sample pending_;  // the sample being assembled
  bool have_pending_ = false;
  bool pending_bad_ = false;    // skip_bad: the pending sample will be dropped
  std::string pending_reason_;  // ... and why
  std::unordered_set<std::string> seen_keys_;
  bool done_ = false;
  Status error_;  // sticky
  uint64_t skipped_ = 0;
  std::string last_skip_reason_;
};

// Writes a tar of regular files, byte for byte the same for the same names
// and contents: POSIX ustar, with a pax header only where ustar cannot hold
// the name (over 100 bytes that do not split at a '/', or not ASCII, which
// is marked hdrcharset=BINARY), mode 0644, uid/gid 0, no user or group
// names, mtime 0, and no padding past the end-of-archive blocks. The tar is
// written to PATH.tmp and renamed to PATH by Close(), after an fsync, so a
// killed writer never leaves a partial tar under PATH; a TarWriter
// destroyed without Close() removes PATH.tmp. An existing PATH is replaced.
// Two writers must not write the same PATH at once.
class TarWriter {
 public:
  static Result<std::unique_ptr<TarWriter>> Create(const std::string& path);
  ~TarWriter();
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;

  // Appends a regular file. InvalidArgument (nothing written) for an empty
  // name, one ending in '/' or holding a NUL, or after Close(); otherwise the
  // errno's Status of a failed write (NoSpace when the disk is full), naming
  // the path and the member. After a failed write every call returns that
  // error, and Close() removes PATH.tmp.
  Status Add(std::string_view name, std::span<const std::byte> data);

  // Ends the tar, fsyncs it, renames PATH.tmp to PATH and fsyncs the folder.
  // On an error before the rename PATH.tmp is removed and PATH is left as it
  // was. A second call returns the first one's Status.
  Status Close();

  const std::string& path() const { return path_; }

 private:
  TarWriter(std::string path, int fd, struct archive* a);
  Status WriteError(std::string_view name);
  Status Finish();
  void Abandon();

  std::string path_;
  std::string tmp_path_;
  int fd_;
  struct archive* archive_;
  Status error_;  // sticky
  bool closed_ = false;
};

}  // namespace stoker::wds
