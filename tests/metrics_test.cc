// Metrics: the lock-free primitives, the metering store and loader, the step
// timeline's breakdown, publishing, the exporter (merge, HTTP, bad input)
// and the report. The real Prometheus server is in
// tests/python/test_metrics_prometheus.py.
#include "stoker/metrics.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "metrics/nvml.h"
#include "stoker/exporter.h"
#include "stoker/pack.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::TempDir;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The value of the first sample line starting with `prefix`, or -1.
double Value(const std::string& text, const std::string& prefix) {
  size_t at = 0;
  while ((at = text.find(prefix, at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') {
      const size_t sp = text.find(' ', at + prefix.size() - 1);
      return std::strtod(text.c_str() + sp + 1, nullptr);
    }
    ++at;
  }
  return -1;
}

// `promtool check metrics` on `text`: its complaints ("" when none).
std::string Promtool(const std::string& text) {
  if (system("command -v promtool >/dev/null 2>&1") != 0) return "SKIP";
  TempDir d;
  const fs::path in = d.path() / "m.prom", out = d.path() / "out";
  std::ofstream(in) << text;
  const std::string cmd =
      "promtool check metrics < " + in.string() + " > " + out.string() + " 2>&1";
  const int rc = system(cmd.c_str());
  std::string complaints = Slurp(out);
  if (rc != 0 && complaints.empty()) complaints = "promtool exited " + std::to_string(rc);
  return complaints;
}

TEST(MetricsTest, HistogramCountsIntoItsBucket) {
  metrics::Histogram h({0.1, 1, 10});
  h.Observe(0.05);
  h.Observe(0.5);
  h.Observe(0.5);
  h.Observe(100);
  const auto s = h.Read();
  EXPECT_EQ(s.count, 4u);
  EXPECT_EQ(s.counts, (std::vector<uint64_t>{1, 2, 0, 1}));
  EXPECT_DOUBLE_EQ(s.sum, 101.05);
}

TEST(MetricsTest, MeteringStoreCountsOperationsBytesAndErrorsAndPassesPromtool) {
  auto store = metrics::MeteringStore(NewMemoryStore("metrics-test"));
  const std::string before = metrics::Exposition();
  const double ops0 =
      std::max(0.0, Value(before, "stoker_store_operations_total{backend=\"memory\",op=\"read\""));
  std::vector<std::byte> data(1000, std::byte{7});
  ASSERT_OK(store->Put("a/x", data));
  std::vector<std::byte> back(1000);
  auto n = store->Read("a/x", 0, back);
  ASSERT_TRUE(n.ok());
  auto reader = store->OpenReader("a/x");
  ASSERT_TRUE(reader.ok());
  std::span<std::byte> one[] = {std::span(back).first(100)};
  ASSERT_TRUE((*reader)->ReadV(0, one).ok());
  EXPECT_EQ(store->Stat("a/missing").status().code(), Code::kNotFound);

  const std::string text =
      metrics::Exposition(std::vector<std::pair<std::string, std::string>>{{"rank", "3"}});
  EXPECT_EQ(Value(text, "stoker_store_operations_total{backend=\"memory\",op=\"read\""), ops0 + 2);
  EXPECT_GE(Value(text, "stoker_store_written_bytes_total{backend=\"memory\""), 1000);
  EXPECT_GE(Value(text,
                  "stoker_store_errors_total{backend=\"memory\",code=\"not_found\","
                  "op=\"stat\""),
            1);
  EXPECT_NE(text.find("rank=\"3\""), std::string::npos);
  const std::string complaints = Promtool(text);
  if (complaints == "SKIP") GTEST_SKIP() << "promtool (Debian: prometheus) is not installed";
  EXPECT_EQ(complaints, "") << text;
}

TEST(MetricsTest, MeteredLoaderCountsWhatTheLoaderDelivers) {
  TempDir dir;
  for (int i = 0; i < 40; ++i) {
    testing::WriteFile(
        dir.path() / "src" / ("c" + std::to_string(i % 2)) / ("f" + std::to_string(i) + ".bin"),
        testing::RandomBytes(3000 + i, i));
  }
  PackOptions po;
  po.shard_bytes = 16 << 10;
  ASSERT_TRUE(Pack((dir.path() / "src").string(), (dir.path() / "ds").string(), po).ok());
  LoaderOptions lo;
  lo.batch_size = 8;
  const std::string t0 = metrics::Exposition();
  auto opened = Loader::Open((dir.path() / "ds").string(), lo);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  auto loader = metrics::MeterLoader(std::move(*opened));
  uint64_t samples = 0, bytes = 0;
  for (;;) {
    auto b = loader->Next();
    if (!b.ok()) {
      ASSERT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
      break;
    }
    samples += b->size();
    bytes += b->buffer().size();
  }
  const LoaderStats stats = loader->stats();
  loader.reset();  // its last counts stay in the totals
  const std::string t1 = metrics::Exposition();
  auto delta = [&](const std::string& name) {
    return Value(t1, name + " ") - std::max(0.0, Value(t0, name + " "));
  };
  EXPECT_EQ(samples, 40u);
  EXPECT_EQ(delta("stoker_loader_delivered_samples_total"), double(stats.samples_delivered));
  EXPECT_EQ(delta("stoker_loader_delivered_batches_total"), 5);
  EXPECT_EQ(delta("stoker_loader_read_bytes_total"), double(stats.bytes_read));
  // No node cache: every byte read came from the store itself.
  EXPECT_EQ(delta("stoker_loader_remote_bytes_total"), double(stats.bytes_read));
  EXPECT_EQ(delta("stoker_loader_cache_hits_total"), 0);
  EXPECT_EQ(delta("stoker_loader_delivered_bytes_total"), double(bytes));
  EXPECT_EQ(delta("stoker_loader_data_wait_seconds_count"), 6);  // 5 batches + the end
  EXPECT_EQ(Value(t1, "stoker_loaders "), 0);
}

TEST(MetricsTest, TimelineGivesEachInstantToOnePhaseAndSumsToTheStep) {
  auto& t = metrics::StepTimeline::Get();
  ASSERT_OK(t.Start());
  const auto t0 = Clock::now();
  // compute 0..20 ms with an all-reduce 5..12 ms under it; data 20..30 ms.
  t.Add(metrics::Phase::kCompute, t0, t0 + 20ms);
  t.Add(metrics::Phase::kComm, t0 + 5ms, t0 + 12ms);
  t.Add(metrics::Phase::kData, t0 + 20ms, t0 + 30ms);
  std::this_thread::sleep_until(t0 + 40ms);
  const metrics::StepRecord r = t.Mark();
  t.Stop();
  auto at = [&](metrics::Phase p) { return r.phase[static_cast<int>(p)]; };
  EXPECT_NEAR(at(metrics::Phase::kCompute), 0.013, 1e-6);
  EXPECT_NEAR(at(metrics::Phase::kComm), 0.007, 1e-6);
  EXPECT_NEAR(at(metrics::Phase::kData), 0.010, 1e-6);
  double sum = r.other;
  for (double v : r.phase) sum += v;
  EXPECT_NEAR(sum, r.seconds, 1e-9);
  EXPECT_GE(r.seconds, 0.040);
}

TEST(MetricsTest, PublishesAFileAndRemovesItWhenDisabled) {
  TempDir dir;
  metrics::Options o;
  o.dir = dir.str();
  o.job = "j1";
  o.rank = 5;
  o.interval = 50ms;
  ASSERT_OK(metrics::Enable(o));
  const std::string path = metrics::PublishedPath();
  EXPECT_EQ(path, dir.str() + "/" + std::to_string(getpid()) + ".prom");
  const std::string text = Slurp(path);
  EXPECT_NE(text.find("job=\"j1\""), std::string::npos);
  EXPECT_NE(text.find("rank=\"5\""), std::string::npos);
  metrics::Disable();
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(metrics::Enabled());
}

TEST(MetricsTest, UnwritableFolderIsAnErrorNamingIt) {
  metrics::Options o;
  o.dir = "/proc/no-such-place/metrics";
  Status s = metrics::Enable(o);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/proc/no-such-place/metrics"), std::string::npos) << s.ToString();
}

TEST(MetricsTest, MergeGroupsEachFamilyOnce) {
  const std::string a =
      "# HELP x_total X.\n# TYPE x_total counter\nx_total{rank=\"0\"} 1\n"
      "# TYPE h histogram\nh_bucket{le=\"+Inf\",rank=\"0\"} 1\nh_sum{rank=\"0\"} 2\n"
      "h_count{rank=\"0\"} 1\n";
  const std::string b = "# HELP x_total X.\n# TYPE x_total counter\nx_total{rank=\"1\"} 4\n";
  auto m = metrics::MergeExpositions({a, b});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m,
            "# HELP x_total X.\n# TYPE x_total counter\nx_total{rank=\"0\"} 1\n"
            "x_total{rank=\"1\"} 4\n# TYPE h histogram\nh_bucket{le=\"+Inf\",rank=\"0\"} 1\n"
            "h_sum{rank=\"0\"} 2\nh_count{rank=\"0\"} 1\n");
}

// A GET over a plain socket: "STATUS_LINE\n\nBODY".
std::string Get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "connect failed";
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, size_t(n));
  close(fd);
  return out;
}

TEST(MetricsTest, ExporterServesLiveProcessesDropsDeadOnesAndSays404) {
  TempDir dir;
  // A live process (this one), a second file of the same job and rank (a
  // child still running), and one of a process that is gone.
  const std::string live =
      "# stoker job=\"j\" rank=\"0\"\n# HELP a_total A.\n# TYPE a_total counter\n"
      "a_total{job=\"j\",rank=\"0\"} 7\n";
  std::ofstream(dir.path() / (std::to_string(getpid()) + ".prom")) << live;
  const pid_t sleeper = fork();
  if (sleeper == 0) {
    pause();
    _exit(0);
  }
  std::ofstream(dir.path() / (std::to_string(sleeper) + ".prom")) << live;
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  const fs::path dead_file = dir.path() / (std::to_string(dead) + ".prom");
  std::ofstream(dead_file) << "# stoker job=\"j\" rank=\"1\"\n# TYPE a_total counter\n"
                              "a_total{job=\"j\",rank=\"1\"} 9\n";
  // Written 10 s ago: a live process would have rewritten it since.
  fs::last_write_time(dead_file, fs::file_time_type::clock::now() - 10s);

  metrics::ExporterOptions o;
  o.listen = "127.0.0.1:0";
  o.dir = dir.str();
  o.gpu = false;
  o.watch_paths = {dir.str()};
  auto e = metrics::Exporter::Start(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const int port = (*e)->port();
  std::thread server([&] { (void)(*e)->Serve(); });

  const std::string ok = Get(port, "/metrics");
  EXPECT_TRUE(ok.starts_with("HTTP/1.1 200")) << ok;
  EXPECT_NE(ok.find("a_total{job=\"j\",rank=\"0\"} 7"), std::string::npos) << ok;
  EXPECT_NE(ok.find("a_total{pid=\"" + std::to_string(sleeper) + "\",job=\"j\",rank=\"0\"} 7"),
            std::string::npos)
      << ok;
  EXPECT_EQ(ok.find("rank=\"1\""), std::string::npos) << "a dead process's series stay";
  EXPECT_FALSE(fs::exists(dead_file));
  EXPECT_NE(ok.find("stoker_exporter_processes 2"), std::string::npos);
  EXPECT_NE(ok.find("stoker_node_page_cache_bytes"), std::string::npos);
  EXPECT_TRUE(Get(port, "/nope").starts_with("HTTP/1.1 404")) << Get(port, "/nope");

  const std::string body = ok.substr(ok.find("\r\n\r\n") + 4);
  const std::string complaints = Promtool(body);
  if (complaints != "SKIP") EXPECT_EQ(complaints, "") << body;

  // The same port again: a clear error naming it.
  metrics::ExporterOptions again = o;
  again.listen = "127.0.0.1:" + std::to_string(port);
  auto second = metrics::Exporter::Start(again);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos);
  EXPECT_NE(second.status().message().find("in use"), std::string::npos)
      << second.status().ToString();

  (*e)->Stop();
  server.join();
  kill(sleeper, SIGKILL);
  waitpid(sleeper, nullptr, 0);
}

TEST(MetricsTest, ExporterWithoutNvmlWarnsOnceAndServesTheRest) {
  metrics::ExporterOptions o;
  o.listen = "127.0.0.1:0";
  o.nvml_library = "libno-such-nvml.so.1";
  TempDir dir;
  o.dir = dir.str();
  auto e = metrics::Exporter::Start(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  // Here NVML is either the real one (a GPU machine: loaded once already by
  // another test in this process) or absent; either way, no error.
  const std::string text = (*e)->Scrape();
  EXPECT_NE(text.find("stoker_node_page_cache_bytes"), std::string::npos);
  if ((*e)->warnings().empty()) return;
  EXPECT_EQ((*e)->warnings().size(), 1u);
  EXPECT_NE((*e)->warnings()[0].find("NVML"), std::string::npos);
  EXPECT_EQ(text.find("stoker_gpu_"), std::string::npos);
}

TEST(MetricsTest, BadListenAddressesAreErrors) {
  metrics::ExporterOptions o;
  for (const char* bad : {"nonsense", "127.0.0.1:99999", "host.example:80"}) {
    o.listen = bad;
    auto e = metrics::Exporter::Start(o);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.status().code(), Code::kInvalidArgument) << e.status().ToString();
    EXPECT_NE(e.status().message().find(bad), std::string::npos);
  }
}

TEST(MetricsTest, ReportHasEveryPlotAndNamesABadLine) {
  TempDir dir;
  const fs::path log = dir.path() / "run.jsonl";
  {
    std::ofstream out(log);
    for (int i = 1; i <= 50; ++i) {
      out << "{\"step\":" << i << ",\"seconds\":0.1,\"data\":0.03,\"h2d\":0,\"compute\":0.05,"
          << "\"comm\":0.01,\"checkpoint\":" << (i % 10 == 0 ? 0.005 : 0) << ",\"other\":0.01,"
          << "\"samples\":64,\"gpu_utilization\":0.6}\n";
    }
  }
  const fs::path html = dir.path() / "r.html";
  ASSERT_OK(metrics::WriteReport(log.string(), html.string()));
  const std::string page = Slurp(html);
  for (const char* id : {"plot-breakdown", "plot-throughput", "plot-data-wait", "plot-gpu",
                         "plot-checkpoint", "summary"}) {
    EXPECT_NE(page.find(std::string("id=\"") + id + "\""), std::string::npos) << id;
  }
  EXPECT_EQ(page.find("http://"), page.find("http://www.w3.org/2000/svg"));  // no fetches
  std::ofstream(log, std::ios::app) << "{\"step\": oops}\n";
  Status s = metrics::WriteReport(log.string(), html.string());
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find(log.string() + ":51"), std::string::npos) << s.ToString();
}

// ---- checkpoints -------------------------------------------------------------

// A store whose writes all fail as a full pool's do (not retryable).
class FullStore final : public StoreWrapper {
 public:
  using StoreWrapper::Put;
  using StoreWrapper::StoreWrapper;
  Status Put(std::string_view k, std::span<const std::byte>, const WriteOptions&) override {
    return Full(k);
  }

 private:
  static Status Full(std::string_view k) { return NoSpace("full test pool: " + std::string(k)); }
};

// How much the process's checkpoint and memory-store series grew since
// construction (the registry is the process's: other tests add to it).
class CkptDelta {
 public:
  CkptDelta() : before_(metrics::Exposition()) {}
  double operator()(const std::string& series) const {
    return std::max(0.0, Value(metrics::Exposition(), series + " ")) -
           std::max(0.0, Value(before_, series + " "));
  }

 private:
  const std::string before_;
};

// Tensors of 3000 and 5000 bytes and their TensorRefs.
struct TwoTensors {
  std::vector<std::byte> a = testing::RandomBytes(3000, 1), b = testing::RandomBytes(5000, 2);
  std::vector<TensorRef> refs{{"a", DType::kUInt8, {3000}, a}, {"b", DType::kUInt8, {5000}, b}};
};

constexpr const char* kMemWritten =
    "stoker_store_written_bytes_total{backend=\"memory\",pool=\"\"}";

TEST(MetricsTest, MeteredCheckpointerCountsSyncAndAsyncSavesWithTheirBytes) {
  auto store = metrics::MeteringStore(NewMemoryStore("metrics-ckpt"));
  auto c = metrics::MeterCheckpointer(NewCheckpointer(store));
  TwoTensors t;
  const CkptDelta delta;
  ASSERT_OK(c->Save("one", t.refs, {}));
  auto h = c->SaveAsync("two", t.refs, {});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  // The stall is counted when SaveAsync returns, the end when the write does
  // (before Wait returns), without anyone asking the handle first.
  EXPECT_EQ(delta("stoker_checkpoint_stall_seconds_count"), 2);
  ASSERT_OK(h->Wait());
  auto one = c->ReadManifest("one"), two = c->ReadManifest("two");
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(one->bytes(), 8000u);
  EXPECT_EQ(delta("stoker_checkpoint_saves_total"), 2);
  EXPECT_EQ(delta("stoker_checkpoint_completed_total"), 2);
  EXPECT_EQ(delta("stoker_checkpoint_failures_total"), 0);
  EXPECT_EQ(delta("stoker_checkpoint_written_bytes_total"), double(one->bytes() + two->bytes()));
  EXPECT_EQ(delta("stoker_checkpoint_save_seconds_count"), 2);
  EXPECT_GT(delta("stoker_checkpoint_save_seconds_sum"), 0);
  // The checkpointer's store is metered: chunks, part records, manifests,
  // the index and the claims went through it.
  EXPECT_GT(delta(kMemWritten), double(one->bytes() + two->bytes()));

  const std::string complaints = Promtool(metrics::Exposition());
  if (complaints == "SKIP") GTEST_SKIP() << "promtool (Debian: prometheus) is not installed";
  EXPECT_EQ(complaints, "");
}

TEST(MetricsTest, MeteredCheckpointerCountsFailedSavesAndTheStoresErrors) {
  auto store =
      metrics::MeteringStore(std::make_shared<FullStore>(NewMemoryStore("metrics-ckpt-full")));
  CheckpointerOptions co;
  co.retry_backoff = 1ms;
  auto c = metrics::MeterCheckpointer(NewCheckpointer(store, co));
  TwoTensors t;
  const CkptDelta delta;
  EXPECT_EQ(c->Save("sync", t.refs, {}).code(), Code::kNoSpace);
  auto h = c->SaveAsync("async", t.refs, {});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->Wait().code(), Code::kNoSpace);
  // Refused for its arguments: started, and failed.
  EXPECT_EQ(c->Save("bad name!", t.refs, {}).code(), Code::kInvalidArgument);
  EXPECT_EQ(delta("stoker_checkpoint_saves_total"), 3);
  EXPECT_EQ(delta("stoker_checkpoint_failures_total"), 3);
  EXPECT_EQ(delta("stoker_checkpoint_completed_total"), 0);
  EXPECT_EQ(delta("stoker_checkpoint_written_bytes_total"), 0);
  EXPECT_EQ(delta("stoker_checkpoint_stall_seconds_count"), 3);
  EXPECT_GE(delta("stoker_store_errors_total{backend=\"memory\",code=\"no_space\",op=\"write\","
                  "pool=\"\"}"),
            2);
  EXPECT_EQ(delta(kMemWritten), 0);
}

TEST(MetricsTest, SaveStartedAtCountsTheCallersWorkInTheStall) {
  auto c = metrics::MeterCheckpointer(NewCheckpointer(NewMemoryStore("metrics-ckpt-began")));
  TwoTensors t;
  auto& timeline = metrics::StepTimeline::Get();
  ASSERT_OK(timeline.Start());
  const CkptDelta delta;
  const auto start = Clock::now();
  std::this_thread::sleep_for(50ms);  // the caller's own work (a copy of GPU tensors)
  {
    metrics::SaveStartedAt began(start);
    auto h = c->SaveAsync("x", t.refs, {});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_OK(h->Wait());
  }
  const metrics::StepRecord step = timeline.Mark();
  timeline.Stop();
  EXPECT_GE(delta("stoker_checkpoint_stall_seconds_sum"), 0.050);
  EXPECT_GE(step.phase[int(metrics::Phase::kCheckpoint)], 0.050);
  // The scope has ended: the next save's stall is no longer than its call.
  const CkptDelta after;
  const auto began = Clock::now();
  ASSERT_OK(c->Save("y", t.refs, {}));
  const double took = std::chrono::duration<double>(Clock::now() - began).count();
  EXPECT_LE(after("stoker_checkpoint_stall_seconds_sum"), took);
}

TEST(MetricsTest, OpenCheckpointerMetersTheStoreOnlyWhenEnabled) {
  TwoTensors t;
  {
    const CkptDelta delta;
    auto c = metrics::OpenCheckpointer("mem://metrics-ckpt-off");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_OK((*c)->Save("off", t.refs, {}));
    EXPECT_EQ(delta("stoker_checkpoint_completed_total"), 1);
    EXPECT_EQ(delta(kMemWritten), 0);
  }
  TempDir dir;
  metrics::Options o;
  o.dir = dir.str();
  ASSERT_OK(metrics::Enable(o));
  const CkptDelta delta;
  auto c = metrics::OpenCheckpointer("mem://metrics-ckpt-on");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_OK((*c)->Save("on", t.refs, {}));
  metrics::Disable();
  EXPECT_EQ(delta("stoker_checkpoint_completed_total"), 1);
  EXPECT_GT(delta(kMemWritten), 8000);
}

// ---- XID errors ------------------------------------------------------------

#ifdef FAKE_NVML_PATH
// XID events cannot be made on demand on a real GPU: the stand-in NVML
// (tests/fake_nvml.c) registers and delivers them as $FAKE_NVML_XIDS says,
// through the same calls (nvmlEventSetCreate, nvmlDeviceRegisterEvents,
// nvmlEventSetWait_v2, nvmlEventSetFree) the real library answers.
TEST(MetricsTest, XidEventsAreCountedByGpuAndXidAndAbsentWithoutEventSupport) {
  std::string warning;
  metrics::Nvml* nvml = metrics::Nvml::Load(FAKE_NVML_PATH, &warning);
  ASSERT_NE(nvml, nullptr) << warning;
  void* fake = dlopen(FAKE_NVML_PATH, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(fake, nullptr);
  const int* live_sets = static_cast<const int*>(dlsym(fake, "fake_nvml_live_sets"));
  ASSERT_NE(live_sets, nullptr);

  // Registration NOT_SUPPORTED on every GPU (some GPUs, VMs): no watch, no
  // set left behind, and the exporter serves the rest with a warning.
  unsetenv("FAKE_NVML_XIDS");
  EXPECT_FALSE(nvml->WatchXid());
  EXPECT_EQ(*live_sets, 0);
  metrics::ExporterOptions o;
  o.listen = "127.0.0.1:0";
  o.nvml_library = FAKE_NVML_PATH;
  TempDir dir;
  o.dir = dir.str();
  {
    auto e = metrics::Exporter::Start(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    const std::string text = (*e)->Scrape();
    EXPECT_NE(text.find("stoker_gpu_utilization_ratio"), std::string::npos);
    EXPECT_EQ(text.find("stoker_gpu_xid_errors_total"), std::string::npos);
    ASSERT_EQ((*e)->warnings().size(), 1u);
    EXPECT_NE((*e)->warnings()[0].find("XID"), std::string::npos);
  }
  // NVML_ERROR_UNKNOWN leaves the set undefined: freed, no watch.
  setenv("FAKE_NVML_XIDS", "unknown", 1);
  EXPECT_FALSE(nvml->WatchXid());
  EXPECT_EQ(*live_sets, 0);

  // Events: two XID 79 on GPU 0, XID 48 on GPU 1, an ECC event (not an
  // XID), and XID 13 on a device handle that is none of the GPUs.
  setenv("FAKE_NVML_XIDS", "0:79,1:48,ecc,0:79,9:13", 1);
  ASSERT_TRUE(nvml->WatchXid());
  using Key = std::pair<unsigned, uint64_t>;
  const std::map<Key, uint64_t> want = {
      {{0, 79}, 2}, {{1, 48}, 1}, {{metrics::Nvml::kUnknownGpu, 13}, 1}};
  const auto deadline = Clock::now() + 10s;
  while (nvml->Xids() != want && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(nvml->Xids(), want);
  auto e = metrics::Exporter::Start(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_TRUE((*e)->warnings().empty());
  const std::string text = (*e)->Scrape();
  EXPECT_EQ(Value(text, "stoker_gpu_xid_errors_total{gpu=\"0\",xid=\"79\"}"), 2) << text;
  EXPECT_EQ(Value(text, "stoker_gpu_xid_errors_total{gpu=\"1\",xid=\"48\"}"), 1);
  EXPECT_EQ(Value(text, "stoker_gpu_xid_errors_total{gpu=\"unknown\",xid=\"13\"}"), 1);
  const std::string complaints = Promtool(text);
  if (complaints != "SKIP") EXPECT_EQ(complaints, "") << text;
}
#endif

}  // namespace
}  // namespace stoker
