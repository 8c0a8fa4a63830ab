// The benchmark loop of `stoker bench comm` (comm.h): meet, compare
// arguments, then for each operation, dtype and size: warm up, check every
// element, time the iterations, and agree with every rank on the outcome.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "comm/backend.h"
#include "comm/bootstrap.h"
#include "comm/values.h"
#include "stoker/topo.h"

extern char** environ;

namespace stoker {

namespace {

constexpr CommOp kOps[] = {CommOp::kAllReduce, CommOp::kAllGather, CommOp::kReduceScatter,
                           CommOp::kBroadcast, CommOp::kAllToAll,  CommOp::kSendRecv};
constexpr const char* kOpNames[] = {"allreduce", "allgather", "reducescatter",
                                    "broadcast", "alltoall",  "sendrecv"};
constexpr CommDtype kDtypes[] = {CommDtype::kFloat32, CommDtype::kBFloat16, CommDtype::kFloat16,
                                 CommDtype::kInt32};
constexpr const char* kDtypeNames[] = {"float32", "bfloat16", "float16", "int32"};

}  // namespace

std::string_view CommOpName(CommOp op) { return kOpNames[static_cast<int>(op)]; }
std::string_view CommDtypeName(CommDtype d) { return kDtypeNames[static_cast<int>(d)]; }

Result<CommOp> ParseCommOp(std::string_view name) {
  for (CommOp op : kOps) {
    if (CommOpName(op) == name) return op;
  }
  return InvalidArgument("no operation '" + std::string(name) +
                         "' (allreduce, allgather, reducescatter, broadcast, alltoall, sendrecv)");
}

Result<CommDtype> ParseCommDtype(std::string_view name) {
  for (CommDtype d : kDtypes) {
    if (CommDtypeName(d) == name) return d;
  }
  return InvalidArgument("no dtype '" + std::string(name) +
                         "' (float32, bfloat16, float16, int32)");
}

size_t CommDtypeSize(CommDtype d) {
  return d == CommDtype::kBFloat16 || d == CommDtype::kFloat16 ? 2 : 4;
}

const std::vector<CommOp>& AllCommOps() {
  static const std::vector<CommOp> v(std::begin(kOps), std::end(kOps));
  return v;
}

const std::vector<CommDtype>& AllCommDtypes() {
  static const std::vector<CommDtype> v(std::begin(kDtypes), std::end(kDtypes));
  return v;
}

double BusBandwidthFactor(CommOp op, int n) {
  switch (op) {
    case CommOp::kAllReduce:
      return 2.0 * (n - 1) / n;
    case CommOp::kAllGather:
    case CommOp::kReduceScatter:
    case CommOp::kAllToAll:
      return double(n - 1) / n;
    case CommOp::kBroadcast:
    case CommOp::kSendRecv:
      return 1;
  }
  return 1;
}

std::vector<uint64_t> CommSizes(const CommBenchOptions& o) {
  std::vector<uint64_t> sizes;
  for (double s = double(o.min_bytes); s <= double(o.max_bytes) * (1 + 1e-9); s *= o.step_factor) {
    sizes.push_back(static_cast<uint64_t>(std::llround(s)));
    if (o.step_factor <= 1) break;
  }
  if (sizes.empty() || sizes.back() != o.max_bytes) sizes.push_back(o.max_bytes);
  return sizes;
}

namespace comm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kBeatPrefix = "stoker-comm-";  // heartbeat files in /dev/shm

// Reports a stall, once, when nothing has progressed for the timeout
// (comm.h): a rank blocked in a collective whose peer died cannot be woken,
// so the caller's on_stall decides (the CLI exits).
//
// To name the culprit, the ranks of a node keep heartbeats in /dev/shm
// (Heartbeats()): this thread rewrites its rank's file every 200 ms with the
// number of phases it has begun. When time runs out, a rank whose file has
// not changed for a second is stopped or dead; a rank with fewer phases is
// behind (stuck before the collective the others wait in).
class Watchdog final {
 public:
  Watchdog(double timeout_s, int rank, std::function<void(const Status&)> on_stall)
      : timeout_(std::chrono::milliseconds(int64_t(timeout_s * 1000))),
        rank_(rank),
        on_stall_(std::move(on_stall)) {
    thread_ = std::thread([this] { Watch(); });
  }
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    if (!beat_dir_.empty()) std::remove(BeatFile(rank_).c_str());
  }
  // A new phase ("timing allreduce float32 1024 B").
  void Progress(std::string what) {
    std::lock_guard lock(mu_);
    what_ = std::move(what);
    last_ = Clock::now();
    ticks_seen_ = ticks_.load(std::memory_order_relaxed);
    ++phases_;
    Beat();
  }
  // Progress within a phase; cheap enough for a timed loop (no lock).
  void Tick() { ticks_.fetch_add(1, std::memory_order_relaxed); }
  // The TimedOut reported, if the watchdog fired (OK if not).
  Status stalled() {
    std::lock_guard lock(mu_);
    return stalled_;
  }
  // Starts heartbeats under `prefix` (the same on every rank of the job).
  void Heartbeats(const std::string& prefix, int size) {
    RemoveStale(std::filesystem::path(prefix).parent_path());
    std::lock_guard lock(mu_);
    beat_dir_ = prefix;
    size_ = size;
    Beat();
  }

 private:
  std::string BeatFile(int rank) const { return beat_dir_ + "-" + std::to_string(rank); }

  // Heartbeat files that ended jobs left behind (a rank killed, or ended by
  // its launcher, removes nothing). A live rank rewrites its file every
  // 200 ms, even while it hangs, so one untouched for 10 minutes belongs to
  // no running rank. Another user's files are not ours to remove (the sticky
  // /dev/shm refuses; ignored).
  static void RemoveStale(const std::filesystem::path& dir) {
    namespace fs = std::filesystem;
    constexpr auto kStale = std::chrono::minutes(10);
    const auto now = fs::file_time_type::clock::now();
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().filename().string().rfind(kBeatPrefix, 0) != 0) continue;
      std::error_code e;
      const auto when = fs::last_write_time(it->path(), e);
      if (!e && now - when > kStale) fs::remove(it->path(), e);
    }
  }

  void Beat() {
    if (beat_dir_.empty()) return;
    if (FILE* f = std::fopen(BeatFile(rank_).c_str(), "w")) {
      std::fprintf(f, "%llu\n", static_cast<unsigned long long>(phases_));
      std::fclose(f);
    }
  }

  // "rank 2 (no heartbeat for 4 s: stopped or dead); rank 3 (behind: phase
  // 10 of 12)", from the node's heartbeat files.
  std::string Suspects() const {
    if (beat_dir_.empty()) return "";
    std::string out;
    const auto now = std::filesystem::file_time_type::clock::now();
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      std::error_code ec;
      const auto when = std::filesystem::last_write_time(BeatFile(r), ec);
      if (ec) continue;  // another node's rank, or gone
      const double age = std::chrono::duration<double>(now - when).count();
      unsigned long long phases = 0;
      if (FILE* f = std::fopen(BeatFile(r).c_str(), "r")) {
        if (std::fscanf(f, "%llu", &phases) != 1) phases = 0;
        std::fclose(f);
      }
      char line[160] = "";
      if (age > 1.0) {
        std::snprintf(line, sizeof line, "rank %d (no heartbeat for %.0f s: stopped or dead)", r,
                      age);
      } else if (phases < phases_) {
        std::snprintf(line, sizeof line, "rank %d (behind: phase %llu of this rank's %llu)", r,
                      phases, static_cast<unsigned long long>(phases_));
      }
      if (*line) out += (out.empty() ? "" : "; ") + std::string(line);
    }
    return out;
  }

  void Watch() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(200));
      Beat();
      const uint64_t ticks = ticks_.load(std::memory_order_relaxed);
      if (ticks != ticks_seen_) {
        ticks_seen_ = ticks;
        last_ = Clock::now();
      }
      // While the ranks meet, the bootstrap keeps its own deadline of the
      // same length and names the ranks that never came; the watchdog only
      // backs it up, so it waits a little longer there.
      const Clock::duration limit = phases_ == 0 ? timeout_ + std::chrono::seconds(2) : timeout_;
      if (stop_ || Clock::now() - last_ < limit) continue;
      const std::string suspects = Suspects();
      if (!beat_dir_.empty()) std::remove(BeatFile(rank_).c_str());
      char took[32];
      std::snprintf(took, sizeof took, "%.0f", std::chrono::duration<double>(limit).count());
      stalled_ = TimedOut("rank " + std::to_string(rank_) + ": no progress for " + took +
                          " s while " + what_ + ": " +
                          (suspects.empty() ? "another rank died or hangs (the launcher's message "
                                              "names a rank that exited)"
                                            : "on this node: " + suspects) +
                          "; giving up");
      // Once: the rank is stuck where no later progress can come from.
      const Status report = stalled_;
      lock.unlock();
      if (on_stall_) {
        on_stall_(report);
      } else {
        std::fprintf(stderr, "stoker: %s\n", report.ToString().c_str());
        std::fflush(stderr);
      }
      return;
    }
  }

  const Clock::duration timeout_;
  const int rank_;
  const std::function<void(const Status&)> on_stall_;
  std::mutex mu_;
  Status stalled_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string what_ = "meeting the other ranks";
  std::atomic<uint64_t> ticks_{0};
  uint64_t ticks_seen_ = 0;
  uint64_t phases_ = 0;
  std::string beat_dir_;
  int size_ = 0;
  Clock::time_point last_ = Clock::now();
  std::thread thread_;
};

std::string Summary(const CommBenchOptions& o) {
  std::ostringstream s;
  s << "--backend " << o.backend << " --ops ";
  for (size_t i = 0; i < o.ops.size(); ++i) s << (i ? "," : "") << CommOpName(o.ops[i]);
  s << " --dtypes ";
  for (size_t i = 0; i < o.dtypes.size(); ++i) s << (i ? "," : "") << CommDtypeName(o.dtypes[i]);
  s << " --min " << o.min_bytes << " --max " << o.max_bytes << " --step " << o.step_factor
    << " --warmup " << o.warmup << " --iters " << o.iters;
  return s.str();
}

// "--a 1 --b 2" -> {"--a 1", "--b 2"}: options with their values.
std::vector<std::string> OptionPairs(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string word;
  while (in >> word) {
    if (word.rfind("--", 0) == 0 || out.empty()) {
      out.push_back(word);
    } else {
      out.back() += " " + word;
    }
  }
  return out;
}

Status CheckArguments(Bootstrap& boot, const std::string& mine) {
  STOKER_ASSIGN_OR_RETURN(auto all, boot.AllGather(mine));
  const auto base = OptionPairs(all[0]);
  std::string diff;
  for (int r = 1; r < boot.size(); ++r) {
    if (all[r] == all[0]) continue;
    const auto pairs = OptionPairs(all[r]);
    std::string what;
    for (size_t i = 0; i < std::max(pairs.size(), base.size()); ++i) {
      const std::string a = i < base.size() ? base[i] : "(none)";
      const std::string b = i < pairs.size() ? pairs[i] : "(none)";
      if (a != b) what += (what.empty() ? "" : ", ") + b + " (rank 0: " + a + ")";
    }
    diff += "; rank " + std::to_string(r) + ": " + what;
  }
  if (diff.empty()) return Status::Ok();
  return InvalidArgument("arguments differ across ranks" + diff);
}

// Elements in the API call's count, and in the output buffer.
uint64_t CallCount(CommOp op, uint64_t bytes, size_t elem, int n) {
  switch (op) {
    case CommOp::kAllGather:
    case CommOp::kReduceScatter:
    case CommOp::kAllToAll:
      return bytes / (elem * n);
    default:
      return bytes / elem;
  }
}
uint64_t OutputCount(CommOp op, uint64_t count, int n) {
  return op == CommOp::kAllGather || op == CommOp::kAllToAll ? count * n : count;
}
// nccl-tests' size of an operation of `count` elements (comm.h).
uint64_t SizeOf(CommOp op, uint64_t count, size_t elem, int n) {
  const bool per_rank =
      op == CommOp::kAllGather || op == CommOp::kReduceScatter || op == CommOp::kAllToAll;
  return count * elem * (per_rank ? n : 1);
}

double Expected(CommOp op, uint64_t k, uint64_t c, int rank, int n, int range) {
  double sum = 0;
  switch (op) {
    case CommOp::kAllReduce:
      for (int r = 0; r < n; ++r) sum += InputValue(r, k, range);
      return sum;
    case CommOp::kAllGather:
      return InputValue(int(k / c), k % c, range);
    case CommOp::kReduceScatter:
      for (int r = 0; r < n; ++r) sum += InputValue(r, uint64_t(rank) * c + k, range);
      return sum;
    case CommOp::kBroadcast:
      return InputValue(0, k, range);
    case CommOp::kAllToAll:
      return InputValue(int(k / c), uint64_t(rank) * c + k % c, range);
    case CommOp::kSendRecv:
      return InputValue((rank + n - 1) % n, k, range);
  }
  return 0;
}

std::string SizeName(uint64_t bytes) { return std::to_string(bytes) + " B"; }

Status CheckOutput(CommOp op, CommDtype dtype, uint64_t count, const std::vector<std::byte>& out,
                   int rank, int n) {
  const int range = ValueRange(dtype, n);
  const uint64_t total = OutputCount(op, count, n);
  for (uint64_t k = 0; k < total; ++k) {
    const double want = Expected(op, k, count, rank, n, range);
    const double got = Load(dtype, out.data(), k);
    if (got != want) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "got %g, expected %g", got, want);
      return Corruption("rank " + std::to_string(rank) + ": " + std::string(CommOpName(op)) + " " +
                        std::string(CommDtypeName(dtype)) + " " +
                        SizeName(SizeOf(op, count, CommDtypeSize(dtype), n)) + ": element " +
                        std::to_string(k) + " of " + std::to_string(total) + ": " + buf);
    }
  }
  return Status::Ok();
}

std::map<std::string, std::string> InterestingVariables() {
  static const char* kPrefixes[] = {"NCCL_",
                                    "OMPI_MCA_",
                                    "UCX_",
                                    "PMIX_MCA_",
                                    "STOKER_COMM_",
                                    "CUDA_VISIBLE_DEVICES",
                                    "CUDA_DEVICE_ORDER"};
  // What mpirun sets for its own plumbing (job ids, URIs, session folders),
  // not settings anyone chose.
  static const char* kPlumbing[] = {"OMPI_MCA_orte_",
                                    "OMPI_MCA_ess",
                                    "OMPI_MCA_pmix",
                                    "OMPI_MCA_initial_wdir",
                                    "OMPI_MCA_shmem_RUNTIME_QUERY_hint",
                                    "PMIX_MCA_psec",
                                    "PMIX_MCA_mca_base_component_show"};
  auto starts = [](const std::string& s, const char* p) { return s.rfind(p, 0) == 0; };
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = kv.substr(0, eq);
    bool keep = false;
    for (const char* p : kPrefixes) keep = keep || starts(name, p);
    for (const char* p : kPlumbing) keep = keep && !starts(name, p);
    if (keep) vars[name] = kv.substr(eq + 1);
  }
  return vars;
}

Status Validate(const CommBenchOptions& o) {
  if (o.backend != "mpi" && o.backend != "nccl") {
    return InvalidArgument("--backend: '" + o.backend + "' is neither mpi nor nccl");
  }
  if (o.ops.empty() || o.dtypes.empty()) return InvalidArgument("no operation or no dtype to run");
  if (o.min_bytes == 0 || o.max_bytes < o.min_bytes) {
    return InvalidArgument("--min " + std::to_string(o.min_bytes) + " and --max " +
                           std::to_string(o.max_bytes) + ": need 0 < min <= max");
  }
  if (o.max_bytes > (uint64_t{8} << 30)) return InvalidArgument("--max is above 8 GiB");
  if (!(o.step_factor > 1) && o.min_bytes != o.max_bytes) {
    return InvalidArgument("--step must be above 1");
  }
  if (o.iters < 1 || o.warmup < 0) return InvalidArgument("--iters must be >= 1, --warmup >= 0");
  if (!(o.timeout_s > 0)) return InvalidArgument("--timeout must be positive");
  return Status::Ok();
}

}  // namespace

Status AgreeOnStatus(Bootstrap& boot, const Status& mine) {
  std::string text = mine.ok() ? "" : std::to_string(int(mine.code())) + ":" + mine.message();
  STOKER_ASSIGN_OR_RETURN(auto all, boot.AllGather(text));
  for (const auto& s : all) {
    if (s.empty()) continue;
    const auto colon = s.find(':');
    return Status(static_cast<Code>(std::atoi(s.substr(0, colon).c_str())), s.substr(colon + 1));
  }
  return Status::Ok();
}

Result<CommReport> RunBench(const CommBenchOptions& o, const BackendDecorator& decorate) {
  STOKER_RETURN_IF_ERROR(Validate(o));
  CommReport report;
  STOKER_ASSIGN_OR_RETURN(report.rank, DiscoverRank());
  const RankInfo& me = report.rank;
  if (!me.launched()) {
    return InvalidArgument(std::string("stoker bench comm runs one process per rank: ") +
                           kLaunchHint);
  }
  Watchdog dog(o.timeout_s, me.rank, o.on_stall);
  STOKER_ASSIGN_OR_RETURN(auto boot, MakeBootstrap(me, o.timeout_s));
  const int n = boot->size();
  const int rank = boot->rank();
  dog.Progress("comparing arguments");
  {
    // Rank 0 names the heartbeat files (comm.h's watchdog), unique per job.
    std::string token = std::to_string(std::random_device{}()) + std::to_string(getpid());
    STOKER_ASSIGN_OR_RETURN(auto tokens, boot->AllGather(rank == 0 ? token : ""));
    if (std::filesystem::is_directory("/dev/shm")) {
      dog.Heartbeats(std::string("/dev/shm/") + kBeatPrefix + tokens[0], n);
    }
  }
  STOKER_RETURN_IF_ERROR(CheckArguments(*boot, o.arguments.empty() ? Summary(o) : o.arguments));

  dog.Progress("setting up the " + o.backend + " backend");
  Result<std::unique_ptr<CollectiveBackend>> made =
      o.backend == "mpi" ? MakeMpiBackend(*boot) : MakeNcclBackend(*boot, me);
  STOKER_RETURN_IF_ERROR(AgreeOnStatus(*boot, made.status()));
  std::unique_ptr<CollectiveBackend> wrapped = std::move(*made);
  if (decorate) wrapped = decorate(std::move(wrapped), rank, n);
  CollectiveBackend& backend = *wrapped;

  report.environment.backend = o.backend;
  report.environment.library_version = backend.version();
  report.environment.bootstrap = boot->description();
  report.environment.variables = InterestingVariables();
  {
    auto topo = LoadTopology();
    RankBinding mine = CurrentBinding(topo.ok() ? &*topo : nullptr, me, backend.device());
    STOKER_ASSIGN_OR_RETURN(auto all, boot->AllGather(EncodeBinding(mine)));
    for (const auto& s : all) report.bindings.push_back(DecodeBinding(s));
  }

  const std::vector<uint64_t> sizes = CommSizes(o);
  STOKER_RETURN_IF_ERROR(AgreeOnStatus(*boot, backend.Allocate(o.max_bytes)));
  std::vector<std::byte> host(o.max_bytes);

  for (CommDtype dtype : o.dtypes) {
    const size_t elem = CommDtypeSize(dtype);
    const int range = ValueRange(dtype, n);
    // Every operation's input is element i = InputValue(rank, i): one
    // upload per dtype serves them all (comm.h).
    dog.Progress("filling the input");
    for (uint64_t i = 0; i < o.max_bytes / elem; ++i) {
      Store(dtype, host.data(), i, InputValue(rank, i, range));
    }
    STOKER_RETURN_IF_ERROR(AgreeOnStatus(*boot, backend.Upload(host.data(), o.max_bytes)));
    for (CommOp op : o.ops) {
      uint64_t last_count = 0;
      for (uint64_t bytes : sizes) {
        const uint64_t count = CallCount(op, bytes, elem, n);
        if (count == 0 || count == last_count) continue;
        last_count = count;
        const uint64_t real_bytes = SizeOf(op, count, elem, n);
        const std::string what = std::string(CommOpName(op)) + " " +
                                 std::string(CommDtypeName(dtype)) + " " + SizeName(real_bytes);
        const uint64_t out_bytes = OutputCount(op, count, n) * elem;
        dog.Progress("warming up " + what);
        Status st = backend.ClearOutput(out_bytes);
        for (int i = 0; st.ok() && i < std::max(o.warmup, 1); ++i)
          st = backend.Run(op, dtype, count);
        if (st.ok()) st = backend.Wait();
        dog.Progress("checking " + what);
        if (st.ok()) st = backend.Download(host.data(), out_bytes);
        if (st.ok()) st = CheckOutput(op, dtype, count, host, rank, n);
        STOKER_RETURN_IF_ERROR(AgreeOnStatus(*boot, st).WithContext("bench comm"));
        // Timed: start together (an exchange), then `iters` back to back.
        dog.Progress("timing " + what);
        STOKER_RETURN_IF_ERROR(boot->AllGather("").status());
        const auto t0 = Clock::now();
        for (int i = 0; st.ok() && i < o.iters; ++i) {
          st = backend.Run(op, dtype, count);
          dog.Tick();
        }
        if (st.ok()) st = backend.Wait();
        const double us =
            std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / o.iters;
        STOKER_RETURN_IF_ERROR(AgreeOnStatus(*boot, st));
        STOKER_ASSIGN_OR_RETURN(auto times, boot->AllGather(std::to_string(us)));
        CommResult r;
        r.op = op;
        r.dtype = dtype;
        r.bytes = real_bytes;
        r.count = count;
        r.algorithm = backend.Algorithm(op, dtype, count);
        for (const auto& t : times) {
          const double v = std::atof(t.c_str());
          r.time_us += v / n;
          r.max_time_us = std::max(r.max_time_us, v);
        }
        r.algbw_gbps = r.time_us > 0 ? double(real_bytes) / r.time_us / 1e3 : 0;
        r.busbw_gbps = r.algbw_gbps * BusBandwidthFactor(op, n);
        report.results.push_back(r);
      }
    }
  }
  // A stall the collectives came back from is still a failure.
  STOKER_RETURN_IF_ERROR(dog.stalled());
  return report;
}

}  // namespace comm

Result<CommReport> RunCommBench(const CommBenchOptions& options) {
  return comm::RunBench(options, nullptr);
}

}  // namespace stoker
