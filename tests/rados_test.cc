// The RADOS store and the loader against a real Ceph cluster: bad
// configurations, cephx refusals, a full pool, an object deleted under a
// running loader, and OSDs killed (SIGKILL) or hung (SIGSTOP) mid-epoch.
//
// The cluster: the one named by STOKER_CEPH_DIR (or by a CEPH_CONF inside a
// folder made by scripts/ceph-cluster.sh) when it is running, else one this
// process starts with `scripts/ceph-cluster.sh start` on first use (≈15 s)
// and stops at exit. CI starts one cluster and exports STOKER_CEPH_DIR, so
// that ctest's one-process-per-test runs share it. The tests that inject
// faults take an exclusive lock on DIR/.rados_test.lock (the others a shared
// one), so parallel test processes never see another test's fault.
//
// Without Ceph installed (no ceph-mon), every test that needs a cluster
// skips with the reason; the URI and error-mapping tests always run.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "stoker/checkpoint.h"
#include "stoker/loader.h"
#include "stoker/pack.h"
#include "bench/storage_bench.h"
#include "stoker/store.h"
#include "store/rados_store.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::RandomBytes;
using testing::TempDir;

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Runs `cmd` with sh; returns its exit status and what it printed (stdout
// and stderr together).
std::pair<int, std::string> Sh(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

bool OnPath(const std::string& tool) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string d; std::getline(dirs, d, ':');) {
    if (!d.empty() && ::access((d + "/" + tool).c_str(), X_OK) == 0) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------
// The cluster, shared by every test of this process.

class Cluster {
 public:
  static Cluster& Get() {
    static Cluster cluster;
    return cluster;
  }

  // Starts or finds the cluster on first use. Returns "" when it is there;
  // otherwise why not, and `*skip` tells whether that is a reason to skip
  // (Ceph not installed) rather than to fail.
  std::string Ensure(bool* skip) {
    std::lock_guard lock(mu_);
    if (!tried_) {
      tried_ = true;
      Start();
    }
    *skip = skip_;
    return problem_;
  }

  void Stop() {
    std::lock_guard lock(mu_);
    if (!owned_) return;
    auto [rc, out] = Sh(ShellQuote(script_) + " stop " + ShellQuote(dir_));
    if (rc != 0)
      std::fprintf(stderr, "rados_test: stopping the cluster failed:\n%s\n", out.c_str());
    owned_ = false;
    tmp_.reset();
  }

  const std::string& dir() const { return dir_; }
  const std::string& conf() const { return conf_; }

  // scripts/ceph-cluster.sh COMMAND ... DIR
  std::pair<int, std::string> Script(const std::string& args) const {
    return Sh(ShellQuote(script_) + " " + args + " " + ShellQuote(dir_));
  }
  std::pair<int, std::string> Ceph(const std::string& args) const {
    return Sh("timeout 60 ceph --conf " + ShellQuote(conf_) + " --id admin --connect-timeout 20 " +
              args);
  }
  pid_t OsdPid(int id) const {
    auto [rc, out] = Script("osd-pid " + std::to_string(id));
    return rc == 0 ? pid_t(std::atol(out.c_str())) : -1;
  }

 private:
  static std::string SourceDir() {
    if (const char* s = std::getenv("STOKER_SOURCE_DIR"); s != nullptr && *s != '\0') return s;
    return fs::path(__FILE__).parent_path().parent_path().string();
  }

  bool Running(const std::string& dir) {
    dir_ = dir;
    return fs::exists(dir + "/ceph.conf") && Script("osd-pid 0").first == 0;
  }

  void Start() {
    script_ = SourceDir() + "/scripts/ceph-cluster.sh";
    if (!OnPath("ceph-mon") || !OnPath("ceph-osd") || !OnPath("ceph")) {
      skip_ = true;
      problem_ =
          "Ceph is not installed (no ceph-mon/ceph-osd/ceph on PATH; "
          "scripts/install-deps.sh --all installs it)";
      return;
    }
    if (!fs::exists(script_)) {
      problem_ = script_ + " not found (set STOKER_SOURCE_DIR to the source tree)";
      return;
    }
    std::string given;
    if (const char* d = std::getenv("STOKER_CEPH_DIR"); d != nullptr && *d != '\0') {
      given = d;
    } else if (const char* c = std::getenv("CEPH_CONF"); c != nullptr && *c != '\0') {
      const fs::path parent = fs::path(c).parent_path();
      if (fs::exists(parent / ".stoker-ceph-cluster")) given = parent.string();
    }
    if (!given.empty()) {
      if (Running(given)) {
        conf_ = dir_ + "/ceph.conf";
        std::fprintf(stderr, "rados_test: using the running cluster in %s\n", dir_.c_str());
        Export();
        return;
      }
      std::fprintf(stderr,
                   "rados_test: no cluster runs in %s (STOKER_CEPH_DIR/CEPH_CONF); starting "
                   "one of our own\n",
                   given.c_str());
    }
    tmp_ = std::make_unique<TempDir>();
    dir_ = tmp_->str() + "/cluster";
    const auto t0 = Clock::now();
    auto [rc, out] = Sh(ShellQuote(script_) + " start " + ShellQuote(dir_));
    if (rc != 0) {
      problem_ = "scripts/ceph-cluster.sh start failed (exit " + std::to_string(rc) + "):\n" + out;
      tmp_.reset();
      return;
    }
    owned_ = true;
    conf_ = dir_ + "/ceph.conf";
    std::fprintf(stderr, "rados_test: started a cluster in %s in %.1f s\n", dir_.c_str(),
                 SecondsSince(t0));
    Export();
  }

  // So that OpenStore's default search and child processes find it.
  void Export() {
    ::setenv("CEPH_CONF", conf_.c_str(), 1);
    ::setenv("STOKER_CEPH_DIR", dir_.c_str(), 1);
    ::unsetenv("CEPH_ARGS");
  }

  std::mutex mu_;
  bool tried_ = false;
  bool skip_ = false;
  bool owned_ = false;
  std::string problem_;
  std::string script_, dir_, conf_;
  std::unique_ptr<TempDir> tmp_;
};

class ClusterEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { Cluster::Get().Stop(); }
};
const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new ClusterEnvironment);

// Tests that need the cluster. Holds a shared lock on the cluster (an
// exclusive one for fault tests) for the test's duration.
class RadosTest : public ::testing::Test {
 protected:
  virtual bool exclusive() const { return false; }

  void SetUp() override {
    bool skip = false;
    const std::string problem = Cluster::Get().Ensure(&skip);
    if (skip) GTEST_SKIP() << problem;
    ASSERT_TRUE(problem.empty()) << problem;
    lock_fd_ = ::open((Cluster::Get().dir() + "/.rados_test.lock").c_str(),
                      O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(lock_fd_, 0) << std::strerror(errno);
    ASSERT_EQ(::flock(lock_fd_, exclusive() ? LOCK_EX : LOCK_SH), 0) << std::strerror(errno);
  }

  void TearDown() override {
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }

  static Cluster& cluster() { return Cluster::Get(); }

  // A name unique to this process and test, for datasets and pools.
  static std::string Unique(std::string_view what) {
    static std::atomic<int> counter{0};
    return std::string(what) + "-" + std::to_string(::getpid()) + "-" +
           std::to_string(counter.fetch_add(1));
  }

  int lock_fd_ = -1;
};

// ---------------------------------------------------------------------------
// A dataset of random samples packed into training_data with stoker-pack.

struct Dataset {
  std::string name;                             // prefix inside training_data
  std::vector<std::vector<std::byte>> samples;  // by sample id (= label)
  uint32_t shards = 0;

  std::string PackUri() const { return "rados://training_data/" + name + "?id=stoker-pack"; }
  std::string TrainUri() const { return "rados://training_data/" + name + "?id=stoker-train"; }

  ~Dataset() {
    if (name.empty()) return;
    auto store = OpenStore(PackUri());
    if (!store.ok()) return;
    auto all = (*store)->List("");
    if (!all.ok()) return;
    for (const ObjectInfo& o : *all) (void)(*store)->Remove(o.key);
  }
};

// `n` samples of 4-28 KiB of random bytes, in shards of `shard_bytes`.
void MakeDataset(Dataset* ds, size_t n, uint64_t shard_bytes, std::string name) {
  TempDir src;
  std::mt19937_64 rng(n * 31 + shard_bytes);
  std::ofstream list(src.path() / "list.txt");
  for (size_t i = 0; i < n; ++i) {
    const size_t size = 4096 + rng() % (24 << 10);
    ds->samples.push_back(RandomBytes(size, rng()));
    const fs::path p = src.path() / ("s" + std::to_string(i) + ".bin");
    testing::WriteFile(p, ds->samples.back());
    list << p.string() << " " << i << "\n";
  }
  list.close();
  ds->name = std::move(name);
  PackOptions po;
  po.shard_bytes = shard_bytes;
  po.shuffle = false;  // sample id = line of the list = index into ds->samples
  auto m = Pack((src.path() / "list.txt").string(), ds->PackUri(), po);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->sample_count, n);
  ds->shards = uint32_t(m->shards.size());
}

// What one epoch delivered, checked sample by sample against the sources.
struct EpochCheck {
  std::vector<int> seen;  // deliveries per sample id
  size_t batches = 0;
  size_t wrong = 0;          // samples whose bytes or label differ from the source
  double longest_stall = 0;  // the longest time Next() blocked, seconds
  double longest_gap = 0;    // the longest time between two batches, seconds
  Status error;              // the first error Next() returned, if any

  explicit EpochCheck(size_t n) : seen(n, 0) {}

  void Add(const Batch& b, const Dataset& ds) {
    ++batches;
    const auto* image = b.bytes("image");
    const auto* label = b.int64("label");
    ASSERT_NE(image, nullptr);
    ASSERT_NE(label, nullptr);
    for (size_t i = 0; i < b.size(); ++i) {
      const uint64_t id = b.sample_ids()[i];
      ASSERT_LT(id, ds.samples.size());
      seen[id]++;
      const auto bytes =
          image->data.subspan(image->offsets[i], image->offsets[i + 1] - image->offsets[i]);
      const auto& want = ds.samples[id];
      if (label->values[i] != int64_t(id) || bytes.size() != want.size() ||
          !std::equal(bytes.begin(), bytes.end(), want.begin())) {
        ++wrong;
      }
    }
  }

  size_t lost() const { return size_t(std::count(seen.begin(), seen.end(), 0)); }
  size_t duplicated() const {
    return size_t(std::count_if(seen.begin(), seen.end(), [](int s) { return s > 1; }));
  }
};

// Reads one epoch, sleeping `pace` between batches (a training step), and
// calls `at_batch(i)` before the i-th Next().
void RunEpoch(Loader& loader, const Dataset& ds, std::chrono::milliseconds pace,
              const std::function<void(size_t)>& at_batch, EpochCheck* check) {
  auto last = Clock::now();
  for (size_t i = 0;; ++i) {
    if (at_batch) at_batch(i);
    const auto t0 = Clock::now();
    auto b = loader.Next();
    const auto t1 = Clock::now();
    check->longest_stall =
        std::max(check->longest_stall, std::chrono::duration<double>(t1 - t0).count());
    check->longest_gap =
        std::max(check->longest_gap, std::chrono::duration<double>(t1 - last).count());
    last = t1;
    if (!b.ok()) {
      if (b.status().code() != Code::kOutOfRange) check->error = b.status();
      return;
    }
    check->Add(*b, ds);
    std::this_thread::sleep_for(pace);
  }
}

// A loader that keeps few shards in memory, so that it reads all through the
// epoch (as a big dataset would) instead of everything at the start.
LoaderOptions TrickleOptions() {
  LoaderOptions o;
  o.batch_size = 4;
  o.seed = 7;
  o.shuffle_window_shards = 1;
  o.prefetch_batches = 2;
  o.reads_in_flight = 4;
  o.threads = 2;
  o.memory_budget = 1 << 20;
  return o;
}

// ---------------------------------------------------------------------------
// Without a cluster: the URI grammar and the error table.

TEST(RadosUri, Parses) {
  auto p = rados::ParseUri(
      "rados://training_data/mnist/v1?id=stoker-train&conf=/x/ceph.conf"
      "&keyring=/k%20r&timeout_ms=2500");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->pool, "training_data");
  EXPECT_EQ(p->prefix, "mnist/v1");
  EXPECT_EQ(p->id, "stoker-train");
  EXPECT_EQ(p->conf, "/x/ceph.conf");
  EXPECT_EQ(p->keyring, "/k r");
  ASSERT_TRUE(p->timeout.has_value());
  EXPECT_EQ(p->timeout->count(), 2500);

  auto bare = rados::ParseUri("rados://pool");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->pool, "pool");
  EXPECT_EQ(bare->prefix, "");
  EXPECT_FALSE(bare->timeout.has_value());
  EXPECT_EQ(rados::ParseUri("RADOS://pool/a/?id=client.x")->prefix, "a");
  EXPECT_EQ(rados::ParseUri("rados://pool/a/?id=client.x")->id, "x");

  for (const char* bad : {"rados://", "rados:///prefix", "rados://pool?id", "rados://pool?x=1",
                          "rados://pool?timeout_ms=0", "rados://pool?timeout_ms=5s",
                          "rados://pool/../x", "rados://pool/a//b", "rados://pool/.hidden",
                          "rados://pool?id=", "rados://p%zz", "rados://pool#frag", "file:///x"}) {
    auto r = rados::ParseUri(bad);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_TRUE(Contains(r.status().message(), bad)) << r.status().message();
  }
}

TEST(RadosErrors, OneTableForEveryCode) {
  const rados::ErrorContext ctx{"read", "training_data", "mnist/shards/000001.stks",
                                "client.stoker-train", 7};
  struct Case {
    int rc;
    Code code;
    bool retryable;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {-ENOENT,
       Code::kNotFound,
       false,
       {"rados://training_data/mnist/shards/000001.stks", "ENOENT"}},
      {-ETIMEDOUT, Code::kTimedOut, true, {"7 s", "training_data", "ETIMEDOUT"}},
      {-EPERM, Code::kPermissionDenied, false, {"client.stoker-train", "training_data", "read"}},
      {-EACCES, Code::kPermissionDenied, false, {"client.stoker-train", "training_data"}},
      {-ENOSPC, Code::kNoSpace, false, {"pool training_data is full", "ENOSPC"}},
      {-EDQUOT, Code::kNoSpace, false, {"pool training_data is full", "quota"}},
      {-ESHUTDOWN, Code::kUnavailable, true, {"client.stoker-train", "not connected"}},
      {-ENOTCONN, Code::kUnavailable, true, {"not connected"}},
      {-ECANCELED, Code::kCancelled, false, {"cancelled"}},
      {-EFBIG, Code::kInvalidArgument, false, {"osd_max_object_size"}},
      {-EIO, Code::kIoError, false, {"EIO"}},
      {-EAGAIN, Code::kIoError, true, {"EAGAIN"}},
      {-EBUSY, Code::kIoError, true, {"EBUSY"}},
      {-EINVAL, Code::kIoError, false, {"EINVAL"}},
      {-ENOMSG, Code::kIoError, false, {"errno"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("rc " + std::to_string(c.rc));
    const Status st = rados::ErrorToStatus(c.rc, ctx);
    EXPECT_EQ(st.code(), c.code) << st.ToString();
    EXPECT_EQ(st.retryable(), c.retryable) << st.ToString();
    EXPECT_TRUE(Contains(st.message(), "read rados://training_data/mnist/shards/000001.stks"))
        << st.message();
    for (const std::string& s : c.says) EXPECT_TRUE(Contains(st.message(), s)) << st.message();
    // Positive values are taken as errno values too.
    EXPECT_EQ(rados::ErrorToStatus(-c.rc, ctx).code(), c.code);
  }
  EXPECT_TRUE(rados::ErrorToStatus(0, ctx).ok());
  const Status write = rados::ErrorToStatus(-EPERM, {"put", "training_data", "x", "client.a", 0});
  EXPECT_TRUE(Contains(write.message(), "client.a may not write to pool training_data"))
      << write.message();
}

// ---------------------------------------------------------------------------
// Bad configuration: each a clear error naming what and where, quickly.

TEST_F(RadosTest, PoolThatDoesNotExistIsNotFound) {
  auto s = OpenStore("rados://no_such_pool_here/x?id=stoker-train");
  EXPECT_EQ(s.status().code(), Code::kNotFound) << s.status().ToString();
  EXPECT_TRUE(Contains(s.status().message(), "pool \"no_such_pool_here\" does not exist"))
      << s.status().message();
}

TEST_F(RadosTest, MissingConfOrKeyringIsAClearError) {
  auto conf = OpenStore("rados://training_data?conf=/nonexistent/ceph.conf&id=stoker-train");
  EXPECT_EQ(conf.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(conf.status().message(), "/nonexistent/ceph.conf"))
      << conf.status().message();

  auto keyring = OpenStore("rados://training_data?id=stoker-train&keyring=/nonexistent/k");
  EXPECT_EQ(keyring.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(keyring.status().message(), "keyring /nonexistent/k"))
      << keyring.status().message();

  // The conf names a keyring file that is not there (no such client).
  auto nokey = OpenStore("rados://training_data?id=nobody");
  EXPECT_EQ(nokey.status().code(), Code::kNotFound) << nokey.status().ToString();
  EXPECT_TRUE(Contains(nokey.status().message(), "client.nobody")) << nokey.status().message();
  EXPECT_TRUE(Contains(nokey.status().message(), "keyring")) << nokey.status().message();

  // No conf anywhere: CEPH_CONF unset (and this test's host has no /etc/ceph).
  if (!fs::exists("/etc/ceph/ceph.conf")) {
    const std::string saved = std::getenv("CEPH_CONF");
    ::unsetenv("CEPH_CONF");
    TempDir empty_home;
    const char* home = std::getenv("HOME");
    const std::string saved_home = home ? home : "";
    ::setenv("HOME", empty_home.str().c_str(), 1);
    auto none = OpenStore("rados://training_data?id=stoker-train");
    ::setenv("CEPH_CONF", saved.c_str(), 1);
    ::setenv("HOME", saved_home.c_str(), 1);
    EXPECT_EQ(none.status().code(), Code::kNotFound) << none.status().ToString();
    EXPECT_TRUE(Contains(none.status().message(), "CEPH_CONF")) << none.status().message();
  }
}

TEST_F(RadosTest, UnreachableMonitorFailsWithinTheTimeout) {
  // A port nobody listens on: bound, then closed.
  const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  ::close(sock);

  TempDir tmp;
  const std::string conf = tmp.str() + "/ceph.conf";
  {
    std::ifstream in(cluster().conf());
    std::ofstream out(conf);
    for (std::string line; std::getline(in, line);) {
      if (line.starts_with("mon host")) line = "mon host = v2:127.0.0.1:" + std::to_string(port);
      out << line << "\n";
    }
  }
  const auto t0 = Clock::now();
  auto s = OpenStore("rados://training_data?conf=" + conf + "&id=stoker-train&timeout_ms=2000");
  const double took = SecondsSince(t0);
  EXPECT_EQ(s.status().code(), Code::kTimedOut) << s.status().ToString();
  EXPECT_TRUE(s.status().retryable());
  EXPECT_TRUE(Contains(s.status().message(), "cannot connect to the Ceph cluster"));
  EXPECT_TRUE(Contains(s.status().message(), "127.0.0.1:" + std::to_string(port)))
      << s.status().message();
  EXPECT_TRUE(Contains(s.status().message(), conf)) << s.status().message();
  EXPECT_TRUE(Contains(s.status().message(), "client.stoker-train")) << s.status().message();
  EXPECT_GE(took, 1.5);
  EXPECT_LT(took, 8.0) << "a 2 s connect timeout took " << took << " s";
}

// (d) least privilege: the training client may not write the training data,
// and a wrong key is refused, each with a message naming pool and client.
TEST_F(RadosTest, TrainingClientMayNotWriteTrainingData) {
  auto train = OpenStore("rados://training_data/" + Unique("perm") + "?id=stoker-train");
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  const Status put = (*train)->Put("x", RandomBytes(10, 1));
  EXPECT_EQ(put.code(), Code::kPermissionDenied) << put.ToString();
  EXPECT_TRUE(Contains(put.message(), "client.stoker-train")) << put.message();
  EXPECT_TRUE(Contains(put.message(), "may not write to pool training_data")) << put.message();

  // Packing with it fails the same way and leaves no dataset.
  TempDir src;
  testing::WriteFile(src.path() / "c" / "a.bin", RandomBytes(1000, 2));
  const std::string name = Unique("perm-pack");
  auto packed = Pack(src.str(), "rados://training_data/" + name + "?id=stoker-train", {});
  EXPECT_EQ(packed.status().code(), Code::kPermissionDenied) << packed.status().ToString();
  auto reader = OpenStore("rados://training_data/" + name + "?id=stoker-train");
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->Stat("manifest.stoker").status().code(), Code::kNotFound);

  // It may write its checkpoints; the packing client may not read them.
  const std::string ck = Unique("ck");
  auto ckpt = OpenStore("rados://checkpoint/" + ck + "?id=stoker-train");
  ASSERT_TRUE(ckpt.ok());
  ASSERT_OK((*ckpt)->Put("step-1", RandomBytes(100, 3)));
  auto pack_client = OpenStore("rados://checkpoint/" + ck + "?id=stoker-pack");
  ASSERT_TRUE(pack_client.ok());
  auto peek = (*pack_client)->Stat("step-1");
  EXPECT_EQ(peek.status().code(), Code::kPermissionDenied) << peek.status().ToString();
  EXPECT_TRUE(
      Contains(peek.status().message(), "client.stoker-pack may not read from pool checkpoint"))
      << peek.status().message();
  ASSERT_OK((*ckpt)->Remove("step-1"));
}

TEST_F(RadosTest, WrongKeyIsRefused) {
  TempDir tmp;
  const std::string keyring = tmp.str() + "/wrong.keyring";
  auto [rc, out] =
      Sh("ceph-authtool --create-keyring --gen-key -n client.stoker-train " + ShellQuote(keyring));
  ASSERT_EQ(rc, 0) << out;
  const auto t0 = Clock::now();
  auto s = OpenStore("rados://training_data?id=stoker-train&keyring=" + keyring);
  EXPECT_LT(SecondsSince(t0), 10.0);
  EXPECT_EQ(s.status().code(), Code::kPermissionDenied) << s.status().ToString();
  EXPECT_TRUE(Contains(s.status().message(), "cephx refused client.stoker-train"))
      << s.status().message();
  EXPECT_TRUE(Contains(s.status().message(), keyring)) << s.status().message();
}

// ---------------------------------------------------------------------------
// The store and the commands on RADOS.

TEST_F(RadosTest, ObjectNamesArePrefixSlashKey) {
  const std::string prefix = Unique("names");
  auto s = OpenStore("rados://checkpoint/" + prefix + "/deeper?id=stoker-train");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_OK((*s)->Put("a/b", RandomBytes(5, 1)));
  auto [rc, out] =
      Sh("rados --conf " + ShellQuote(cluster().conf()) + " --id stoker-train -p checkpoint stat " +
         ShellQuote(prefix + "/deeper/a/b"));
  EXPECT_EQ(rc, 0) << out;
  auto whole = OpenStore("rados://checkpoint?id=stoker-train");
  ASSERT_TRUE(whole.ok());
  auto listed = (*whole)->List(prefix + "/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].key, prefix + "/deeper/a/b");
  EXPECT_EQ((*listed)[0].size, 5u);
  ASSERT_OK((*s)->Remove("a/b"));
  const StoreDescription d = (*s)->Describe();
  EXPECT_EQ(d.kind, "rados");
  EXPECT_EQ(d.location, "checkpoint");
  EXPECT_EQ(d.prefix, prefix + "/deeper");
  EXPECT_EQ(d.engine, "librados");
}

TEST_F(RadosTest, ObjectsLargerThanRadosAllowsAreRefused) {
  auto s = OpenStore("rados://checkpoint/" + Unique("big") + "?id=stoker-train");
  ASSERT_TRUE(s.ok());
  std::vector<std::byte> big((128 << 20) + 1);
  const Status st = (*s)->Put("too-big", big);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_TRUE(Contains(st.message(), "osd_max_object_size")) << st.message();
}

TEST_F(RadosTest, CommandsWorkUnchangedOnRados) {
  const char* bin = std::getenv("STOKER_BIN");
  if (bin == nullptr || !fs::exists(bin)) GTEST_SKIP() << "STOKER_BIN is not set (ctest sets it)";
  TempDir src;
  for (int c = 0; c < 2; ++c) {
    for (int i = 0; i < 20; ++i) {
      testing::WriteFile(src.path() / ("class" + std::to_string(c)) / ("f" + std::to_string(i)),
                         RandomBytes(3000 + i * 100, c * 100 + i));
    }
  }
  const std::string name = Unique("cli");
  Dataset cleanup;
  cleanup.name = name;
  const std::string b = ShellQuote(bin);
  const std::string pack_uri = ShellQuote("rados://training_data/" + name + "?id=stoker-pack");
  const std::string train_uri = ShellQuote("rados://training_data/" + name + "?id=stoker-train");
  auto [prc, pout] = Sh(b + " pack " + src.str() + " " + pack_uri + " --shard-mib 0.03");
  ASSERT_EQ(prc, 0) << pout;
  EXPECT_TRUE(Contains(pout, "packed 40 samples")) << pout;
  auto [irc, iout] = Sh(b + " inspect " + train_uri);
  EXPECT_EQ(irc, 0) << iout;
  EXPECT_TRUE(Contains(iout, "samples        40")) << iout;
  auto [vrc, vout] = Sh(b + " verify " + train_uri);
  EXPECT_EQ(vrc, 0) << vout;
  EXPECT_TRUE(Contains(vout, ": OK")) << vout;
  auto [lrc, lout] = Sh(b + " bench loader " + train_uri + " --json");
  EXPECT_EQ(lrc, 0) << lout;
  EXPECT_TRUE(Contains(lout, "\"samples\": 40")) << lout;
  // Packing again into the same place is refused; packing with the
  // training client is refused with a clear message and exit code.
  auto [arc, aout] = Sh(b + " pack " + src.str() + " " + pack_uri);
  EXPECT_EQ(arc, 10 + int(Code::kAlreadyExists)) << aout;
  auto [drc, dout] =
      Sh(b + " pack " + src.str() + " " +
         ShellQuote("rados://training_data/" + Unique("cli-denied") + "?id=stoker-train"));
  EXPECT_EQ(drc, 10 + int(Code::kPermissionDenied)) << dout;
  EXPECT_TRUE(Contains(dout, "client.stoker-train may not write to pool training_data")) << dout;
  // bench storage on RADOS: every pattern, and nothing left behind.
  const std::string ck = Unique("bench-storage");
  auto [src_rc, sout] =
      Sh(b + " bench storage " + ShellQuote("rados://checkpoint/" + ck + "?id=stoker-train") +
         " --seconds 0.5 --objects 4 --object-mib 1 --depth 4 --json");
  EXPECT_EQ(src_rc, 0) << sout;
  for (const char* k :
       {"\"write\"", "\"seq\"", "\"rand\"", "\"p99.9\"", "\"mb_per_s\"", "\"iops\""}) {
    EXPECT_TRUE(Contains(sout, k)) << k << " missing in " << sout;
  }
  auto left = OpenStore("rados://checkpoint/" + ck + "?id=stoker-train");
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left.value()->List("")->empty()) << "bench storage left objects behind";
}

TEST_F(RadosTest, StorageBenchLibraryOnRados) {
  auto s = OpenStore("rados://checkpoint/" + Unique("sb") + "?id=stoker-train");
  ASSERT_TRUE(s.ok());
  StorageBenchOptions o;
  o.object_bytes = 256 << 10;
  o.objects = 6;
  o.depth = 3;
  o.seconds = 0.3;
  auto r = RunStorageBench(**s, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->patterns.size(), 3u);
  for (const PatternResult& p : r->patterns) {
    SCOPED_TRACE(p.name);
    EXPECT_GE(p.ops, p.name == "rand" ? 3u : 6u);
    EXPECT_GT(p.mb_per_second(), 0);
    EXPECT_GT(p.latency.p50, 0);
    EXPECT_LE(p.latency.p50, p.latency.p99);
    EXPECT_LE(p.latency.p99, p.latency.p999);
    EXPECT_LE(p.latency.p999, p.latency.max);
  }
  EXPECT_EQ(r->patterns[1].bytes, r->patterns[1].ops * o.object_bytes);
  EXPECT_TRUE((*s)->List("")->empty());
}

// A shard removed while the loader runs: the epoch fails with NotFound
// naming the shard; every sample delivered before that is correct.
TEST_F(RadosTest, ObjectDeletedUnderARunningLoaderIsNotFound) {
  Dataset ds;
  ASSERT_NO_FATAL_FAILURE(MakeDataset(&ds, 200, 64 << 10, Unique("deleted")));
  auto loader = Loader::Open(ds.TrainUri(), TrickleOptions());
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  auto b = (*loader)->Next();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto packer = OpenStore(ds.PackUri());
  ASSERT_TRUE(packer.ok());
  auto shards = (*packer)->List("shards/");
  ASSERT_TRUE(shards.ok());
  for (const ObjectInfo& o : *shards) ASSERT_OK((*packer)->Remove(o.key));
  EpochCheck check(ds.samples.size());
  check.Add(*b, ds);
  RunEpoch(**loader, ds, 0ms, nullptr, &check);
  EXPECT_EQ(check.wrong, 0u);
  EXPECT_EQ(check.error.code(), Code::kNotFound) << check.error.ToString();
  EXPECT_TRUE(Contains(check.error.message(), "rados://training_data/" + ds.name + "/shards/"))
      << check.error.message();
  EXPECT_TRUE(Contains(check.error.message(), "no such object")) << check.error.message();
}

// A pool of its own for a test, removed after it.
struct PoolGuard {
  const Cluster& c;
  std::string pool;
  ~PoolGuard() { c.Ceph("osd pool rm " + pool + " " + pool + " --yes-i-really-really-mean-it"); }
};

// Creates `pool` with a quota of `quota_bytes`, lets `before` write to it
// while it has room, then fills it past the quota and waits until the
// monitor flags it full. Sets *skip when the quota is not enforced in 30 s.
void FillPool(const std::string& pool, uint64_t quota_bytes, const std::function<void()>& before,
              bool* skip) {
  *skip = false;
  for (const std::string& cmd :
       {"osd pool create " + pool + " 8 8 replicated",
        "osd pool application enable " + pool + " rados",
        "osd pool set-quota " + pool + " max_bytes " + std::to_string(quota_bytes)}) {
    auto [rc, out] = Cluster::Get().Ceph(cmd);
    ASSERT_EQ(rc, 0) << cmd << ": " << out;
  }
  if (before) before();
  // Fill it past the quota; the monitor flags the pool full once the usage
  // is reported (a few seconds, through the mgr).
  auto admin = OpenStore("rados://" + pool + "?id=admin");
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  ASSERT_OK((*admin)->Put("filler", RandomBytes(quota_bytes * 4, 1)));
  const auto t0 = Clock::now();
  while (!Contains(Cluster::Get().Ceph("osd pool ls detail").second, "full_quota")) {
    if (SecondsSince(t0) > 30) {
      *skip = true;
      return;
    }
    std::this_thread::sleep_for(250ms);
  }
}

// A pool at its quota: pack fails with a clear NoSpace error at once (not a
// write blocked until the pool has room), and no manifest is written.
TEST_F(RadosTest, PackIntoAFullPoolFailsCleanly) {
  const std::string pool = "stoker_quota_" + std::to_string(::getpid());
  PoolGuard guard{cluster(), pool};
  bool skip = false;
  ASSERT_NO_FATAL_FAILURE(FillPool(pool, 65536, nullptr, &skip));
  if (skip) GTEST_SKIP() << "the pool quota was not enforced within 30 s (no mgr?)";
  auto admin = OpenStore("rados://" + pool + "?id=admin");
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  TempDir src;
  for (int i = 0; i < 30; ++i) {
    testing::WriteFile(src.path() / "c" / ("f" + std::to_string(i)), RandomBytes(20000, i));
  }
  PackOptions po;
  po.shard_bytes = 64 << 10;
  const auto p0 = Clock::now();
  auto packed = Pack(src.str(), "rados://" + pool + "/ds?id=admin", po);
  EXPECT_LT(SecondsSince(p0), 10.0) << "a write to a full pool blocked";
  EXPECT_EQ(packed.status().code(), Code::kNoSpace) << packed.status().ToString();
  EXPECT_TRUE(Contains(packed.status().message(), "pool " + pool + " is full"))
      << packed.status().message();
  auto ds = OpenStore("rados://" + pool + "/ds?id=admin");
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ((*ds)->Stat("manifest.stoker").status().code(), Code::kNotFound)
      << "a failed pack left a manifest";
  // Removing still works in a full pool (it is how it gets room again).
  EXPECT_TRUE((*admin)->Remove("filler").ok());
}

// A checkpoint into a full pool: a clear NoSpace error at once, `latest`
// and the checkpoint saved before the pool filled stay intact.
TEST_F(RadosTest, CheckpointIntoAFullPoolFailsCleanly) {
  const std::string pool = "stoker_ckquota_" + std::to_string(::getpid());
  PoolGuard guard{cluster(), pool};
  const std::string uri = "rados://" + pool + "/run?id=admin";
  std::vector<std::byte> small = RandomBytes(100000, 3);
  std::vector<TensorRef> refs = {{"w", DType::kUInt8, {100000}, small}};
  bool skip = false;
  ASSERT_NO_FATAL_FAILURE(FillPool(
      pool, 1 << 20,
      [&] {
        auto c = OpenCheckpointer(uri);
        ASSERT_TRUE(c.ok()) << c.status().ToString();
        ASSERT_OK((*c)->Save("before", refs, {}));
      },
      &skip));
  if (skip) GTEST_SKIP() << "the pool quota was not enforced within 30 s (no mgr?)";
  auto c = OpenCheckpointer(uri);
  ASSERT_TRUE(c.ok());
  std::vector<std::byte> big = RandomBytes(4 << 20, 4);
  std::vector<TensorRef> more = {{"w", DType::kUInt8, {4 << 20}, big}};
  const auto t0 = Clock::now();
  Status s = (*c)->Save("after", more, {});
  EXPECT_LT(SecondsSince(t0), 10.0) << "a write to a full pool blocked";
  EXPECT_EQ(s.code(), Code::kNoSpace) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "pool " + pool + " is full")) << s.message();
  // Named as the save or its commit, whichever hit the quota first (rank 0
  // claims the commit's sequence number before the chunks are written).
  EXPECT_TRUE(Contains(s.message(), "of checkpoint after")) << s.message();
  auto latest = (*c)->Latest();
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(*latest, "before");
  auto r = (*c)->Restore("", {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), 1u);
  EXPECT_EQ(0, std::memcmp(r->tensors[0].data.data(), small.data(), small.size()));
}

// ---------------------------------------------------------------------------
// Fault injection: OSDs killed or hung mid-epoch.

class RadosFaultTest : public RadosTest {
 protected:
  bool exclusive() const override { return true; }

  void SetUp() override {
    RadosTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    // Two settings of the test cluster, idempotent, set once per process:
    // - Memstore OSDs count as hdd, whose recovery sleeps 0.1 s per object
    //   (osd_recovery_sleep_hdd): a restarted, empty OSD would take minutes
    //   to get its copies back. Tests want it done in seconds.
    // - An OSD sends its peers' failures to the monitor only every
    //   osd_mon_report_interval (5 s), so a hung OSD was marked down 6-11 s
    //   after it stopped, not at the 6 s heartbeat grace; at 1 s, 6-8 s.
    static const bool tuned = [] {
      for (const char* opt : {"osd_recovery_sleep_hdd 0", "osd_recovery_max_active_hdd 16",
                              "osd_mon_report_interval 1"}) {
        auto [rc, out] = cluster().Ceph(std::string("config set osd ") + opt);
        if (rc != 0) std::fprintf(stderr, "rados_test: config set osd %s: %s\n", opt, out.c_str());
      }
      return true;
    }();
    (void)tuned;
    WaitClean();
  }

  // Whatever a test did, the OSDs run again afterwards.
  void TearDown() override {
    if (lock_fd_ >= 0) {
      for (int id = 0; id < 3; ++id) {
        const pid_t pid = cluster().OsdPid(id);
        if (pid > 0) {
          ::kill(pid, SIGCONT);
        } else {
          cluster().Script("restart-osd " + std::to_string(id));
        }
      }
      WaitClean();
    }
    RadosTest::TearDown();
  }

  void WaitClean() {
    const auto t0 = Clock::now();
    auto [rc, out] = cluster().Script("wait-clean");
    EXPECT_EQ(rc, 0) << "wait-clean: " << out;
    std::fprintf(stderr, "[ cluster  ] active+clean after %.1f s\n", SecondsSince(t0));
  }

  void Report(const char* what, const EpochCheck& c, const Loader& l) {
    const LoaderStats s = l.stats();
    std::fprintf(stderr,
                 "[ %s ] %zu batches, %zu samples; lost %zu, duplicated %zu, corrupt %zu; "
                 "longest stall %.2f s (Next() blocked), longest gap between batches %.2f s; "
                 "%lu read retries\n",
                 what, c.batches, ds_.samples.size() - c.lost(), c.lost(), c.duplicated(), c.wrong,
                 c.longest_stall, c.longest_gap, (unsigned long)s.read_retries);
    RecordProperty("longest_stall_s", std::to_string(c.longest_stall));
    RecordProperty("read_retries", std::to_string(s.read_retries));
  }

  Dataset ds_;
};

// (a) SIGKILL an OSD mid-epoch and restart it later: the epoch completes,
// every sample exactly once and correct; the stall stays within 5 s.
TEST_F(RadosFaultTest, KilledOsdMidEpoch) {
  ASSERT_NO_FATAL_FAILURE(MakeDataset(&ds_, 1000, 64 << 10, Unique("kill")));
  auto loader = Loader::Open(ds_.TrainUri(), TrickleOptions());
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  const size_t batches = (*loader)->num_batches();
  std::thread restarter;
  Clock::time_point killed_at;
  EpochCheck check(ds_.samples.size());
  RunEpoch(
      **loader, ds_, 40ms,
      [&](size_t i) {
        if (i == batches / 5) {
          const pid_t pid = cluster().OsdPid(1);
          ASSERT_GT(pid, 0);
          ASSERT_EQ(::kill(pid, SIGKILL), 0);
          killed_at = Clock::now();
          std::fprintf(stderr, "[ fault    ] SIGKILL osd.1 (pid %d) at batch %zu of %zu\n", pid, i,
                       batches);
        }
        if (i == batches / 2) {
          std::fprintf(stderr,
                       "[ fault    ] restarting osd.1 at batch %zu, %.1f s after the kill\n", i,
                       SecondsSince(killed_at));
          restarter = std::thread([] { cluster().Script("restart-osd 1"); });
        }
      },
      &check);
  if (restarter.joinable()) restarter.join();
  Report("SIGKILL ", check, **loader);
  EXPECT_TRUE(check.error.ok()) << check.error.ToString();
  EXPECT_EQ(check.batches, batches);
  EXPECT_EQ(check.lost(), 0u);
  EXPECT_EQ(check.duplicated(), 0u);
  EXPECT_EQ(check.wrong, 0u);
  EXPECT_LE(check.longest_stall, 5.0) << "target: a killed OSD stalls the loader at most 5 s";
}

// (b) SIGSTOP an OSD (hung, not dead), SIGCONT it later: the same
// guarantees; the stall stays within the heartbeat grace (6 s) + 5 s.
TEST_F(RadosFaultTest, HungOsdMidEpoch) {
  ASSERT_NO_FATAL_FAILURE(MakeDataset(&ds_, 1000, 64 << 10, Unique("hang")));
  auto loader = Loader::Open(ds_.TrainUri(), TrickleOptions());
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  const size_t batches = (*loader)->num_batches();
  pid_t pid = -1;
  Clock::time_point stopped_at;
  bool continued = false;
  EpochCheck check(ds_.samples.size());
  RunEpoch(
      **loader, ds_, 40ms,
      [&](size_t i) {
        if (i == batches / 10) {
          pid = cluster().OsdPid(2);
          ASSERT_GT(pid, 0);
          ASSERT_EQ(::kill(pid, SIGSTOP), 0);
          stopped_at = Clock::now();
          std::fprintf(stderr, "[ fault    ] SIGSTOP osd.2 (pid %d) at batch %zu of %zu\n", pid, i,
                       batches);
        }
        // Hung for 12 s: past the 6 s grace, so Ceph marks it down and the
        // reads move to the other copy.
        if (pid > 0 && !continued && SecondsSince(stopped_at) > 12) {
          ::kill(pid, SIGCONT);
          continued = true;
          std::fprintf(stderr, "[ fault    ] SIGCONT osd.2 at batch %zu\n", i);
        }
      },
      &check);
  if (pid > 0 && !continued) ::kill(pid, SIGCONT);
  Report("SIGSTOP ", check, **loader);
  EXPECT_TRUE(check.error.ok()) << check.error.ToString();
  EXPECT_EQ(check.batches, batches);
  EXPECT_EQ(check.lost(), 0u);
  EXPECT_EQ(check.duplicated(), 0u);
  EXPECT_EQ(check.wrong, 0u);
  EXPECT_LE(check.longest_stall, 6.0 + 5.0)
      << "target: a hung OSD stalls the loader at most the heartbeat grace (6 s) + 5 s";
}

// (c) Every OSD hung: the loader reports a timeout naming the shard within
// its configured timeout, instead of hanging; closing it does not hang either.
TEST_F(RadosFaultTest, AllOsdsHungIsATimeoutNotAHang) {
  ASSERT_NO_FATAL_FAILURE(MakeDataset(&ds_, 200, 64 << 10, Unique("allhung")));
  LoaderOptions o = TrickleOptions();
  o.read_timeout = 5s;
  o.store.op_timeout = 5s;
  auto loader = Loader::Open(ds_.TrainUri(), o);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  std::vector<pid_t> pids;
  Clock::time_point stopped_at;
  EpochCheck check(ds_.samples.size());
  RunEpoch(
      **loader, ds_, 0ms,
      [&](size_t i) {
        if (i == 3) {
          for (int id = 0; id < 3; ++id) {
            pids.push_back(cluster().OsdPid(id));
            ASSERT_GT(pids.back(), 0);
            ASSERT_EQ(::kill(pids.back(), SIGSTOP), 0);
          }
          stopped_at = Clock::now();
          std::fprintf(stderr, "[ fault    ] SIGSTOP osd.0-2 at batch %zu\n", i);
        }
      },
      &check);
  const double to_error = SecondsSince(stopped_at);
  const auto c0 = Clock::now();
  loader->reset();  // in-flight reads are cancelled, not waited out
  const double to_close = SecondsSince(c0);
  for (pid_t p : pids) ::kill(p, SIGCONT);
  std::fprintf(stderr, "[ all hung ] error after %.2f s, loader closed in %.2f s: %s\n", to_error,
               to_close, check.error.ToString().c_str());
  EXPECT_EQ(check.error.code(), Code::kTimedOut) << check.error.ToString();
  EXPECT_TRUE(Contains(check.error.message(), "shards/")) << check.error.message();
  EXPECT_EQ(check.wrong, 0u);
  EXPECT_LE(to_error, 5.0 + 3.0) << "read_timeout is 5 s";
  EXPECT_LT(to_close, 3.0);
}

}  // namespace
}  // namespace stoker
