#include "cache/space.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <tuple>

namespace stoker::cache_internal {
namespace {

// Another dataset's table in the same folder, mapped while this process
// runs (its size from its header).
struct OtherTable {
  MappedFile file;
  uint64_t shards = 0;
  Entry& At(uint32_t s) const {
    return reinterpret_cast<Entry*>(static_cast<std::byte*>(file.data()) +
                                    sizeof(DatasetHeader))[s];
  }
};

// Folder -> its mapped table; the folders of one cache folder, seen by this
// process (a dataset that appears later is mapped when first seen).
std::mutex g_others_mu;
std::map<std::string, std::unique_ptr<OtherTable>>& Others() {
  static auto* m = new std::map<std::string, std::unique_ptr<OtherTable>>;
  return *m;
}

OtherTable* MapOther(const std::string& ds_dir) {
  auto& m = Others();
  auto it = m.find(ds_dir);
  if (it != m.end()) return it->second.get();
  const std::string path = ds_dir + "/table";
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  DatasetHeader h{};
  const bool read = pread(fd, &h, sizeof h, 0) == ssize_t(sizeof h);
  close(fd);
  if (!read || h.magic != kDatasetMagic || h.shards == 0 || h.shards > (1ull << 32)) {
    return nullptr;  // not (yet) a table: looked at again next time
  }
  auto t = std::make_unique<OtherTable>();
  t->shards = h.shards;
  if (!t->file.Open(path, DatasetTableBytes(h.shards)).ok()) return nullptr;
  return (m[ds_dir] = std::move(t)).get();
}

}  // namespace

Space::Space(FolderTables* tables, const ShardFiles* files, std::string pin_lock,
             std::vector<uint64_t> shard_bytes, uint64_t capacity, std::atomic<uint64_t>* evictions)
    : tables_(tables),
      files_(files),
      pin_lock_(std::move(pin_lock)),
      shard_bytes_(std::move(shard_bytes)),
      capacity_(capacity),
      evictions_(evictions) {}

bool Space::Reserve(uint32_t s, std::vector<Candidate> own, bool others) {
  const uint64_t bytes = shard_bytes_[s];
  if (bytes > capacity_) return false;
  FolderHeader& h = tables_->header();
  if (h.used + bytes > capacity_) {
    std::sort(own.begin(), own.end(), [](const Candidate& a, const Candidate& b) {
      return std::tie(a.far, a.rank) > std::tie(b.far, b.rank);
    });
    size_t i = 0;
    for (; i < own.size() && own[i].far && h.used + bytes > capacity_; ++i) EvictOwn(own[i].shard);
    if (others && h.used + bytes > capacity_) EvictOthers(h.used + bytes - capacity_);
    for (; i < own.size() && h.used + bytes > capacity_; ++i) EvictOwn(own[i].shard);
    if (h.used + bytes > capacity_) return false;
  }
  Entry& e = tables_->At(s);
  e.bytes = bytes;
  e.pid = uint32_t(getpid());
  e.last_use = ++h.tick;
  __atomic_store_n(&e.state, kFetching, __ATOMIC_RELEASE);
  h.used += bytes;
  return true;
}

bool Space::EvictOwn(uint32_t x) {
  if (tables_->At(x).state != kPresent) return false;
  ByteLock pin;  // no reader holds it: evict
  auto got = pin.Lock(pin_lock_, x, /*exclusive=*/true, /*wait=*/false);
  if (!got.ok() || !*got) return false;
  unlink(files_->Path(x).c_str());
  Forget(x);
  (*evictions_)++;
  return true;
}

uint64_t Space::EvictOthers(uint64_t want) {
  const std::filesystem::path own(files_->dir());
  std::lock_guard lock(g_others_mu);
  std::vector<std::tuple<uint64_t, OtherTable*, std::string, uint32_t>> order;
  std::error_code ec;
  for (const auto& d : std::filesystem::directory_iterator(own.parent_path(), ec)) {
    if (!d.is_directory(ec) || d.path() == own) continue;
    OtherTable* t = MapOther(d.path().string());
    if (!t) continue;
    for (uint32_t x = 0; x < t->shards; ++x) {
      const Entry& e = t->At(x);
      if (e.state == kPresent && !e.soon) order.emplace_back(e.last_use, t, d.path().string(), x);
    }
  }
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  uint64_t freed = 0;
  FolderHeader& h = tables_->header();
  for (const auto& [use, t, dir, x] : order) {
    if (freed >= want) break;
    ByteLock pin;
    auto got = pin.Lock(dir + "/pin.lock", x, /*exclusive=*/true, /*wait=*/false);
    if (!got.ok() || !*got) continue;
    Entry& e = t->At(x);
    char name[32];
    std::snprintf(name, sizeof(name), "/%08u.stks", x);
    unlink((dir + name).c_str());
    h.used -= std::min(h.used, e.bytes);
    freed += e.bytes;
    e.state = kAbsent;
    e.bytes = 0;
    (*evictions_)++;
  }
  return freed;
}

void Space::Unreserve(uint32_t s) {
  if (tables_->At(s).state == kFetching) Forget(s);
}

void Space::Commit(uint32_t s, const struct stat& written) {
  Entry& e = tables_->At(s);
  e.ino = uint64_t(written.st_ino);
  e.ctime_ns = ShardFiles::CtimeNs(written);
  __atomic_store_n(&e.state, kPresent, __ATOMIC_RELEASE);
}

void Space::Adopt(uint32_t s, const struct stat& st) {
  Entry& e = tables_->At(s);
  if (e.state == kFetching) return;  // its fetcher is still at it
  if (e.state == kAbsent) {
    e.bytes = shard_bytes_[s];
    e.state = kPresent;
    tables_->header().used += e.bytes;
  }
  e.ino = uint64_t(st.st_ino);
  e.ctime_ns = ShardFiles::CtimeNs(st);
}

void Space::Forget(uint32_t s) {
  Entry& e = tables_->At(s);
  if (e.state == kAbsent) return;
  FolderHeader& h = tables_->header();
  h.used -= std::min(h.used, e.bytes);
  e.state = kAbsent;
  e.bytes = 0;
  e.soon = 0;
}

void Space::FixStale(uint32_t s) {
  Entry& e = tables_->At(s);
  if (e.state == kAbsent) return;
  if (e.state == kFetching) unlink(files_->TmpPath(s, e.pid).c_str());
  struct stat st;
  if (stat(files_->Path(s).c_str(), &st) == 0 && uint64_t(st.st_size) == shard_bytes_[s]) {
    e.state = kPresent;
    return;
  }
  Forget(s);
}

}  // namespace stoker::cache_internal
