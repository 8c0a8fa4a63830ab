// Storage: read throughput of the cache and checkpoint folders, and the Ceph
// cluster's reachability and round trip through stoker's own store.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "doctor/internal.h"
#include "stoker/store.h"

namespace stoker::doctor {
namespace {

constexpr CheckState kPass = CheckState::kPass;
constexpr CheckState kWarn = CheckState::kWarn;
constexpr CheckState kFail = CheckState::kFail;
constexpr CheckState kSkip = CheckState::kSkip;

using Seconds = std::chrono::duration<double>;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Writes `bytes` to a new file in `dir` (unlinked at once, so that nothing
// is left behind, also when the check is abandoned), then reads it `repeats`
// times with O_DIRECT, past the page cache. A file system without O_DIRECT
// (tmpfs) is read buffered after its pages are dropped, and says so.
void DirRead(const std::string& dir, const std::string& flag, const DoctorOptions& o,
             CheckResult* out) {
  if (dir.empty()) return Verdict(out, kSkip, "no folder given (" + flag + ")");
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    out->evidence.push_back("stat " + dir + ": " + std::strerror(errno));
    return Verdict(out, kFail, dir + " is not a folder", "create it, or pass the right " + flag);
  }
  std::string path = dir + "/.stoker-doctor-XXXXXX";
  Fd w;
  w.fd = ::mkstemp(path.data());
  if (w.fd < 0) {
    out->evidence.push_back("mkstemp in " + dir + ": " + std::strerror(errno));
    return Verdict(out, kFail, "cannot write a test file in " + dir,
                   "give this user write access to " + dir + " (stoker writes its cache there)");
  }
  Fd r;
  r.fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  const bool direct = r.fd >= 0;
  if (!direct) r.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ::unlink(path.c_str());
  if (r.fd < 0) {
    out->evidence.push_back("open " + path + ": " + std::strerror(errno));
    return Verdict(out, kFail, "cannot read back a test file in " + dir,
                   "check " + dir + "'s permissions");
  }
  constexpr size_t kChunk = 4u << 20;
  const uint64_t bytes = std::max<uint64_t>(kChunk, o.dir_read_bytes / kChunk * kChunk);
  std::unique_ptr<void, decltype(&std::free)> buf(std::aligned_alloc(4096, kChunk), &std::free);
  if (!buf) return Verdict(out, kSkip, "no memory for a 4 MiB buffer");
  // Incompressible bytes, so that no layer below shrinks them.
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < kChunk / 8; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(static_cast<char*>(buf.get()) + i * 8, &x, 8);
  }
  const auto tw = std::chrono::steady_clock::now();
  for (uint64_t done = 0; done < bytes; done += kChunk) {
    if (::write(w.fd, buf.get(), kChunk) != ssize_t(kChunk)) {
      out->evidence.push_back("write in " + dir + ": " + std::strerror(errno));
      return Verdict(out, kFail, "cannot write " + BytesText(bytes) + " in " + dir,
                     "free space in " + dir);
    }
  }
  if (::fdatasync(w.fd) != 0) {
    out->evidence.push_back("fdatasync in " + dir + ": " + std::strerror(errno));
  }
  const double write_s = Seconds(std::chrono::steady_clock::now() - tw).count();
  out->evidence.push_back("wrote " + BytesText(bytes) + " in " + Fixed(write_s, 2) +
                          " s (buffered, then fdatasync)");
  std::vector<double> runs;
  for (uint32_t i = 0; i < std::max(1u, o.dir_read_repeats); ++i) {
    if (!direct) (void)::posix_fadvise(r.fd, 0, 0, POSIX_FADV_DONTNEED);
    const auto t0 = std::chrono::steady_clock::now();
    for (uint64_t off = 0; off < bytes; off += kChunk) {
      const ssize_t n = ::pread(r.fd, buf.get(), kChunk, off_t(off));
      if (n != ssize_t(kChunk)) {
        out->evidence.push_back("pread in " + dir + ": " +
                                (n < 0 ? std::strerror(errno) : std::string("short read")));
        return Verdict(out, kFail, "cannot read back the test file in " + dir,
                       "check the device's health (dmesg)");
      }
    }
    const double s = Seconds(std::chrono::steady_clock::now() - t0).count();
    runs.push_back(s > 0 ? double(bytes) / s / 1e6 : 0);
  }
  const Spread sp = SpreadOf(runs);
  out->evidence.push_back(
      std::string(direct ? "O_DIRECT" : "buffered (no O_DIRECT here; pages dropped first)") +
      " reads of " + BytesText(bytes) + " x" + std::to_string(runs.size()) + ": " +
      SpreadText(sp, "MB/s"));
  out->metrics["median_mbps"] = sp.median;
  out->metrics["spread"] = sp.spread;
  const std::string what =
      dir + ": " + Fixed(sp.median, 0) + " MB/s read (spread " + Fixed(sp.spread * 100, 0) + "%)";
  if (sp.median < o.min_dir_read_mbps) {
    return Verdict(out, kWarn, what + ", below " + Fixed(o.min_dir_read_mbps, 0) + " MB/s",
                   "put " + flag + " on local NVMe (fio --direct=1 --rw=read confirms the device)");
  }
  if (sp.spread > 0.25) {
    return Verdict(out, kWarn, what + ": runs differ by more than 25%",
                   "rerun when the node is idle; something else uses the device");
  }
  Verdict(out, kPass, what);
}

void CacheDir(const NodeEnv&, const DoctorOptions& o, CheckResult* out) {
  DirRead(o.cache_dir, "--cache-dir", o, out);
}
void CkptDir(const NodeEnv&, const DoctorOptions& o, CheckResult* out) {
  DirRead(o.ckpt_dir, "--ckpt-dir", o, out);
}

// Connects through stoker's RADOS store with a bounded timeout, then times
// stats of an object that need not exist: a NotFound is a full round trip to
// the object's primary OSD, and nothing is written.
void CephReach(const NodeEnv&, const DoctorOptions& o, CheckResult* out) {
  if (o.ceph_uri.empty())
    return Verdict(out, kSkip, "no cluster given (--ceph rados://POOL?conf=...)");
  if (o.ceph_uri.rfind("rados://", 0) != 0) {
    return Verdict(out, kFail, "'" + o.ceph_uri + "' is not a rados:// URI",
                   "pass --ceph rados://POOL[/PREFIX]?conf=CONF&id=CLIENT");
  }
  StoreOptions so;
  const auto budget = std::chrono::duration_cast<std::chrono::milliseconds>(o.bandwidth_timeout);
  so.op_timeout = std::max(std::chrono::milliseconds(1000), budget / 4);
  const auto t0 = std::chrono::steady_clock::now();
  auto store = OpenStore(o.ceph_uri, so);
  const double connect_s = Seconds(std::chrono::steady_clock::now() - t0).count();
  if (!store.ok()) {
    out->evidence.push_back("open " + o.ceph_uri + ": " + store.status().ToString());
    if (store.status().code() == Code::kUnsupported) {
      return Verdict(out, kSkip, "this stoker was built without RADOS (-DSTOKER_WITH_RADOS=ON)");
    }
    return Verdict(
        out, kFail, "cannot reach the cluster: " + store.status().message(),
        "check mon host in the conf, the client's keyring, and `ceph -s` from this node");
  }
  out->evidence.push_back("connected to " + o.ceph_uri + " in " + Fixed(connect_s, 3) + " s");
  std::vector<double> runs;
  for (uint32_t i = 0; i < std::max(1u, o.ceph_repeats); ++i) {
    const auto s0 = std::chrono::steady_clock::now();
    auto st = (*store)->Stat("stoker-doctor-probe");
    const double ms = Seconds(std::chrono::steady_clock::now() - s0).count() * 1e3;
    if (!st.ok() && st.status().code() != Code::kNotFound) {
      out->evidence.push_back("stat stoker-doctor-probe: " + st.status().ToString());
      if (st.status().code() == Code::kPermissionDenied) {
        return Verdict(
            out, kFail, "the client may not read the pool: " + st.status().message(),
            "give the client 'allow r pool=POOL' (stoker tune ceph makes such a client)");
      }
      return Verdict(out, kFail, "stat failed: " + st.status().message(),
                     "check the OSDs (ceph -s, ceph osd tree)");
    }
    runs.push_back(ms);
  }
  const Spread sp = SpreadOf(runs);
  out->evidence.push_back("stat round trips x" + std::to_string(runs.size()) + ": " +
                          SpreadText(sp, "ms"));
  out->metrics["connect_s"] = connect_s;
  out->metrics["rtt_median_ms"] = sp.median;
  out->metrics["rtt_max_ms"] = sp.max;
  const std::string what = "reachable; stat round trip " + Fixed(sp.median, 2) + " ms median";
  if (sp.median > o.max_ceph_rtt_ms) {
    return Verdict(out, kWarn, what + ", above " + Fixed(o.max_ceph_rtt_ms, 0) + " ms",
                   "check the network path to the OSDs (MTU, a congested or routed link)");
  }
  Verdict(out, kPass, what);
}

}  // namespace

std::vector<CheckSpec> IoChecks() {
  return {
      {"cache-dir-read", "read throughput of the node cache folder (O_DIRECT, repeated)", true,
       CacheDir},
      {"ckpt-dir-read", "read throughput of the checkpoint folder (O_DIRECT, repeated)", true,
       CkptDir},
      {"ceph-reach", "Ceph reachable; stat round trip, repeated", true, CephReach},
  };
}

}  // namespace stoker::doctor
