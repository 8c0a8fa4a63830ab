// stoker tune comm (placeholder until tune.cc lands).
#include "cli/cli.h"

namespace stoker::cli {
void RegisterTuneComm(CLI::App& app, Action* action) {}
}  // namespace stoker::cli
