// What `stoker --version` says: the version, the optional parts this binary
// was built with (STOKER_BUILD_OPTIONS, from CMake) and the git revision of
// the source (captured at build time; "unknown" outside git).
#include "cli/cli.h"
#include "stoker_git_revision.h"

namespace stoker::cli {

std::string VersionText() {
  return std::string("stoker ") + STOKER_VERSION + "\nbuilt with: " + STOKER_BUILD_OPTIONS +
         "\ngit revision: " + STOKER_GIT_REVISION;
}

}  // namespace stoker::cli
