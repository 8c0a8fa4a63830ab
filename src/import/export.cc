// ExportWebDataset: a dataset back to WebDataset tars, a shard read ahead of
// the tar being written.
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <system_error>

#include "stoker/dataset.h"
#include "stoker/import.h"
#include "wds/tar.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using format::FieldSpec;
using format::FieldType;

std::string TarName(uint64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%06llu.tar", static_cast<unsigned long long>(n));
  return buf;
}

std::string SampleKey(uint64_t id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%09llu", static_cast<unsigned long long>(id));
  return buf;
}

// A scalar as decimal text: the shortest that reads back as the same value.
template <typename T>
std::string Decimal(T v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// A stored float (its little-endian bytes) as decimal text.
template <typename T>
std::string FloatText(std::span<const std::byte> data) {
  T x = 0;
  if (data.size() == sizeof x) std::memcpy(&x, data.data(), sizeof x);
  return Decimal(x);
}

struct Shard {
  std::vector<std::byte> bytes;
  format::ShardView view;
};

Result<Shard> LoadShard(Store& store, const format::Manifest& m, uint32_t s) {
  Shard out;
  const format::ShardExpectation e = format::ExpectationFor(m, s);
  STOKER_ASSIGN_OR_RETURN(out.bytes, store.ReadAll(e.key));
  STOKER_ASSIGN_OR_RETURN(out.view, format::ShardView::Parse(out.bytes, e));
  return out;
}

}  // namespace

Result<ExportResult> ExportWebDataset(std::string_view src_uri, const std::string& out_dir,
                                      const ExportOptions& options) {
  if (options.samples_per_tar == 0) return InvalidArgument("samples per tar must be at least 1");
  STOKER_ASSIGN_OR_RETURN(auto store, OpenStore(src_uri, options.store));
  STOKER_ASSIGN_OR_RETURN(format::Manifest m, ReadManifest(*store));
  std::error_code ec;
  if (fs::exists(out_dir, ec)) {
    if (!fs::is_directory(out_dir, ec)) return AlreadyExists(out_dir + ": exists and is no folder");
    if (!fs::is_empty(out_dir, ec)) {
      return AlreadyExists(out_dir + ": holds files already; export into a new or empty folder");
    }
  } else if (!fs::create_directories(out_dir, ec)) {
    return ErrnoToStatus(ec.value(), "create " + out_dir);
  }

  const int key_field = m.FieldIndex(kKeyField);
  if (key_field >= 0 && m.fields[key_field].type != FieldType::kString) {
    return InvalidArgument(std::string(src_uri) + ": field __key__ is not str");
  }
  std::vector<std::string> exts(m.fields.size());
  for (size_t j = 0; j < m.fields.size(); ++j) {
    exts[j] = "." + (m.fields[j].ext.empty() ? m.fields[j].name : m.fields[j].ext);
  }

  ExportResult result;
  ExportProgress progress;
  progress.samples_total = m.sample_count;
  progress.bytes_total = m.payload_bytes;
  auto report = [&] {
    if (!options.progress) return;
    progress.samples = result.samples;
    progress.bytes = result.bytes;
    progress.tars = result.tars;
    options.progress(progress);
  };
  std::unique_ptr<wds::TarWriter> tar;
  uint64_t in_tar = 0;
  std::string name, text;
  // The next shard is read while this one is written.
  std::future<Result<Shard>> next;
  if (!m.shards.empty()) {
    next = std::async(std::launch::async, [&] { return LoadShard(*store, m, 0); });
  }
  for (uint32_t s = 0; s < m.shards.size(); ++s) {
    Result<Shard> shard = next.get();
    if (s + 1 < m.shards.size()) {
      next = std::async(std::launch::async, [&, s] { return LoadShard(*store, m, s + 1); });
    }
    if (!shard.ok()) return shard.status();
    const format::ShardView& v = shard->view;
    for (uint32_t i = 0; i < v.sample_count(); ++i) {
      const uint64_t id = m.shards[s].first_sample + i;
      STOKER_RETURN_IF_ERROR(v.VerifySample(i));
      if (tar == nullptr) {
        const std::string path = (fs::path(out_dir) / TarName(result.tars)).string();
        STOKER_ASSIGN_OR_RETURN(tar, wds::TarWriter::Create(path));
      }
      std::string key;
      if (key_field >= 0) {
        auto k = v.Field(i, static_cast<uint32_t>(key_field));
        key.assign(reinterpret_cast<const char*>(k.data()), k.size());
        if (key.empty() || key.back() == '/' || key.find('\0') != std::string::npos) {
          return InvalidArgument(std::string(src_uri) + ": sample " + std::to_string(id) +
                                 ": key '" + key + "' cannot name a tar member");
        }
      } else {
        key = SampleKey(id);
      }
      for (size_t j = 0; j < m.fields.size(); ++j) {
        if (static_cast<int>(j) == key_field) continue;
        const FieldSpec& f = m.fields[j];
        // A token field's block sums (docs/format.md §3.5) are the format's,
        // not a member: an import of the export writes them again.
        if (!f.block_sums_of.empty()) continue;
        auto data = v.Field(i, static_cast<uint32_t>(j));
        switch (f.type) {
          case FieldType::kInt64:
            text = Decimal(v.Int64(i, static_cast<uint32_t>(j)));
            data = std::as_bytes(std::span(text));
            break;
          case FieldType::kFloat32:
            text = FloatText<float>(data);
            data = std::as_bytes(std::span(text));
            break;
          case FieldType::kFloat64:
            text = FloatText<double>(data);
            data = std::as_bytes(std::span(text));
            break;
          default:
            break;
        }
        name = key;
        name += exts[j];
        STOKER_RETURN_IF_ERROR(tar->Add(name, data));
        result.bytes += data.size();
      }
      ++result.samples;
      if (++in_tar == options.samples_per_tar) {
        STOKER_RETURN_IF_ERROR(tar->Close());
        result.paths.push_back(tar->path());
        tar.reset();
        in_tar = 0;
        ++result.tars;
      }
    }
    report();
    if (options.cancelled && options.cancelled()) {
      return Cancelled(std::string(src_uri) + ": export cancelled after " +
                       std::to_string(result.samples) + " of " + std::to_string(m.sample_count) +
                       " samples (" + std::to_string(result.tars) + " tars finished in " +
                       out_dir + ")");
    }
  }
  if (tar != nullptr) {
    STOKER_RETURN_IF_ERROR(tar->Close());
    result.paths.push_back(tar->path());
    ++result.tars;
  }
  report();
  return result;
}

}  // namespace stoker
