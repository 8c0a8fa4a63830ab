// The loader's resume state: its identity and the check on resume
// (include/stoker/loader.h, LoaderState).
#include <string>

#include "stoker/loader.h"
#include "stoker/plan.h"

namespace stoker {

LoaderState IdentifiedState(uint64_t epoch, uint64_t position, const format::Manifest& m,
                            const LoaderOptions& o) {
  LoaderState s;
  s.epoch = epoch;
  s.position = position;
  s.version = kLoaderStateVersion;
  s.dataset_id = m.IdHex();
  s.seed = o.seed;
  s.shuffle = o.shuffle;
  s.shuffle_window_shards = o.shuffle_window_shards;
  s.world_size = o.world_size;
  s.sequence_length = o.sequence_length;
  return s;
}

namespace {

template <typename T>
Status Differs(const char* what, const T& saved, const T& mine) {
  return InvalidArgument("resume state was saved with " + std::string(what) + " " +
                         std::to_string(saved) + ", this loader has " + std::to_string(mine) +
                         ": the position would select other samples");
}

}  // namespace

Status CheckResumeState(const LoaderState& state, const format::Manifest& m,
                        const LoaderOptions& o) {
  // Token windows: positions count windows, which the token loader bounds
  // when it starts the epoch (the manifest does not know them).
  if (o.sequence_length == 0 && state.position > m.sample_count) {
    return InvalidArgument("resume position " + std::to_string(state.position) +
                           " is past the end of the dataset (" + std::to_string(m.sample_count) +
                           " samples)");
  }
  if (state.version == 0) return Status::Ok();
  if (state.version > kLoaderStateVersion) {
    return Unsupported("resume state version " + std::to_string(state.version) +
                       " was written by a newer stoker (this one reads version " +
                       std::to_string(kLoaderStateVersion) + ")");
  }
  if (state.version < 2 && state.shuffle && state.position > 0) {
    return Unsupported(
        "resume state (epoch " + std::to_string(state.epoch) + ", position " +
        std::to_string(state.position) + ") was saved under epoch order version 1; this stoker " +
        "shuffles with order version " + std::to_string(kPlanOrderVersion) +
        ", so the rest of that epoch would be other samples. Resume it with the stoker that " +
        "saved it, or start at the next epoch (position 0)");
  }
  if (state.dataset_id != m.IdHex()) {
    return InvalidArgument("resume state was saved for dataset " + state.dataset_id +
                           ", this loader reads " + m.IdHex());
  }
  if (state.sequence_length != o.sequence_length) {
    return Differs("sequence_length", state.sequence_length, o.sequence_length);
  }
  if (state.seed != o.seed) return Differs("seed", state.seed, o.seed);
  if (state.shuffle != o.shuffle) return Differs("shuffle", state.shuffle, o.shuffle);
  if (o.shuffle && state.shuffle_window_shards != o.shuffle_window_shards) {
    return Differs("shuffle_window_shards", state.shuffle_window_shards, o.shuffle_window_shards);
  }
  return Status::Ok();
}

}  // namespace stoker
