// The NodeEnv of a root folder: files under the root; limits, the clock, NVML
// and CUDA from the system on the live node ("/"), from files under
// ROOT/.stoker/ elsewhere (doctor.h says which).
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/timex.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "doctor/internal.h"
#include "gpu/h2d_bench.h"
#include "stoker/gpu.h"

namespace stoker {
namespace {

// ---- NVML, loaded at run time ------------------------------------------------

// The few NVML entry points the checks use, declared here so that the build
// needs no NVML header and the binary no NVML library: a node without the
// driver gets "no NVML", not a loader error.
using NvmlDevice = void*;
struct NvmlApi {
  int (*init)();
  int (*shutdown)();
  const char* (*error_string)(int);
  int (*driver_version)(char*, unsigned);
  int (*count)(unsigned*);
  int (*handle)(unsigned, NvmlDevice*);
  int (*name)(NvmlDevice, char*, unsigned);
  int (*pci_info)(NvmlDevice, void*);
  int (*persistence)(NvmlDevice, int*);
  int (*ecc_mode)(NvmlDevice, int*, int*);
  int (*ecc_total)(NvmlDevice, int, int, unsigned long long*);
  int (*remapped_rows)(NvmlDevice, unsigned*, unsigned*, unsigned*, unsigned*);
  int (*retired_pending)(NvmlDevice, int*);
  int (*compute_mode)(NvmlDevice, int*);
};

// nvmlPciInfo_t (v3): busIdLegacy[16], domain, bus, device, pciDeviceId,
// pciSubSystemId, busId[32]. Oversized, in case a later driver grows it.
struct NvmlPciInfo {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
  char reserved[256];
};

// "00000000:19:00.0" -> "0000:19:00.0", lower case: sysfs's spelling.
std::string NormalizeBusId(std::string id) {
  std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return std::tolower(c); });
  const auto colon = id.find(':');
  if (colon != std::string::npos && colon > 4) id = id.substr(colon - 4);
  return id;
}

Result<NvmlReport> LoadNvml() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    return Unavailable(std::string("no NVML: dlopen(libnvidia-ml.so.1): ") +
                       (err ? err : "not found") + " (no NVIDIA driver on this node)");
  }
  // The library stays loaded: NVML keeps threads and state past shutdown on
  // some drivers, and unloading it under them is how processes crash.
  NvmlApi api{};
  auto sym = [&](const char* name) { return dlsym(lib, name); };
  api.init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
  api.shutdown = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
  api.error_string = reinterpret_cast<const char* (*)(int)>(sym("nvmlErrorString"));
  api.driver_version =
      reinterpret_cast<int (*)(char*, unsigned)>(sym("nvmlSystemGetDriverVersion"));
  api.count = reinterpret_cast<int (*)(unsigned*)>(sym("nvmlDeviceGetCount_v2"));
  api.handle =
      reinterpret_cast<int (*)(unsigned, NvmlDevice*)>(sym("nvmlDeviceGetHandleByIndex_v2"));
  api.name = reinterpret_cast<int (*)(NvmlDevice, char*, unsigned)>(sym("nvmlDeviceGetName"));
  api.pci_info = reinterpret_cast<int (*)(NvmlDevice, void*)>(sym("nvmlDeviceGetPciInfo_v3"));
  api.persistence =
      reinterpret_cast<int (*)(NvmlDevice, int*)>(sym("nvmlDeviceGetPersistenceMode"));
  api.ecc_mode = reinterpret_cast<int (*)(NvmlDevice, int*, int*)>(sym("nvmlDeviceGetEccMode"));
  api.ecc_total = reinterpret_cast<int (*)(NvmlDevice, int, int, unsigned long long*)>(
      sym("nvmlDeviceGetTotalEccErrors"));
  api.remapped_rows =
      reinterpret_cast<int (*)(NvmlDevice, unsigned*, unsigned*, unsigned*, unsigned*)>(
          sym("nvmlDeviceGetRemappedRows"));
  api.retired_pending =
      reinterpret_cast<int (*)(NvmlDevice, int*)>(sym("nvmlDeviceGetRetiredPagesPendingStatus"));
  api.compute_mode = reinterpret_cast<int (*)(NvmlDevice, int*)>(sym("nvmlDeviceGetComputeMode"));
  if (!api.init || !api.shutdown || !api.count || !api.handle) {
    return Unavailable("NVML: libnvidia-ml.so.1 lacks nvmlInit_v2/nvmlDeviceGetCount_v2");
  }
  auto err = [&](int rc) {
    return std::string(api.error_string ? api.error_string(rc) : "error") + " (" +
           std::to_string(rc) + ")";
  };
  if (int rc = api.init(); rc != 0) return Unavailable("nvmlInit_v2: " + err(rc));
  NvmlReport report;
  char buf[128] = {};
  if (api.driver_version && api.driver_version(buf, sizeof buf) == 0) report.driver_version = buf;
  unsigned count = 0;
  if (int rc = api.count(&count); rc != 0) {
    api.shutdown();
    return Unavailable("nvmlDeviceGetCount_v2: " + err(rc));
  }
  for (unsigned i = 0; i < count; ++i) {
    NvmlDevice dev = nullptr;
    NvmlGpu g;
    g.index = static_cast<int>(i);
    if (api.handle(i, &dev) != 0) continue;
    if (api.name && api.name(dev, buf, sizeof buf) == 0) g.name = buf;
    NvmlPciInfo pci{};
    if (api.pci_info && api.pci_info(dev, &pci) == 0) {
      pci.bus_id[sizeof pci.bus_id - 1] = 0;
      g.pci_bus_id = NormalizeBusId(pci.bus_id);
    }
    int v = 0, pending = 0;
    if (api.persistence && api.persistence(dev, &v) == 0) g.persistence_mode = v;
    if (api.ecc_mode && api.ecc_mode(dev, &v, &pending) == 0) g.ecc_enabled = v;
    unsigned long long n = 0;
    // errorType 1 = uncorrected, 0 = corrected; counterType 0 = volatile, 1 = aggregate.
    if (api.ecc_total && api.ecc_total(dev, 1, 0, &n) == 0) g.ecc_uncorrected_volatile = int64_t(n);
    if (api.ecc_total && api.ecc_total(dev, 1, 1, &n) == 0)
      g.ecc_uncorrected_aggregate = int64_t(n);
    if (api.ecc_total && api.ecc_total(dev, 0, 0, &n) == 0) g.ecc_corrected_volatile = int64_t(n);
    unsigned corr = 0, unc = 0, is_pending = 0, failed = 0;
    if (api.remapped_rows && api.remapped_rows(dev, &corr, &unc, &is_pending, &failed) == 0) {
      g.pending_memory_repair = is_pending ? 1 : 0;
    } else if (api.retired_pending && api.retired_pending(dev, &v) == 0) {
      g.pending_memory_repair = v ? 1 : 0;
    }
    // 0 DEFAULT, 1 EXCLUSIVE_THREAD (gone since CUDA 8), 2 PROHIBITED, 3 EXCLUSIVE_PROCESS.
    if (api.compute_mode && api.compute_mode(dev, &v) == 0) {
      static const char* kModes[] = {"DEFAULT", "EXCLUSIVE_THREAD", "PROHIBITED",
                                     "EXCLUSIVE_PROCESS"};
      g.compute_mode = v >= 0 && v < 4 ? kModes[v] : std::to_string(v);
    }
    report.gpus.push_back(std::move(g));
  }
  api.shutdown();
  return report;
}

// ---- the env ---------------------------------------------------------------

class RootNodeEnv final : public NodeEnv {
 public:
  explicit RootNodeEnv(std::string root) : root_(std::move(root)) {
    while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
    if (root_.empty()) root_ = "/";
    live_ = root_ == "/";
  }

  const std::string& root() const override { return root_; }

  Result<std::string> ReadFile(std::string_view path) const override {
    const std::string full = Full(path);
    const int fd = ::open(full.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return ErrnoToStatus(errno, "open " + std::string(path));
    std::string text;
    char buf[8192];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        ::close(fd);
        return ErrnoToStatus(e, "read " + std::string(path));
      }
      if (n == 0) break;
      text.append(buf, size_t(n));
      // sysfs and procfs files are small; a large one is not what a check
      // meant to read.
      if (text.size() > (4u << 20)) break;
    }
    ::close(fd);
    return text;
  }

  Result<std::vector<std::string>> ListDir(std::string_view path) const override {
    const std::string full = Full(path);
    DIR* d = ::opendir(full.c_str());
    if (d == nullptr) return ErrnoToStatus(errno, "opendir " + std::string(path));
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }

  Result<std::string> RealPath(std::string_view path) const override {
    const std::string full = Full(path);
    char buf[PATH_MAX];
    if (::realpath(full.c_str(), buf) == nullptr) {
      return ErrnoToStatus(errno, "realpath " + std::string(path));
    }
    std::string r = buf;
    if (live_) return r;
    char root_buf[PATH_MAX];
    const std::string real_root = ::realpath(root_.c_str(), root_buf) ? root_buf : root_;
    if (r.compare(0, real_root.size(), real_root) != 0) {
      return InvalidArgument("realpath " + std::string(path) + ": leaves the root " + root_);
    }
    r = r.substr(real_root.size());
    return r.empty() ? "/" : r;
  }

  Result<ProcessLimits> Limits() const override {
    if (!live_) {
      STOKER_ASSIGN_OR_RETURN(std::string text, ReadFile("/proc/self/limits"));
      return doctor::ParseLimitsFile(text);
    }
    ProcessLimits l;
    auto get = [](int resource, ResourceLimit* out) -> Status {
      rlimit r{};
      if (::getrlimit(resource, &r) != 0) return ErrnoToStatus(errno, "getrlimit");
      out->soft = r.rlim_cur == RLIM_INFINITY ? kUnlimited : uint64_t(r.rlim_cur);
      out->hard = r.rlim_max == RLIM_INFINITY ? kUnlimited : uint64_t(r.rlim_max);
      return Status::Ok();
    };
    STOKER_RETURN_IF_ERROR(get(RLIMIT_MEMLOCK, &l.memlock));
    STOKER_RETURN_IF_ERROR(get(RLIMIT_NOFILE, &l.nofile));
    return l;
  }

  Result<ClockState> Clock() const override {
    ClockState c;
    if (!live_) {
      STOKER_ASSIGN_OR_RETURN(std::string text, ReadFile("/.stoker/adjtimex"));
      bool have_status = false;
      for (const std::string& line : doctor::SplitLines(text)) {
        const auto sp = line.find_first_of(" \t=:");
        if (sp == std::string::npos) continue;
        const std::string key = line.substr(0, sp);
        const std::string value = doctor::Trim(line.substr(sp + 1));
        const long long v = std::strtoll(value.c_str(), nullptr, 0);
        if (key == "status") {
          c.unsynchronized = (v & STA_UNSYNC) != 0;
          have_status = true;
        }
        if (key == "maxerror") c.max_error_us = v;
        if (key == "esterror") c.est_error_us = v;
        if (key == "offset") c.offset_us = v;
      }
      if (!have_status) return InvalidArgument("/.stoker/adjtimex: no 'status' line");
      return c;
    }
    timex tx{};  // modes 0: only reads, allowed to anyone
    const int state = ::adjtimex(&tx);
    if (state < 0) return ErrnoToStatus(errno, "adjtimex");
    c.unsynchronized = (tx.status & STA_UNSYNC) != 0 || state == TIME_ERROR;
    c.max_error_us = tx.maxerror;
    c.est_error_us = tx.esterror;
    c.offset_us = (tx.status & STA_NANO) ? tx.offset / 1000 : tx.offset;
    return c;
  }

  Result<NvmlReport> Nvml() const override {
    std::call_once(nvml_once_, [this] { nvml_ = live_ ? LoadNvml() : NvmlFromFile(); });
    return *nvml_;
  }

  Result<std::vector<CudaGpu>> CudaGpus() const override {
    if (!live_) {
      STOKER_ASSIGN_OR_RETURN(nlohmann::json j, Json("/.stoker/cuda.json"));
      std::vector<CudaGpu> gpus;
      for (const auto& g : j.value("gpus", nlohmann::json::array())) {
        gpus.push_back({g.value("index", 0), g.value("name", ""), g.value("pci_bus_id", "")});
      }
      return gpus;
    }
    if (!BuiltWithCuda()) return Unsupported("this stoker was built without CUDA");
    std::vector<CudaGpu> gpus;
    for (int i = 0;; ++i) {
      auto d = GetCudaDevice(i);
      if (!d.ok()) {
        // InvalidArgument: past the last device. Anything else at 0: no GPU.
        if (i > 0 && d.status().code() == Code::kInvalidArgument) break;
        if (i == 0) return d.status();
        break;
      }
      std::string bus = d->pci_bus_id;
      std::transform(bus.begin(), bus.end(), bus.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      gpus.push_back({i, d->name, bus});
    }
    return gpus;
  }

  Result<std::vector<double>> MeasureH2d(int device, uint64_t bytes_per_run,
                                         uint32_t runs) const override {
    if (!live_) {
      STOKER_ASSIGN_OR_RETURN(nlohmann::json j, Json("/.stoker/cuda.json"));
      const auto all = j.value("h2d_gbps", nlohmann::json::object());
      const std::string key = std::to_string(device);
      if (!all.contains(key)) return NotFound("/.stoker/cuda.json: no h2d_gbps for GPU " + key);
      std::vector<double> out;
      for (const auto& v : all[key]) {
        if (out.size() < runs) out.push_back(v.get<double>());
      }
      return out;
    }
    H2dBenchOptions o;
    o.device = device;
    o.sizes = {std::min<uint64_t>(bytes_per_run, 64ull << 20)};
    o.bytes_per_run = bytes_per_run;
    o.repeats = runs;
    o.stoker_path = false;
    STOKER_ASSIGN_OR_RETURN(H2dReport r, BenchH2d(o));
    for (const auto& m : r.results) {
      if (m.direction == "h2d" && m.memory == "pinned") return m.runs;
    }
    return Internal("bench h2d reported no pinned host-to-device run");
  }

 private:
  std::string Full(std::string_view path) const {
    if (live_) return std::string(path);
    return root_ + (path.empty() || path[0] != '/' ? "/" : "") + std::string(path);
  }

  Result<nlohmann::json> Json(std::string_view path) const {
    STOKER_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return InvalidArgument(std::string(path) + ": not a JSON object");
    }
    return j;
  }

  Result<NvmlReport> NvmlFromFile() const {
    auto j = Json("/.stoker/nvml.json");
    if (!j.ok()) {
      if (j.status().code() == Code::kNotFound) {
        return Unavailable("no NVML: no /.stoker/nvml.json under " + root_);
      }
      return j.status();
    }
    NvmlReport r;
    r.driver_version = j->value("driver_version", "");
    try {
      for (const auto& g : j->value("gpus", nlohmann::json::array())) {
        NvmlGpu x;
        x.index = g.value("index", 0);
        x.name = g.value("name", "");
        x.pci_bus_id = g.value("pci_bus_id", "");
        x.persistence_mode = g.value("persistence_mode", -1);
        x.ecc_enabled = g.value("ecc_enabled", -1);
        x.ecc_uncorrected_volatile = g.value("ecc_uncorrected_volatile", int64_t(-1));
        x.ecc_uncorrected_aggregate = g.value("ecc_uncorrected_aggregate", int64_t(-1));
        x.ecc_corrected_volatile = g.value("ecc_corrected_volatile", int64_t(-1));
        x.pending_memory_repair = g.value("pending_memory_repair", -1);
        x.compute_mode = g.value("compute_mode", "");
        r.gpus.push_back(std::move(x));
      }
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgument(std::string("/.stoker/nvml.json: ") + e.what());
    }
    return r;
  }

  std::string root_;
  bool live_ = true;
  mutable std::once_flag nvml_once_;
  mutable std::optional<Result<NvmlReport>> nvml_;
};

}  // namespace

std::shared_ptr<NodeEnv> NewNodeEnv(std::string root) {
  return std::make_shared<RootNodeEnv>(std::move(root));
}

}  // namespace stoker
