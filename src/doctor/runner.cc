// RunDoctor: a thread per check under its own time limit; the report, as
// JSON and as text.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "doctor/internal.h"

namespace stoker {

std::string_view CheckStateName(CheckState state) {
  switch (state) {
    case CheckState::kPass:
      return "PASS";
    case CheckState::kSkip:
      return "SKIP";
    case CheckState::kWarn:
      return "WARN";
    case CheckState::kFail:
      return "FAIL";
  }
  return "FAIL";
}

const std::vector<CheckSpec>& DoctorChecks() {
  static const std::vector<CheckSpec> kChecks = [] {
    std::vector<CheckSpec> all;
    for (auto part :
         {doctor::PciChecks(), doctor::SystemChecks(), doctor::GpuChecks(), doctor::IoChecks()}) {
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  }();
  return kChecks;
}

CheckState DoctorReport::Worst() const {
  CheckState worst = CheckState::kPass;
  for (const auto& c : checks) worst = std::max(worst, c.state);
  return worst == CheckState::kSkip ? CheckState::kPass : worst;
}

int DoctorReport::ExitCode() const {
  switch (Worst()) {
    case CheckState::kFail:
      return 2;
    case CheckState::kWarn:
      return 1;
    default:
      return 0;
  }
}

namespace {

using Seconds = std::chrono::duration<double>;

// One check's thread and its verdict. Shared with the thread, so that a
// check abandoned at its limit writes into memory that is still there.
struct Slot {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  CheckResult result;
};

std::shared_ptr<Slot> Launch(const CheckSpec& spec, std::shared_ptr<const NodeEnv> env,
                             std::shared_ptr<const DoctorOptions> options) {
  auto slot = std::make_shared<Slot>();
  std::thread([spec, env, options, slot] {
    CheckResult r;
    r.name = spec.name;
    const auto t0 = std::chrono::steady_clock::now();
    // A check must not take the run down: an exception (a parser's) is its
    // failure, reported under its name.
    try {
      spec.run(*env, *options, &r);
    } catch (const std::exception& e) {
      doctor::Verdict(&r, CheckState::kFail, std::string("the check failed: ") + e.what(),
                      "report this as a stoker bug, with the evidence");
    }
    r.seconds = Seconds(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard lock(slot->mu);
    slot->result = std::move(r);
    slot->done = true;
    slot->cv.notify_all();
  }).detach();
  return slot;
}

CheckResult Await(Slot& slot, const CheckSpec& spec, std::chrono::steady_clock::time_point deadline,
                  std::chrono::milliseconds limit) {
  std::unique_lock lock(slot.mu);
  if (slot.cv.wait_until(lock, deadline, [&] { return slot.done; })) return slot.result;
  CheckResult r;
  r.name = spec.name;
  r.timed_out = true;
  r.seconds = Seconds(limit).count();
  doctor::Verdict(&r, CheckState::kFail,
                  "check '" + spec.name + "' timed out after " + doctor::Fixed(r.seconds, 1) +
                      " s and was abandoned (" + spec.description + ")",
                  "find what blocks it: a hung device, mount or driver (the stacks of the stuck "
                  "threads: cat /proc/PID/task/*/stack)");
  r.evidence.push_back("no verdict within the limit of " + doctor::Fixed(r.seconds, 1) + " s");
  return r;
}

}  // namespace

Result<DoctorReport> RunDoctor(const DoctorOptions& options) {
  std::vector<CheckSpec> specs = DoctorChecks();
  specs.insert(specs.end(), options.extra_checks.begin(), options.extra_checks.end());
  if (!options.only.empty()) {
    std::set<std::string> known;
    for (const auto& s : specs) known.insert(s.name);
    for (const auto& name : options.only) {
      if (!known.count(name)) {
        std::string list;
        for (const auto& s : specs) list += (list.empty() ? "" : ", ") + s.name;
        return InvalidArgument("doctor: unknown check '" + name + "'; the checks are: " + list);
      }
    }
    std::erase_if(specs, [&](const CheckSpec& s) {
      return std::find(options.only.begin(), options.only.end(), s.name) == options.only.end();
    });
  }
  auto opts = std::make_shared<const DoctorOptions>(options);
  std::shared_ptr<const NodeEnv> env = options.env ? options.env : NewNodeEnv(options.sysroot);

  DoctorReport report;
  report.root = env->root();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::optional<CheckResult>> results(specs.size());
  // Quick checks all at once, each with its own deadline...
  std::vector<std::pair<size_t, std::shared_ptr<Slot>>> running;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].exclusive) running.emplace_back(i, Launch(specs[i], env, opts));
  }
  for (auto& [i, slot] : running) {
    results[i] = Await(*slot, specs[i], start + options.check_timeout, options.check_timeout);
  }
  // ...then the measurements, one at a time, so that none measures another.
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].exclusive) continue;
    auto slot = Launch(specs[i], env, opts);
    results[i] =
        Await(*slot, specs[i], std::chrono::steady_clock::now() + options.bandwidth_timeout,
              options.bandwidth_timeout);
  }
  for (auto& r : results) report.checks.push_back(std::move(*r));
  report.seconds = Seconds(std::chrono::steady_clock::now() - t0).count();
  return report;
}

std::string DoctorReportJson(const DoctorReport& report) {
  nlohmann::json j;
  j["schema"] = "stoker.doctor/1";
  j["root"] = report.root;
  j["seconds"] = report.seconds;
  j["exit_code"] = report.ExitCode();
  nlohmann::json counts = {{"PASS", 0}, {"WARN", 0}, {"FAIL", 0}, {"SKIP", 0}};
  j["checks"] = nlohmann::json::array();
  for (const CheckResult& c : report.checks) {
    const std::string state(CheckStateName(c.state));
    counts[state] = counts[state].get<int>() + 1;
    nlohmann::json metrics = nlohmann::json::object();
    for (const auto& [k, v] : c.metrics) metrics[k] = v;
    j["checks"].push_back({{"name", c.name},
                           {"state", state},
                           {"summary", c.summary},
                           {"evidence", c.evidence},
                           {"fix", c.fix},
                           {"metrics", metrics},
                           {"seconds", c.seconds},
                           {"timed_out", c.timed_out}});
  }
  j["counts"] = counts;
  // Replacement of invalid UTF-8 (a sysfs string, a device name) rather than
  // an exception.
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string DoctorReportText(const DoctorReport& report, bool verbose) {
  std::string s;
  int counts[4] = {};
  size_t width = 0;
  for (const auto& c : report.checks) width = std::max(width, c.name.size());
  for (const auto& c : report.checks) {
    ++counts[int(c.state)];
    s += std::string(CheckStateName(c.state)) + "  " + c.name +
         std::string(width - c.name.size() + 2, ' ') + c.summary + "\n";
    const bool problem = c.state == CheckState::kWarn || c.state == CheckState::kFail;
    if (verbose || problem) {
      for (const auto& e : c.evidence) s += "      " + e + "\n";
    }
    if (problem && !c.fix.empty()) s += "      fix: " + c.fix + "\n";
  }
  s += "stoker doctor: " + std::to_string(report.checks.size()) + " checks in " +
       doctor::Fixed(report.seconds, 1) + " s (root " + report.root +
       "): " + std::to_string(counts[int(CheckState::kPass)]) + " PASS, " +
       std::to_string(counts[int(CheckState::kWarn)]) + " WARN, " +
       std::to_string(counts[int(CheckState::kFail)]) + " FAIL, " +
       std::to_string(counts[int(CheckState::kSkip)]) + " SKIP\n";
  return s;
}

}  // namespace stoker
