// The machine's topology from hwloc (topo_hwloc.cc), or Unsupported in a
// build without it (topo_no_hwloc.cc); topo.cc does the rest.
#pragma once

#include "stoker/topo.h"

namespace stoker::comm {

Result<Topology> LoadMachineTopology();

}  // namespace stoker::comm
