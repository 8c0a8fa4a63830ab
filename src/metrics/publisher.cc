// Publishing a process's metrics to the node's exporter: one thread rewrites
// DIR/<pid>.prom every interval, atomically (a hidden temporary file, then
// rename), so that the exporter reads a whole exposition or the previous
// one, never a torn one.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "metrics/registry.h"

namespace stoker::metrics {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string DefaultDir() {
  std::string d = Env("STOKER_METRICS_DIR");
  return d.empty() ? "/dev/shm/stoker-metrics" : d;
}

std::string DefaultJob() {
  for (const char* v : {"STOKER_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"}) {
    std::string s = Env(v);
    if (!s.empty()) return s;
  }
  return "stoker";
}

int64_t DefaultRank() {
  for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    std::string s = Env(v);
    if (s.empty()) continue;
    char* end = nullptr;
    const long long r = std::strtoll(s.c_str(), &end, 10);
    if (end && *end == '\0' && r >= 0) return r;
  }
  return 0;
}

Status WriteAtomically(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string tmp = dir + "/." + name + ".tmp";
  const std::string path = dir + "/" + name;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "open " + tmp);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoToStatus(err, "write " + tmp);
    }
    done += size_t(n);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoToStatus(err, "rename " + tmp);
  }
  return Status::Ok();
}

class Publisher {
 public:
  static Publisher& Get() {
    static Publisher p;
    return p;
  }
  ~Publisher() { Stop(); }

  Status Start(const Options& o) {
    if (Forked()) return Status::Ok();
    std::lock_guard lock(mu_);
    if (running_) return Status::Ok();
    dir_ = o.dir.empty() ? DefaultDir() : o.dir;
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    // Every user's processes publish here: the folder is shared like /tmp.
    if (!ec)
      std::filesystem::permissions(
          dir_, std::filesystem::perms::all | std::filesystem::perms::sticky_bit, ec);
    name_ = std::to_string(::getpid()) + ".prom";
    labels_ = {{"job", o.job.empty() ? DefaultJob() : o.job},
               {"rank", std::to_string(o.rank >= 0 ? o.rank : DefaultRank())}};
    interval_ = o.interval.count() > 0 ? o.interval : std::chrono::milliseconds(1000);
    Status s = Write();
    if (!s.ok()) return s.WithContext("stoker metrics: cannot publish in " + dir_);
    running_ = true;
    enabled_.store(true);
    pid_.store(::getpid());
    thread_ = std::make_unique<std::thread>([this] { Loop(); });
    return Status::Ok();
  }

  void Stop() {
    if (Forked()) {
      // A child of fork() has the parent's state but not its thread (and
      // maybe a mutex the thread held): it publishes nothing, and must not
      // join or lock. The parent's file is the parent's.
      enabled_.store(false);
      (void)thread_.release();
      return;
    }
    std::unique_ptr<std::thread> t;
    {
      std::lock_guard lock(mu_);
      if (!running_) return;
      running_ = false;
      enabled_.store(false);
      t = std::move(thread_);
    }
    cv_.notify_all();
    if (t && t->joinable()) t->join();
    ::unlink((dir_ + "/" + name_).c_str());
  }

  bool enabled() const { return enabled_.load(std::memory_order_relaxed) && !Forked(); }
  std::string path() {
    if (Forked()) return "";
    std::lock_guard lock(mu_);
    return running_ ? dir_ + "/" + name_ : "";
  }

 private:
  bool Forked() const {
    const pid_t p = pid_.load(std::memory_order_relaxed);
    return p != 0 && p != ::getpid();
  }

  Status Write() {
    // The first line names the process's labels, so that the exporter can
    // tell two processes with the same job and rank apart.
    std::string text = "# stoker job=\"" + labels_[0].second + "\" rank=\"" + labels_[1].second +
                       "\"\n" + Exposition(labels_);
    return WriteAtomically(dir_, name_, text);
  }

  void Loop() {
    std::unique_lock lock(mu_);
    while (running_) {
      cv_.wait_for(lock, interval_, [this] { return !running_; });
      // Even when stopping: the last counts reach the file before it goes,
      // for the exporter's scrape in between.
      (void)Write();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool running_ = false;
  std::atomic<bool> enabled_{false};
  std::atomic<pid_t> pid_{0};  // the process that started the thread
  std::unique_ptr<std::thread> thread_;
  std::string dir_, name_;
  std::vector<std::pair<std::string, std::string>> labels_;
  std::chrono::milliseconds interval_{1000};
};

}  // namespace

Status Enable(const Options& options) { return Publisher::Get().Start(options); }
void Disable() { Publisher::Get().Stop(); }
bool Enabled() { return Publisher::Get().enabled(); }
std::string PublishedPath() { return Publisher::Get().path(); }

}  // namespace stoker::metrics
