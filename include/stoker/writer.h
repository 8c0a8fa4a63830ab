// Writing a dataset from the user's own records: a schema of typed fields
// (docs/format.md §2.2), records streamed in one at a time, shards cut at
// the shard size and stored in parallel, the shard table and the manifest
// last (docs/format.md §5.1). Pack and the importers are users of it.
//
// Atomic: the manifest is the commit. A writer destroyed without Close (an
// exception, a kill) leaves shards but no manifest, which no reader takes
// for a dataset, and a note ("pack.pending") naming how many shards may be
// there, so that the next writer into the same place overwrites and removes
// them without listing the store. A destination that already holds a
// dataset is refused (AlreadyExists).
//
// Parallel writers: a dataset may be written in parts, each by its own
// writer (a process, a rank), each part a complete dataset of its own under
// DST/parts/NNNNNN; CommitParts then writes DST's shard table and manifest,
// which name the parts' shards where they lie (docs/format.md §2.6): the
// shards are not copied. A part that is missing or unfinished fails the
// commit, naming it; re-running its writer and then the commit finishes the
// dataset.
//
// Thread safety: a DatasetWriter is used by one thread at a time (Write and
// Close from the same thread, or with external synchronisation); it stores
// shards from `threads` workers of its own and calls `progress` from the
// writing thread. Distinct writers are independent.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/format.h"
#include "stoker/status.h"
#include "stoker/store.h"

namespace stoker {

struct WriterProgress {
  uint64_t records = 0;        // records accepted by Write
  uint64_t bytes = 0;          // their record bytes
  uint64_t shards_stored = 0;  // shards stored so far
};

struct WriterOptions {
  // Default: 4 MiB, Ceph's object size. A record larger than this gets a
  // shard of its own.
  uint64_t shard_bytes = format::kDefaultShardBytes;
  // Shards finished and stored at once (the memory bound is about
  // (threads + 1) x shard_bytes). Default: 0 = min(8, max(2, cores)).
  uint32_t threads = 0;
  // Label names by label value, stored in the manifest; may be empty.
  std::vector<std::string> classes;
  // Free text for the manifest's created_by. Default: "stoker VERSION writer".
  std::string created_by;
  // Check each str field's value is UTF-8 and each json field's one JSON
  // value (docs/format.md §3.2). Default: on; off only for sources already
  // checked (the exporter's own round trip).
  bool check_text = true;
  // Block checksums of the token field (docs/format.md §3.5): the field a
  // token loader takes by default ("tokens" when it is an integer array of
  // shape [*], else the schema's only such field) gets a companion bytes
  // field NAME_sums, last in the schema, holding one checksum per block of
  // this many of its bytes, so that a verified window reads only the blocks
  // it touches instead of whole documents. A power of two in 64..1 MiB, or 0
  // for none (windows then check whole records, as datasets packed before
  // §3.5 do). No effect on a schema without a token field. Default: 512
  // (format::kDefaultTokenBlockBytes, which says why).
  uint32_t token_block_bytes = format::kDefaultTokenBlockBytes;
  // Called from the writing thread after each stored shard and at Close.
  std::function<void(const WriterProgress&)> progress;
  StoreOptions store;
};

class DatasetWriter {
 public:
  // A writer of a new dataset into `dst` with schema `fields` (checked as
  // CheckSchema does; InvalidArgument naming the field). The dataset's
  // schema is `fields` plus, for a token field, its block-sums field
  // (WriterOptions::token_block_bytes), which the writer fills itself:
  // `fields` may not hold one, nor a field of its name.
  static Result<std::unique_ptr<DatasetWriter>> Create(std::shared_ptr<Store> dst,
                                                       std::vector<format::FieldSpec> fields,
                                                       const WriterOptions& options);
  static Result<std::unique_ptr<DatasetWriter>> Create(std::string_view dst_uri,
                                                       std::vector<format::FieldSpec> fields,
                                                       const WriterOptions& options);
  // Part `part` of a dataset written in parts: a dataset of its own under
  // DST_URI/parts/NNNNNN (see the header comment). A part may be closed
  // with no record (a rank that got no input): it then holds no shard, and
  // CommitParts leaves it out of the parts list.
  static Result<std::unique_ptr<DatasetWriter>> CreatePart(std::string_view dst_uri,
                                                           uint32_t part,
                                                           std::vector<format::FieldSpec> fields,
                                                           const WriterOptions& options);

  // Stops the workers. Without a successful Close, nothing becomes visible.
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  // Appends one record: `values[j]` is field j's value (FieldValue::bytes
  // for bytes, str, json and arrays; i64 for int64; f64 for float32 and
  // float64). InvalidArgument naming the record (its 0-based number) and the
  // field: a wrong number of values, a length that does not fit the field's
  // shape, invalid UTF-8 in a str, a json value that does not parse. A
  // record is copied before Write returns. A failed store (a full disk, a
  // dead cluster) is returned by the next Write or by Close, naming the
  // shard; after any error other than a bad record the writer is failed and
  // every later call returns that error.
  Status Write(std::span<const format::FieldValue> values);

  // Stores the last shard, waits for every shard, then writes the shard
  // table and the manifest (the commit), removes what an earlier, killed
  // writer left past this one's shards, and the note. Returns the manifest
  // as written. An empty dataset (no record written) is InvalidArgument.
  // A second call returns the first one's result.
  Result<format::Manifest> Close();

  uint64_t records() const;
  // The fields Write takes values for: the schema given to Create (the
  // manifest's, less the block-sums field the writer adds).
  const std::vector<format::FieldSpec>& fields() const;
  const std::string& uri() const;

 private:
  struct Impl;
  explicit DatasetWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Commits a dataset written in `parts` parts (CreatePart 0 .. parts-1):
// reads each part's manifest and shard table, checks that their schemas
// agree, and writes DST_URI's shard table and manifest, which list the
// parts in order (the dataset's samples are part 0's, then part 1's, ...).
// Errors: NotFound naming the first missing part ("part 3 of 8 has no
// manifest: its writer did not finish"), InvalidArgument for a schema that
// differs, AlreadyExists when DST_URI already holds a dataset,
// InvalidArgument when no part holds a record.
Result<format::Manifest> CommitParts(std::string_view dst_uri, uint32_t parts,
                                     const StoreOptions& store = {});

// The key prefix of part `part` within its dataset: "parts/000003".
std::string PartPrefix(uint32_t part);

// The note key a writer leaves until its commit (docs/format.md §5.1).
inline constexpr std::string_view kPendingKey = "pack.pending";

}  // namespace stoker
