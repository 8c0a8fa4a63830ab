// Shared plumbing of the `stoker` command: one file per subcommand, each a
// thin shell over the library, registered from main.cc.
#pragma once

#include <sys/types.h>

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "stoker/comm.h"
#include "stoker/status.h"

namespace stoker::cli {

// A subcommand's action, run after parsing; returns the exit code.
using Action = std::function<int()>;

// Exit codes: 0 success, 1 the command ran and found problems (verify), 2 a
// usage error, 10 + Code for a failed operation (see status.h).
inline constexpr int kExitProblems = 1;
inline constexpr int kExitUsage = 2;

// Prints "stoker: <status>" to stderr and returns its exit code.
int Fail(const Status& status);

// Registration of each subcommand (one file each).
void RegisterPack(CLI::App& app, Action* action);
// `stoker export DS --webdataset OUTDIR` (cmd_export.cc).
void RegisterExport(CLI::App& app, Action* action);
void RegisterInspect(CLI::App& app, Action* action);
void RegisterVerify(CLI::App& app, Action* action);
void RegisterBench(CLI::App& app, Action* action);
void RegisterDemo(CLI::App& app, Action* action);
void RegisterCkpt(CLI::App& app, Action* action);
// `completion bash`: a completion script from the registered commands.
void RegisterCompletion(CLI::App& app, Action* action);
// `exporter` and `report` (metrics).
void RegisterExporter(CLI::App& app, Action* action);
void RegisterReport(CLI::App& app, Action* action);
// `bench storage`, registered under the `bench` subcommand.
void RegisterBenchStorage(CLI::App* bench, Action* action);
// `bench h2d` and `bench gpu-loader` (GPU delivery), under `bench`.
void RegisterBenchH2d(CLI::App* bench, Action* action);
void RegisterBenchGpuLoader(CLI::App* bench, Action* action);
// `bench node` (N rank processes sharing one node cache), under `bench`.
void RegisterBenchNode(CLI::App* bench, Action* action);
// `bench scale` (open, plan and first batch against the dataset's size).
void RegisterBenchScale(CLI::App* bench, Action* action);

// This program again (/proc/self/exe) with `argv` (argv[0] first), its
// stdin and stdout on pipes: write to `in`, read its stdout from `out`. The
// rank processes of `bench node` and `bench scale`.
struct SelfChild {
  pid_t pid = -1;
  int in = -1;
  int out = -1;
};
Result<SelfChild> SpawnSelf(std::vector<std::string> argv);

// `stoker doctor` (cmd_doctor.cc).
void RegisterDoctor(CLI::App& app, Action* action);
// `stoker tune` and its children `ceph` and `node` (cmd_tune.cc). Other
// files add their own children (tune comm) under TuneCommand(app), which
// makes the `tune` parent the first time and returns it after.
void RegisterTune(CLI::App& app, Action* action);
CLI::App* TuneCommand(CLI::App& app);

// What `stoker --version` prints: version, build options, git revision.
std::string VersionText();
// `bench comm` (collectives), under `bench`, each run through `run`:
// RunCommBench in the product, a fault-injecting runner in the tests' binary
// (tests/comm/comm_faults.cc); `topo` and `tune comm` (comm).
using CommBenchRunner = std::function<Result<CommReport>(const CommBenchOptions&)>;
void RegisterBenchComm(CLI::App* bench, Action* action, CommBenchRunner run = RunCommBench);
void RegisterTopo(CLI::App& app, Action* action);
void RegisterTuneComm(CLI::App& app, Action* action);

// Human-readable byte count ("3.2 GiB").
std::string HumanBytes(double bytes);

// A progress bar on stderr, redrawn in place ("\r") at most 10 times a
// second, with the rate and the time left; drawn only when `enabled` (the
// commands pass: stderr is a terminal and no --quiet). One thread.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled);
  // `done` of `total` bytes (total 0: unknown, no bar or ETA), then `extra`.
  void Update(uint64_t done, uint64_t total, const std::string& extra);
  // Ends the line if a bar was drawn.
  void Finish();
  // Seconds since the bar was made.
  double Seconds() const;

 private:
  bool enabled_;
  bool drawn_ = false;
  double start_;
  double last_ = -1;
};

}  // namespace stoker::cli
