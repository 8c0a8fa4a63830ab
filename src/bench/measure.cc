#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "bench/bench.h"

namespace stoker {

ProcessUsage GetProcessUsage() {
  ProcessUsage u;
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) == 0) {
    u.kernel_cpu_seconds = ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    u.cpu_seconds = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + u.kernel_cpu_seconds;
    u.page_faults = uint64_t(ru.ru_minflt) + uint64_t(ru.ru_majflt);
  }
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    uint64_t kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %lu kB", &kb) == 1) u.rss_bytes = kb << 10;
    if (std::sscanf(line.c_str(), "VmHWM: %lu kB", &kb) == 1) u.peak_rss_bytes = kb << 10;
  }
  return u;
}

bool ResetPeakRss() {
  const int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "5", 1) == 1;
  ::close(fd);
  return ok;
}

Result<LoaderRun> MeasureLoader(const std::function<Result<Batch>()>& next, uint64_t max_samples,
                                const std::function<uint64_t()>& bytes_read) {
  LoaderRun run;
  const ProcessUsage before = GetProcessUsage();
  const uint64_t read_before = bytes_read();
  const auto start = Clock::now();
  while (max_samples == 0 || run.samples < max_samples) {
    auto b = next();
    if (!b.ok()) {
      if (b.status().code() == Code::kOutOfRange) break;
      return b.status();
    }
    if (run.batches == 0) {
      run.first_batch_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    }
    run.batches++;
    run.samples += b->size();
    for (const auto& c : b->bytes_columns()) run.bytes += c.data.size();
    for (const auto& c : b->image_columns()) run.bytes += c.data.size();
  }
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const ProcessUsage after = GetProcessUsage();
  // The user and kernel parts apart, then summed: the difference of the two
  // sums can come out a rounding step below the kernel part alone (seen:
  // 0.000992 of each, the kernel's the larger).
  run.kernel_cpu_seconds = after.kernel_cpu_seconds - before.kernel_cpu_seconds;
  const double user = (after.cpu_seconds - after.kernel_cpu_seconds) -
                      (before.cpu_seconds - before.kernel_cpu_seconds);
  run.cpu_seconds = std::max(0.0, user) + run.kernel_cpu_seconds;
  run.page_faults = after.page_faults - before.page_faults;
  run.peak_rss_bytes = after.peak_rss_bytes;
  run.bytes_read = bytes_read() - read_before;
  return run;
}

Result<TrainRun> EmulateTraining(const std::function<Result<Batch>()>& next,
                                 std::chrono::microseconds compute_per_step, uint64_t max_steps) {
  TrainRun run;
  const auto start = Clock::now();
  while (max_steps == 0 || run.steps < max_steps) {
    const auto t0 = Clock::now();
    auto b = next();
    run.wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    if (!b.ok()) {
      if (b.status().code() == Code::kOutOfRange) break;
      return b.status();
    }
    run.steps++;
    run.samples += b->size();
    // The accelerator's step: it holds no host CPU, so a sleep stands in.
    std::this_thread::sleep_for(compute_per_step);
    run.compute_seconds += std::chrono::duration<double>(compute_per_step).count();
  }
  run.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return run;
}

}  // namespace stoker
