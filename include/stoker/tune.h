// stoker tune: settings derived for a GPU-and-Ceph node and its cluster.
//
// tune ceph: the training layout on a Ceph cluster — a data pool and a
// checkpoint pool with PG counts from the OSD count, replication, CRUSH rules
// by device class (checkpoints on the fast class when there is one),
// application tags; a per-job client with least-privilege caps (read the
// data pool, write the checkpoint pool under one prefix, read it whole:
// listing needs that); OSD options scaled
// by GPUs per node and the client options stoker's reads depend on. It reads
// the cluster, plans only the changes (a second apply plans none), applies
// them one by one through the `ceph` command, each checked before the next,
// and reads every value back.
//
// tune node: sysctl, limits, the mpirun mapping, NCCL environment and MPS
// commands for a node, derived from what the doctor reads. It prints and
// writes text; it never changes the node, and never a GPU setting.
//
// Thread safety: the functions are reentrant.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stoker/doctor.h"
#include "stoker/status.h"

namespace stoker {

// ---- tune ceph ----------------------------------------------------------------

struct CephTuneOptions {
  // The `ceph` command and the key it runs as. Default: `ceph` on PATH,
  // ceph's own conf search ($CEPH_CONF, /etc/ceph/ceph.conf), client.admin.
  std::string ceph = "ceph";
  std::string conf;
  std::string id = "admin";  // without "client."
  std::string keyring;       // default: the conf's
  // Each `ceph` call's limit. Default: 60 s.
  std::chrono::seconds command_timeout{60};

  std::string data_pool = "training_data";
  std::string ckpt_pool = "checkpoint";
  // Copies of each object, and the copies a write waits for. Default: 3 and
  // size - 1 (at least 1).
  uint32_t replicas = 3;
  uint32_t min_size = 0;
  // The usual target of PGs per OSD (counting each copy), shared by the two
  // pools: the data pool gets data_share of it. Default: 100, 0.8.
  uint32_t pgs_per_osd = 100;
  double data_share = 0.8;

  // GPUs per node: osd_op_num_shards = 2 x this. Default: 8.
  uint32_t gpus_per_node = 8;
  // Bytes; 0 = max(4 GiB, 1 GiB per GPU of a node). Default: 0.
  uint64_t osd_memory_target = 0;
  // One rank's reads in flight and the object size: the client may have
  // twice that in flight. Default: 32 and 4 MiB (stoker's read queue depth
  // and shard size).
  uint32_t read_depth = 32;
  uint64_t object_size = 4ull << 20;
  // rados_osd_op_timeout and rados_mon_op_timeout of the job client, in
  // seconds. Default: 30 (stoker's store default).
  uint32_t op_timeout_s = 30;

  // The per-job client (without "client.") and the object prefix it may
  // write in the checkpoint pool. Default: "stoker-job", prefix = the client.
  std::string job_client = "stoker-job";
  std::string job_prefix;
  // After an apply, write the job client's keyring here (mode 0600), for
  // the job's `keyring =`. Default: none.
  std::string job_keyring_out;
};

// One `ceph` command of a plan.
struct CephCommand {
  std::vector<std::string> args;  // after `ceph` and the connection options
  std::string why;
  // "ceph osd pool create ...", quoted for a shell.
  std::string Shell(const CephTuneOptions& options) const;
};

// A value asked for and the value read back.
struct CephValue {
  std::string what;  // "pool training_data size"
  std::string want;
  std::string got;
  bool ok() const { return want == got; }
};

struct CephPlan {
  // What was read.
  int osds = 0;
  std::vector<std::string> device_classes;
  std::string failure_domain;  // "host" or "osd"
  // What is asked, one value each, and what the cluster has now.
  std::vector<CephValue> values;
  // The changes, in the order they are applied. Empty: nothing to do.
  std::vector<CephCommand> commands;
  // The job client's config section, caps, and where they come from.
  std::string Text(const CephTuneOptions& options) const;
};

// Reads the cluster and plans the changes. Errors: the `ceph` command
// missing, the cluster unreachable, a read refused (each naming the command).
Result<CephPlan> PlanCephLayout(const CephTuneOptions& options);

struct CephApplyReport {
  CephPlan plan;
  std::vector<std::string> applied;  // the commands run, in order
  std::vector<CephValue> read_back;  // every value, read after the changes
};

// Plans, checks that the key may change the cluster before changing
// anything (PermissionDenied naming the refused command otherwise), then
// runs the commands in order, each checked before the next, and reads every
// value back. A refused or failed command stops the run: the error names it
// and lists what was applied before it (each step whole; none half-done), so
// that a second apply, once fixed, completes the rest. A value read back
// different from what was asked is an error naming it.
Result<CephApplyReport> ApplyCephLayout(const CephTuneOptions& options);

// ---- tune node -----------------------------------------------------------------

struct NodeTuneOptions {
  // Where the node is read (doctor.h's NodeEnv). Default: the live node.
  std::string sysroot = "/";
  std::shared_ptr<NodeEnv> env;
  // Ranks on this node. Default: 0 = one per GPU found (1 without GPUs).
  uint32_t ranks = 0;
  // `stoker tune comm`'s environment file (KEY=VALUE lines, "export" and
  // comments allowed). Default: none; the NCCL section then says so.
  std::string comm_env_file;
  // The MPS folders. Default: /tmp/nvidia-mps, /tmp/nvidia-log.
  std::string mps_pipe_dir = "/tmp/nvidia-mps";
  std::string mps_log_dir = "/tmp/nvidia-log";
};

struct NodeTuning {
  std::vector<std::string> sysctl;    // "vm.dirty_background_bytes = 268435456  # why"
  std::vector<std::string> limits;    // limits.d lines
  std::string mpirun;                 // the mapping and binding options
  std::vector<std::string> nccl_env;  // KEY=VALUE
  std::vector<std::string> mps;       // shell commands, for an operator to run
  std::vector<std::string> notes;     // what was found that the lines follow from
  // The doctor's quick checks (not the measuring ones) that WARN or FAIL
  // here: "WARN cpu-governor: ... | fix: ...".
  std::vector<std::string> doctor;
  std::string Text() const;
};

// Derives the node's settings. Errors only for an unreadable comm env file
// that was named; whatever of the node cannot be read is a note.
Result<NodeTuning> PlanNodeTuning(const NodeTuneOptions& options);

}  // namespace stoker
