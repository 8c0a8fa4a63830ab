// NVML through dlopen. The few types and constants used are NVML's stable
// C ABI (nvml.h, which the CUDA toolkit here does not ship), declared below.
#include "metrics/nvml.h"

#include <dlfcn.h>

#include <chrono>

namespace stoker::metrics {
namespace {

using nvmlReturn_t = int;
using nvmlDevice_t = void*;
using nvmlEventSet_t = void*;
// nvmlReturn_t values (nvml.h).
constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kTimeout = 10;
constexpr nvmlReturn_t kUnknown = 999;
struct nvmlUtilization_t {
  unsigned int gpu, memory;
};
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlEventData_t {
  nvmlDevice_t device;
  unsigned long long eventType, eventData;
  unsigned int gpuInstanceId, computeInstanceId;
};
constexpr unsigned long long kEventXidCritical = 0x8;  // nvmlEventTypeXidCriticalError
constexpr int kTemperatureGpu = 0;
constexpr int kClockSm = 1;
constexpr int kPcieTxBytes = 0, kPcieRxBytes = 1;
constexpr int kEccCorrected = 0, kEccUncorrected = 1, kEccVolatile = 0;

}  // namespace

struct Nvml::Api {
  void* lib = nullptr;
  nvmlReturn_t (*Init)() = nullptr;
  nvmlReturn_t (*GetCount)(unsigned*) = nullptr;
  nvmlReturn_t (*GetHandle)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*Util)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*Memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*Power)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*Temperature)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*Clock)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*Pcie)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*Throttle)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*Ecc)(nvmlDevice_t, int, int, unsigned long long*) = nullptr;
  nvmlReturn_t (*EventSetCreate)(nvmlEventSet_t*) = nullptr;
  nvmlReturn_t (*RegisterEvents)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) = nullptr;
  nvmlReturn_t (*EventSetWait)(nvmlEventSet_t, nvmlEventData_t*, unsigned) = nullptr;
  nvmlReturn_t (*EventSetFree)(nvmlEventSet_t) = nullptr;
  const char* (*ErrorString)(nvmlReturn_t) = nullptr;
};

namespace {

template <typename F>
void Sym(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace

Nvml* Nvml::Load(const std::string& library, std::string* warning) {
  // Once per library (NVML is initialised once per process; a test loads a
  // stand-in after a missing library).
  static std::mutex mu;
  static std::map<std::string, std::pair<Nvml*, std::string>> tried;
  std::lock_guard lock(mu);
  if (auto it = tried.find(library); it != tried.end()) {
    if (!it->second.first && warning) *warning = it->second.second;
    return it->second.first;
  }
  Nvml*& loaded = tried[library].first;
  std::string& failure = tried[library].second;
  auto api = std::make_unique<Api>();
  api->lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (api->lib == nullptr) {
    const char* e = dlerror();
    failure = "NVML not loaded (" + std::string(e ? e : library) + "): no GPU metrics";
    if (warning) *warning = failure;
    return nullptr;
  }
  void* l = api->lib;
  Sym(l, "nvmlInit_v2", &api->Init);
  Sym(l, "nvmlDeviceGetCount_v2", &api->GetCount);
  Sym(l, "nvmlDeviceGetHandleByIndex_v2", &api->GetHandle);
  Sym(l, "nvmlDeviceGetUtilizationRates", &api->Util);
  Sym(l, "nvmlDeviceGetMemoryInfo", &api->Memory);
  Sym(l, "nvmlDeviceGetPowerUsage", &api->Power);
  Sym(l, "nvmlDeviceGetTemperature", &api->Temperature);
  Sym(l, "nvmlDeviceGetClockInfo", &api->Clock);
  Sym(l, "nvmlDeviceGetPcieThroughput", &api->Pcie);
  Sym(l, "nvmlDeviceGetCurrentClocksThrottleReasons", &api->Throttle);
  Sym(l, "nvmlDeviceGetTotalEccErrors", &api->Ecc);
  Sym(l, "nvmlEventSetCreate", &api->EventSetCreate);
  Sym(l, "nvmlDeviceRegisterEvents", &api->RegisterEvents);
  Sym(l, "nvmlEventSetWait_v2", &api->EventSetWait);
  Sym(l, "nvmlEventSetFree", &api->EventSetFree);
  Sym(l, "nvmlErrorString", &api->ErrorString);
  if (!api->Init || !api->GetCount || !api->GetHandle) {
    failure = library + " lacks nvmlInit_v2/nvmlDeviceGetCount_v2: no GPU metrics";
    if (warning) *warning = failure;
    return nullptr;
  }
  if (nvmlReturn_t r = api->Init(); r != kSuccess) {
    failure = "nvmlInit failed (" +
              std::string(api->ErrorString ? api->ErrorString(r) : std::to_string(r)) +
              "): no GPU metrics";
    if (warning) *warning = failure;
    return nullptr;
  }
  auto* n = new Nvml();  // never unloaded: NVML stays initialised for the process
  unsigned count = 0;
  if (api->GetCount(&count) != kSuccess) count = 0;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t d = nullptr;
    if (api->GetHandle(i, &d) != kSuccess) break;
    n->devices_.push_back(d);
  }
  n->count_ = unsigned(n->devices_.size());
  n->api_ = api.release();
  loaded = n;
  return n;
}

Result<double> Nvml::Utilization(unsigned index) {
  nvmlUtilization_t u{};
  if (index >= count_ || !api_->Util || api_->Util(devices_[index], &u) != kSuccess) {
    return Unsupported("GPU " + std::to_string(index) + ": no utilisation from NVML");
  }
  return u.gpu / 100.0;
}

std::vector<GpuSample> Nvml::Sample() {
  std::vector<GpuSample> out;
  for (unsigned i = 0; i < count_; ++i) {
    nvmlDevice_t d = devices_[i];
    GpuSample s;
    s.index = i;
    if (auto u = Utilization(i); u.ok()) s.utilization = *u;
    nvmlMemory_t m{};
    if (api_->Memory && api_->Memory(d, &m) == kSuccess) {
      s.memory_used = double(m.used);
      s.memory_total = double(m.total);
    }
    unsigned v = 0;
    if (api_->Power && api_->Power(d, &v) == kSuccess) s.power_watts = v / 1000.0;
    if (api_->Temperature && api_->Temperature(d, kTemperatureGpu, &v) == kSuccess) {
      s.temperature_celsius = v;
    }
    if (api_->Clock && api_->Clock(d, kClockSm, &v) == kSuccess) s.sm_clock_hertz = v * 1e6;
    // NVML reports PCIe throughput in KB/s over its last 20 ms sample.
    if (api_->Pcie && api_->Pcie(d, kPcieRxBytes, &v) == kSuccess) {
      s.pcie_rx_bytes_per_second = v * 1024.0;
    }
    if (api_->Pcie && api_->Pcie(d, kPcieTxBytes, &v) == kSuccess) {
      s.pcie_tx_bytes_per_second = v * 1024.0;
    }
    unsigned long long bits = 0;
    if (api_->Throttle && api_->Throttle(d, &bits) == kSuccess) s.throttle_reasons = int64_t(bits);
    unsigned long long n = 0;
    if (api_->Ecc && api_->Ecc(d, kEccCorrected, kEccVolatile, &n) == kSuccess) {
      s.ecc_corrected = double(n);
    }
    if (api_->Ecc && api_->Ecc(d, kEccUncorrected, kEccVolatile, &n) == kSuccess) {
      s.ecc_uncorrected = double(n);
    }
    out.push_back(s);
  }
  return out;
}

bool Nvml::WatchXid() {
  std::lock_guard lock(mu_);
  if (watching_) return true;
  if (!api_->EventSetCreate || !api_->RegisterEvents || !api_->EventSetWait) return false;
  nvmlEventSet_t set = nullptr;
  if (api_->EventSetCreate(&set) != kSuccess) return false;
  // nvmlDeviceRegisterEvents: NOT_SUPPORTED (GPUs and VMs without events)
  // leaves the set usable, nothing registered for that device, as do the
  // errors about one device (GPU_IS_LOST, NO_PERMISSION); UNKNOWN leaves the
  // set undefined, to be freed.
  bool any = false, broken = false;
  for (auto* d : devices_) {
    const nvmlReturn_t r = api_->RegisterEvents(d, kEventXidCritical, set);
    any |= r == kSuccess;
    broken |= r == kUnknown;
  }
  if (!any || broken) {
    if (api_->EventSetFree) api_->EventSetFree(set);
    return false;
  }
  watching_ = true;
  // Detached with the process's NVML (never unloaded): it ends with the
  // process.
  std::thread([this, set] {
    for (;;) {
      nvmlEventData_t e{};
      const nvmlReturn_t r = api_->EventSetWait(set, &e, 1000);
      if (r == kTimeout) continue;
      if (r != kSuccess) {
        // A GPU fallen off the bus (GPU_IS_LOST) must not blind the watch
        // to the others: wait a little and go on.
        std::this_thread::sleep_for(std::chrono::seconds(1));
        continue;
      }
      CountEvent(e.device, e.eventType, e.eventData);
    }
  }).detach();
  return true;
}

void Nvml::CountEvent(void* device, uint64_t type, uint64_t data) {
  if (type != kEventXidCritical) return;  // only XIDs are registered, but be sure
  unsigned index = 0;
  while (index < count_ && devices_[index] != device) ++index;
  if (index == count_) index = kUnknownGpu;
  std::lock_guard l(mu_);
  ++xids_[{index, data}];  // eventData is the XID
}

std::map<std::pair<unsigned, uint64_t>, uint64_t> Nvml::Xids() {
  std::lock_guard lock(mu_);
  return xids_;
}

}  // namespace stoker::metrics
