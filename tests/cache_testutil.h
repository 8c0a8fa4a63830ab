// Helpers of the node cache's test suites: small datasets, a store that
// counts (and can hold up) reads, children that report back, counters.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "stoker/cache.h"
#include "stoker/loader.h"
#include "stoker/pack.h"
#include "testutil.h"

namespace stoker::cache_testing {

namespace fs = std::filesystem;
using testing::RandomBytes;
using testing::TempDir;

// A dataset of `files` random files packed into small shards, so that a test
// has dozens of shards and still runs in a moment.
struct Dataset {
  std::string uri;
  format::Manifest manifest;
  uint64_t bytes = 0;  // all shards

  // Samples of 2,000-8,000 bytes, or all of `sample_bytes` when given.
  Dataset(const fs::path& where, uint32_t files, uint64_t seed, uint64_t shard_bytes = 64 << 10,
          uint64_t sample_bytes = 0) {
    const fs::path src = where / "src";
    for (uint32_t i = 0; i < files; ++i) {
      char name[64];
      std::snprintf(name, sizeof name, "c%u/f%05u.bin", i % 3, i);
      const uint64_t n = sample_bytes ? sample_bytes : 2000 + (i * 7919) % 6000;
      testing::WriteFile(src / name, RandomBytes(n, seed * 100000 + i));
    }
    uri = (where / "ds").string();
    PackOptions po;
    po.shard_bytes = shard_bytes;
    po.threads = 2;
    auto m = Pack(src.string(), uri, po);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    manifest = *m;
    for (const auto& s : manifest.shards) bytes += s.bytes;
  }
};

// Counts the bytes read through it; optionally blocks reads of one key until
// released (a fetcher stuck in the middle of its fetch).
class CountingStore final : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  Result<size_t> Read(std::string_view k, uint64_t off, std::span<std::byte> dst) override {
    if (!block_key.empty() && k == block_key) {
      if (on_block) on_block();
      while (block_key == k) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    auto n = StoreWrapper::Read(k, off, dst);
    if (n.ok()) bytes += *n;
    return n;
  }
  std::atomic<uint64_t> bytes{0};
  std::string block_key;
  std::function<void()> on_block;
};

inline Result<std::shared_ptr<NodeCache>> Open(const Dataset& d, const std::string& dir,
                                               CacheOptions o = {}) {
  STOKER_ASSIGN_OR_RETURN(auto remote, OpenStore(d.uri));
  o.dir = dir;
  return OpenNodeCache(remote, d.manifest, o);
}

// Reads shard s whole through `store` and compares it with the dataset's.
inline std::string ReadAndCheck(Store& store, const Dataset& d, uint32_t s) {
  const auto& info = d.manifest.shards[s];
  std::vector<std::byte> got(info.bytes);
  auto n = store.Read(info.key, 0, got);
  if (!n.ok()) return n.status().ToString();
  if (*n != info.bytes) return info.key + ": short read";
  std::vector<std::byte> want;
  std::ifstream f(d.uri + "/" + info.key, std::ios::binary);
  want.resize(info.bytes);
  f.read(reinterpret_cast<char*>(want.data()), std::streamsize(want.size()));
  if (got != want) return info.key + ": bytes differ from the store's";
  return "";
}

// Runs `body` in `n` child processes at once (each gets its index), and
// returns what each reported ("" = fine).
inline std::vector<std::string> InChildren(int n, const std::function<std::string(int)>& body) {
  std::vector<std::pair<pid_t, int>> kids;
  for (int i = 0; i < n; ++i) {
    int p[2];
    EXPECT_EQ(pipe(p), 0);
    const pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      const std::string r = body(i);
      (void)!write(p[1], r.data(), r.size());
      close(p[1]);
      _exit(0);
    }
    close(p[1]);
    kids.emplace_back(pid, p[0]);
  }
  std::vector<std::string> out;
  for (auto [pid, fd] : kids) {
    std::string r;
    char buf[4096];
    ssize_t k;
    while ((k = read(fd, buf, sizeof buf)) > 0) r.append(buf, size_t(k));
    close(fd);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status)) r = "child died (status " + std::to_string(status) + ")";
    out.push_back(r);
  }
  return out;
}

// "remote=R misses=M hits=H waits=W" -> values.
inline std::map<std::string, uint64_t> ParseCounts(const std::string& s) {
  std::map<std::string, uint64_t> m;
  std::istringstream in(s);
  std::string kv;
  while (in >> kv) {
    const auto eq = kv.find('=');
    if (eq != std::string::npos) m[kv.substr(0, eq)] = std::stoull(kv.substr(eq + 1));
  }
  return m;
}

inline std::string Counts(const CacheStats& c) {
  return "remote=" + std::to_string(c.remote_bytes) + " misses=" + std::to_string(c.misses) +
         " hits=" + std::to_string(c.hits) + " waits=" + std::to_string(c.fetch_waits) +
         " refetches=" + std::to_string(c.refetches) +
         " prefetches=" + std::to_string(c.prefetches) + " used=" + std::to_string(c.used_bytes);
}

inline uint64_t FolderBytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    if (name.ends_with(".stks") || name.starts_with(".tmp-")) {
      std::error_code e2;
      const auto size = fs::file_size(it->path(), e2);
      if (!e2) total += size;
    }
  }
  return total;
}

// The bytes of the cache files under `dir` (a cache folder), measured under
// the folder lock, so that no eviction or bookkeeping runs meanwhile, and
// counting a shard whose temporary file is renamed during the listing once
// (a listing is no snapshot: a file renamed or replaced while it runs can
// be seen under both names).
inline uint64_t LockedFolderBytes(const fs::path& dir) {
  const int fd = open((dir / "stoker-cache.table").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) flock(fd, LOCK_EX);
  std::map<std::string, uint64_t> per_shard;  // "<folder>/<shard>" -> bytes
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    unsigned shard;
    int pid;
    if (std::sscanf(name.c_str(), "%u.stks", &shard) != 1 &&
        std::sscanf(name.c_str(), ".tmp-%u-%d", &shard, &pid) != 2) {
      continue;
    }
    std::error_code e2;
    const auto size = fs::file_size(it->path(), e2);
    if (e2) continue;
    uint64_t& b = per_shard[it->path().parent_path().string() + "/" + std::to_string(shard)];
    b = std::max<uint64_t>(b, size);
  }
  if (fd >= 0) close(fd);  // drops the lock
  uint64_t total = 0;
  for (const auto& [k, b] : per_shard) total += b;
  return total;
}

// Drains the loader's current epoch: "ID ID ... " of the samples it
// delivered (padding left out), or "ERR <status>".
inline std::string DrainEpoch(Loader& l) {
  std::string ids;
  while (true) {
    auto b = l.Next();
    if (!b.ok()) {
      if (b.status().code() == Code::kOutOfRange) return ids;
      return "ERR " + b.status().ToString();
    }
    for (size_t i = 0; i < b->size(); ++i) {
      if (!b->padding()[i]) ids += std::to_string(b->sample_ids()[i]) + " ";
    }
  }
}

// The children's reports: a number is a sample id (counted in *seen), KEY=N
// a counter (summed over the children in *counts). A report with ERR fails
// the test.
inline void Tally(const std::vector<std::string>& results, std::map<uint64_t, int>* seen,
                  std::map<std::string, uint64_t>* counts) {
  for (const auto& r : results) {
    if (r.find("ERR") != std::string::npos) {
      ADD_FAILURE() << r;
      continue;
    }
    std::istringstream in(r);
    std::string tok;
    while (in >> tok) {
      const auto eq = tok.find('=');
      if (eq == std::string::npos) {
        (*seen)[std::stoull(tok)]++;
      } else {
        (*counts)[tok.substr(0, eq)] += std::stoull(tok.substr(eq + 1));
      }
    }
  }
}

}  // namespace stoker::cache_testing
