// DatasetWriter: records in, shards, the shard table and the manifest out
// (docs/format.md §5.1). See include/stoker/writer.h.
#include "stoker/writer.h"

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "stoker/dataset.h"

namespace stoker {
namespace {

using format::FieldSpec;
using format::FieldType;
using format::FieldValue;

// A writer's note of the shards it may have stored (docs/format.md §5.1):
// written before the first shard past what it covers, removed after the
// commit. "STOKER-PACK-PENDING N\n".
constexpr std::string_view kPendingMagic = "STOKER-PACK-PENDING ";
// The note covers this many shards at first, then twice as many each time
// the writer reaches its end: O(log shards) small writes.
constexpr uint64_t kFirstNote = 64;

// How many shards the writer that left a note meant to write; 0 without one.
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

// The offset of the first byte that is not part of valid UTF-8 (RFC 3629:
// no overlongs, no surrogates, nothing past U+10FFFF), or npos.
size_t InvalidUtf8At(std::span<const std::byte> s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII runs, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

// Empty when `v` fits field `f`, else why not (after "field NAME (TYPE) ").
std::string ValueProblem(const FieldSpec& f, const FieldValue& v, bool check_text) {
  if (f.type == FieldType::kInt64 || f.type == FieldType::kFloat32 ||
      f.type == FieldType::kFloat64) {
    return {};
  }
  if (v.bytes.size() > UINT32_MAX) {
    return "is " + std::to_string(v.bytes.size()) + " bytes, the most is 2^32-1";
  }
  if (std::string why = f.LengthProblem(v.bytes.size()); !why.empty()) return why;
  if (!check_text) return {};
  if (f.type == FieldType::kString || f.type == FieldType::kJson) {
    if (size_t at = InvalidUtf8At(v.bytes); at != std::string_view::npos) {
      return "is not UTF-8 (byte " + std::to_string(at) + ")";
    }
  }
  if (f.type == FieldType::kJson) {
    const auto* b = reinterpret_cast<const char*>(v.bytes.data());
    if (!nlohmann::json::accept(b, b + v.bytes.size())) return "is not one JSON value";
  }
  return {};
}

// "file:///d" -> "file:///d/parts/000003"; a query ("?conf=...") stays last.
std::string PartUri(std::string_view uri, uint32_t part) {
  const size_t q = uri.find('?');
  std::string base(uri.substr(0, q));
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  std::string out = base + "/" + PartPrefix(part);
  if (q != std::string_view::npos) out += uri.substr(q);
  return out;
}

}  // namespace

std::string PartPrefix(uint32_t part) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "parts/%06u", part);
  return buf;
}

struct DatasetWriter::Impl {
  struct Job {
    uint32_t number = 0;
    std::unique_ptr<format::ShardBuilder> builder;
  };
  struct Stored {
    uint64_t bytes = 0;
    uint32_t samples = 0;
    uint64_t index_hash = 0;
    uint64_t payload = 0;
    uint64_t max_sample = 0;
  };

  std::shared_ptr<Store> dst;
  WriterOptions options;
  format::Manifest m;  // identity and schema; totals at Close
  std::vector<FieldSpec> user_fields;  // what Write takes: m.fields less the block sums
  // The token field whose block sums the writer adds as m.fields' last
  // (docs/format.md §3.5), or -1; and one record's values with them.
  int sums_of = -1;
  std::vector<FieldValue> with_sums;
  std::vector<std::byte> sums;
  uint32_t threads = 1;
  uint64_t earlier = 0;  // what the note of an earlier writer here covered
  uint64_t noted = 0;    // what our note covers
  bool part = false;     // a part may be empty: a rank with no input

  // The writing thread's.
  std::unique_ptr<format::ShardBuilder> builder;
  uint32_t next_shard = 0;
  uint64_t records = 0, bytes = 0;
  uint64_t reported = 0;  // shards_stored at the last progress call
  std::optional<Result<format::Manifest>> closed;

  std::mutex mu;
  std::condition_variable work_cv;  // a job, or stop
  std::condition_variable done_cv;  // a job finished
  std::deque<Job> queue;            // guarded by mu
  size_t in_flight = 0;             // queued or being stored; guarded by mu
  std::vector<Stored> stored;       // by shard number; guarded by mu
  uint64_t shards_stored = 0;       // guarded by mu
  Status error;                     // the first store failure; guarded by mu
  std::vector<std::vector<std::byte>> spare;  // stored shards' buffers; guarded by mu
  bool stop = false;                // guarded by mu
  std::vector<std::thread> pool;

  void Worker() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mu);
        work_cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        job = std::move(queue.front());
        queue.pop_front();
      }
      Stored s;
      s.samples = job.builder->sample_count();
      s.payload = job.builder->payload_bytes();
      s.max_sample = job.builder->max_sample_bytes();
      std::vector<std::byte> shard = job.builder->Finish(&s.index_hash);
      job.builder.reset();
      s.bytes = shard.size();
      const std::string key = format::ShardKey(job.number);
      Status st = dst->Put(key, shard);
      std::lock_guard lock(mu);
      // At most `threads` shards are in flight: as many buffers go round.
      if (spare.size() <= threads) spare.push_back(std::move(shard));
      if (!st.ok() && error.ok()) {
        error = st.WithContext("storing shard " + std::to_string(job.number) + " (" + dst->uri() +
                               "/" + key + ")");
      }
      if (st.ok()) {
        if (stored.size() <= job.number) stored.resize(job.number + 1);
        stored[job.number] = s;
        ++shards_stored;
      }
      --in_flight;
      done_cv.notify_all();
    }
  }

  void StopWorkers() {
    {
      std::lock_guard lock(mu);
      stop = true;
      queue.clear();
    }
    work_cv.notify_all();
    for (auto& t : pool) t.join();
    pool.clear();
  }

  Status Failed() {
    std::lock_guard lock(mu);
    return error;
  }

  // Hands the current builder to the workers, waiting while `threads`
  // shards are already in flight (the memory bound).
  Status Submit() {
    Job job{next_shard - 1, std::move(builder)};
    std::unique_lock lock(mu);
    done_cv.wait(lock, [&] { return in_flight < threads || !error.ok(); });
    if (!error.ok()) return error;
    queue.push_back(std::move(job));
    ++in_flight;
    work_cv.notify_one();
    return Status::Ok();
  }

  // A new builder for the next shard, the note extended first if it does
  // not cover it yet.
  Status StartShard() {
    if (next_shard == UINT32_MAX) return InvalidArgument(dst->uri() + ": too many shards");
    if (next_shard >= noted) {
      noted = std::max<uint64_t>(noted * 2, kFirstNote);
      if (Status st = WritePending(*dst, std::max(noted, earlier)); !st.ok()) {
        std::lock_guard lock(mu);
        if (error.ok()) error = st.WithContext("writing the note " + dst->uri() + "/pack.pending");
        return error;
      }
    }
    std::vector<std::byte> buffer;
    {
      std::lock_guard lock(mu);
      if (!spare.empty()) {
        buffer = std::move(spare.back());
        spare.pop_back();
      }
    }
    // Room for a shard as cut (a record larger than a shard grows it).
    builder = std::make_unique<format::ShardBuilder>(m.fields, m.dataset_id, next_shard++,
                                                     std::move(buffer), options.shard_bytes);
    return Status::Ok();
  }

  void Report() {
    if (!options.progress) return;
    WriterProgress p;
    p.records = records;
    p.bytes = bytes;
    {
      std::lock_guard lock(mu);
      p.shards_stored = shards_stored;
    }
    if (p.shards_stored == reported && builder) return;
    reported = p.shards_stored;
    options.progress(p);
  }

  Result<format::Manifest> Commit() {
    if (builder && builder->sample_count() > 0) STOKER_RETURN_IF_ERROR(Submit());
    builder.reset();
    {
      std::unique_lock lock(mu);
      done_cv.wait(lock, [&] { return in_flight == 0; });
    }
    StopWorkers();
    STOKER_RETURN_IF_ERROR(Failed());
    if (records == 0 && !part) return InvalidArgument(dst->uri() + ": no records written");
    m.shards.reserve(stored.size());
    for (const Stored& s : stored) {
      m.shards.AppendNumbered(s.bytes, s.samples, s.index_hash);
      m.payload_bytes += s.payload;
      m.max_sample_bytes = std::max(m.max_sample_bytes, s.max_sample);
    }
    m.sample_count = m.shards.total_samples();
    m.format_version = format::FormatVersionFor(m.fields);
    // The shard table, then the commit: the manifest, which names the table
    // by its header's hash, so that a table left by a killed writer is never
    // taken for this one's (docs/format.md §5.1).
    const std::vector<std::byte> table = format::EncodeShardTable(m, &m.table);
    STOKER_RETURN_IF_ERROR(dst->Put(m.table.key, table));
    const std::string text = format::EncodeManifest(m);
    STOKER_RETURN_IF_ERROR(
        dst->Put(format::kManifestKey, std::as_bytes(std::span(text.data(), text.size()))));
    // Shards an earlier, killed writer stored past this one's last are not
    // part of this dataset; remove them (best effort: they are harmless,
    // only wasted space), then the note that named them.
    for (uint64_t s = stored.size(); s < earlier; ++s) {
      (void)dst->Remove(format::ShardKey(static_cast<uint32_t>(s)));
    }
    (void)dst->Remove(kPendingKey);
    Report();
    return m;
  }
};

namespace {

// The field of `fields` that gets block sums (docs/format.md §3.5): the one
// TokenDataset takes by default, "tokens" if token-shaped, else the only
// token-shaped field; -1 for none or with `block_bytes` 0.
Result<int> TokenFieldForSums(const std::vector<FieldSpec>& fields, uint32_t block_bytes,
                              const std::string& where) {
  for (const FieldSpec& f : fields) {
    if (!f.block_sums_of.empty() || f.block_bytes != 0) {
      return InvalidArgument(where + ": field '" + f.name +
                             "' is a block-sums field (block_sums_of '" + f.block_sums_of +
                             "'): the writer adds those itself (WriterOptions::token_block_bytes)");
    }
  }
  if (block_bytes == 0) return -1;
  int tokens = -1, shaped = -1, count = 0;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (!format::TokenShaped(fields[i])) continue;
    if (fields[i].name == "tokens") tokens = int(i);
    shaped = int(i);
    ++count;
  }
  const int f = tokens >= 0 ? tokens : count == 1 ? shaped : -1;
  if (f < 0) return -1;
  if (block_bytes < format::kMinTokenBlockBytes || block_bytes > format::kMaxTokenBlockBytes ||
      (block_bytes & (block_bytes - 1)) != 0) {
    return InvalidArgument("token_block_bytes " + std::to_string(block_bytes) +
                           " is not 0 or a power of two in " +
                           std::to_string(format::kMinTokenBlockBytes) + ".." +
                           std::to_string(format::kMaxTokenBlockBytes));
  }
  if (fields.size() >= format::kMaxFields) {
    return InvalidArgument(where + ": " + std::to_string(fields.size()) +
                           " fields leave no room for the block sums of '" + fields[f].name +
                           "' (at most " + std::to_string(format::kMaxFields) +
                           "); set token_block_bytes to 0");
  }
  const std::string name = format::BlockSumsFieldName(fields[f].name);
  for (const FieldSpec& g : fields) {
    if (g.name == name) {
      return InvalidArgument(where + ": field '" + name + "' is the name of the block sums of '" +
                             fields[f].name + "'; rename it or set token_block_bytes to 0");
    }
  }
  return f;
}

}  // namespace

DatasetWriter::DatasetWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DatasetWriter::~DatasetWriter() {
  if (impl_) impl_->StopWorkers();
}

Result<std::unique_ptr<DatasetWriter>> DatasetWriter::Create(std::shared_ptr<Store> dst,
                                                             std::vector<FieldSpec> fields,
                                                             const WriterOptions& options) {
  if (options.shard_bytes < format::kShardAlignment ||
      options.shard_bytes > format::kMaxShardBytes) {
    return InvalidArgument("shard size must be between 4 KiB and 4 GiB");
  }
  STOKER_RETURN_IF_ERROR(format::CheckSchema(fields));
  // Refuse to replace a dataset: its readers would see it change under them.
  {
    auto existing = dst->Stat(format::kManifestKey);
    if (existing.ok()) {
      return AlreadyExists(dst->uri() + " already holds a stoker dataset (" +
                           std::string(format::kManifestKey) +
                           "); remove it or write to another place");
    }
    if (existing.status().code() != Code::kNotFound) return existing.status();
  }
  auto impl = std::make_unique<Impl>();
  STOKER_ASSIGN_OR_RETURN(impl->sums_of,
                          TokenFieldForSums(fields, options.token_block_bytes, dst->uri()));
  STOKER_ASSIGN_OR_RETURN(impl->earlier, ReadPending(*dst));
  impl->dst = std::move(dst);
  impl->options = options;
  impl->m.dataset_id = format::NewDatasetId();
  impl->user_fields = fields;
  impl->m.fields = std::move(fields);
  if (impl->sums_of >= 0) {
    impl->m.fields.push_back(
        format::BlockSumsFieldFor(impl->m.fields[impl->sums_of], options.token_block_bytes));
  }
  impl->m.classes = options.classes;
  impl->m.created_by = options.created_by.empty()
                           ? std::string("stoker ") + STOKER_VERSION + " writer"
                           : options.created_by;
  uint32_t threads = options.threads;
  if (threads == 0) {
    threads = std::min(8u, std::max(2u, std::thread::hardware_concurrency()));
  }
  impl->threads = threads;
  Impl* p = impl.get();
  for (uint32_t t = 0; t < threads; ++t) impl->pool.emplace_back([p] { p->Worker(); });
  return std::unique_ptr<DatasetWriter>(new DatasetWriter(std::move(impl)));
}

Result<std::unique_ptr<DatasetWriter>> DatasetWriter::Create(std::string_view dst_uri,
                                                             std::vector<FieldSpec> fields,
                                                             const WriterOptions& options) {
  STOKER_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(dst_uri, options.store));
  return Create(std::move(store), std::move(fields), options);
}

Result<std::unique_ptr<DatasetWriter>> DatasetWriter::CreatePart(std::string_view dst_uri,
                                                                 uint32_t part,
                                                                 std::vector<FieldSpec> fields,
                                                                 const WriterOptions& options) {
  STOKER_ASSIGN_OR_RETURN(auto w, Create(PartUri(dst_uri, part), std::move(fields), options));
  w->impl_->part = true;
  return w;
}

Status DatasetWriter::Write(std::span<const FieldValue> values) {
  Impl& w = *impl_;
  if (w.closed) return InvalidArgument(w.dst->uri() + ": Write after Close");
  STOKER_RETURN_IF_ERROR(w.Failed());
  const auto& fields = w.user_fields;
  const std::string rec = "record " + std::to_string(w.records);
  if (values.size() != fields.size()) {
    std::string names;
    for (const FieldSpec& f : fields) names += (names.empty() ? "" : ", ") + f.name;
    return InvalidArgument(rec + ": " + std::to_string(values.size()) + " values, the schema has " +
                           std::to_string(fields.size()) + " fields (" + names + ")");
  }
  for (size_t f = 0; f < fields.size(); ++f) {
    if (std::string why = ValueProblem(fields[f], values[f], w.options.check_text); !why.empty()) {
      return InvalidArgument(rec + ": field " + fields[f].Describe() + " " + why);
    }
  }
  if (w.sums_of >= 0) {
    // §3.5: H of each block of the token bytes, u64 little-endian.
    const std::span<const std::byte> t = values[w.sums_of].bytes;
    const uint32_t block = w.m.fields.back().block_bytes;
    w.sums.resize(format::BlockSumsBytes(t.size(), block));
    format::FillBlockSums(t, block, w.sums);
    w.with_sums.assign(values.begin(), values.end());
    w.with_sums.push_back({std::span<const std::byte>(w.sums)});
    values = w.with_sums;
  }
  if (w.builder && w.builder->sample_count() > 0 &&
      w.builder->SizeWith(values) > w.options.shard_bytes) {
    STOKER_RETURN_IF_ERROR(w.Submit());
    w.Report();
  }
  if (!w.builder) STOKER_RETURN_IF_ERROR(w.StartShard());
  const uint64_t before = w.builder->payload_bytes();
  if (Status st = w.builder->Add(values); !st.ok()) return st.WithContext(rec);
  w.bytes += w.builder->payload_bytes() - before;
  ++w.records;
  return Status::Ok();
}

Result<format::Manifest> DatasetWriter::Close() {
  Impl& w = *impl_;
  if (!w.closed) {
    auto r = w.Commit();
    if (!r.ok()) {
      r = r.status().WithContext("writing " + w.dst->uri() + " failed, no dataset was created");
    }
    w.closed = std::move(r);
  }
  return *w.closed;
}

Result<format::Manifest> CommitParts(std::string_view dst_uri, uint32_t parts,
                                     const StoreOptions& store_options) {
  if (parts == 0) return InvalidArgument(std::string(dst_uri) + ": no parts to commit");
  STOKER_ASSIGN_OR_RETURN(std::shared_ptr<Store> dst, OpenStore(dst_uri, store_options));
  {
    auto existing = dst->Stat(format::kManifestKey);
    if (existing.ok()) {
      return AlreadyExists(dst->uri() + " already holds a stoker dataset (" +
                           std::string(format::kManifestKey) + "): its parts were committed");
    }
    if (existing.status().code() != Code::kNotFound) return existing.status();
  }
  format::Manifest m;
  std::vector<format::PartRef> refs;
  for (uint32_t p = 0; p < parts; ++p) {
    const std::string uri = PartUri(dst_uri, p);
    STOKER_ASSIGN_OR_RETURN(std::shared_ptr<Store> part, OpenStore(uri, store_options));
    auto pm = ReadManifest(*part);
    if (!pm.ok()) {
      if (pm.status().code() == Code::kNotFound) {
        return NotFound("part " + std::to_string(p) + " of " + std::to_string(parts) + " (" +
                        part->uri() + ") has no manifest: its writer did not finish");
      }
      return pm.status().WithContext("part " + std::to_string(p) + " of " + std::to_string(parts));
    }
    if (!pm->shards.parts().empty()) {
      return InvalidArgument(part->uri() + ": a part is itself made of parts");
    }
    if (p == 0) {
      m.fields = pm->fields;
      m.classes = pm->classes;
    } else if (pm->fields != m.fields) {
      std::string a, b;
      for (const auto& f : m.fields) a += (a.empty() ? "" : ", ") + f.Describe();
      for (const auto& f : pm->fields) b += (b.empty() ? "" : ", ") + f.Describe();
      return InvalidArgument("part " + std::to_string(p) + " (" + part->uri() +
                             ") has another schema than part 0: " + b + " against " + a);
    } else if (pm->classes != m.classes) {
      return InvalidArgument("part " + std::to_string(p) + " (" + part->uri() +
                             ") has other class names than part 0");
    }
    for (uint32_t s = 0; s < pm->shards.size(); ++s) {
      m.shards.AppendNumbered(pm->shards.bytes(s), pm->shards.samples(s),
                              pm->shards.index_hash(s));
    }
    if (m.shards.size() > UINT32_MAX) return InvalidArgument(dst->uri() + ": too many shards");
    m.payload_bytes += pm->payload_bytes;
    m.max_sample_bytes = std::max(m.max_sample_bytes, pm->max_sample_bytes);
    // An empty part (a rank with no input) adds nothing and is not listed.
    if (pm->shards.size() == 0) continue;
    refs.push_back({PartPrefix(p), pm->dataset_id, static_cast<uint32_t>(pm->shards.size())});
  }
  m.shards.SetParts(std::move(refs));
  m.sample_count = m.shards.total_samples();
  if (m.sample_count == 0) {
    return InvalidArgument(dst->uri() + ": none of its " + std::to_string(parts) +
                           " parts holds a record");
  }
  m.dataset_id = format::NewDatasetId();
  m.created_by = std::string("stoker ") + STOKER_VERSION + " writer, " + std::to_string(parts) +
                 " parts";
  m.format_version = 3;
  const std::vector<std::byte> table = format::EncodeShardTable(m, &m.table);
  STOKER_RETURN_IF_ERROR(dst->Put(m.table.key, table));
  const std::string text = format::EncodeManifest(m);
  STOKER_RETURN_IF_ERROR(
      dst->Put(format::kManifestKey, std::as_bytes(std::span(text.data(), text.size()))));
  return m;
}

uint64_t DatasetWriter::records() const { return impl_->records; }
const std::vector<FieldSpec>& DatasetWriter::fields() const { return impl_->user_fields; }
const std::string& DatasetWriter::uri() const { return impl_->dst->uri(); }

}  // namespace stoker
