// stoker exporter: the node's scrape target. Each scrape reads the live
// processes' files (removing those of processes that are gone), merges them
// family by family, and adds the GPUs (NVML) and the node's storage
// (/proc/meminfo, /proc/diskstats). A small HTTP/1.0 server, one request at
// a time: a scrape is a few milliseconds, and a node has one Prometheus.
#include "stoker/exporter.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "metrics/nvml.h"
#include "metrics/registry.h"

namespace stoker::metrics {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The family a sample line belongs to: its metric name, less a histogram's
// or summary's suffix when the family in force is that base name.
std::string SampleName(std::string_view line) {
  const size_t end = line.find_first_of("{ ");
  return std::string(line.substr(0, end));
}

bool BelongsTo(const std::string& sample, const std::string& family) {
  if (sample == family) return true;
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    if (sample == family + suffix) return true;
  }
  return false;
}

// Adds label `name="value"` to a sample line.
std::string WithLabel(std::string_view line, const std::string& label) {
  const size_t brace = line.find('{');
  const size_t space = line.find(' ');
  if (brace != std::string_view::npos && brace < space) {
    const bool empty = line.size() > brace + 1 && line[brace + 1] == '}';
    return std::string(line.substr(0, brace + 1)) + label + (empty ? "" : ",") +
           std::string(line.substr(brace + 1));
  }
  return std::string(line.substr(0, space)) + "{" + label + "}" + std::string(line.substr(space));
}

struct MergedFamily {
  std::string help, type;
  std::vector<std::string> samples;
};

class Merger {
 public:
  // Adds one exposition; `extra_label` (may be empty) goes on each sample.
  Status Add(const std::string& text, const std::string& extra_label) {
    std::string current;
    std::istringstream in(text);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (line.empty()) continue;
      if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) {
        const std::string rest = line.substr(7);
        const size_t sp = rest.find(' ');
        const std::string name = rest.substr(0, sp);
        const std::string value = sp == std::string::npos ? "" : rest.substr(sp + 1);
        MergedFamily& f = Family(name);
        (line[2] == 'H' ? f.help : f.type) = value;
        current = name;
        continue;
      }
      if (line[0] == '#') continue;
      const std::string name = SampleName(line);
      if (current.empty() || !BelongsTo(name, current)) {
        if (name.empty()) return InvalidArgument("line " + std::to_string(n) + ": no metric name");
        current = name;  // an untyped family
      }
      Family(current).samples.push_back(extra_label.empty() ? line : WithLabel(line, extra_label));
    }
    return Status::Ok();
  }

  std::string Text() const {
    std::string out;
    for (const auto& name : order_) {
      const MergedFamily& f = families_.at(name);
      if (!f.help.empty()) out += "# HELP " + name + " " + f.help + "\n";
      if (!f.type.empty()) out += "# TYPE " + name + " " + f.type + "\n";
      for (const auto& s : f.samples) out += s + "\n";
    }
    return out;
  }

 private:
  MergedFamily& Family(const std::string& name) {
    auto [it, added] = families_.try_emplace(name);
    if (added) order_.push_back(name);
    return it->second;
  }
  std::map<std::string, MergedFamily> families_;
  std::vector<std::string> order_;
};

// "HOST:PORT" (IPv4) into a socket address.
Result<sockaddr_in> ParseListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return InvalidArgument("--listen " + listen + ": want HOST:PORT, e.g. 127.0.0.1:9478");
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  std::string host = listen.substr(0, colon);
  if (host.empty() || host == "localhost") host = "127.0.0.1";
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    return InvalidArgument("--listen " + listen + ": " + host + " is not an IPv4 address");
  }
  char* end = nullptr;
  const long port = std::strtol(listen.c_str() + colon + 1, &end, 10);
  if (end == listen.c_str() + colon + 1 || *end != '\0' || port < 0 || port > 65535) {
    return InvalidArgument("--listen " + listen + ": bad port");
  }
  a.sin_port = htons(uint16_t(port));
  return a;
}

// /proc/meminfo's value of `key` in bytes (-1 if absent).
double MeminfoBytes(const std::string& meminfo, const std::string& key) {
  const size_t at = meminfo.find("\n" + key + ":");
  if (at == std::string::npos) return -1;
  return std::strtod(meminfo.c_str() + at + key.size() + 2, nullptr) * 1024;
}

struct WatchedDevice {
  std::string path, device;
  unsigned major = 0, minor = 0;
};

class ExporterImpl final : public Exporter {
 public:
  ExporterImpl(int fd, int port, ExporterOptions o) : fd_(fd), port_(port), o_(std::move(o)) {
    if (o_.dir.empty()) {
      const char* d = std::getenv("STOKER_METRICS_DIR");
      o_.dir = d && *d ? d : "/dev/shm/stoker-metrics";
    }
    if (o_.gpu) {
      std::string warning;
      nvml_ = Nvml::Load(o_.nvml_library, &warning);
      if (nvml_ == nullptr) {
        warnings_.push_back(warning);
      } else if (!nvml_->WatchXid()) {
        warnings_.push_back("NVML offers no XID events here: no stoker_gpu_xid_errors_total");
      }
    }
    const std::string diskstats = ReadFile("/proc/diskstats");
    for (const auto& path : o_.watch_paths) {
      struct stat st;
      if (::stat(path.c_str(), &st) != 0) {
        warnings_.push_back("--watch " + path + ": " + std::strerror(errno));
        continue;
      }
      WatchedDevice w{path, "", major(st.st_dev), minor(st.st_dev)};
      std::istringstream in(diskstats);
      std::string line;
      while (std::getline(in, line)) {
        unsigned ma = 0, mi = 0;
        char name[64] = {0};
        if (std::sscanf(line.c_str(), " %u %u %63s", &ma, &mi, name) == 3 && ma == w.major &&
            mi == w.minor) {
          w.device = name;
        }
      }
      if (w.device.empty()) {
        warnings_.push_back("--watch " + path + ": on no block device (" + std::to_string(w.major) +
                            ":" + std::to_string(w.minor) +
                            ", e.g. tmpfs or overlay): no disk throughput for it");
        continue;
      }
      watched_.push_back(w);
    }
  }
  ~ExporterImpl() override { ::close(fd_); }

  int port() const override { return port_; }
  const std::vector<std::string>& warnings() const override { return warnings_; }
  void Stop() override { stop_.store(true); }

  Status Serve() override {
    while (!stop_.load()) {
      pollfd p{fd_, POLLIN, 0};
      const int r = ::poll(&p, 1, 200);
      if (r < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll on the exporter's socket");
      if (r <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      Handle(c);
      ::close(c);
    }
    return Status::Ok();
  }

  std::string Scrape() override {
    Merger m;
    uint64_t processes = 0;
    std::set<std::string> seen;
    if (DIR* d = ::opendir(o_.dir.c_str())) {
      std::vector<std::string> names;
      while (dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name.starts_with(".") || !name.ends_with(".prom")) continue;
        names.push_back(name);
      }
      ::closedir(d);
      std::sort(names.begin(), names.end());
      for (const auto& name : names) {
        const std::string path = o_.dir + "/" + name;
        const long pid = std::strtol(name.c_str(), nullptr, 10);
        if (Gone(path, pid)) {
          ::unlink(path.c_str());  // fails in another user's sticky folder: skipped anyway
          continue;
        }
        const std::string text = ReadFile(path);
        if (text.empty()) continue;
        // Two processes with one job and rank (a benchmark beside the
        // training): the later ones get a pid label, so that no series is
        // duplicated.
        const std::string key = text.substr(0, text.find('\n'));
        const std::string extra =
            seen.insert(key).second ? "" : "pid=\"" + std::to_string(pid) + "\"";
        if (m.Add(text, extra).ok()) ++processes;
      }
    }
    (void)m.Add(Node(processes), "");
    return m.Text();
  }

 private:
  // A process that is gone: its series go with it. No such pid, and a file
  // not rewritten for a few seconds (a process in another pid namespace, a
  // container, is not visible by its number, but its file stays fresh); or a
  // file not rewritten for a minute, whatever the pid (a stopped process).
  static bool Gone(const std::string& path, long pid) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return true;
    const double age = double(::time(nullptr) - st.st_mtime);
    if (age > kStaleSeconds) return true;
    return pid > 0 && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH && age > kGoneSeconds;
  }
  // A live process rewrites its file every second (Options::interval).
  static constexpr double kGoneSeconds = 3, kStaleSeconds = 60;

  std::string Node(uint64_t processes) {
    Families f;
    f.Gauge("stoker_exporter_processes", "stoker processes publishing metrics on this node.",
            double(processes));
    const std::string meminfo = "\n" + ReadFile("/proc/meminfo");
    if (double v = MeminfoBytes(meminfo, "Cached"); v >= 0) {
      f.Gauge("stoker_node_page_cache_bytes", "Page cache (/proc/meminfo Cached).", v);
    }
    if (double v = MeminfoBytes(meminfo, "Dirty"); v >= 0) {
      f.Gauge("stoker_node_dirty_bytes", "Dirty page cache waiting for writeback.", v);
    }
    if (double v = MeminfoBytes(meminfo, "MemAvailable"); v >= 0) {
      f.Gauge("stoker_node_memory_available_bytes", "Memory available (/proc/meminfo).", v);
    }
    if (!watched_.empty()) Disks(f);
    if (nvml_ != nullptr) Gpus(f);
    return Serialize(f.Take());
  }

  void Disks(Families& f) {
    const std::string diskstats = ReadFile("/proc/diskstats");
    std::set<std::string> done;
    for (const auto& w : watched_) {
      f.Gauge("stoker_node_watched_path_info", "A watched folder and its block device.", 1,
              {{"device", w.device}, {"path", w.path}});
      if (!done.insert(w.device).second) continue;
      std::istringstream in(diskstats);
      std::string line;
      while (std::getline(in, line)) {
        unsigned ma, mi;
        char name[64];
        unsigned long long rd, rdm, rs, rms, wr, wrm, ws, wms, inflight, ioms;
        if (std::sscanf(line.c_str(),
                        " %u %u %63s %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &ma, &mi,
                        name, &rd, &rdm, &rs, &rms, &wr, &wrm, &ws, &wms, &inflight, &ioms) != 13 ||
            ma != w.major || mi != w.minor) {
          continue;
        }
        // /proc/diskstats counts 512-byte sectors whatever the device's.
        const std::vector<ClientMetric::Label> l = {{"device", w.device}};
        f.Counter("stoker_node_disk_read_bytes_total", "Bytes read from the device.", rs * 512.0,
                  l);
        f.Counter("stoker_node_disk_written_bytes_total", "Bytes written to the device.",
                  ws * 512.0, l);
        f.Counter("stoker_node_disk_reads_total", "Reads completed by the device.", double(rd), l);
        f.Counter("stoker_node_disk_writes_total", "Writes completed by the device.", double(wr),
                  l);
        f.Counter("stoker_node_disk_io_seconds_total", "Time the device had I/O in progress.",
                  ioms / 1000.0, l);
      }
    }
  }

  void Gpus(Families& f) {
    for (const GpuSample& s : nvml_->Sample()) {
      const std::string gpu = std::to_string(s.index);
      auto gauge = [&](const char* name, const char* help, double v) {
        if (v >= 0) f.Gauge(name, help, v, {{"gpu", gpu}});
      };
      gauge("stoker_gpu_utilization_ratio", "Share of the last sample period the GPU was busy.",
            s.utilization);
      gauge("stoker_gpu_memory_used_bytes", "GPU memory in use.", s.memory_used);
      gauge("stoker_gpu_memory_total_bytes", "GPU memory in all.", s.memory_total);
      gauge("stoker_gpu_power_watts", "Power draw.", s.power_watts);
      gauge("stoker_gpu_temperature_celsius", "GPU temperature.", s.temperature_celsius);
      gauge("stoker_gpu_sm_clock_hertz", "SM clock.", s.sm_clock_hertz);
      gauge("stoker_gpu_pcie_rx_bytes_per_second", "PCIe receive throughput (NVML, 20 ms).",
            s.pcie_rx_bytes_per_second);
      gauge("stoker_gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput (NVML, 20 ms).",
            s.pcie_tx_bytes_per_second);
      if (s.throttle_reasons >= 0) {
        for (const auto& r : kThrottleReasons) {
          f.Gauge("stoker_gpu_clocks_throttled", "1 while the clocks are held down for a reason.",
                  (uint64_t(s.throttle_reasons) & r.bit) ? 1 : 0,
                  {{"gpu", gpu}, {"reason", r.name}});
        }
      }
      if (s.ecc_corrected >= 0) {
        f.Counter("stoker_gpu_ecc_errors_total", "ECC errors since the driver loaded.",
                  s.ecc_corrected, {{"gpu", gpu}, {"type", "corrected"}});
      }
      if (s.ecc_uncorrected >= 0) {
        f.Counter("stoker_gpu_ecc_errors_total", "ECC errors since the driver loaded.",
                  s.ecc_uncorrected, {{"gpu", gpu}, {"type", "uncorrected"}});
      }
    }
    for (const auto& [key, n] : nvml_->Xids()) {
      f.Counter("stoker_gpu_xid_errors_total", "Critical XID errors seen since the exporter began.",
                double(n),
                {{"gpu", key.first == Nvml::kUnknownGpu ? "unknown" : std::to_string(key.first)},
                 {"xid", std::to_string(key.second)}});
    }
  }

  void Handle(int c) {
    timeval tv{5, 0};
    ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    std::string req;
    char buf[4096];
    while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos &&
           req.size() < 16384) {
      const ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      req.append(buf, size_t(n));
    }
    std::istringstream in(req);
    std::string method, target;
    in >> method >> target;
    const std::string path = target.substr(0, target.find('?'));
    std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
    if (method != "GET" && method != "HEAD") {
      status = "405 Method Not Allowed";
      type = "text/plain";
      body = "only GET\n";
    } else if (path == "/metrics") {
      body = Scrape();
    } else if (path == "/") {
      type = "text/html";
      body = "<html><body><h1>stoker exporter</h1><a href=\"/metrics\">metrics</a></body></html>\n";
    } else {
      status = "404 Not Found";
      type = "text/plain";
      body = "not found: " + path + " (try /metrics)\n";
    }
    std::string head = "HTTP/1.1 " + status + "\r\nContent-Type: " + type +
                       "\r\nContent-Length: " + std::to_string(body.size()) +
                       "\r\nConnection: close\r\n\r\n";
    std::string out = head + (method == "HEAD" ? "" : body);
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::send(c, out.data() + done, out.size() - done, MSG_NOSIGNAL);
      if (n <= 0) break;
      done += size_t(n);
    }
  }

  int fd_;
  int port_;
  ExporterOptions o_;
  std::atomic<bool> stop_{false};
  Nvml* nvml_ = nullptr;
  std::vector<WatchedDevice> watched_;
  std::vector<std::string> warnings_;
};

}  // namespace

Result<std::unique_ptr<Exporter>> Exporter::Start(const ExporterOptions& options) {
  auto addr = ParseListen(options.listen);
  if (!addr.ok()) return addr.status();
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, "socket for " + options.listen);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr) != 0) {
    const int err = errno;
    ::close(fd);
    std::string why = err == EADDRINUSE ? "address already in use (another exporter? pick "
                                          "another port with --listen)"
                                        : std::strerror(err);
    Status s = ErrnoToStatus(err, "listen on " + options.listen);
    return Status(s.code(), "cannot listen on " + options.listen + ": " + why);
  }
  if (::listen(fd, 64) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, "listen on " + options.listen);
  }
  sockaddr_in bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  return std::unique_ptr<Exporter>(
      std::make_unique<ExporterImpl>(fd, ntohs(bound.sin_port), options));
}

Result<std::string> MergeExpositions(const std::vector<std::string>& texts) {
  Merger m;
  for (size_t i = 0; i < texts.size(); ++i) {
    Status s = m.Add(texts[i], "");
    if (!s.ok()) return s.WithContext("exposition " + std::to_string(i));
  }
  return m.Text();
}

}  // namespace stoker::metrics
