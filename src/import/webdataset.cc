// ImportWebDataset: tars read ahead by a few threads, one reader per tar,
// handed to one DatasetWriter in tar order, then sample order.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "import/values.h"
#include "stoker/import.h"
#include "wds/tar.h"

namespace stoker {
namespace {

using format::FieldSpec;
using format::FieldType;
using format::FieldValue;

// Samples of one tar, from its reader thread to the writing thread.
struct TarQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<wds::Sample> samples;
  uint64_t bytes = 0;  // of the samples queued
  bool done = false;   // the reader finished (status says how)
  Status status;
  uint64_t skipped = 0;
  std::string last_skip_reason;
};

uint64_t SampleBytes(const wds::Sample& s) {
  uint64_t b = 0;
  for (const auto& m : s.members) b += m.data.size();
  return b;
}

// Reads tars ahead of the consumer: thread w reads tars w, w + K, w + 2K,
// ... one after another, each into its own bounded queue, so at most K tars
// are open and each holds at most `cap` bytes waiting. The consumer takes
// tar 0's samples, then tar 1's, ...: the order is the tars' and the
// samples', whatever the threads' timing.
class ReadAhead {
 public:
  ReadAhead(const std::vector<std::string>& tars, uint32_t threads, uint64_t cap,
            wds::TarReadOptions options)
      : tars_(tars), cap_(cap), options_(options) {
    queues_.reserve(tars.size());
    for (size_t i = 0; i < tars.size(); ++i) queues_.push_back(std::make_unique<TarQueue>());
    const size_t k = std::max<size_t>(1, std::min<size_t>(threads, tars.size()));
    for (size_t w = 0; w < k; ++w) {
      threads_.emplace_back([this, w, k] {
        for (size_t t = w; t < tars_.size() && !stop_; t += k) ReadTar(t);
      });
    }
  }
  ~ReadAhead() {
    stop_ = true;
    for (auto& q : queues_) {
      std::lock_guard<std::mutex> lock(q->mu);
      q->cv.notify_all();
    }
    for (auto& t : threads_) t.join();
  }

  // The next sample into *out and its tar's index: true, or false after the
  // last tar. A tar's error is returned when its good samples are taken.
  Result<bool> Next(wds::Sample* out, size_t* tar) {
    while (current_ < queues_.size()) {
      TarQueue& q = *queues_[current_];
      std::unique_lock<std::mutex> lock(q.mu);
      q.cv.wait(lock, [&] { return !q.samples.empty() || q.done; });
      if (!q.samples.empty()) {
        *out = std::move(q.samples.front());
        q.samples.pop_front();
        q.bytes -= SampleBytes(*out);
        q.cv.notify_all();
        *tar = current_;
        return true;
      }
      if (!q.status.ok()) return q.status;
      skipped_ += q.skipped;
      if (!q.last_skip_reason.empty()) last_skip_reason_ = q.last_skip_reason;
      ++current_;
    }
    return false;
  }

  uint64_t skipped() const { return skipped_; }
  const std::string& last_skip_reason() const { return last_skip_reason_; }

 private:
  void ReadTar(size_t t) {
    TarQueue& q = *queues_[t];
    auto finish = [&](Status st, const wds::TarSampleReader* r) {
      std::lock_guard<std::mutex> lock(q.mu);
      q.status = std::move(st);
      if (r != nullptr) {
        q.skipped = r->skipped();
        q.last_skip_reason = r->last_skip_reason();
      }
      q.done = true;
      q.cv.notify_all();
    };
    auto reader = wds::TarSampleReader::Open(tars_[t], options_);
    if (!reader.ok()) return finish(reader.status(), nullptr);
    while (!stop_) {
      wds::Sample s;
      auto more = (*reader)->Next(&s);
      if (!more.ok()) return finish(more.status(), reader->get());
      if (!*more) break;
      const uint64_t b = SampleBytes(s);
      std::unique_lock<std::mutex> lock(q.mu);
      q.cv.wait(lock, [&] { return stop_ || q.samples.empty() || q.bytes + b <= cap_; });
      if (stop_) break;
      q.bytes += b;
      q.samples.push_back(std::move(s));
      q.cv.notify_all();
    }
    finish(Status::Ok(), reader->get());
  }

  const std::vector<std::string>& tars_;
  const uint64_t cap_;
  const wds::TarReadOptions options_;
  std::vector<std::unique_ptr<TarQueue>> queues_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  size_t current_ = 0;  // consumer only
  uint64_t skipped_ = 0;
  std::string last_skip_reason_;
};

std::string Quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

// The schema of a WebDataset source from its first sample (see import.h).
Result<std::vector<FieldSpec>> SchemaFrom(const wds::Sample& first,
                                          const std::vector<FieldSpec>& overrides) {
  std::vector<FieldSpec> fields;
  FieldSpec key;
  key.name = std::string(kKeyField);
  key.type = FieldType::kString;
  fields.push_back(key);
  for (const wds::Member& m : first.members) {
    FieldSpec f;
    f.name = import::FieldNameForExt(m.ext);
    if (m.ext == "txt" || m.ext == "text") {
      f.type = FieldType::kString;
    } else if (m.ext == "json") {
      f.type = FieldType::kJson;
    }
    if (f.name != m.ext) f.ext = m.ext;
    for (const FieldSpec& g : fields) {
      if (g.name == f.name) {
        return InvalidArgument(first.tar + ": sample " + Quoted(first.key) + ": members ." +
                               m.ext + " and ." + (g.ext.empty() ? g.name : g.ext) +
                               " would both be field " + Quoted(f.name));
      }
    }
    fields.push_back(std::move(f));
  }
  for (const FieldSpec& o : overrides) {
    bool found = false;
    for (FieldSpec& f : fields) {
      if (f.name != o.name) continue;
      if (f.name == kKeyField && o.type != FieldType::kString) {
        return InvalidArgument("--field " + o.name + ": the key field is str");
      }
      std::string ext = f.ext;
      f = o;
      f.ext = ext;
      found = true;
    }
    if (!found) {
      std::string names;
      for (const FieldSpec& f : fields) names += (names.empty() ? "" : ", ") + f.name;
      return InvalidArgument("--field " + o.name + ": no such field in the first sample (" +
                             first.tar + ", " + Quoted(first.key) + ", has " + names + ")");
    }
  }
  STOKER_RETURN_IF_ERROR(format::CheckSchema(fields));
  return fields;
}

// Member `m` as field `f`'s value; scalars are parsed from their text.
Status ToValue(const FieldSpec& f, const wds::Sample& s, const wds::Member& m, FieldValue* v) {
  v->bytes = m.data;
  const std::string_view text(reinterpret_cast<const char*>(m.data.data()), m.data.size());
  switch (f.type) {
    case FieldType::kInt64:
      if (!import::ParseInt64Text(text, &v->i64)) {
        return InvalidArgument(s.tar + ": member " + Quoted(s.key + "." + m.ext) +
                               ": not an integer, as field " + f.Describe() + " needs");
      }
      break;
    case FieldType::kFloat32:
    case FieldType::kFloat64:
      if (!import::ParseDoubleText(text, &v->f64)) {
        return InvalidArgument(s.tar + ": member " + Quoted(s.key + "." + m.ext) +
                               ": not a number, as field " + f.Describe() + " needs");
      }
      break;
    default:
      break;
  }
  return Status::Ok();
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

}  // namespace

Result<ImportResult> ImportWebDataset(std::span<const std::string> paths,
                                      std::string_view dst_uri, const ImportOptions& options) {
  ImportResult result;
  STOKER_ASSIGN_OR_RETURN(result.sources, ListTars(paths));
  std::vector<uint64_t> sizes;
  for (const std::string& t : result.sources) {
    sizes.push_back(FileSize(t));
    result.source_bytes += sizes.back();
  }
  wds::TarReadOptions ro;
  ro.skip_bad = options.skip_bad;
  ReadAhead reader(result.sources, options.read_threads ? options.read_threads : 3,
                   std::max<uint64_t>(options.read_ahead_bytes, 1), ro);

  wds::Sample sample;
  size_t tar = 0;
  STOKER_ASSIGN_OR_RETURN(bool any, reader.Next(&sample, &tar));
  if (!any) {
    return InvalidArgument("no samples in " + result.sources.front() +
                           (result.sources.size() > 1 ? " and the other tars" : ""));
  }
  STOKER_ASSIGN_OR_RETURN(std::vector<FieldSpec> fields, SchemaFrom(sample, options.fields));
  const std::string schema_from = sample.tar + ", sample " + Quoted(sample.key);
  std::string schema_names;
  std::unordered_map<std::string, size_t> by_ext;
  for (size_t j = 1; j < fields.size(); ++j) {
    const std::string& ext = fields[j].ext.empty() ? fields[j].name : fields[j].ext;
    by_ext.emplace(ext, j);
    schema_names += (schema_names.empty() ? "" : ", ") + ext;
  }

  WriterOptions wo = options.writer;
  if (wo.created_by.empty()) wo.created_by = import::CreatedBy("webdataset");
  ImportProgress progress;
  progress.bytes_total = result.source_bytes;
  uint64_t stored = 0;
  auto user_progress = wo.progress;
  wo.progress = [&](const WriterProgress& p) {
    stored = p.shards_stored;
    if (user_progress) user_progress(p);
  };
  STOKER_ASSIGN_OR_RETURN(auto writer, DatasetWriter::Create(dst_uri, fields, wo));

  std::vector<FieldValue> values(fields.size());
  std::vector<bool> have(fields.size());
  uint64_t done_tars_bytes = 0, tar_bytes = 0, next_report = 0;
  size_t last_tar = 0;
  constexpr uint64_t kReportEvery = 16ull << 20;
  for (bool more = true; more;) {
    if (tar != last_tar) {
      for (size_t t = last_tar; t < tar; ++t) done_tars_bytes += sizes[t];
      tar_bytes = 0;
      last_tar = tar;
    }
    std::fill(have.begin(), have.end(), false);
    values[0] = FieldValue{};
    values[0].bytes = std::as_bytes(std::span(sample.key));
    have[0] = true;
    for (const wds::Member& m : sample.members) {
      auto it = by_ext.find(m.ext);
      if (it == by_ext.end()) {
        return InvalidArgument(sample.tar + ": sample " + Quoted(sample.key) + ": member " +
                               Quoted(sample.key + "." + m.ext) + " is field ." + m.ext +
                               ", which the schema lacks (" + schema_names + ", from " +
                               schema_from + ")");
      }
      values[it->second] = FieldValue{};
      STOKER_RETURN_IF_ERROR(ToValue(fields[it->second], sample, m, &values[it->second]));
      have[it->second] = true;
      tar_bytes += m.data.size() + 512;  // a ustar header per member
    }
    std::string missing;
    for (size_t j = 1; j < fields.size(); ++j) {
      if (!have[j]) {
        missing = fields[j].ext.empty() ? fields[j].name : fields[j].ext;
        break;
      }
    }
    if (!missing.empty()) {
      std::string why = sample.tar + ": sample " + Quoted(sample.key) + " has no member " +
                        Quoted(sample.key + "." + missing) + " (field ." + missing +
                        " of the schema, from " + schema_from + ")";
      if (!options.skip_bad) return InvalidArgument(why);
      ++result.skipped;
      result.last_skip_reason = std::move(why);
    } else {
      Status st = writer->Write(values);
      if (!st.ok()) {
        return st.WithContext(sample.tar + ": sample " + Quoted(sample.key));
      }
    }
    progress.bytes_read = std::min(done_tars_bytes + tar_bytes, result.source_bytes);
    if (progress.bytes_read >= next_report) {
      next_report = progress.bytes_read + kReportEvery;
      progress.samples = writer->records();
      progress.shards_stored = stored;
      progress.skipped = result.skipped + reader.skipped();
      if (options.progress) options.progress(progress);
      STOKER_RETURN_IF_ERROR(import::CheckCancelled(options.cancelled, "import", progress));
    }
    STOKER_ASSIGN_OR_RETURN(more, reader.Next(&sample, &tar));
  }
  result.skipped += reader.skipped();
  if (!reader.last_skip_reason().empty() && result.last_skip_reason.empty()) {
    result.last_skip_reason = reader.last_skip_reason();
  }
  STOKER_RETURN_IF_ERROR(import::Finish(*writer, options.progress, &progress, &result));
  return result;
}

}  // namespace stoker
