// The in-memory store, for unit tests: the same semantics as the real
// backends, without a filesystem.
//
// Objects are immutable shared buffers, so a Put is atomic by construction (it
// swaps one pointer under the lock) and a reader copies from the snapshot it
// took, outside the lock. Reads complete synchronously inside Submit; Wait
// only hands them out.
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "stoker/store.h"
#include "store/store_internal.h"

namespace stoker {
namespace {

using store_internal::Quote;
using Bytes = std::vector<std::byte>;

// What a store and its read queues share; queues keep it alive, so a queue may
// outlive its store.
struct MemoryState {
  explicit MemoryState(std::string u) : uri(std::move(u)) {}

  const std::string uri;
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const Bytes>, std::less<>> objects;  // guarded by mu

  Result<std::shared_ptr<const Bytes>> Get(std::string_view key) {
    STOKER_RETURN_IF_ERROR(ValidateKey(key));
    std::lock_guard lock(mu);
    auto it = objects.find(key);
    if (it == objects.end()) return NotFound(uri + ": " + Quote(key) + ": no such object");
    return it->second;
  }
};

class MemoryReadQueue final : public ReadQueue {
 public:
  explicit MemoryReadQueue(std::shared_ptr<MemoryState> state) : state_(std::move(state)) {}

  Status Submit(std::span<const ReadRequest> requests) override {
    for (const ReadRequest& r : requests) ready_.push_back(Execute(r));
    return Status::Ok();
  }

  Result<size_t> Wait(size_t min_completions, Deadline deadline,
                      std::vector<ReadCompletion>* out) override {
    if (out == nullptr) return InvalidArgument("ReadQueue::Wait: out is null");
    // Everything submitted is complete already, so min_completions (capped at
    // Outstanding) is always met and the deadline never matters.
    return store_internal::MoveCompletions(ready_, out);
  }

  size_t Outstanding() const override { return ready_.size(); }

 private:
  ReadCompletion Execute(const ReadRequest& r) {
    ReadCompletion c;
    c.tag = r.tag;
    auto object = state_->Get(r.key);
    if (!object.ok()) {
      c.status = object.status();
      return c;
    }
    const Bytes& data = **object;
    if (r.offset < data.size()) {
      c.bytes = std::min<uint64_t>(r.dst.size(), data.size() - r.offset);
      if (c.bytes > 0) std::memcpy(r.dst.data(), data.data() + r.offset, c.bytes);
    }
    return c;
  }

  std::shared_ptr<MemoryState> state_;
  std::vector<ReadCompletion> ready_;
};

// A snapshot of one object: a concurrent Put replaces the object, never the
// bytes this reader holds (as an open file keeps its inode).
class MemoryObjectReader final : public ObjectReader {
 public:
  explicit MemoryObjectReader(std::shared_ptr<const Bytes> object) : object_(std::move(object)) {}

  Result<size_t> ReadV(uint64_t offset, std::span<const std::span<std::byte>> dsts) override {
    size_t done = 0;
    for (std::span<std::byte> d : dsts) {
      if (offset + done >= object_->size()) break;
      const size_t n = std::min<size_t>(d.size(), object_->size() - (offset + done));
      std::memcpy(d.data(), object_->data() + offset + done, n);
      done += n;
    }
    return done;
  }
  Result<std::span<const std::byte>> Map() override {
    return std::span<const std::byte>(object_->data(), object_->size());
  }

 private:
  std::shared_ptr<const Bytes> object_;
};

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(std::string uri) : state_(std::make_shared<MemoryState>(std::move(uri))) {}

  const std::string& uri() const override { return state_->uri; }
  StoreDescription Describe() const override {
    StoreDescription d;
    d.kind = "memory";
    d.location = state_->uri.substr(std::string_view("mem://").size());
    return d;
  }

  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& options) override {
    STOKER_RETURN_IF_ERROR(store_internal::ValidateQueueOptions(options));
    return std::unique_ptr<ReadQueue>(std::make_unique<MemoryReadQueue>(state_));
  }

  Result<std::unique_ptr<ObjectReader>> OpenReader(std::string_view key) override {
    STOKER_ASSIGN_OR_RETURN(std::shared_ptr<const Bytes> object, state_->Get(key));
    return std::unique_ptr<ObjectReader>(std::make_unique<MemoryObjectReader>(std::move(object)));
  }

  // Whole-object reads take one snapshot, so unlike the default (Stat, then
  // Read) they never see a concurrent Put change the size.
  Result<std::vector<std::byte>> ReadAll(std::string_view key) override {
    STOKER_ASSIGN_OR_RETURN(std::shared_ptr<const Bytes> object, state_->Get(key));
    return *object;
  }

  // Durable on return whatever options.durability says (as durable as
  // memory gets); the observer sees the data whole before it is copied.
  using Store::Put;
  Status Put(std::string_view key, std::span<const std::byte> data,
             const WriteOptions& options) override {
    STOKER_RETURN_IF_ERROR(ValidateKey(key));
    if (options.observer != nullptr) (*options.observer)(data);
    // Copy outside the lock; publish with one pointer swap.
    auto object = std::make_shared<const Bytes>(data.begin(), data.end());
    std::shared_ptr<const Bytes> old;
    {
      std::lock_guard lock(state_->mu);
      if (options.if_absent) {
        auto [it, inserted] = state_->objects.try_emplace(std::string(key), std::move(object));
        if (!inserted) return AlreadyExists(state_->uri + ": " + Quote(key) + ": exists");
        return Status::Ok();
      }
      auto& slot = state_->objects[std::string(key)];
      old = std::move(slot);  // freed outside the lock
      slot = std::move(object);
    }
    return Status::Ok();
  }

  StoreCapabilities capabilities() const override {
    return {.local_reads = true,
            .prefix_listing = true,
            .mapped_reads = true,
            .exclusive_create = true};
  }

  Result<ObjectInfo> Stat(std::string_view key) override {
    STOKER_ASSIGN_OR_RETURN(std::shared_ptr<const Bytes> object, state_->Get(key));
    return ObjectInfo{std::string(key), object->size()};
  }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    STOKER_RETURN_IF_ERROR(store_internal::ValidatePrefix(prefix));
    std::vector<ObjectInfo> out;
    std::lock_guard lock(state_->mu);
    for (auto it = state_->objects.lower_bound(prefix);
         it != state_->objects.end() && it->first.starts_with(prefix); ++it) {
      out.push_back({it->first, it->second->size()});
    }
    return out;
  }

  Status Remove(std::string_view key) override {
    STOKER_RETURN_IF_ERROR(ValidateKey(key));
    std::shared_ptr<const Bytes> old;
    std::lock_guard lock(state_->mu);
    auto it = state_->objects.find(key);
    if (it == state_->objects.end()) {
      return NotFound(state_->uri + ": " + Quote(key) + ": no such object");
    }
    old = std::move(it->second);
    state_->objects.erase(it);
    return Status::Ok();
  }

 private:
  std::shared_ptr<MemoryState> state_;
};

}  // namespace

std::shared_ptr<Store> NewMemoryStore(std::string name) {
  return std::make_shared<MemoryStore>("mem://" + name);
}

namespace store_internal {

std::shared_ptr<Store> OpenNamedMemoryStore(std::string_view name) {
  // Never destroyed: stores registered here live as long as the process, and
  // leaking the map avoids destruction-order trouble at exit.
  static std::mutex* mu = new std::mutex;
  static auto* registry = new std::unordered_map<std::string, std::shared_ptr<Store>>;
  std::lock_guard lock(*mu);
  auto& slot = (*registry)[std::string(name)];
  if (slot == nullptr) slot = NewMemoryStore(std::string(name));
  return slot;
}

}  // namespace store_internal
}  // namespace stoker
