// The machine's topology through hwloc: NUMA nodes, cores, and the PCI
// GPUs and NICs with the CPUs and NUMA node each is local to.
#include <hwloc.h>

#include <memory>

#include "comm/topo_internal.h"

namespace stoker::comm {

namespace {

std::vector<int> Cpus(hwloc_const_bitmap_t set) {
  std::vector<int> cpus;
  if (set == nullptr) return cpus;
  unsigned i;
  hwloc_bitmap_foreach_begin(i, set) cpus.push_back(static_cast<int>(i));
  hwloc_bitmap_foreach_end();
  return cpus;
}

// PCI display controllers of GPU vendors (not a VM's emulated VGA).
bool IsGpu(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& p) {
  const bool display = (p.class_id >> 8) == 0x03;
  return display && (p.vendor_id == 0x10de || p.vendor_id == 0x1002);
}
// Ethernet, InfiniBand and other network controllers.
bool IsNic(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& p) { return (p.class_id >> 8) == 0x02; }

TopoDevice Describe(hwloc_topology_t t, hwloc_obj_t obj, const char* kind) {
  TopoDevice d;
  d.kind = kind;
  const auto& p = obj->attr->pcidev;
  char pci[32];
  std::snprintf(pci, sizeof pci, "%04x:%02x:%02x.%01x", p.domain, p.bus, p.dev, p.func);
  d.pci = pci;
  // OS devices under it name it best (eth0, mlx5_0, ib0, card0).
  for (hwloc_obj_t c = obj->io_first_child; c != nullptr; c = c->next_sibling) {
    if (c->type == HWLOC_OBJ_OS_DEVICE && c->name != nullptr) {
      d.name += (d.name.empty() ? "" : " / ") + std::string(c->name);
    }
  }
  if (d.name.empty()) {
    const char* model = hwloc_obj_get_info_by_name(obj, "PCIDevice");
    char ids[16];
    std::snprintf(ids, sizeof ids, "%04x:%04x", p.vendor_id, p.device_id);
    d.name = model != nullptr ? model : ids;
  }
  hwloc_obj_t parent = hwloc_get_non_io_ancestor_obj(t, obj);
  if (parent != nullptr) {
    d.cpus = Cpus(parent->cpuset);
    // A NUMA node when exactly one holds the device's CPUs; -1 on machines
    // that do not say (virtual machines, single-node boxes report the root).
    if (parent->nodeset != nullptr && hwloc_bitmap_weight(parent->nodeset) == 1 &&
        hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE) > 1) {
      d.numa = hwloc_bitmap_first(parent->nodeset);
    } else if (hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE) == 1) {
      d.numa = 0;
    }
  }
  return d;
}

}  // namespace

Result<Topology> LoadMachineTopology() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return Internal("hwloc_topology_init failed");
  std::unique_ptr<hwloc_topology, void (*)(hwloc_topology_t)> t(raw, hwloc_topology_destroy);
  hwloc_topology_set_io_types_filter(t.get(), HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(t.get()) != 0) return IoError("hwloc_topology_load failed");
  Topology topo;
  topo.source = "hwloc " + std::string(HWLOC_VERSION);
  topo.cores = hwloc_get_nbobjs_by_type(t.get(), HWLOC_OBJ_CORE);
  topo.pus = hwloc_get_nbobjs_by_type(t.get(), HWLOC_OBJ_PU);
  const int nodes = hwloc_get_nbobjs_by_type(t.get(), HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < nodes; ++i) {
    hwloc_obj_t n = hwloc_get_obj_by_type(t.get(), HWLOC_OBJ_NUMANODE, i);
    TopoNuma numa;
    numa.index = static_cast<int>(n->os_index);
    numa.cpus = Cpus(n->cpuset);
    numa.cores = hwloc_get_nbobjs_inside_cpuset_by_type(t.get(), n->cpuset, HWLOC_OBJ_CORE);
    numa.memory_bytes = n->attr->numanode.local_memory;
    topo.numa.push_back(std::move(numa));
  }
  for (hwloc_obj_t o = hwloc_get_next_pcidev(t.get(), nullptr); o != nullptr;
       o = hwloc_get_next_pcidev(t.get(), o)) {
    if (IsGpu(o->attr->pcidev)) topo.gpus.push_back(Describe(t.get(), o, "gpu"));
    if (IsNic(o->attr->pcidev)) topo.nics.push_back(Describe(t.get(), o, "nic"));
  }
  return topo;
}

}  // namespace stoker::comm
