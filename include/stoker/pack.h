// Packing: many small files in, a few large shards, their shard table and a
// manifest out.
//
// Sources are an ImageFolder tree (ROOT/CLASS/FILE: class folders in sorted
// order become labels 0, 1, ...) or a list file of "PATH LABEL" lines. Each
// sample gets two fields: "image" (the file's bytes) and "label" (int64).
//
// Atomic: shards are written first, then the shard table, the manifest last
// (the commit). A pack killed part way leaves shards (and maybe a table) but
// no manifest, which no reader takes for a dataset; the next pack into the
// same place overwrites and cleans them up, knowing their names from a note
// the killed pack left ("pack.pending", docs/format.md §5.1), not from a
// listing of the store. A destination that already holds a dataset is
// refused (AlreadyExists).
//
// Thread safety: the functions are reentrant; Pack uses `threads` workers of
// its own and calls `progress` from any of them (serialised).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/format.h"
#include "stoker/status.h"
#include "stoker/store.h"

namespace stoker {

struct PackSource {
  std::string path;
  int64_t label = 0;
};

struct PackSources {
  std::vector<PackSource> files;
  std::vector<std::string> classes;  // label names by value; may be empty
};

// ROOT/CLASS/FILE. Hidden files and folders (".x") are skipped; files
// directly under ROOT are an error (they have no class). Files are sorted by
// class then name, so the same tree always packs the same way.
Result<PackSources> ScanImageFolder(const std::string& root);

// One sample per line: "PATH LABEL" (whitespace-separated; PATH may not
// contain whitespace; relative paths are relative to the list file's
// folder). Blank lines and lines starting with '#' are skipped. Errors name
// the line.
Result<PackSources> ReadListFile(const std::string& list_path);

// A folder is scanned as an ImageFolder, a regular file read as a list.
Result<PackSources> ScanSources(const std::string& src);

struct PackProgress {
  uint64_t files_done = 0, files_total = 0;
  uint64_t bytes_done = 0, bytes_total = 0;
  uint64_t shards_written = 0;
};

struct PackOptions {
  // Shuffle the samples (seeded, so the same sources and seed always pack
  // the same way) before cutting shards. The loader shuffles shards and then
  // samples within a window of shards; without a shuffle here, an ImageFolder
  // packed class by class would give batches of only a few classes. Sample
  // ids are positions in the packed order; PackedOrder(...) maps them back
  // to sources. Default: on, seed 0.
  bool shuffle = true;
  uint64_t shuffle_seed = 0;
  // Default: 4 MiB, Ceph's object size. A sample larger than this gets a
  // shard of its own.
  uint64_t shard_bytes = format::kDefaultShardBytes;
  // Workers reading sources and writing shards. Default: 0 = 2 x cores.
  uint32_t threads = 0;
  std::function<void(const PackProgress&)> progress;
  StoreOptions store;
};

// The order pack writes `count` sources in: packed sample id i holds
// sources.files[PackedOrder(count, options)[i]].
std::vector<uint64_t> PackedOrder(uint64_t count, const PackOptions& options);

// Packs `sources` into the dataset store `dst` (see the header comment).
Result<format::Manifest> Pack(const PackSources& sources, Store& dst, const PackOptions& options);
// The same, from a source path and a destination URI.
Result<format::Manifest> Pack(const std::string& src, std::string_view dst_uri,
                              const PackOptions& options);

}  // namespace stoker
