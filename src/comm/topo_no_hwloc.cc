// Built without hwloc: only STOKER_TOPO_FILE's topology is known.
#include "comm/topo_internal.h"

namespace stoker::comm {

Result<Topology> LoadMachineTopology() {
  return Unsupported(
      "built without hwloc (install libhwloc-dev and reconfigure), and STOKER_TOPO_FILE is unset");
}

}  // namespace stoker::comm
