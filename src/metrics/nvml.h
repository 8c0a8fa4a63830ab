// NVML, loaded at run time (dlopen of libnvidia-ml.so.1), so that stoker
// builds and runs where there is no NVIDIA driver: there, Load returns null
// with a warning, and the GPU series are absent.
//
// Thread safety: an Nvml is safe for concurrent use (NVML is).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "stoker/status.h"

namespace stoker::metrics {

// One GPU's readings; a field NVML does not support on it is negative.
struct GpuSample {
  unsigned index = 0;
  double utilization = -1;                     // 0..1, the last sample period's busy share
  double memory_used = -1, memory_total = -1;  // bytes
  double power_watts = -1, temperature_celsius = -1, sm_clock_hertz = -1;
  double pcie_rx_bytes_per_second = -1, pcie_tx_bytes_per_second = -1;
  int64_t throttle_reasons = -1;                    // bit mask, see kThrottleReasons
  double ecc_corrected = -1, ecc_uncorrected = -1;  // volatile counts
};

// Bits of nvmlDeviceGetCurrentClocksThrottleReasons, with label values.
struct ThrottleReason {
  uint64_t bit;
  const char* name;
};
inline constexpr ThrottleReason kThrottleReasons[] = {
    {0x1, "gpu_idle"},    {0x2, "applications_clocks"}, {0x4, "sw_power_cap"},
    {0x8, "hw_slowdown"}, {0x10, "sync_boost"},         {0x20, "sw_thermal"},
    {0x40, "hw_thermal"}, {0x80, "hw_power_brake"},     {0x100, "display_clock"}};

class Nvml {
 public:
  // The process's NVML, loaded and initialised once; null (and *warning set)
  // when the library is missing or nvmlInit fails.
  static Nvml* Load(const std::string& library, std::string* warning);
  unsigned device_count() const { return count_; }
  std::vector<GpuSample> Sample();
  Result<double> Utilization(unsigned index);
  // XID errors seen since WatchXid, by (GPU index, XID); kUnknownGpu for an
  // event on a device handle that is none of ours. Empty when the driver
  // offers no events.
  std::map<std::pair<unsigned, uint64_t>, uint64_t> Xids();
  static constexpr unsigned kUnknownGpu = ~0u;
  // Starts a thread waiting on NVML's event set for critical XID errors
  // (nvmlEventTypeXidCriticalError) of every GPU that supports them. Returns
  // false, with nothing left behind, when none does (registration
  // NOT_SUPPORTED on every GPU, as on some GPUs and VMs) or when a
  // registration fails with NVML_ERROR_UNKNOWN (the set is then undefined);
  // the XID series are then absent.
  bool WatchXid();

 private:
  Nvml() = default;
  // One event from nvmlEventSetWait_v2.
  void CountEvent(void* device, uint64_t type, uint64_t data);
  struct Api;
  Api* api_ = nullptr;
  unsigned count_ = 0;
  std::vector<void*> devices_;
  std::mutex mu_;
  std::map<std::pair<unsigned, uint64_t>, uint64_t> xids_;
  bool watching_ = false;
};

}  // namespace stoker::metrics
