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
#include <future>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/file_util.h"
#include "stoker/plan.h"
#include "stoker/writer.h"

namespace stoker {
namespace fs = std::filesystem;
namespace {

bool Hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
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
  if (sources.files.empty()) return InvalidArgument("nothing to pack");

  // Sizes first: a missing, special or empty file fails the pack before any
  // shard is stored.
  const size_t n = sources.files.size();
  uint64_t bytes_total = 0;
  for (size_t i = 0; i < n; ++i) {
    struct stat st;
    const std::string& path = sources.files[i].path;
    if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat " + path);
    if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file");
    if (st.st_size == 0)
      return InvalidArgument(path + ": empty source file (a sample needs bytes)");
    bytes_total += static_cast<uint64_t>(st.st_size);
  }

  uint32_t threads = options.threads;
  if (threads == 0) threads = std::max(2u, 2 * std::thread::hardware_concurrency());
  PackProgress progress;
  progress.files_total = n;
  progress.bytes_total = bytes_total;
  WriterOptions wo;
  wo.shard_bytes = options.shard_bytes;
  wo.threads = std::min(threads, 8u);
  wo.classes = sources.classes;
  wo.created_by = std::string("stoker ") + STOKER_VERSION + " pack";
  wo.store = options.store;
  if (options.progress) {
    wo.progress = [&](const WriterProgress& p) {
      progress.files_done = p.records;
      progress.bytes_done = p.bytes;
      progress.shards_written = p.shards_stored;
      options.progress(progress);
    };
  }
  // The writer stores into `dst`, which the caller owns and keeps alive.
  std::shared_ptr<Store> borrowed(&dst, [](Store*) {});
  STOKER_ASSIGN_OR_RETURN(
      auto writer,
      DatasetWriter::Create(borrowed,
                            {{"image", format::FieldType::kBytes}, {"label", format::FieldType::kInt64}},
                            wo));

  // Files are read `threads` at a time, a window ahead of the writer, which
  // takes them in the packed order: the same sources always give the same
  // shards.
  const size_t window = std::max<size_t>(64, 4 * size_t{threads});
  auto read_window = [&](size_t begin, std::vector<std::vector<std::byte>>* out) -> Status {
    const size_t end = std::min(n, begin + window);
    out->resize(end - begin);
    std::atomic<size_t> next{begin};
    std::mutex mu;
    Status first;
    auto reader = [&] {
      for (size_t i; (i = next.fetch_add(1)) < end;) {
        Status st = ReadSource(sources.files[i].path, &(*out)[i - begin]);
        if (!st.ok()) {
          std::lock_guard lock(mu);
          if (first.ok()) first = st;
          return;
        }
      }
    };
    std::vector<std::thread> pool;
    const size_t workers = std::min<size_t>(threads, end - begin);
    for (size_t t = 1; t < workers; ++t) pool.emplace_back(reader);
    reader();
    for (auto& t : pool) t.join();
    return first;
  };
  auto fail = [&](const Status& st) {
    return st.WithContext("pack into " + dst.uri() + " failed, no dataset was created");
  };
  std::vector<std::vector<std::byte>> current, ahead;
  if (Status st = read_window(0, &current); !st.ok()) return fail(st);
  for (size_t begin = 0; begin < n; begin += window) {
    std::future<Status> next_read;
    if (begin + window < n) {
      next_read = std::async(std::launch::async, read_window, begin + window, &ahead);
    }
    Status st;
    for (size_t k = 0; k < current.size() && st.ok(); ++k) {
      format::FieldValue values[2];
      values[0].bytes = current[k];
      values[1].i64 = sources.files[begin + k].label;
      st = writer->Write(values);
      if (!st.ok()) st = st.WithContext(sources.files[begin + k].path);
    }
    if (next_read.valid()) {
      Status read = next_read.get();
      if (st.ok()) st = read;
    }
    if (!st.ok()) return fail(st);
    std::swap(current, ahead);
  }
  auto m = writer->Close();
  if (!m.ok()) return m.status();
  return m;
}

Result<format::Manifest> Pack(const std::string& src, std::string_view dst_uri,
                              const PackOptions& options) {
  STOKER_ASSIGN_OR_RETURN(PackSources sources, ScanSources(src));
  STOKER_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(dst_uri, options.store));
  return Pack(sources, *store, options);
}

}  // namespace stoker
