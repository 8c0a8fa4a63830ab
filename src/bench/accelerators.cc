// How many emulated accelerators a loader keeps busy (see bench.h): ranks
// as threads on this node, each with its own loader, and the doubling
// search MLPerf Storage's question asks for.
#include <thread>

#include "bench/bench.h"

namespace stoker {

Result<AcceleratorTrial> RunAccelerators(uint32_t accelerators,
                                         const std::function<Result<BatchSource>(uint32_t)>& open,
                                         std::chrono::microseconds compute_per_step,
                                         uint32_t warmup_steps, uint32_t steps) {
  if (accelerators == 0) return InvalidArgument("accelerators must be at least 1");
  if (steps == 0) return InvalidArgument("steps must be at least 1");
  std::vector<Result<TrainRun>> results(accelerators, Internal("rank did not run"));
  const auto start = Clock::now();
  {
    std::vector<std::jthread> ranks;
    for (uint32_t r = 0; r < accelerators; ++r) {
      ranks.emplace_back([&, r] {
        auto source = open(r);
        if (!source.ok()) {
          results[r] = source.status();
          return;
        }
        // Warm-up: the loader's start and first reads, with the compute, as
        // the job's first steps would have them; not measured.
        auto warm = EmulateTraining(*source, compute_per_step, warmup_steps);
        if (!warm.ok()) {
          results[r] = warm.status();
          return;
        }
        if (warm->steps < warmup_steps) {
          results[r] = OutOfRange("the data ran out during the warm-up steps");
          return;
        }
        results[r] = EmulateTraining(*source, compute_per_step, steps);
      });
    }
  }
  AcceleratorTrial trial;
  trial.accelerators = accelerators;
  trial.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  double compute = 0, nominal = 0, wall = 0, samples_per_second = 0;
  trial.min_utilisation = 1;
  for (auto& r : results) {
    if (!r.ok()) return r.status();
    if (r->steps < steps) return OutOfRange("the data ran out before the measured steps ended");
    // Busy = not waiting for a batch: a sleep that overruns on a loaded
    // machine is the emulated accelerator's, not the loader's.
    compute += r->wall_seconds - r->wait_seconds;
    nominal += r->compute_seconds;
    wall += r->wall_seconds;
    samples_per_second += r->samples_per_second();
    trial.min_utilisation = std::min(trial.min_utilisation, 1 - r->data_wait_share());
    trial.ranks.push_back(*r);
  }
  trial.utilisation = wall > 0 ? compute / wall : 0;
  trial.compute_share = wall > 0 ? nominal / wall : 0;
  trial.samples_per_second = samples_per_second;
  return trial;
}

Result<AcceleratorSearch> SearchAccelerators(
    const std::function<Result<AcceleratorTrial>(uint32_t)>& trial, double threshold,
    uint32_t max_accelerators) {
  if (max_accelerators == 0) return InvalidArgument("max_accelerators must be at least 1");
  if (!(threshold > 0 && threshold <= 1)) {
    return InvalidArgument("threshold must be in (0, 1]");
  }
  AcceleratorSearch search;
  for (uint64_t n = 1; n <= max_accelerators; n *= 2) {
    STOKER_ASSIGN_OR_RETURN(auto t, trial(uint32_t(n)));
    const bool pass = t.utilisation >= threshold;
    search.trials.push_back(std::move(t));
    if (!pass) break;
    search.supported = uint32_t(n);
  }
  return search;
}

}  // namespace stoker
