#include "stoker/pack.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/file_util.h"
#include "stoker/plan.h"

namespace stoker {
namespace fs = std::filesystem;
namespace {

bool Hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

// A pack's note of the shards it may write (docs/format.md §5.1): written
// before the first shard, removed after the commit. "STOKER-PACK-PENDING N\n".
constexpr std::string_view kPendingKey = "pack.pending";
constexpr std::string_view kPendingMagic = "STOKER-PACK-PENDING ";

// How many shards the pack that left a note meant to write; 0 without one.
// A note that does not parse (another tool's object of that name) counts as
// none: the worst case is shards left behind, which are harmless.
Result<uint64_t> ReadPending(Store& dst) {
  auto raw = dst.ReadAll(kPendingKey);
  if (!raw.ok()) {
    if (raw.status().code() == Code::kNotFound) return uint64_t{0};
    return raw.status().WithContext("reading " + dst.uri() + "/" + std::string(kPendingKey));
  }
  const std::string_view text(reinterpret_cast<const char*>(raw->data()), raw->size());
  if (!text.starts_with(kPendingMagic) || !text.ends_with('\n')) return uint64_t{0};
  const std::string_view digits =
      text.substr(kPendingMagic.size(), text.size() - kPendingMagic.size() - 1);
  uint64_t shards = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), shards);
  if (ec != std::errc() || end != digits.data() + digits.size() || shards > UINT32_MAX) {
    return uint64_t{0};
  }
  return shards;
}

Status WritePending(Store& dst, uint64_t shards) {
  const std::string text = std::string(kPendingMagic) + std::to_string(shards) + "\n";
  return dst.Put(kPendingKey, std::as_bytes(std::span(text.data(), text.size())));
}

// Reads a whole source file into `out`. Errors name the file.
Status ReadSource(const std::string& path, std::vector<std::byte>* out) {
  STOKER_RETURN_IF_ERROR(internal::ReadWholeFile(path, out));
  if (out->empty()) return InvalidArgument(path + ": empty source file (a sample needs bytes)");
  return Status::Ok();
}

}  // namespace

Result<PackSources> ScanImageFolder(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return NotFound(root + ": not a folder");
  PackSources out;
  std::vector<fs::path> class_dirs;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (Hidden(it->path())) continue;
    if (it->is_directory(ec)) {
      class_dirs.push_back(it->path());
    } else {
      return InvalidArgument(it->path().string() +
                             ": a file directly in an ImageFolder root has no class "
                             "(expected ROOT/CLASS/FILE)");
    }
  }
  if (ec) return ErrnoToStatus(ec.value(), "list " + root);
  std::sort(class_dirs.begin(), class_dirs.end());
  for (size_t label = 0; label < class_dirs.size(); ++label) {
    out.classes.push_back(class_dirs[label].filename().string());
    std::vector<std::string> files;
    for (fs::recursive_directory_iterator it(class_dirs[label], ec), end; !ec && it != end;
         it.increment(ec)) {
      if (Hidden(it->path())) {
        if (it->is_directory(ec)) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file(ec)) files.push_back(it->path().string());
    }
    if (ec) return ErrnoToStatus(ec.value(), "list " + class_dirs[label].string());
    std::sort(files.begin(), files.end());
    for (auto& f : files) out.files.push_back({std::move(f), static_cast<int64_t>(label)});
  }
  if (out.files.empty())
    return InvalidArgument(root + ": no files found (expected ROOT/CLASS/FILE)");
  return out;
}

Result<PackSources> ReadListFile(const std::string& list_path) {
  std::ifstream in(list_path);
  if (!in) return ErrnoToStatus(errno ? errno : ENOENT, "open " + list_path);
  const fs::path base = fs::path(list_path).parent_path();
  PackSources out;
  std::string line;
  int64_t max_label = -1;
  for (size_t lineno = 1; std::getline(in, line); ++lineno) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    std::istringstream fields(line);
    std::string path, label_text, extra;
    fields >> path >> label_text;
    const std::string where = list_path + ":" + std::to_string(lineno);
    if (label_text.empty()) return InvalidArgument(where + ": expected 'PATH LABEL'");
    if (fields >> extra) {
      return InvalidArgument(where + ": unexpected '" + extra +
                             "' after the label (paths may not contain spaces)");
    }
    int64_t label = 0;
    try {
      size_t used = 0;
      label = std::stoll(label_text, &used);
      if (used != label_text.size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      return InvalidArgument(where + ": label '" + label_text + "' is not an integer");
    }
    if (label < 0) return InvalidArgument(where + ": label " + label_text + " is negative");
    max_label = std::max(max_label, label);
    fs::path p(path);
    if (p.is_relative()) p = base / p;
    out.files.push_back({p.string(), label});
  }
  if (in.bad()) return IoError("read " + list_path);
  if (out.files.empty()) return InvalidArgument(list_path + ": no samples listed");
  return out;
}

Result<PackSources> ScanSources(const std::string& src) {
  std::error_code ec;
  const auto st = fs::status(src, ec);
  if (ec || !fs::exists(st)) return NotFound(src + ": no such file or folder");
  if (fs::is_directory(st)) return ScanImageFolder(src);
  return ReadListFile(src);
}

std::vector<uint64_t> PackedOrder(uint64_t count, const PackOptions& options) {
  std::vector<uint64_t> order(count);
  for (uint64_t i = 0; i < count; ++i) order[i] = i;
  if (options.shuffle) {
    Rng rng(MixSeed({options.shuffle_seed, count, 0x5041434bull /* "PACK" */}));
    Permute(std::span<uint64_t>(order), rng);
  }
  return order;
}

Result<format::Manifest> Pack(const PackSources& in_order, Store& dst, const PackOptions& options) {
  // The packed order (see PackOptions::shuffle).
  PackSources sources;
  sources.classes = in_order.classes;
  for (uint64_t i : PackedOrder(in_order.files.size(), options)) {
    sources.files.push_back(in_order.files[i]);
  }
  if (options.shard_bytes < format::kShardAlignment ||
      options.shard_bytes > format::kMaxShardBytes) {
    return InvalidArgument("shard size must be between 4 KiB and 4 GiB");
  }
  if (sources.files.empty()) return InvalidArgument("nothing to pack");
  // Refuse to replace a dataset: its readers would see it change under them.
  {
    auto existing = dst.Stat(format::kManifestKey);
    if (existing.ok()) {
      return AlreadyExists(dst.uri() + " already holds a stoker dataset (" +
                           std::string(format::kManifestKey) +
                           "); remove it or pack to another place");
    }
    if (existing.status().code() != Code::kNotFound) return existing.status();
  }

  // Sizes first, so that shards can be cut deterministically before any
  // data is read: the same sources always give the same shards.
  const size_t n = sources.files.size();
  std::vector<uint64_t> sizes(n);
  uint64_t bytes_total = 0;
  for (size_t i = 0; i < n; ++i) {
    struct stat st;
    const std::string& path = sources.files[i].path;
    if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat " + path);
    if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file");
    if (st.st_size == 0)
      return InvalidArgument(path + ": empty source file (a sample needs bytes)");
    sizes[i] = static_cast<uint64_t>(st.st_size);
    bytes_total += sizes[i];
  }

  format::Manifest m;
  m.dataset_id = format::NewDatasetId();
  m.fields = {{"image", format::FieldType::kBytes}, {"label", format::FieldType::kInt64}};
  m.classes = sources.classes;
  m.created_by = std::string("stoker ") + STOKER_VERSION + " pack";

  // Cut shards: consecutive samples while the shard stays under the target.
  struct Cut {
    size_t begin, end;
  };
  std::vector<Cut> cuts;
  {
    size_t begin = 0;
    uint64_t estimate = 0;
    // Per sample: the record (bytes + 8-byte label) and its index entry.
    const uint64_t entry = 24;  // round_up(16 + 4 * 2 fields, 8), docs/format.md §3.3
    for (size_t i = 0; i < n; ++i) {
      const uint64_t add = sizes[i] + 8 + entry + 8;  // + up to 8 of index alignment
      if (i > begin && format::kShardHeaderBytes + estimate + add > options.shard_bytes) {
        cuts.push_back({begin, i});
        begin = i;
        estimate = 0;
      }
      estimate += add;
    }
    cuts.push_back({begin, n});
  }
  if (cuts.size() > UINT32_MAX) return InvalidArgument("too many shards");
  // What an earlier pack here that did not finish meant to write, and what
  // this one will write, before any shard is: whichever is killed, the next
  // pack knows which shards may be left behind, without listing the store.
  STOKER_ASSIGN_OR_RETURN(const uint64_t earlier, ReadPending(dst));
  STOKER_RETURN_IF_ERROR(WritePending(dst, std::max<uint64_t>(earlier, cuts.size())));

  // Each shard's entry, by shard number, as the workers finish them.
  struct Written {
    uint64_t bytes = 0;
    uint32_t samples = 0;
    uint64_t index_hash = 0;
  };
  std::vector<Written> written(cuts.size());

  uint32_t threads = options.threads;
  if (threads == 0) threads = std::max(2u, 2 * std::thread::hardware_concurrency());
  threads = std::min<uint32_t>(threads, static_cast<uint32_t>(cuts.size()));

  std::atomic<size_t> next{0};
  std::mutex mu;  // guards first_error, progress, m's totals
  Status first_error;
  PackProgress progress;
  progress.files_total = n;
  progress.bytes_total = bytes_total;
  std::atomic<bool> failed{false};

  auto worker = [&] {
    std::vector<std::byte> data;
    while (!failed.load()) {
      const size_t s = next.fetch_add(1);
      if (s >= cuts.size()) return;
      format::ShardBuilder builder(m.fields, m.dataset_id, static_cast<uint32_t>(s));
      uint64_t bytes_in = 0;
      Status st;
      for (size_t i = cuts[s].begin; i < cuts[s].end && st.ok(); ++i) {
        st = ReadSource(sources.files[i].path, &data);
        if (!st.ok()) break;
        format::FieldValue values[2];
        values[0].bytes = data;
        values[1].i64 = sources.files[i].label;
        st = builder.Add(values);
        if (!st.ok()) st = st.WithContext(sources.files[i].path);
        bytes_in += data.size();
      }
      Written w;
      if (st.ok()) {
        w.samples = builder.sample_count();
        const uint64_t payload = builder.payload_bytes();
        const uint64_t max_sample = builder.max_sample_bytes();
        std::vector<std::byte> shard = builder.Finish(&w.index_hash);
        w.bytes = shard.size();
        st = dst.Put(format::ShardKey(static_cast<uint32_t>(s)), shard);
        if (st.ok()) {
          std::lock_guard lock(mu);
          m.payload_bytes += payload;
          m.max_sample_bytes = std::max(m.max_sample_bytes, max_sample);
        }
      }
      std::lock_guard lock(mu);
      if (!st.ok()) {
        if (first_error.ok()) first_error = st;
        failed = true;
        return;
      }
      written[s] = w;
      progress.files_done += cuts[s].end - cuts[s].begin;
      progress.bytes_done += bytes_in;
      progress.shards_written++;
      if (options.progress) options.progress(progress);
    }
  };
  std::vector<std::thread> pool;
  for (uint32_t t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (!first_error.ok()) {
    return first_error.WithContext("pack into " + dst.uri() + " failed, no dataset was created");
  }

  m.shards.reserve(written.size());
  for (const Written& w : written) m.shards.AppendNumbered(w.bytes, w.samples, w.index_hash);
  m.sample_count = m.shards.total_samples();

  // The shard table, then the commit: the manifest, which names the table
  // by its header's hash, so that a table left by a killed pack is never
  // taken for this one's (docs/format.md §5.1).
  const std::vector<std::byte> table = format::EncodeShardTable(m, &m.table);
  STOKER_RETURN_IF_ERROR(dst.Put(m.table.key, table));
  const std::string text = format::EncodeManifest(m);
  STOKER_RETURN_IF_ERROR(
      dst.Put(format::kManifestKey, std::as_bytes(std::span(text.data(), text.size()))));

  // Shards an earlier, killed pack wrote past this one's last are not part
  // of this dataset; remove them (best effort: they are harmless, only
  // wasted space), then the note that named them.
  for (uint64_t s = cuts.size(); s < earlier; ++s) {
    (void)dst.Remove(format::ShardKey(static_cast<uint32_t>(s)));
  }
  (void)dst.Remove(kPendingKey);
  return m;
}

Result<format::Manifest> Pack(const std::string& src, std::string_view dst_uri,
                              const PackOptions& options) {
  STOKER_ASSIGN_OR_RETURN(PackSources sources, ScanSources(src));
  STOKER_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(dst_uri, options.store));
  return Pack(sources, *store, options);
}

}  // namespace stoker
