// Importers of the formats training data already comes in (WebDataset tars,
// JSONL) into a stoker dataset, and the exporter back to WebDataset tars, so
// that a dataset is never locked in: importing a WebDataset tar set and
// exporting it again gives tars whose members (names, order, bytes) are the
// originals; when the originals were written the way wds::TarWriter writes
// (ustar, fixed metadata) the tar files themselves are byte-identical.
//
// Every importer writes through DatasetWriter (include/stoker/writer.h):
// shards stored in parallel, the manifest last, nothing visible until the
// commit, a destination holding a dataset refused (AlreadyExists).
//
// Thread safety: each function is reentrant; ImportWebDataset reads tars on
// threads of its own and calls `progress` from the calling thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/format.h"
#include "stoker/status.h"
#include "stoker/store.h"
#include "stoker/writer.h"

namespace stoker {

// The field holding each sample's WebDataset key ("a/b/000001"), first in
// the schema of an imported WebDataset; the exporter names members after it.
inline constexpr std::string_view kKeyField = "__key__";

struct ImportProgress {
  uint64_t samples = 0;       // records written so far
  uint64_t bytes_read = 0;    // source bytes consumed so far (approximate for tars)
  uint64_t bytes_total = 0;   // the sources' size on disk
  uint64_t shards_stored = 0;
  uint64_t skipped = 0;       // bad samples or lines skipped (skip_bad)
};

struct ImportOptions {
  // Declared fields. WebDataset: overrides of the inferred type by field
  // name (e.g. cls as int64: the member's decimal text parsed). JSONL: the
  // fields to take from each line, in this order; empty: inferred from the
  // first line. Default: none.
  std::vector<format::FieldSpec> fields;
  // Default: false (the first bad sample, tar or line fails the import).
  // True: a bad sample (TarReadOptions::skip_bad), a sample missing a field
  // of the schema, or a bad JSONL line is skipped and counted.
  bool skip_bad = false;
  // WebDataset: tars read ahead at once, each by a thread of its own.
  // Default: 0 = 3 (the reads overlap the writer's work on any machine; more
  // only adds memory, at most read_ahead_bytes per tar).
  uint32_t read_threads = 0;
  // Bytes of samples read ahead per tar. Default: 64 MiB.
  uint64_t read_ahead_bytes = 64ull << 20;
  // Where the records go (shard size, threads, store options).
  WriterOptions writer;
  // Called from the calling thread, about every 16 MiB read and at the end.
  std::function<void(const ImportProgress&)> progress;
  // Asked from the calling thread about every 16 MiB read (after progress):
  // true stops the import with Cancelled naming what was read; nothing is
  // committed (the writer is dropped, as by a kill). Default: none.
  std::function<bool()> cancelled;
};

struct ImportResult {
  format::Manifest manifest;
  uint64_t samples = 0;       // records written
  uint64_t skipped = 0;       // bad samples, tars' tails or lines skipped
  std::string last_skip_reason;
  uint64_t source_bytes = 0;  // the sources' size on disk
  std::vector<std::string> sources;  // the files read, in order
};

// The tars a WebDataset source names: each path a .tar (or .tar.gz, .tgz)
// file, or a folder whose *.tar files are taken in name order (not its
// subfolders). NotFound naming a path that does not exist, InvalidArgument
// for a folder without tars or a file that is no tar by name.
Result<std::vector<std::string>> ListTars(std::span<const std::string> paths);
// True when `paths` look like a WebDataset source (each a .tar file or a
// folder holding .tar files): what `stoker pack` recognises.
bool LooksLikeWebDataset(std::span<const std::string> paths);

// Parses "NAME:TYPE" as `--field` gives it (TYPE as ParseFieldSpec reads it:
// "str", "json", "int64", "uint32[*]", ...). InvalidArgument naming it.
Result<format::FieldSpec> ParseFieldArg(std::string_view arg);

// WebDataset tars (ListTars's paths) into a new dataset at `dst_uri`.
// The schema comes from the first sample: __key__ (str), then one field per
// member in that sample's order, named after the extension with every
// character outside [A-Za-z0-9_] made '_' and the extension kept as the
// field's ext ("seg.png": field seg_png). Types: txt and text are str, json
// is json, everything else (cls included) bytes, so that the export is
// byte-identical; options.fields overrides by name. Errors name the tar
// and the member or key: those of the tar reader (not a tar, truncated, a
// duplicate field, members not adjacent), a sample missing a field of the
// schema (skip_bad: skipped and counted), a member whose extension is not
// in the schema, a value the writer refuses (bad UTF-8, bad JSON).
// Tars are read by options.read_threads threads ahead of the writer; the
// records keep tar order, then sample order.
Result<ImportResult> ImportWebDataset(std::span<const std::string> tars,
                                      std::string_view dst_uri, const ImportOptions& options);

// JSONL files (one JSON object a line; blank lines skipped) into a new
// dataset at `dst_uri`. Each field of options.fields is the value of the
// key of its name: str from a JSON string, json from any value (serialised
// compactly), int64 from an integer, float32/float64 from a number, bytes
// from a string's UTF-8 bytes, arrays from (nested) JSON arrays of numbers,
// each checked against the dtype's range (70000 in a uint16 field is
// OutOfRange). Without declared fields, the first line decides: strings
// str, integers int64, other numbers float64, arrays of integers int64[*],
// other arrays of numbers float32[*], anything else json. Errors name
// FILE:LINE and the key (InvalidArgument: a line that is not an object, a
// missing key, a value of the wrong type; OutOfRange: a number the field
// cannot hold).
Result<ImportResult> ImportJsonl(std::span<const std::string> paths, std::string_view dst_uri,
                                 const ImportOptions& options);

struct ExportProgress {
  uint64_t samples = 0;
  uint64_t samples_total = 0;
  uint64_t bytes = 0;        // member bytes written
  uint64_t bytes_total = 0;  // the dataset's record bytes (about what will be)
  uint64_t tars = 0;         // tars finished
};

struct ExportOptions {
  // Samples per tar. Default: 10,000, as LAION and DataComp ship them.
  uint64_t samples_per_tar = 10000;
  // Called from the calling thread after each shard and at the end.
  std::function<void(const ExportProgress&)> progress;
  // Asked after each shard: true stops the export with Cancelled; the tars
  // finished so far stay, the one being written is not renamed into place.
  std::function<bool()> cancelled;
  StoreOptions store;
};

struct ExportResult {
  uint64_t samples = 0;
  uint64_t tars = 0;
  uint64_t bytes = 0;  // member bytes written
  std::vector<std::string> paths;
};

// Writes the dataset at `src_uri` as WebDataset tars OUT_DIR/000000.tar,
// 000001.tar, ... (created with wds::TarWriter: ustar, deterministic, each
// renamed into place when complete). A sample's members are KEY.EXT in
// schema order, EXT the field's ext (or its name); KEY is the __key__
// field's value when the schema has one (it is not written as a member),
// else the sample id zero-padded to 9 digits. Values: bytes, str and json
// as stored, int64 and floats as decimal text (shortest round trip),
// arrays as their raw little-endian bytes. Every sample's checksum is
// checked before it is written. OUT_DIR is created; one that holds files
// already is refused (AlreadyExists). A key that is empty or would make a
// bad member name is InvalidArgument naming the sample.
Result<ExportResult> ExportWebDataset(std::string_view src_uri, const std::string& out_dir,
                                      const ExportOptions& options);

// ---- Megatron-LM indexed datasets (.bin + .idx) ----
//
// The .idx layout (megatron/core/datasets/indexed_dataset.py), little-endian:
// magic "MMIDIDX\0\0" (9 bytes), version u64 (1), dtype code u8 (1 uint8,
// 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16),
// sequence count u64, document count u64, then the sequences' lengths
// (int32, in tokens), their pointers (int64, byte offsets into the .bin), and
// the document index (int64, sequence numbers where documents start,
// document count of them: 0 first, the sequence count last).
inline constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kMegatronHeaderBytes = 34;
// The field of an imported Megatron dataset's tokens, and (only when some
// document holds more than one sequence) of each sequence's document number.
inline constexpr std::string_view kMegatronTokenField = "tokens";
inline constexpr std::string_view kMegatronDocumentField = "document";

// A parsed .idx, viewing the bytes it was read from (which must outlive it).
struct MegatronIndex {
  format::DType dtype = format::DType::kUInt16;
  uint8_t dtype_code = 8;
  uint64_t sequences = 0;
  uint64_t documents = 0;  // entries of the document index (documents + 1)
  uint64_t lengths_offset = 0, pointers_offset = 0, documents_offset = 0;
  std::span<const std::byte> idx;
  int32_t Length(uint64_t i) const;         // i < sequences
  int64_t Pointer(uint64_t i) const;        // i < sequences
  int64_t DocumentIndex(uint64_t d) const;  // d < documents
};

// The stoker dtype of a Megatron dtype code, `*name` set to its Megatron
// name: int8, int16 and float64 have none of the same bytes (Unsupported),
// a code outside 1..8 is InvalidArgument.
Result<format::DType> MegatronDType(uint8_t code, std::string* name);
// Parses and checks an .idx (`path` names it): InvalidArgument naming the
// file, the offset and the field for a wrong magic, version or dtype code,
// a truncated header, counts that do not match the file's size, or a
// document index that does not run from 0 to the sequence count.
Result<MegatronIndex> ReadMegatronIndex(std::span<const std::byte> idx, const std::string& path);
// The prefixes (PATH without .bin/.idx) that `paths` name, each given as
// PREFIX, PREFIX.idx or PREFIX.bin; NotFound naming a missing file.
Result<std::vector<std::string>> ListMegatron(std::span<const std::string> paths);
// True when every path ends in .idx or .bin.
bool LooksLikeMegatron(std::span<const std::string> paths);

// Megatron datasets (ListMegatron's paths, in order) into a new dataset at
// `dst_uri`: one record per sequence, its tokens byte for byte in an array
// field "tokens" of the .idx's dtype and shape [*] (options.fields may
// rename it: one NAME:DTYPE[*] of that dtype), plus an int64 field
// "document" (the sequence's document, counted across the sources) when
// some document holds more than one sequence (otherwise records are
// documents). Every sequence must lie in the .bin and their lengths add up
// to its size (InvalidArgument naming the .idx, the offset and the
// sequence); several sources must share one dtype.
Result<ImportResult> ImportMegatron(std::span<const std::string> paths, std::string_view dst_uri,
                                    const ImportOptions& options);

}  // namespace stoker
