// Parsing helpers of the doctor's checks (internal.h).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/text.h"
#include "doctor/internal.h"

namespace stoker::doctor {

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::vector<std::string> SplitLines(std::string_view s) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < s.size()) {
    size_t nl = s.find('\n', start);
    if (nl == std::string_view::npos) nl = s.size();
    lines.emplace_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

Result<std::vector<int>> ParseCpuList(std::string_view s) {
  std::vector<int> cpus;
  const std::string text = Trim(s);
  size_t i = 0;
  auto bad = [&] { return InvalidArgument("'" + text + "' is not a CPU list like 0-3,8"); };
  while (i < text.size()) {
    char* end = nullptr;
    const long a = std::strtol(text.c_str() + i, &end, 10);
    if (end == text.c_str() + i || a < 0) return bad();
    i = size_t(end - text.c_str());
    long b = a;
    if (i < text.size() && text[i] == '-') {
      ++i;
      b = std::strtol(text.c_str() + i, &end, 10);
      if (end == text.c_str() + i || b < a || b - a > 1 << 20) return bad();
      i = size_t(end - text.c_str());
    }
    for (long c = a; c <= b; ++c) cpus.push_back(int(c));
    if (i < text.size()) {
      if (text[i] != ',') return bad();
      ++i;
    }
  }
  return cpus;
}

std::string SelectedChoice(std::string_view s) {
  const auto open = s.find('[');
  const auto close = s.find(']', open == std::string_view::npos ? 0 : open);
  if (open == std::string_view::npos || close == std::string_view::npos) return "";
  return std::string(s.substr(open + 1, close - open - 1));
}

std::optional<uint64_t> MeminfoBytes(std::string_view text, std::string_view key) {
  for (const std::string& line : SplitLines(text)) {
    // "MemTotal:  32823488 kB" or "Node 0 MemTotal:  32823488 kB"
    const auto k = line.find(std::string(key) + ":");
    if (k == std::string::npos) continue;
    if (k > 0 && line[k - 1] != ' ') continue;
    const char* p = line.c_str() + k + key.size() + 1;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(p, &end, 10);
    if (end == p) return std::nullopt;
    const bool kb = std::string_view(end).find("kB") != std::string_view::npos;
    return uint64_t(v) * (kb ? 1024 : 1);
  }
  return std::nullopt;
}

double ParseLinkSpeed(std::string_view s) {
  const std::string t = Trim(s);
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end == t.c_str() || v <= 0) return 0;
  return v;
}

double LinkGBps(const PciLink& link) {
  const double gts = link.speed_gts;
  double efficiency = 128.0 / 130.0;
  if (gts <= 5.0) efficiency = 0.8;
  if (gts >= 64.0) efficiency = 242.0 / 256.0;
  return gts * efficiency / 8.0 * link.width;
}

std::string LinkText(const PciLink& link) {
  if (link.speed_gts <= 0 && link.width <= 0) return "unknown";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g GT/s x%d", link.speed_gts, link.width);
  return buf;
}

std::string BytesText(uint64_t bytes) {
  if (bytes == kUnlimited) return "unlimited";
  return internal::HumanBytes(double(bytes));
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::optional<KernelRelease> ParseKernelRelease(std::string_view release) {
  KernelRelease k;
  const std::string r = Trim(release);
  int consumed = 0;
  if (std::sscanf(r.c_str(), "%d.%d%n", &k.major, &k.minor, &consumed) < 2) return std::nullopt;
  const char* p = r.c_str() + consumed;
  if (*p == '.') {
    char* end = nullptr;
    k.patch = int(std::strtol(p + 1, &end, 10));
    p = end;
  }
  if (*p == '-' && std::isdigit(static_cast<unsigned char>(p[1]))) {
    k.abi = int(std::strtol(p + 1, nullptr, 10));
  }
  return k;
}

Spread SpreadOf(std::vector<double> runs) {
  Spread s;
  if (runs.empty()) return s;
  std::sort(runs.begin(), runs.end());
  const size_t n = runs.size();
  s.median = n % 2 ? runs[n / 2] : (runs[n / 2 - 1] + runs[n / 2]) / 2;
  s.min = runs.front();
  s.max = runs.back();
  s.spread = s.median > 0 ? (s.max - s.min) / s.median : 0;
  return s;
}

std::string SpreadText(const Spread& s, std::string_view unit) {
  return "median " + Fixed(s.median, 2) + " " + std::string(unit) + " (min " + Fixed(s.min, 2) +
         ", max " + Fixed(s.max, 2) + ", spread " + Fixed(s.spread * 100, 1) + "%)";
}

Result<ProcessLimits> ParseLimitsFile(std::string_view text) {
  ProcessLimits l;
  bool memlock = false, nofile = false;
  auto value = [](const std::string& tok) -> uint64_t {
    return tok == "unlimited" ? kUnlimited : std::strtoull(tok.c_str(), nullptr, 10);
  };
  for (const std::string& line : SplitLines(text)) {
    // "Max locked memory         8388608              8388608              bytes"
    for (auto [label, out, seen] : {std::tuple{"Max locked memory", &l.memlock, &memlock},
                                    std::tuple{"Max open files", &l.nofile, &nofile}}) {
      if (line.rfind(label, 0) != 0) continue;
      char soft[32] = {}, hard[32] = {};
      if (std::sscanf(line.c_str() + std::string_view(label).size(), "%31s %31s", soft, hard) !=
          2) {
        return InvalidArgument("limits: cannot parse '" + line + "'");
      }
      out->soft = value(soft);
      out->hard = value(hard);
      *seen = true;
    }
  }
  if (!memlock || !nofile) {
    return InvalidArgument("limits: no 'Max locked memory' or 'Max open files' line");
  }
  return l;
}

std::optional<std::string> ReadTrimmed(const NodeEnv& env, std::string_view path,
                                       CheckResult* out) {
  auto text = env.ReadFile(path);
  if (!text.ok()) {
    out->evidence.push_back("cannot read " + std::string(path) + ": " + text.status().ToString());
    return std::nullopt;
  }
  return Trim(*text);
}

void Verdict(CheckResult* out, CheckState state, std::string summary, std::string fix) {
  out->state = state;
  out->summary = std::move(summary);
  out->fix = std::move(fix);
}

}  // namespace stoker::doctor
