// The Checkpointer: the public face of the checkpoint's parts. It checks a
// save's arguments, snapshots an asynchronous save into the staging area and
// runs it in the background, and hands each job to its part:
//
//   ChunkWriter  (chunk_writer.cc)  a rank's chunks and part record
//   Coordinator  (coordinator.cc)   the ranks agree; rank 0 commits
//   Catalog      (catalog.cc)       names, sequences, latest, retention, list
//   Restorer     (restore.cc)       restore and verify
//
// docs/checkpoint.md is the format; §1.1 the commit protocol.
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_set>

#include "ckpt/catalog.h"
#include "ckpt/chunk_writer.h"
#include "ckpt/coordinator.h"
#include "ckpt/device_staging.h"
#include "ckpt/records.h"
#include "ckpt/reshard.h"
#include "ckpt/restore.h"
#include "core/thread_boundary.h"
#include "stoker/checkpoint.h"

namespace stoker {

// ---- SaveHandle -------------------------------------------------------------

struct SaveHandle::State {
  std::string name;
  std::string uri;
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool done = false;
  mutable bool observed = false;
  Status status;
  std::vector<std::function<void(const Status&)>> on_done;  // SaveHandle::OnDone
  std::shared_ptr<ckpt::StagedSave> staged;  // device copies; null without device tensors

  // The OnDone callbacks run before done is set, so that a waiter wakes to
  // their effects (a counted save); status no longer changes while they run.
  void Finish(Status s) {
    std::unique_lock<std::mutex> l(mu);
    status = std::move(s);
    while (!on_done.empty()) {
      std::vector<std::function<void(const Status&)>> callbacks;
      callbacks.swap(on_done);
      l.unlock();
      for (const auto& f : callbacks) f(status);
      l.lock();
    }
    done = true;
    l.unlock();
    cv.notify_all();
  }
};

bool SaveHandle::Done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> l(state_->mu);
  if (state_->done) state_->observed = true;
  return state_->done;
}

Status SaveHandle::Wait() const {
  if (!state_) return InvalidArgument("SaveHandle: empty handle");
  std::unique_lock<std::mutex> l(state_->mu);
  state_->cv.wait(l, [&] { return state_->done; });
  state_->observed = true;
  return state_->status;
}

Status SaveHandle::WaitUntil(Deadline deadline) const {
  if (!state_) return InvalidArgument("SaveHandle: empty handle");
  std::unique_lock<std::mutex> l(state_->mu);
  if (!state_->cv.wait_until(l, deadline, [&] { return state_->done; })) {
    return TimedOut("checkpoint " + state_->name + " at " + state_->uri + ": still being written");
  }
  state_->observed = true;
  return state_->status;
}

void SaveHandle::OnDone(std::function<void(const Status&)> f) const {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> l(state_->mu);
    if (!state_->done) {
      state_->on_done.push_back(std::move(f));
      return;
    }
  }
  f(state_->status);
}

Status SaveHandle::WaitStaged() const {
  if (!state_) return InvalidArgument("SaveHandle: empty handle");
  return state_->staged ? state_->staged->WaitStaged() : Status::Ok();
}

const std::string& SaveHandle::name() const {
  static const std::string kEmpty;
  return state_ ? state_->name : kEmpty;
}

namespace {

using ckpt::ManifestKey;
using ckpt::PartKey;
using ckpt::PartRecord;

// A tensor's problem as a save argument, or "".
std::string TensorProblem(const TensorRef& t) {
  if (std::string why = ckpt::TensorNameProblem(t.name); !why.empty()) return why;
  const size_t size = DTypeSize(t.dtype);
  if (size == 0) return "tensor '" + t.name + "': unknown dtype";
  unsigned __int128 count = 1;
  for (int64_t d : t.shape) {
    if (d < 0) return "tensor '" + t.name + "': negative dimension";
    count *= static_cast<uint64_t>(d);
    if (count > (static_cast<unsigned __int128>(1) << 58)) {
      return "tensor '" + t.name + "': too many elements";
    }
  }
  if (std::string why = ckpt::LayoutProblem(t.layout, t.shape); !why.empty()) {
    return "tensor '" + t.name + "': layout " + LayoutText(t.layout, t.shape) + ": " + why;
  }
  if (count * size != t.data.size()) {
    return "tensor '" + t.name + "' has " + std::to_string(t.data.size()) +
           " bytes; its shape and dtype (" + std::string(DTypeName(t.dtype)) + ") make " +
           std::to_string(static_cast<uint64_t>(count * size));
  }
  return "";
}

class CheckpointerImpl final : public Checkpointer {
 public:
  CheckpointerImpl(std::shared_ptr<Store> store, const CheckpointerOptions& options,
                   std::shared_ptr<ckpt::DeviceRuntime> runtime)
      : store_(std::move(store)),
        opt_(Fixed(options)),
        retrying_(ckpt::WithWriteRetries(store_, opt_.write_retries, opt_.retry_backoff)),
        writer_(retrying_, opt_.io_threads),
        catalog_(retrying_),
        copier_(std::make_shared<ckpt::DeviceCopier>(std::move(runtime), opt_)),
        restorer_(store_, opt_, copier_) {}

  ~CheckpointerImpl() override {
    std::lock_guard<std::mutex> l(save_mu_);
    JoinBackground();
  }

  const std::string& uri() const override { return store_->uri(); }

  Status Save(std::string_view given, std::span<const TensorRef> tensors,
              const SaveOptions& options) override {
    const std::string name = NameOf(given, options);
    STOKER_RETURN_IF_ERROR(CheckSave(name, tensors, options));
    STOKER_ASSIGN_OR_RETURN(std::shared_ptr<ckpt::Coordinator> coordinator,
                            Choose(name, options, /*background=*/false));
    std::lock_guard<std::mutex> l(save_mu_);
    JoinBackground();
    if (Status p = Prepare(name, options); !p.ok()) {
      return coordinator->Finish(std::string(name), p, {}, "", options, nullptr);
    }
    // Device tensors: copied as the chunks that hold them are written.
    auto staged = copier_->Start(tensors, options.chunk_bytes);
    if (!staged.ok()) {
      return coordinator->Finish(std::string(name),
                                 staged.status().WithContext("save of " + Where(name)), {}, "",
                                 options, nullptr);
    }
    std::shared_ptr<ckpt::StagedSave> device = *staged;
    const std::span<const TensorRef> refs =
        device ? std::span<const TensorRef>(device->tensors()) : tensors;
    Status s = WriteAndCommit(std::string(name), refs, options, *coordinator, device.get());
    if (device) device->Finish(s);
    return s;
  }

  Result<SaveHandle> SaveAsync(std::string_view given, std::span<const TensorRef> tensors,
                               const SaveOptions& options) override {
    const std::string name = NameOf(given, options);
    STOKER_RETURN_IF_ERROR(CheckSave(name, tensors, options));
    STOKER_ASSIGN_OR_RETURN(std::shared_ptr<ckpt::Coordinator> coordinator,
                            Choose(name, options, /*background=*/true));
    std::lock_guard<std::mutex> l(save_mu_);
    JoinBackground();
    if (Status p = Prepare(name, options); !p.ok()) {
      return coordinator->Finish(std::string(name), p, {}, "", options, nullptr);
    }
    // Device tensors first (their copies queued, ordered after the callers'
    // streams), then the host tensors copied into the host staging area.
    auto device = copier_->Start(tensors, options.chunk_bytes);
    if (!device.ok()) {
      return coordinator->Finish(std::string(name),
                                 device.status().WithContext("save of " + Where(name)), {}, "",
                                 options, nullptr);
    }
    std::vector<TensorRef> host;
    std::vector<size_t> host_index;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].device < 0) {
        host.push_back(tensors[i]);
        host_index.push_back(i);
      }
    }
    STOKER_ASSIGN_OR_RETURN(std::vector<TensorRef> host_staged, staging_.Snapshot(host));
    std::vector<TensorRef> staged =
        *device ? (*device)->tensors() : std::vector<TensorRef>(tensors.begin(), tensors.end());
    for (size_t k = 0; k < host_index.size(); ++k) staged[host_index[k]] = host_staged[k];
    auto state = std::make_shared<SaveHandle::State>();
    state->name = std::string(name);
    state->uri = uri();
    state->staged = *device;
    background_ = state;
    bg_ = std::thread([this, state, staged = std::move(staged), options, coordinator]() {
      Status s = internal::CatchAsStatus("background save", [&] {
        return WriteAndCommit(state->name, staged, options, *coordinator, state->staged.get());
      });
      if (state->staged) state->staged->Finish(s);
      if (!s.ok()) {
        // Never silently dropped: said here, and kept in the handle.
        std::fprintf(stderr, "stoker: background save of checkpoint %s failed: %s\n",
                     state->name.c_str(), s.ToString().c_str());
      }
      state->Finish(std::move(s));
    });
    return SaveHandle(state);
  }

  Result<std::vector<CheckpointListing>> List() override { return catalog_.List(); }
  Result<std::string> Latest() override { return catalog_.Latest(); }
  Result<std::string> ClaimName() override { return catalog_.ClaimName("ckpt-"); }

  Result<CheckpointManifest> ReadManifest(std::string_view name) override {
    STOKER_ASSIGN_OR_RETURN(std::string n, catalog_.Resolve(name));
    return catalog_.ReadManifest(n);
  }

  Result<Restored> Restore(std::string_view name, const RestoreOptions& options) override {
    STOKER_ASSIGN_OR_RETURN(CheckpointManifest m, ReadManifest(name));
    return restorer_.Restore(std::move(m), options);
  }

  Result<CheckpointManifest> RestoreInto(std::string_view name,
                                         std::span<const TensorDestination> dst,
                                         const RestoreOptions& options) override {
    STOKER_ASSIGN_OR_RETURN(CheckpointManifest m, ReadManifest(name));
    STOKER_RETURN_IF_ERROR(restorer_.RestoreInto(m, dst, options));
    return m;
  }

  Status Verify(std::string_view name, CheckpointVerifyReport* report) override {
    STOKER_ASSIGN_OR_RETURN(CheckpointManifest m, ReadManifest(name));
    return restorer_.Verify(m, report);
  }

  Status Remove(std::string_view name) override { return catalog_.Remove(name); }

 private:
  static CheckpointerOptions Fixed(CheckpointerOptions o) {
    if (o.io_threads == 0) o.io_threads = 1;
    return o;
  }
  std::string Where(std::string_view name) const { return catalog_.Where(name); }

  Result<std::shared_ptr<ckpt::Coordinator>> Choose(std::string_view name, const SaveOptions& o,
                                                    bool background) {
    STOKER_ASSIGN_OR_RETURN(
        std::unique_ptr<ckpt::Coordinator> c,
        ckpt::ChooseCoordinator(store_, opt_.poll_interval, name, o, background));
    return std::shared_ptr<ckpt::Coordinator>(std::move(c));
  }

  void JoinBackground() {
    if (bg_.joinable()) bg_.join();
    if (background_) {
      std::lock_guard<std::mutex> l(background_->mu);
      if (!background_->status.ok() && !background_->observed) {
        std::fprintf(stderr,
                     "stoker: the background save of checkpoint %s failed and nobody asked its "
                     "handle: %s\n",
                     background_->name.c_str(), background_->status.ToString().c_str());
      }
    }
    background_.reset();
  }

  // An empty name with a step is the step's (SaveOptions::step).
  static std::string NameOf(std::string_view name, const SaveOptions& o) {
    return name.empty() && o.step ? StepCheckpointName(*o.step) : std::string(name);
  }

  // Arguments, before anything is written or copied.
  Status CheckSave(std::string_view name, std::span<const TensorRef> tensors,
                   const SaveOptions& o) const {
    STOKER_RETURN_IF_ERROR(ValidateCheckpointName(name));
    const std::string where = "save of checkpoint " + std::string(name) + " to " + uri();
    if (o.world_size == 0 || o.world_size > kMaxCheckpointRanks) {
      return InvalidArgument(where + ": world_size " + std::to_string(o.world_size) + " (1.." +
                             std::to_string(kMaxCheckpointRanks) + ")");
    }
    if (o.rank >= o.world_size) {
      return InvalidArgument(where + ": rank " + std::to_string(o.rank) +
                             " is not below world_size " + std::to_string(o.world_size));
    }
    if (o.chunk_bytes < 4096 || o.chunk_bytes > ckpt::kMaxChunkBytes) {
      return InvalidArgument(where + ": chunk_bytes " + std::to_string(o.chunk_bytes) +
                             " (4 KiB .. 1 GiB)");
    }
    if (o.format_version < 1 || o.format_version > kCheckpointFormat) {
      return InvalidArgument(where + ": format_version " + std::to_string(o.format_version) +
                             " (1.." + std::to_string(kCheckpointFormat) + ")");
    }
    if (o.format_version >= 2 && (o.checksum_block_bytes < ckpt::kMinChecksumBlockBytes ||
                                  o.checksum_block_bytes > ckpt::kMaxChecksumBlockBytes)) {
      return InvalidArgument(where + ": checksum_block_bytes " +
                             std::to_string(o.checksum_block_bytes) + " (4 KiB .. 64 MiB)");
    }
    auto meta = nlohmann::json::parse(o.metadata_json, nullptr, /*allow_exceptions=*/false);
    if (!meta.is_object()) return InvalidArgument(where + ": metadata is not a JSON object");
    std::unordered_set<std::string_view> names;
    for (const TensorRef& t : tensors) {
      if (std::string why = TensorProblem(t); !why.empty()) {
        return InvalidArgument(where + ": " + why);
      }
      if (o.format_version < 2 && t.layout.kind != TensorLayout::Kind::kWhole) {
        return InvalidArgument(where + ": tensor '" + t.name +
                               "' has a layout, which checkpoint format 1 cannot hold");
      }
      if (!names.insert(t.name).second) {
        return InvalidArgument(where + ": tensor name '" + t.name + "' given twice");
      }
    }
    return Status::Ok();
  }

  // §1.1 step 1: refuse a committed name; drop this rank's stale part.
  Status Prepare(std::string_view name, const SaveOptions& o) {
    auto st = store_->Stat(ManifestKey(name));
    if (st.ok()) {
      return AlreadyExists(Where(name) +
                           " is already committed; remove it or save under another name");
    }
    if (st.status().code() != Code::kNotFound) return st.status();
    Status s = store_->Remove(PartKey(name, o.rank));
    if (!s.ok() && s.code() != Code::kNotFound) return s;
    return Status::Ok();
  }

  // §1.1: chunks, part record, then the coordinator (and, on rank 0, the
  // catalog's commit).
  Status WriteAndCommit(const std::string& name, std::span<const TensorRef> tensors,
                        const SaveOptions& o, ckpt::Coordinator& coordinator,
                        ckpt::ChunkSource* source) {
    auto fail = [&](Status st) { return coordinator.Finish(name, std::move(st), {}, "", o, {}); };
    // Rank 0 claims the commit's sequence first, so that the claim is made
    // durable by the chunks' sync (Catalog::Claim).
    uint64_t sequence = 0;
    if (o.rank == 0) {
      auto claimed = catalog_.Claim(name);
      if (!claimed.ok()) return fail(claimed.status());
      sequence = *claimed;
    }
    Status s = WriteAndFinish(name, tensors, o, coordinator, sequence, source);
    if (!s.ok() && o.rank == 0) catalog_.Release(name, sequence);
    return s;
  }

  Status WriteAndFinish(const std::string& name, std::span<const TensorRef> tensors,
                        const SaveOptions& o, ckpt::Coordinator& coordinator, uint64_t sequence,
                        ckpt::ChunkSource* source) {
    auto fail = [&](Status st) { return coordinator.Finish(name, std::move(st), {}, "", o, {}); };
    auto part = writer_.Write(name, o.rank, tensors, o.chunk_bytes,
                              o.format_version >= 2 ? o.checksum_block_bytes : 0, source);
    if (!part.ok()) return fail(part.status().WithContext("save of " + Where(name)));
    PartRecord rec{o.format_version, name, o.world_size, o.attempt, std::move(*part)};
    const std::string encoded = ckpt::EncodePart(rec);
    Status s = writer_.PutSmall(PartKey(name, o.rank), std::as_bytes(std::span(encoded)));
    if (!s.ok()) return fail(s.WithContext("save of " + Where(name) + ": part record"));
    return coordinator.Finish(name, Status::Ok(), std::move(rec), encoded, o,
                              [&](std::vector<RankPart> parts) {
                                return catalog_.Commit(name, sequence, std::move(parts), o);
                              });
  }

  std::shared_ptr<Store> store_;
  const CheckpointerOptions opt_;
  const std::shared_ptr<Store> retrying_;  // store_ with write retries
  ckpt::ChunkWriter writer_;
  ckpt::Catalog catalog_;
  const std::shared_ptr<ckpt::DeviceCopier> copier_;
  ckpt::Restorer restorer_;
  std::mutex save_mu_;  // one save at a time; guards the members below
  ckpt::StagingArea staging_;
  std::thread bg_;
  std::shared_ptr<SaveHandle::State> background_;
};

}  // namespace

std::unique_ptr<Checkpointer> NewCheckpointer(std::shared_ptr<Store> store,
                                              const CheckpointerOptions& options) {
  return std::make_unique<CheckpointerImpl>(std::move(store), options, ckpt::CudaDeviceRuntime());
}

namespace ckpt {
std::unique_ptr<Checkpointer> NewCheckpointerOn(std::shared_ptr<Store> store,
                                                const CheckpointerOptions& options,
                                                std::shared_ptr<DeviceRuntime> runtime) {
  return std::make_unique<CheckpointerImpl>(std::move(store), options, std::move(runtime));
}
}  // namespace ckpt

Result<std::unique_ptr<Checkpointer>> OpenCheckpointer(std::string_view uri,
                                                       const CheckpointerOptions& options) {
  STOKER_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(uri, options.store));
  return NewCheckpointer(std::move(store), options);
}

Result<std::string> CheckpointNameFor(Checkpointer& c, std::string_view name,
                                      const SaveOptions& options) {
  if (!name.empty()) {
    STOKER_RETURN_IF_ERROR(ValidateCheckpointName(name));
    return std::string(name);
  }
  if (options.step) return StepCheckpointName(*options.step);
  if (options.world_size > 1) {
    return InvalidArgument("a save by " + std::to_string(options.world_size) +
                           " ranks needs a name or a step, so that every rank saves under the "
                           "same name");
  }
  return c.ClaimName();  // ckpt-N, claimed atomically under the root
}

}  // namespace stoker
