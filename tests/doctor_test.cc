// stoker doctor and tune node: the checks on this machine (none may FAIL or
// crash, each with evidence), on fixture trees that take every FAIL and WARN
// path (tests/fixtures/doctor, written by make_fixtures.py), a check that
// hangs, the JSON schema, and the CLI's exit codes.
#include "stoker/doctor.h"

#include <sys/timex.h>
#include <sys/wait.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "gtest/gtest.h"
#include "stoker/tune.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

fs::path Fixture(const std::string& name) { return fs::path(STOKER_DOCTOR_FIXTURES) / name; }

std::map<std::string, CheckResult> ByName(const DoctorReport& r) {
  std::map<std::string, CheckResult> m;
  for (const auto& c : r.checks) m[c.name] = c;
  return m;
}

std::string Describe(const CheckResult& c) {
  std::string s = std::string(CheckStateName(c.state)) + " " + c.name + ": " + c.summary;
  for (const auto& e : c.evidence) s += "\n    " + e;
  if (!c.fix.empty()) s += "\n    fix: " + c.fix;
  return s;
}

DoctorReport RunOn(const std::string& fixture, DoctorOptions o = {}) {
  o.sysroot = Fixture(fixture).string();
  auto r = RunDoctor(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : DoctorReport{};
}

TEST(Doctor, HasTwentyChecksWithUniqueNames) {
  std::set<std::string> names;
  for (const auto& c : DoctorChecks()) {
    EXPECT_TRUE(names.insert(c.name).second) << c.name;
    EXPECT_FALSE(c.description.empty()) << c.name;
  }
  EXPECT_GE(names.size(), 20u);
}

// What the kernel says of its clock, asked here independently of the doctor.
bool ClockUnsynchronized() {
  timex tx{};
  const int state = adjtimex(&tx);
  return state == TIME_ERROR || (tx.status & STA_UNSYNC) != 0;
}

// This machine, as it is: no check crashes or fails, each says what it read
// (a SKIP says why), and the run is quick.
TEST(Doctor, ThisMachine) {
  TempDir cache, ckpt;
  DoctorOptions o;
  o.cache_dir = cache.str();
  o.ckpt_dir = ckpt.str();
  o.dir_read_bytes = 16u << 20;
  if (const char* conf = std::getenv("CEPH_CONF")) {
    o.ceph_uri = std::string("rados://checkpoint?conf=") + conf + "&id=stoker-train";
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto r = RunDoctor(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s", DoctorReportText(*r, true).c_str());
  std::printf("doctor on this machine: %.2f s\n", s);
  ASSERT_EQ(r->checks.size(), DoctorChecks().size());
  const bool unsynced = ClockUnsynchronized();
  for (const auto& c : r->checks) {
    if (c.name == "clock-sync") {
      // The one verdict this machine may fail, when its kernel says so: a
      // guest whose clock no time service disciplines (this VM's, at times).
      const std::string want = unsynced ? "STA_UNSYNC set" : "STA_UNSYNC clear";
      EXPECT_NE(c.evidence.at(0).find(want), std::string::npos) << Describe(c);
      if (unsynced) {
        std::printf("note: this machine's clock is unsynchronised (adjtimex): clock-sync %s\n",
                    std::string(CheckStateName(c.state)).c_str());
        continue;
      }
    }
    EXPECT_NE(c.state, CheckState::kFail) << Describe(c);
    EXPECT_FALSE(c.timed_out) << Describe(c);
    EXPECT_FALSE(c.summary.empty()) << Describe(c);
    if (c.state != CheckState::kSkip) {
      EXPECT_FALSE(c.evidence.empty()) << Describe(c);
    }
    if (c.state == CheckState::kWarn) {
      EXPECT_FALSE(c.fix.empty()) << Describe(c);
    }
  }
  if (!unsynced) {
    EXPECT_LT(r->ExitCode(), 2);
  }
}

TEST(Doctor, GoodFixturePasses) {
  const DoctorReport r = RunOn("good");
  for (const auto& c : r.checks) {
    if (c.name == "cache-dir-read" || c.name == "ckpt-dir-read" || c.name == "ceph-reach") {
      EXPECT_EQ(c.state, CheckState::kSkip) << Describe(c);
    } else {
      EXPECT_EQ(c.state, CheckState::kPass) << Describe(c);
    }
  }
  EXPECT_EQ(r.ExitCode(), 0);
}

// Every check that can fail fails on bad/, each for the reason planted.
TEST(Doctor, BadFixtureFailsEachCheck) {
  DoctorOptions o;
  o.min_vfs = 4;
  const auto m = ByName(RunOn("bad", o));
  const std::map<std::string, std::string> fails = {
      {"kernel-version", "before 5.4.0-135"},
      {"transparent-hugepages", "always"},
      {"hugepages", "too little"},
      {"memlock-limit", "RDMA"},
      {"open-files-limit", "512"},
      {"clock-sync", "STA_UNSYNC"},
      {"iommu", "GPU(s) behind a translating IOMMU"},
      {"gpu-pcie-link", "runs x8 of x16"},
      {"nic-pcie-link", "16.0 of 32.0 GT/s"},
      {"pcie-aspm-policy", "powersave"},
      {"pcie-aspm-devices", "ASPM on for 3"},
      {"sriov", "fewer than 4 VFs"},
      {"gpu-ecc", "uncorrected ECC"},
      {"gpu-mps", "no MPS daemon"},
      {"h2d-bandwidth", "below 10.0 GB/s"},
  };
  for (const auto& [name, reason] : fails) {
    ASSERT_TRUE(m.count(name)) << name;
    const CheckResult& c = m.at(name);
    EXPECT_EQ(c.state, CheckState::kFail) << Describe(c);
    EXPECT_NE(c.summary.find(reason), std::string::npos) << "want '" << reason << "'\n"
                                                         << Describe(c);
    EXPECT_FALSE(c.fix.empty()) << Describe(c);
    EXPECT_FALSE(c.evidence.empty()) << Describe(c);
  }
  const std::map<std::string, std::string> warns = {
      {"numa-layout", "unbalanced"},        {"gpu-numa", "all 2 GPUs on NUMA node 0"},
      {"nic-numa", "no NIC on their node"}, {"numa-balancing", "on with 2"},
      {"cpu-governor", "powersave"},        {"gpu-persistence", "2 GPU(s) without persistence"},
  };
  for (const auto& [name, reason] : warns) {
    const CheckResult& c = m.at(name);
    EXPECT_EQ(c.state, CheckState::kWarn) << Describe(c);
    EXPECT_NE(c.summary.find(reason), std::string::npos) << "want '" << reason << "'\n"
                                                         << Describe(c);
  }
}

// The config space of a device, as lspci reads it: a capability list with
// the PCI Express capability, whose Link Control has `aspm` in bits 0-1.
std::string ConfigSpace(int aspm) {
  std::string c(256, '\0');
  c[0x06] = 0x10;               // status: capability list
  c[0x34] = char(0x40);         // first capability
  c[0x40] = 0x01;               // power management
  c[0x41] = char(0x60);         // next
  c[0x60] = 0x10;               // PCI Express
  c[0x61] = 0x00;               // last
  c[0x60 + 0x10] = char(aspm);  // Link Control
  return c;
}

TEST(Doctor, WarnFixtureTakesTheWarnPaths) {
  // No link/*_aspm files here: the ASPM state comes from the config space,
  // copied so that the fixture in the tree stays as committed.
  TempDir d;
  fs::copy(Fixture("warn"), d.path() / "warn",
           fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  const fs::path devs = d.path() / "warn/sys/bus/pci/devices";
  std::ofstream(devs / "0000:18:00.0/config", std::ios::binary) << ConfigSpace(0);
  for (const char* gpu : {"0000:19:00.0", "0000:9a:00.0"}) {
    std::ofstream(devs / gpu / "config", std::ios::binary) << ConfigSpace(0);
  }
  DoctorOptions o;
  o.sysroot = (d.path() / "warn").string();
  auto r = RunDoctor(o);
  ASSERT_TRUE(r.ok());
  auto m = ByName(*r);
  const std::map<std::string, std::string> warns = {
      {"kernel-version", "5.15 LTS is recommended"},
      {"hugepages", "reserved in huge pages"},
      {"memlock-limit", "128.0 MiB"},
      {"open-files-limit", "4096"},
      {"cpu-governor", "schedutil"},
      {"gpu-pcie-link", "below their speed"},
      {"pcie-aspm-policy", "default"},
      {"gpu-ecc", "ECC off"},
      {"gpu-mps", "compute mode DEFAULT"},
      {"h2d-bandwidth", "below 60% of their link"},
      {"iommu", ""},
  };
  for (const auto& [name, reason] : warns) {
    const CheckResult& c = m.at(name);
    if (name == "iommu") {
      EXPECT_EQ(c.state, CheckState::kPass) << Describe(c);  // no IOMMU unit
      continue;
    }
    EXPECT_EQ(c.state, CheckState::kWarn) << Describe(c);
    EXPECT_NE(c.summary.find(reason), std::string::npos) << "want '" << reason << "'\n"
                                                         << Describe(c);
  }
  EXPECT_EQ(m.at("pcie-aspm-devices").state, CheckState::kPass)
      << Describe(m.at("pcie-aspm-devices"));
  EXPECT_NE(m.at("pcie-aspm-devices").evidence[0].find("config space"), std::string::npos);
  EXPECT_EQ(r->ExitCode(), 1);

  // The same config space with L1 on: FAIL, from the config space.
  for (const char* gpu : {"0000:19:00.0", "0000:9a:00.0"}) {
    std::ofstream(devs / gpu / "config", std::ios::binary) << ConfigSpace(2);
  }
  o.only = {"pcie-aspm-devices"};
  auto again = RunDoctor(o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->checks[0].state, CheckState::kFail) << Describe(again->checks[0]);

  // A spread over 15% alone WARNs as flapping: GPU 1's runs here.
  EXPECT_NE(m.at("h2d-bandwidth").evidence[1].find("spread"), std::string::npos);
}

// An unsynchronised clock fails, except in a guest on a paravirtual clock
// (it follows the host's), where it warns.
TEST(Doctor, UnsyncedClockFailsButWarnsOnAParavirtualClock) {
  TempDir d;
  fs::copy(Fixture("good"), d.path(),
           fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  std::ofstream(d.path() / ".stoker/adjtimex") << "status 0x41\nmaxerror 16000000\n";
  DoctorOptions o;
  o.sysroot = d.str();
  o.only = {"clock-sync"};
  auto r = RunDoctor(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->checks[0].state, CheckState::kFail) << Describe(r->checks[0]);
  fs::create_directories(d.path() / "sys/devices/system/clocksource/clocksource0");
  std::ofstream(d.path() / "sys/devices/system/clocksource/clocksource0/current_clocksource")
      << "kvm-clock\n";
  r = RunDoctor(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->checks[0].state, CheckState::kWarn) << Describe(r->checks[0]);
  EXPECT_NE(r->checks[0].summary.find("kvm-clock"), std::string::npos);
}

// Runs that spread over 15% WARN as flapping, even above every floor.
TEST(Doctor, FlappingCopiesWarn) {
  TempDir d;
  fs::copy(Fixture("good"), d.path(),
           fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  std::ofstream(d.path() / ".stoker/cuda.json")
      << R"({"gpus": [{"index": 0, "name": "NVIDIA H200", "pci_bus_id": "0000:19:00.0"}],
             "h2d_gbps": {"0": [55.0, 41.0, 54.8, 55.1, 47.0]}})";
  DoctorOptions o;
  o.sysroot = d.str();
  o.only = {"h2d-bandwidth"};
  auto r = RunDoctor(o);
  ASSERT_TRUE(r.ok());
  const CheckResult& c = r->checks[0];
  EXPECT_EQ(c.state, CheckState::kWarn) << Describe(c);
  EXPECT_NE(c.summary.find("spread over 15%"), std::string::npos) << Describe(c);
  EXPECT_NEAR(c.metrics.at("gpu0_median_gbps"), 54.8, 1e-9);
  EXPECT_NEAR(c.metrics.at("gpu0_spread"), (55.1 - 41.0) / 54.8, 1e-9);
}

// Folders and a cluster that cannot be used fail, saying which and why.
TEST(Doctor, StorageChecksFailOnWhatCannotBeUsed) {
  TempDir d;
  DoctorOptions o;
  o.sysroot = d.str();
  o.cache_dir = (d.path() / "no-such-folder").string();
  o.ceph_uri = "file:///tmp/not-ceph";
  o.only = {"cache-dir-read", "ceph-reach"};
  auto r = RunDoctor(o);
  ASSERT_TRUE(r.ok());
  auto m = ByName(*r);
  EXPECT_EQ(m.at("cache-dir-read").state, CheckState::kFail) << Describe(m.at("cache-dir-read"));
  EXPECT_NE(m.at("cache-dir-read").summary.find("no-such-folder is not a folder"),
            std::string::npos);
  EXPECT_EQ(m.at("ceph-reach").state, CheckState::kFail) << Describe(m.at("ceph-reach"));
  EXPECT_NE(m.at("ceph-reach").summary.find("is not a rados:// URI"), std::string::npos);
}

TEST(Doctor, MissingFilesSkipWithTheReason) {
  TempDir empty;
  DoctorOptions o;
  o.sysroot = empty.str();
  auto r = RunDoctor(o);
  ASSERT_TRUE(r.ok());
  for (const auto& c : r->checks) {
    EXPECT_NE(c.state, CheckState::kFail) << Describe(c);
    if (c.state == CheckState::kSkip) {
      EXPECT_FALSE(c.summary.empty()) << Describe(c);
    }
  }
  auto m = ByName(*r);
  EXPECT_EQ(m.at("kernel-version").state, CheckState::kSkip);
  EXPECT_NE(m.at("kernel-version").evidence[0].find("cannot read /proc/sys/kernel/osrelease"),
            std::string::npos);
  EXPECT_EQ(m.at("gpu-ecc").state, CheckState::kSkip);
  EXPECT_NE(m.at("gpu-ecc").summary.find("no NVML"), std::string::npos);
}

// A check that never returns: the run goes on at its limit, and names it.
TEST(Doctor, HungCheckTimesOutAndNamesItself) {
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  };
  auto gate = std::make_shared<Gate>();
  DoctorOptions o;
  o.sysroot = Fixture("good").string();
  o.check_timeout = std::chrono::milliseconds(300);
  o.only = {"kernel-version", "test-hang"};
  o.extra_checks.push_back({"test-hang", "a check that blocks (a test hook)", false,
                            [gate](const NodeEnv&, const DoctorOptions&, CheckResult* out) {
                              std::unique_lock lock(gate->mu);
                              gate->cv.wait(lock, [&] { return gate->open; });
                              out->state = CheckState::kPass;
                            }});
  const auto t0 = std::chrono::steady_clock::now();
  auto r = RunDoctor(o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard lock(gate->mu);
    gate->open = true;
  }
  gate->cv.notify_all();
  ASSERT_TRUE(r.ok());
  EXPECT_LT(s, 2.0);
  auto m = ByName(*r);
  EXPECT_EQ(m.at("kernel-version").state, CheckState::kPass);
  const CheckResult& hung = m.at("test-hang");
  EXPECT_EQ(hung.state, CheckState::kFail);
  EXPECT_TRUE(hung.timed_out);
  EXPECT_NE(hung.summary.find("check 'test-hang' timed out after 0.3 s"), std::string::npos)
      << hung.summary;
  EXPECT_EQ(r->ExitCode(), 2);
}

TEST(Doctor, OnlyRunsTheNamedChecksAndRejectsUnknownOnes) {
  DoctorOptions o;
  o.sysroot = Fixture("bad").string();
  o.only = {"clock-sync", "kernel-version"};
  auto r = RunDoctor(o);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->checks.size(), 2u);
  o.only = {"no-such-check"};
  auto bad = RunDoctor(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unknown check 'no-such-check'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("clock-sync"), std::string::npos);
}

struct Ran {
  int code = -1;
  std::string out;
};

Ran Stoker(const std::string& args) {
  const char* bin = std::getenv("STOKER_BIN");
  const std::string exe =
      bin ? bin
          : (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "stoker").string();
  Ran r;
  FILE* p = popen((exe + " " + args + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The JSON report's schema, field by field.
void CheckSchema(const nlohmann::json& j) {
  ASSERT_EQ(j.at("schema"), "stoker.doctor/1");
  ASSERT_TRUE(j.at("root").is_string());
  ASSERT_TRUE(j.at("seconds").is_number());
  ASSERT_TRUE(j.at("exit_code").is_number_integer());
  ASSERT_TRUE(j.at("checks").is_array());
  int total = 0;
  for (const auto& [k, v] : j.at("counts").items()) {
    ASSERT_TRUE(k == "PASS" || k == "WARN" || k == "FAIL" || k == "SKIP") << k;
    total += v.get<int>();
  }
  ASSERT_EQ(total, int(j.at("checks").size()));
  for (const auto& c : j.at("checks")) {
    ASSERT_TRUE(c.at("name").is_string());
    const std::string state = c.at("state");
    ASSERT_TRUE(state == "PASS" || state == "WARN" || state == "FAIL" || state == "SKIP") << state;
    ASSERT_TRUE(c.at("summary").is_string());
    ASSERT_TRUE(c.at("fix").is_string());
    ASSERT_TRUE(c.at("evidence").is_array());
    for (const auto& e : c.at("evidence")) ASSERT_TRUE(e.is_string());
    ASSERT_TRUE(c.at("metrics").is_object());
    for (const auto& [k, v] : c.at("metrics").items()) ASSERT_TRUE(v.is_number()) << k;
    ASSERT_TRUE(c.at("seconds").is_number());
    ASSERT_TRUE(c.at("timed_out").is_boolean());
  }
}

TEST(DoctorCli, JsonSchemaAndExitCodes) {
  Ran good = Stoker("doctor --json --sysroot " + Fixture("good").string());
  EXPECT_EQ(good.code, 0) << good.out;
  auto j = nlohmann::json::parse(good.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << good.out;
  CheckSchema(j);
  EXPECT_EQ(j.at("exit_code"), 0);

  Ran bad = Stoker("doctor --json --sysroot " + Fixture("bad").string());
  EXPECT_EQ(bad.code, 2) << bad.out;
  auto jb = nlohmann::json::parse(bad.out, nullptr, false);
  ASSERT_FALSE(jb.is_discarded()) << bad.out;
  CheckSchema(jb);
  EXPECT_GT(jb.at("counts").at("FAIL").get<int>(), 10);

  Ran warn = Stoker("doctor --sysroot " + Fixture("good").string() +
                    " --only numa-layout gpu-numa --min-h2d-gbps 60");
  EXPECT_EQ(warn.code, 0) << warn.out;
  Ran h2d = Stoker("doctor --sysroot " + Fixture("good").string() +
                   " --only h2d-bandwidth --min-h2d-gbps 60");
  EXPECT_EQ(h2d.code, 2) << h2d.out;
  EXPECT_NE(h2d.out.find("FAIL  h2d-bandwidth"), std::string::npos) << h2d.out;

  Ran unknown = Stoker("doctor --only nope");
  EXPECT_NE(unknown.code, 0);
  EXPECT_NE(unknown.out.find("unknown check 'nope'"), std::string::npos) << unknown.out;

  // This machine, through the CLI, as JSON: it parses and follows the schema.
  Ran here = Stoker("doctor --json");
  if (!ClockUnsynchronized()) {
    EXPECT_LT(here.code, 2) << here.out;
  }
  auto jh = nlohmann::json::parse(here.out, nullptr, false);
  ASSERT_FALSE(jh.is_discarded()) << here.out;
  CheckSchema(jh);
}

TEST(TuneNode, FromTheGoodFixture) {
  TempDir d;
  const fs::path env = d.path() / "comm.env";
  std::ofstream(env)
      << "# from tune comm\nexport NCCL_IB_HCA=mlx5_0,mlx5_1\nNCCL_SOCKET_IFNAME=eth0\n";
  NodeTuneOptions o;
  o.sysroot = Fixture("good").string();
  o.comm_env_file = env.string();
  auto t = PlanNodeTuning(o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const std::string text = t->Text();
  EXPECT_NE(t->mpirun.find("mpirun -np 2 --map-by ppr:1:numa:PE=32 --bind-to core"),
            std::string::npos)
      << t->mpirun;
  EXPECT_NE(text.find("memlock  unlimited"), std::string::npos) << text;
  EXPECT_NE(text.find("kernel.numa_balancing = 0"), std::string::npos) << text;
  EXPECT_NE(text.find("vm.dirty_background_bytes = 268435456"), std::string::npos) << text;
  EXPECT_NE(text.find("export NCCL_IB_HCA=mlx5_0,mlx5_1"), std::string::npos) << text;
  EXPECT_NE(text.find("export NCCL_SOCKET_IFNAME=eth0"), std::string::npos) << text;
  EXPECT_NE(text.find("nvidia-smi -i 0000:19:00.0 -c EXCLUSIVE_PROCESS"), std::string::npos)
      << text;
  EXPECT_NE(text.find("nvidia-cuda-mps-control -d"), std::string::npos) << text;

  // A comm file that is not KEY=VALUE lines is an error naming it.
  std::ofstream(env) << "this is not an env file\n";
  auto bad = PlanNodeTuning(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("comm.env"), std::string::npos);
}

// What the doctor found goes into the plan, with its fixes: bad/'s kernel,
// THP, limits; the measuring checks are not run.
TEST(TuneNode, CarriesTheDoctorsFindings) {
  NodeTuneOptions o;
  o.sysroot = Fixture("bad").string();
  auto t = PlanNodeTuning(o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  NodeTuneOptions good;
  good.sysroot = Fixture("good").string();
  EXPECT_TRUE(PlanNodeTuning(good)->doctor.empty());
  std::string all;
  for (const auto& d : t->doctor) all += d + "\n";
  EXPECT_NE(all.find("FAIL kernel-version: 5.4.0-100-generic"), std::string::npos) << all;
  EXPECT_NE(all.find("FAIL transparent-hugepages"), std::string::npos) << all;
  EXPECT_NE(all.find("| fix: memlock unlimited"), std::string::npos) << all;
  EXPECT_EQ(all.find("h2d-bandwidth"), std::string::npos) << all;
  EXPECT_NE(t->Text().find("# ---- stoker doctor's findings here"), std::string::npos);
  EXPECT_NE(t->Text().find("echo madvise > /sys/kernel/mm/transparent_hugepage/enabled"),
            std::string::npos);
}

TEST(TuneNode, CliWritesTheFile) {
  TempDir d;
  const std::string out = (d.path() / "node.conf").string();
  Ran r = Stoker("tune node --write " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream f(out);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("mpirun -np 1"), std::string::npos) << text;
  EXPECT_NE(text.find("nothing here was applied"), std::string::npos);
  EXPECT_NE(r.out.find(text.substr(0, 40)), std::string::npos);
}

}  // namespace
}  // namespace stoker
