// stoker report RUN_LOG [-o report.html]: one self-contained HTML page of a
// run's step timeline (plots and the summary table).
#include <cstdio>

#include "cli/cli.h"
#include "stoker/metrics.h"

namespace stoker::cli {

void RegisterReport(CLI::App& app, Action* action) {
  struct Args {
    std::string log, out = "report.html";
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("report", "An HTML report (plots, summary) of a run's step log");
  cmd->add_option("RUN_LOG", args->log, "The run's step log (JSON lines, StepTimeline)")
      ->required();
  cmd->add_option("-o,--output", args->out, "The HTML file to write")->capture_default_str();
  cmd->callback([args, action] {
    *action = [args] {
      Status s = metrics::WriteReport(args->log, args->out);
      if (!s.ok()) return Fail(s);
      std::printf("wrote %s\n", args->out.c_str());
      return 0;
    };
  });
}

}  // namespace stoker::cli
