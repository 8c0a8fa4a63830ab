// Private to the doctor module: parsing helpers shared by the checks, and the
// lists of checks each file contributes.
//
// Thread safety: the functions are reentrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/doctor.h"

namespace stoker::doctor {

std::string Trim(std::string_view s);
std::vector<std::string> SplitLines(std::string_view s);
// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; InvalidArgument naming the text.
Result<std::vector<int>> ParseCpuList(std::string_view s);
// "[madvise] never" style sysfs choices -> "madvise"; "" when none is marked.
std::string SelectedChoice(std::string_view s);
// A "Key:   123 kB" line's value in bytes from /proc/meminfo-like text.
std::optional<uint64_t> MeminfoBytes(std::string_view text, std::string_view key);
// "16.0 GT/s PCIe" -> 16; 0 for "Unknown" or garbage.
double ParseLinkSpeed(std::string_view s);
// Theoretical bytes per second of one direction of a PCIe link, in GB/s
// (1e9 B/s), after line encoding: 8b/10b up to 5 GT/s, 128b/130b above,
// FLIT (242/256) at 64 GT/s.
double LinkGBps(const PciLink& link);
// "16.0 GT/s x16"
std::string LinkText(const PciLink& link);
// 1 KiB, 3.2 GiB, "unlimited" for kUnlimited.
std::string BytesText(uint64_t bytes);
std::string Fixed(double v, int digits);

// A kernel release ("5.4.0-135-generic", "6.1.0-18-amd64", "5.15.0").
struct KernelRelease {
  int major = 0, minor = 0, patch = 0;
  int abi = -1;  // the distribution's number after the first '-', if numeric
};
std::optional<KernelRelease> ParseKernelRelease(std::string_view release);

// The median, and the spread (max - min) / median, of a set of runs.
struct Spread {
  double median = 0, min = 0, max = 0, spread = 0;
};
Spread SpreadOf(std::vector<double> runs);
std::string SpreadText(const Spread& s, std::string_view unit);

// The limits file of /proc/PID/limits -> memlock and nofile.
Result<ProcessLimits> ParseLimitsFile(std::string_view text);

// Reads one file, trimmed; on failure records "cannot read PATH: ..." in
// `out`'s evidence and returns nullopt.
std::optional<std::string> ReadTrimmed(const NodeEnv& env, std::string_view path, CheckResult* out);

// One PCI device's folder under /sys/bus/pci/devices (facts.cc).
PciDevice ReadPciDevice(const NodeEnv& env, const std::string& address);

// Sets a verdict in one call.
void Verdict(CheckResult* out, CheckState state, std::string summary, std::string fix = "");

// The checks, by file.
std::vector<CheckSpec> SystemChecks();  // checks_system.cc
std::vector<CheckSpec> PciChecks();     // checks_pci.cc
std::vector<CheckSpec> GpuChecks();     // checks_gpu.cc
std::vector<CheckSpec> IoChecks();      // checks_io.cc

}  // namespace stoker::doctor
