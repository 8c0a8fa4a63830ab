// stoker_comm_faults: `stoker bench comm` with a fault injected, for the
// tests (tests/comm/test_comm_mpi.py) and scripts/gpu/comm.sh; built with the
// tests, never installed, so the product's `stoker` has no fault to switch on.
//
//   stoker_comm_faults [--corrupt R] [--die R] [--hang R] bench comm ARGS...
//
// --corrupt R zeroes one output element of rank R's reductions (allreduce,
// reducescatter) after each warm-up, before the check, which must catch it.
// --die R and --hang R make rank R die (SIGKILL) or stop, its watchdog too
// (SIGSTOP: a hung node), when the first operation reaches its third size.
//
// The faults are a decorator of the benchmark's CollectiveBackend
// (comm/backend.h): the benchmark loop, its checks and its watchdog are the
// product's, unchanged. Thread safety: the backend's (one thread at a time).
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <utility>

#include "cli/cli.h"
#include "comm/backend.h"
#include "stoker/comm.h"

namespace stoker {

namespace cli {

// cmd_bench_comm.cc's failures, as main.cc prints them.
int Fail(const Status& status) {
  std::fprintf(stderr, "stoker_comm_faults: %s\n", status.ToString().c_str());
  return 10 + static_cast<int>(status.code());
}

}  // namespace cli

namespace {

// The rank each fault hits; -1: none.
struct Faults {
  int corrupt = -1;
  int die = -1;
  int hang = -1;
};

class FaultyBackend final : public comm::CollectiveBackend {
 public:
  FaultyBackend(std::unique_ptr<comm::CollectiveBackend> inner, const Faults& faults, int rank)
      : inner_(std::move(inner)),
        corrupt_(faults.corrupt == rank),
        die_(faults.die == rank),
        hang_(faults.hang == rank) {}

  std::string version() const override { return inner_->version(); }
  std::string device() const override { return inner_->device(); }
  Status Allocate(size_t bytes) override { return inner_->Allocate(bytes); }
  Status Upload(const void* host, size_t bytes) override { return inner_->Upload(host, bytes); }
  Status Download(void* host, size_t bytes) override { return inner_->Download(host, bytes); }
  Status Poke(size_t offset, const void* host, size_t bytes) override {
    return inner_->Poke(offset, host, bytes);
  }
  std::string Algorithm(CommOp op, CommDtype dtype, size_t count) const override {
    return inner_->Algorithm(op, dtype, count);
  }

  // The benchmark clears the output once a size, before its warm-up: the
  // next Wait ends the runs whose result it checks.
  Status ClearOutput(size_t bytes) override {
    checked_next_ = true;
    return inner_->ClearOutput(bytes);
  }

  Status Run(CommOp op, CommDtype dtype, size_t count) override {
    if (!started_) {
      started_ = true;
      first_op_ = op;
      first_dtype_ = dtype;
    }
    // A new size of the first operation (the benchmark runs each size's
    // count once, sizes in increasing order).
    if (op == first_op_ && dtype == first_dtype_ && count != first_count_) {
      first_count_ = count;
      if (++first_sizes_ == 3) {
        if (die_) raise(SIGKILL);
        if (hang_) raise(SIGSTOP);
      }
    }
    op_ = op;
    dtype_ = dtype;
    count_ = count;
    return inner_->Run(op, dtype, count);
  }

  Status Wait() override {
    Status st = inner_->Wait();
    const bool checked = checked_next_;
    checked_next_ = false;
    if (st.ok() && checked && corrupt_ &&
        (op_ == CommOp::kAllReduce || op_ == CommOp::kReduceScatter)) {
      // The middle element of the output (count elements for both).
      const uint64_t zero = 0;
      const size_t elem = CommDtypeSize(dtype_);
      st = inner_->Poke(count_ / 2 * elem, &zero, elem);
    }
    return st;
  }

 private:
  const std::unique_ptr<comm::CollectiveBackend> inner_;
  const bool corrupt_, die_, hang_;
  bool started_ = false;
  CommOp first_op_{};
  CommDtype first_dtype_{};
  size_t first_count_ = 0;
  int first_sizes_ = 0;
  CommOp op_{};
  CommDtype dtype_{};
  size_t count_ = 0;
  bool checked_next_ = false;
};

}  // namespace

}  // namespace stoker

int main(int argc, char** argv) {
  using namespace stoker;
  CLI::App app{"stoker bench comm with a fault injected (tests only)", "stoker_comm_faults"};
  app.require_subcommand(1);
  Faults faults;
  app.add_option("--corrupt", faults.corrupt, "rank whose reductions get one wrong element");
  app.add_option("--die", faults.die, "rank killed (SIGKILL) at the first op's third size");
  app.add_option("--hang", faults.hang, "rank stopped (SIGSTOP) at the first op's third size");
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  cli::Action action;
  const comm::BackendDecorator inject = [&faults](std::unique_ptr<comm::CollectiveBackend> backend,
                                                  int rank, int) {
    return std::unique_ptr<comm::CollectiveBackend>(
        std::make_unique<FaultyBackend>(std::move(backend), faults, rank));
  };
  cli::RegisterBenchComm(
      bench, &action, [&inject](const CommBenchOptions& o) { return comm::RunBench(o, inject); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : cli::kExitUsage;
  }
  return action ? action() : cli::kExitUsage;
}
