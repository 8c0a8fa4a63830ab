// Rank discovery from launcher environments (rank.h).
#include "stoker/rank.h"

#include <cerrno>
#include <cstdlib>
#include <vector>

namespace stoker {

namespace {

// One launcher's variable names; an empty name: the launcher has none.
struct Launcher {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
  const char* node;
  const char* num_nodes;
};

// In the order they are trusted (rank.h).
constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
     "GROUP_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", "", ""},
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "", ""},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
     "SLURM_NODEID", "SLURM_NNODES"},
};

// A non-negative integer, whole string ("3", not "3x" or "-1").
Result<int> ParseCount(const std::string& name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || v < 0 || v > 1 << 30) {
    return InvalidArgument("environment variable " + name + "='" + text +
                           "' is not a non-negative integer");
  }
  return static_cast<int>(v);
}

// Slurm's SLURM_TASKS_PER_NODE ("4(x2),3": 4 on nodes 0 and 1, 3 on node 2):
// the count on `node`, or nullopt when the text does not parse or is short.
std::optional<int> SlurmTasksOnNode(const std::string& text, int node) {
  size_t pos = 0;
  int index = 0;
  while (pos < text.size()) {
    char* end = nullptr;
    const long count = std::strtol(text.c_str() + pos, &end, 10);
    if (end == text.c_str() + pos || count <= 0) return std::nullopt;
    pos = end - text.c_str();
    long repeat = 1;
    if (pos < text.size() && text[pos] == '(') {
      if (text.compare(pos, 2, "(x") != 0) return std::nullopt;
      repeat = std::strtol(text.c_str() + pos + 2, &end, 10);
      if (repeat <= 0 || *end != ')') return std::nullopt;
      pos = end - text.c_str() + 1;
    }
    if (node < index + repeat) return static_cast<int>(count);
    index += static_cast<int>(repeat);
    if (pos < text.size() && text[pos] != ',') return std::nullopt;
    ++pos;
  }
  return std::nullopt;
}

// Fills `out` from launcher `l`, whose rank and size variables are set.
Status FromLauncher(const Launcher& l, const EnvLookup& env, RankInfo* out) {
  RankInfo r;
  r.launcher = l.name;
  const std::string where = std::string(" (from ") + l.name + ")";
  STOKER_ASSIGN_OR_RETURN(r.rank, ParseCount(l.rank, *env(l.rank)));
  STOKER_ASSIGN_OR_RETURN(r.world_size, ParseCount(l.size, *env(l.size)));
  if (r.world_size == 0) return InvalidArgument(std::string(l.size) + "=0" + where);
  if (r.rank >= r.world_size) {
    return InvalidArgument(std::string(l.rank) + "=" + std::to_string(r.rank) + " is not below " +
                           l.size + "=" + std::to_string(r.world_size) + where);
  }
  // Local rank and size: both, or neither (then this process is alone on its
  // node as far as anyone can tell).
  auto local_rank = env(l.local_rank);
  auto local_size = env(l.local_size);
  if (!local_size && std::string(l.name) == "slurm" && env("SLURM_TASKS_PER_NODE") &&
      env("SLURM_NODEID")) {
    auto node = ParseCount("SLURM_NODEID", *env("SLURM_NODEID"));
    if (node.ok()) {
      if (auto n = SlurmTasksOnNode(*env("SLURM_TASKS_PER_NODE"), *node)) {
        local_size = std::to_string(*n);
      } else {
        return InvalidArgument("SLURM_TASKS_PER_NODE='" + *env("SLURM_TASKS_PER_NODE") +
                               "' does not parse or names no node " + std::to_string(*node) +
                               where);
      }
    }
  }
  // A local rank without a size is common (torchrun's LOCAL_RANK set by
  // hand, srun without --ntasks-per-node): the size is then unknown.
  if (local_size && !local_rank) {
    return InvalidArgument(std::string(l.local_size) + " is set but " + l.local_rank + " is not" +
                           where);
  }
  r.local_rank = 0;
  r.local_size = local_rank ? -1 : 1;
  if (local_rank) {
    STOKER_ASSIGN_OR_RETURN(r.local_rank, ParseCount(l.local_rank, *local_rank));
    if (r.local_rank >= r.world_size) {
      return InvalidArgument(std::string(l.local_rank) + "=" + std::to_string(r.local_rank) +
                             " is not below " + l.size + "=" + std::to_string(r.world_size) +
                             where);
    }
  }
  if (local_size) {
    STOKER_ASSIGN_OR_RETURN(r.local_size, ParseCount(l.local_size, *local_size));
    if (r.local_rank >= r.local_size) {
      return InvalidArgument(std::string(l.local_rank) + "=" + std::to_string(r.local_rank) +
                             " is not below " + l.local_size + "=" + std::to_string(r.local_size) +
                             where);
    }
    if (r.local_size > r.world_size) {
      return InvalidArgument(std::string(l.local_size) + "=" + std::to_string(r.local_size) +
                             " is above " + l.size + "=" + std::to_string(r.world_size) + where);
    }
  }
  // Node index: torchrun and Slurm say; MPI launchers do not.
  r.node = -1;
  r.num_nodes = -1;
  if (*l.node) {
    auto node = env(l.node);
    auto nodes = env(l.num_nodes);
    if (node) {
      STOKER_ASSIGN_OR_RETURN(r.node, ParseCount(l.node, *node));
    }
    if (nodes) {
      STOKER_ASSIGN_OR_RETURN(r.num_nodes, ParseCount(l.num_nodes, *nodes));
    }
    if (node && nodes && r.node >= r.num_nodes) {
      return InvalidArgument(std::string(l.node) + "=" + std::to_string(r.node) + " is not below " +
                             l.num_nodes + "=" + std::to_string(r.num_nodes) + where);
    }
    if (nodes && r.num_nodes > r.world_size) {
      return InvalidArgument(std::string(l.num_nodes) + "=" + std::to_string(r.num_nodes) +
                             " is above " + l.size + "=" + std::to_string(r.world_size) + where);
    }
  }
  // Every process on one node: then the node is known even where the
  // launcher does not name it.
  if (r.local_size == r.world_size) {
    if (r.node > 0) {
      return InvalidArgument(std::string(l.local_size) + " equals " + l.size + " (one node) but " +
                             l.node + "=" + std::to_string(r.node) + where);
    }
    r.node = 0;
    r.num_nodes = 1;
  }
  *out = std::move(r);
  return Status::Ok();
}

}  // namespace

std::string RankInfo::ToString() const {
  if (!launched()) return "rank 0/1 (not started by a launcher)";
  std::string s = "rank " + std::to_string(rank) + "/" + std::to_string(world_size) + " (local " +
                  std::to_string(local_rank);
  if (local_size > 0) s += "/" + std::to_string(local_size);
  if (node >= 0) {
    s += ", node " + std::to_string(node);
    if (num_nodes > 0) s += "/" + std::to_string(num_nodes);
  }
  return s + ", from " + launcher + ")";
}

Result<RankInfo> DiscoverRank(const EnvLookup& env) {
  for (const Launcher& l : kLaunchers) {
    // Both, or the launcher is not this one (rank.h).
    if (env(l.rank) && env(l.size)) {
      RankInfo r;
      STOKER_RETURN_IF_ERROR(FromLauncher(l, env, &r));
      return r;
    }
  }
  return RankInfo{};
}

std::vector<std::string> RankVariables() {
  std::vector<std::string> names;
  for (const Launcher& l : kLaunchers) {
    for (const char* v : {l.rank, l.size, l.local_rank, l.local_size, l.node, l.num_nodes}) {
      if (*v) names.emplace_back(v);
    }
  }
  names.emplace_back("SLURM_TASKS_PER_NODE");
  return names;
}

Result<RankInfo> DiscoverRank() {
  return DiscoverRank([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

Result<RankInfo> DiscoverRank(const std::map<std::string, std::string>& env) {
  return DiscoverRank([&env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

}  // namespace stoker
