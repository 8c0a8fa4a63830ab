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
  auto short_of = [&] { return h.used + bytes > capacity_; };
  if (short_of()) {
    std::vector<Candidate> far, lru, near;
    for (const auto& c : own) (c.far ? far : c.lru ? lru : near).push_back(c);
    auto furthest = [](const Candidate& a, const Candidate& b) { return a.rank > b.rank; };
    std::sort(far.begin(), far.end(), furthest);
    std::sort(near.begin(), near.end(), furthest);
    for (size_t i = 0; i < far.size() && short_of(); ++i) EvictOwn(far[i].shard);
    if (short_of() && (others || !lru.empty())) EvictIdle(std::move(lru), others, bytes);
    for (size_t i = 0; i < near.size() && short_of(); ++i) EvictOwn(near[i].shard);
    if (short_of()) return false;
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

// Own LRU candidates and (when `others`) other datasets' idle shards, least
// recently used first, until `bytes` fit.
void Space::EvictIdle(std::vector<Candidate> own, bool others, uint64_t bytes) {
  struct Idle {
    uint64_t tick;
    OtherTable* table;  // null: own
    std::string dir;
    uint32_t shard;
  };
  std::vector<Idle> order;
  for (const auto& c : own) order.push_back({c.rank, nullptr, "", c.shard});
  const std::filesystem::path mine(files_->dir());
  std::lock_guard lock(g_others_mu);
  std::error_code ec;
  for (const auto& d : std::filesystem::directory_iterator(mine.parent_path(), ec)) {
    if (!others) break;
    if (!d.is_directory(ec) || std::filesystem::equivalent(d.path(), mine, ec)) continue;
    OtherTable* t = MapOther(d.path().string());
    if (!t) continue;
    for (uint32_t x = 0; x < t->shards; ++x) {
      const Entry& e = t->At(x);
      if (e.state == kPresent && !e.soon) order.push_back({e.last_use, t, d.path().string(), x});
    }
  }
  std::sort(order.begin(), order.end(),
            [](const Idle& a, const Idle& b) { return a.tick < b.tick; });
  FolderHeader& h = tables_->header();
  for (const auto& i : order) {
    if (h.used + bytes <= capacity_) break;
    if (!i.table) {
      EvictOwn(i.shard);
      continue;
    }
    ByteLock pin;
    auto got = pin.Lock(i.dir + "/pin.lock", i.shard, /*exclusive=*/true, /*wait=*/false);
    if (!got.ok() || !*got) continue;
    Entry& e = i.table->At(i.shard);
    char name[32];
    std::snprintf(name, sizeof(name), "/%08u.stks", i.shard);
    unlink((i.dir + name).c_str());
    h.used -= std::min(h.used, e.bytes);
    e.state = kAbsent;
    e.bytes = 0;
    static_cast<DatasetHeader*>(i.table->file.data())->dropped++;
    (*evictions_)++;
  }
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
  tables_->dataset().dropped++;
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
