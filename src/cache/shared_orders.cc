#include "cache/shared_orders.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <thread>

namespace stoker::cache_internal {
namespace {

// A mapping of an order file, unmapped when the last order over it goes.
struct Mapping {
  void* data = nullptr;
  size_t bytes = 0;
  Mapping(void* d, size_t n) : data(d), bytes(n) {}
  ~Mapping() { munmap(data, bytes); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  std::span<std::byte> span() const { return {static_cast<std::byte*>(data), bytes}; }
};

std::string OrderName(uint64_t identity, uint64_t epoch) {
  char name[64];
  std::snprintf(name, sizeof name, "/order-%016" PRIx64 "-%" PRIu64, identity, epoch);
  return name;
}

}  // namespace

std::string SharedOrders::Path(const OrderKey& key) const {
  return dir_ + OrderName(key.job.identity, key.job.epoch);
}

std::shared_ptr<const NeedOrder> SharedOrders::TryMap(const OrderKey& key, uint32_t local_rank) {
  const int fd = open(Path(key).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st;
  void* p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && uint64_t(st.st_size) >= kOrderHeaderBytes) {
    p = mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (p == MAP_FAILED) return nullptr;
  // Files are replaced by rename, never changed in place: a mapping stays
  // whole.
  auto m = std::make_shared<Mapping>(p, size_t(st.st_size));
  auto o = NeedOrder::FromBytes(m->span(), m, key, local_rank);
  if (!o.ok()) return nullptr;  // another run's, an older layout's, cut short
  mapped_++;
  return std::make_shared<const NeedOrder>(std::move(*o));
}

Result<std::shared_ptr<const NeedOrder>> SharedOrders::Publish(const NeedOrderBuilder& b) {
  const std::string tmp = dir_ + "/.order-" + std::to_string(getpid()) + "-" +
                          std::to_string(tmp_counter_++);
  const int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return std::shared_ptr<const NeedOrder>();
  // Allocated, not sparse: a page a full disk cannot back would be SIGBUS
  // at the first store through the mapping (as folder.cc's tables).
  void* p = MAP_FAILED;
  if (posix_fallocate(fd, 0, off_t(b.bytes())) == 0) {
    p = mmap(nullptr, b.bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (p == MAP_FAILED) {
    unlink(tmp.c_str());
    return std::shared_ptr<const NeedOrder>();
  }
  auto m = std::make_shared<Mapping>(p, b.bytes());
  b.Write(m->span());
  mprotect(p, b.bytes(), PROT_READ);
  const std::string path = Path(b.key());
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());  // kept in this process only (the mapping stays)
  } else {
    written_++;
    // The order before last of this job is done with on the node (a rank
    // still reading it has it mapped; one starting it late computes it).
    if (b.key().job.epoch >= 2) {
      unlink((dir_ + OrderName(b.key().job.identity, b.key().job.epoch - 2)).c_str());
    }
  }
  STOKER_ASSIGN_OR_RETURN(NeedOrder o, NeedOrder::FromBytes(m->span(), m, b.key(), b.local_rank()));
  return std::make_shared<const NeedOrder>(std::move(o));
}

Result<std::shared_ptr<const NeedOrder>> SharedOrders::Get(uint64_t dataset_id,
                                                           std::span<const uint32_t> shard_samples,
                                                           const PlanOptions& plan,
                                                           uint32_t ranks_per_node,
                                                           uint64_t epoch, uint64_t position) {
  const OrderKey key =
      MakeOrderKey(dataset_id, shard_samples.size(), plan, ranks_per_node, epoch, position);
  const uint32_t local_rank = plan.rank - key.job.rank;
  if (auto o = TryMap(key, local_rank)) return o;
  // Wait for the process computing it (its lock), or take the lock and
  // compute it; the kernel drops a dead holder's lock.
  ByteLock lock;
  const auto deadline = std::chrono::steady_clock::now() + wait_;
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    auto got = lock.Lock(LockPath(), LockByte(key), /*exclusive=*/true, /*wait=*/false);
    if (!got.ok() || *got || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
    if (auto o = TryMap(key, local_rank)) return o;
  }
  if (lock.held()) {
    if (auto o = TryMap(key, local_rank)) return o;  // written just before the lock came
  }
  STOKER_ASSIGN_OR_RETURN(NeedOrderBuilder b,
                          NeedOrderBuilder::Make(dataset_id, shard_samples, plan, ranks_per_node,
                                                 epoch, position));
  if (lock.held()) {
    STOKER_ASSIGN_OR_RETURN(std::shared_ptr<const NeedOrder> o, Publish(b));
    if (o) return o;
  }
  // No lock (another is stuck on it) or no file: this process's own.
  STOKER_ASSIGN_OR_RETURN(NeedOrder o, b.Build());
  return std::make_shared<const NeedOrder>(std::move(o));
}

}  // namespace stoker::cache_internal
