// stoker bench storage URI: the access patterns of a training job, on any
// store (placeholder until the storage benchmark lands).
#include "cli/cli.h"

namespace stoker::cli {

void RegisterBenchStorage(CLI::App* bench, Action* action) {}

}  // namespace stoker::cli
