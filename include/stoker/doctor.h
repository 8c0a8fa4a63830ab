// stoker doctor: the production checklist of a GPU-and-Ceph node, as one call.
//
// Each check reads what the node exposes (sysfs, procfs, system calls, NVML,
// a timed copy or read) and returns PASS, WARN, FAIL or SKIP with the
// evidence it read and a one-line fix. Checks run concurrently, each on its
// own thread under its own time limit: a check that does not finish in time
// is reported as FAIL naming itself, and the run goes on without it. The
// bandwidth checks (host-to-device copies, folder reads, Ceph round trips)
// run one after another, after the others, so that they do not measure each
// other; each repeats its measurement and reports the median and the spread.
//
// Every file is read through a NodeEnv, whose root prefixes each path ("/" on
// a live node), so that tests point the checks at fixture trees. What a live
// node gives through system calls or libraries (resource limits, the kernel's
// clock state, NVML, CUDA copies) a fixture root gives in files under
// ROOT/.stoker/ (see NewNodeEnv).
//
// Nothing here changes the node: no GPU setting, no sysctl, no file outside
// the folders given for read tests (a temporary file there, removed after).
//
// Thread safety: RunDoctor may be called from several threads at once. A
// NodeEnv must be safe for concurrent use (the checks share it).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker {

// ---- what a check returns ---------------------------------------------------

// Ordered by severity: the worst state of a run decides the exit status.
enum class CheckState : int { kPass = 0, kSkip = 1, kWarn = 2, kFail = 3 };

// "PASS", "SKIP", "WARN", "FAIL".
std::string_view CheckStateName(CheckState state);

struct CheckResult {
  std::string name;  // "kernel-version"
  CheckState state = CheckState::kSkip;
  // One line: what was found ("6.1.0-18-amd64: 5.15 or newer"), or for a
  // SKIP why the check could not run.
  std::string summary;
  // What it read, one item a line, each naming its source:
  // "/proc/sys/kernel/osrelease = 6.1.0-18-amd64", and what it could not
  // read ("cannot read /sys/...: Permission denied").
  std::vector<std::string> evidence;
  // One line saying how to fix a WARN or FAIL; empty otherwise.
  std::string fix;
  // Figures a program may compare ("median_gbps", "spread"), by name.
  std::map<std::string, double> metrics;
  double seconds = 0;      // wall time the check took (its limit if it timed out)
  bool timed_out = false;  // it did not finish within its limit (state kFail)
};

// ---- what the checks read -----------------------------------------------------

// A process's resource limit; kUnlimited for RLIM_INFINITY.
inline constexpr uint64_t kUnlimited = UINT64_MAX;
struct ResourceLimit {
  uint64_t soft = 0, hard = 0;
};
struct ProcessLimits {
  ResourceLimit memlock;  // bytes
  ResourceLimit nofile;   // open files
};

// The kernel's clock discipline (adjtimex).
struct ClockState {
  bool unsynchronized = true;  // STA_UNSYNC: no time service disciplines the clock
  int64_t max_error_us = 0;    // maxerror
  int64_t est_error_us = 0;    // esterror
  int64_t offset_us = 0;       // the last offset measured by the time service
};

// One GPU as NVML sees it. -1 means NVML could not say.
struct NvmlGpu {
  int index = 0;
  std::string name;
  std::string pci_bus_id;                  // "0000:19:00.0", lower case
  int persistence_mode = -1;               // 1 enabled
  int ecc_enabled = -1;                    // current mode, 1 enabled
  int64_t ecc_uncorrected_volatile = -1;   // since the driver loaded
  int64_t ecc_uncorrected_aggregate = -1;  // over the GPU's life
  int64_t ecc_corrected_volatile = -1;
  // 1 when a repair of bad memory (a row remap; a page retirement before
  // Ampere) waits for the next GPU reset.
  int pending_memory_repair = -1;
  // "DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED"; "" when unknown.
  std::string compute_mode;
};
struct NvmlReport {
  std::string driver_version;
  std::vector<NvmlGpu> gpus;
};

// One GPU as CUDA numbers it, for the copy measurements.
struct CudaGpu {
  int index = 0;
  std::string name;
  std::string pci_bus_id;  // lower case
};

// Where the checks get what they read. Paths are absolute as on a live node
// ("/sys/bus/pci/devices"); the implementation prefixes its root.
class NodeEnv {
 public:
  virtual ~NodeEnv() = default;
  // The root every path is read under; "/" for the live node.
  virtual const std::string& root() const = 0;
  // A whole file's text (sysfs and procfs files included). Errors name the
  // path as given (not the root) and map errno (EACCES: PermissionDenied).
  virtual Result<std::string> ReadFile(std::string_view path) const = 0;
  // The entries of a folder, sorted, without "." and "..".
  virtual Result<std::vector<std::string>> ListDir(std::string_view path) const = 0;
  // The target of a symbolic link, resolved to an absolute path as on the
  // node (not prefixed with the root); NotFound if it is not a link.
  virtual Result<std::string> RealPath(std::string_view path) const = 0;
  // The calling process's limits (live: getrlimit).
  virtual Result<ProcessLimits> Limits() const = 0;
  // The clock's state (live: adjtimex).
  virtual Result<ClockState> Clock() const = 0;
  // GPUs through NVML (live: libnvidia-ml.so.1 loaded at run time).
  // Unavailable when there is no driver, naming what failed.
  virtual Result<NvmlReport> Nvml() const = 0;
  // GPUs through CUDA (live: the runtime; Unsupported in a build without it).
  virtual Result<std::vector<CudaGpu>> CudaGpus() const = 0;
  // `runs` timed runs of pinned host-to-device copies (64 MiB each,
  // `bytes_per_run` in all per run) on `device`: each run's GB/s (1e9 bytes
  // per second), in order (live: BenchH2d).
  virtual Result<std::vector<double>> MeasureH2d(int device, uint64_t bytes_per_run,
                                                 uint32_t runs) const = 0;
};

// The NodeEnv of the node whose root is `root` ("/": the live node).
// For another root (a fixture tree, a copy of a node's /sys and /proc), what
// has no file comes from files under ROOT/.stoker/, each optional (absent:
// the check says it cannot know, and skips):
//   limits     from ROOT/proc/self/limits (the kernel's own format)
//   clock      ROOT/.stoker/adjtimex: "status 0x40", "maxerror 16000" lines
//              (STA_UNSYNC is 0x40), as `adjtimex --print` shows them
//   NVML       ROOT/.stoker/nvml.json: {"driver_version": "...", "gpus":
//              [{"index": 0, "name": ..., "pci_bus_id": ..., and the
//              NvmlGpu fields by name}]}
//   CUDA       ROOT/.stoker/cuda.json: {"gpus": [{"index", "name",
//              "pci_bus_id"}], "h2d_gbps": {"0": [run, run, ...]}}: the
//              runs MeasureH2d returns (the first `runs` of them)
std::shared_ptr<NodeEnv> NewNodeEnv(std::string root = "/");

// ---- the run --------------------------------------------------------------------

struct DoctorOptions;

// A check: reads through `env`, writes its verdict into `out` (whose name is
// already set). It may be abandoned at its time limit: it must own what it
// uses (the arguments stay valid until it returns, also when abandoned).
using CheckFn =
    std::function<void(const NodeEnv& env, const DoctorOptions& options, CheckResult* out)>;

struct CheckSpec {
  std::string name;         // kebab-case, unique
  std::string description;  // one line, for --help and --list
  // Measures bandwidth or latency: runs alone, after the others, with
  // DoctorOptions::bandwidth_timeout.
  bool exclusive = false;
  CheckFn run;
};

// The built-in checks, in report order.
const std::vector<CheckSpec>& DoctorChecks();

struct DoctorOptions {
  // Where files are read. Default: the live node ("/").
  std::string sysroot = "/";
  // Overrides sysroot when set (tests, other sources).
  std::shared_ptr<NodeEnv> env;
  // Check names to run; empty runs them all. An unknown name is
  // InvalidArgument listing the known ones.
  std::vector<std::string> only;
  // Time limit of each check. Default: 5 s (a sysfs read takes microseconds;
  // one that blocks points at a hung device or driver).
  std::chrono::milliseconds check_timeout{5000};
  // Time limit of each bandwidth check (all its repeats). Default: 20 s.
  std::chrono::milliseconds bandwidth_timeout{20000};

  // Host-to-device copies: timed runs per GPU, bytes per run and the floor.
  // Default: 5 runs of 256 MiB (about 5 ms each at 50 GB/s), 10 GB/s: the
  // production guides' floor for a PCIe 4/5 x16 GPU.
  uint32_t h2d_repeats = 5;
  uint64_t h2d_bytes = 256ull << 20;
  double min_h2d_gbps = 10;

  // Folders whose read throughput is measured (a temporary file written,
  // then read with O_DIRECT, repeatedly). Default: none (the checks skip).
  std::string cache_dir;
  std::string ckpt_dir;
  // Default: 64 MiB read 3 times: bounded, and past the drive's own cache.
  uint64_t dir_read_bytes = 64ull << 20;
  uint32_t dir_read_repeats = 3;
  // Below this the folder WARNs. Default: 500 MB/s (a SATA SSD's read; a
  // node cache on NVMe reads several GB/s).
  double min_dir_read_mbps = 500;

  // The cluster to reach: a rados:// URI (stoker's store syntax, with
  // ?conf=&id=&keyring=). Default: none (the check skips).
  std::string ceph_uri;
  // Stat round trips to time. Default: 5.
  uint32_t ceph_repeats = 5;
  // Above this the round trip WARNs. Default: 20 ms.
  double max_ceph_rtt_ms = 20;

  // SR-IOV capable NICs must have at least this many VFs. Default: 0 (none
  // needed; the check only reports).
  uint32_t min_vfs = 0;

  // More checks, run after the built-in ones (site checks; a test's hook).
  std::vector<CheckSpec> extra_checks;
};

struct DoctorReport {
  std::vector<CheckResult> checks;
  double seconds = 0;
  std::string root;
  // The worst state of the checks, SKIP counting as PASS.
  CheckState Worst() const;
  // 0 all PASS or SKIP, 1 a WARN, 2 a FAIL.
  int ExitCode() const;
};

// Runs the checks. InvalidArgument for an unknown name in `only`; every
// other problem is a check's verdict, never an error of the run.
Result<DoctorReport> RunDoctor(const DoctorOptions& options);

// The report as JSON (schema "stoker.doctor/1"): {"schema", "root",
// "seconds", "exit_code", "counts": {"PASS": n, ...}, "checks": [{"name",
// "state", "summary", "evidence": [..], "fix", "metrics": {..}, "seconds",
// "timed_out"}]}.
std::string DoctorReportJson(const DoctorReport& report);
// The report for a person: a line per check, its evidence and fix below.
std::string DoctorReportText(const DoctorReport& report, bool verbose);

// ---- what the node is, for the tuners -------------------------------------------

struct PciLink {
  double speed_gts = 0;  // GT/s per lane; 0 when not reported
  int width = 0;         // lanes; 0 when not reported
};

struct PciDevice {
  std::string address;  // "0000:19:00.0"
  uint32_t klass = 0;   // 0x030200
  uint16_t vendor = 0, device = 0;
  std::string kind;                      // "gpu", "nic" or "other"
  int numa_node = -1;                    // -1: the platform does not say
  PciLink current, max;                  // the device's link now and its capability
  PciLink upstream_max;                  // the port above it, when found
  int sriov_total = -1, sriov_num = -1;  // -1: not SR-IOV capable
  bool virtual_function = false;
  int aspm_l0s = -1, aspm_l1 = -1;  // link/l0s_aspm, link/l1_aspm; -1 unknown
};

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;
  uint64_t mem_total = 0;  // bytes
};

struct NodeFacts {
  std::vector<NumaNode> numa;
  std::vector<PciDevice> gpus, nics;
  int online_cpus = 0;
  uint64_t mem_total = 0;
  std::string kernel;
  std::string thp;  // "always", "madvise", "never", "" unknown
  ProcessLimits limits;
  bool limits_known = false;
  // What could not be read, for the record.
  std::vector<std::string> unreadable;
};

// What the doctor's checks see of the node, in one structure.
NodeFacts GatherNodeFacts(const NodeEnv& env);

}  // namespace stoker
