// tune ceph: read the cluster through the `ceph` command (JSON), derive the
// training layout, plan the differences, apply them in order with a check
// after each group, read everything back.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "doctor/internal.h"
#include "doctor/process.h"
#include "stoker/tune.h"

namespace stoker {
namespace {

using nlohmann::json;

std::string Quote(const std::string& s) {
  static const std::regex kPlain("[A-Za-z0-9_./=:,@+-]+");
  if (!s.empty() && std::regex_match(s, kPlain)) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::vector<std::string> BaseArgs(const CephTuneOptions& o) {
  std::vector<std::string> a = {o.ceph};
  if (!o.conf.empty()) a.insert(a.end(), {"--conf", o.conf});
  a.insert(a.end(), {"--id", o.id});
  if (!o.keyring.empty()) a.insert(a.end(), {"--keyring", o.keyring});
  a.insert(a.end(), {"--connect-timeout", std::to_string(o.command_timeout.count())});
  return a;
}

// The `ceph` command's errors: "Error EACCES: access denied" -> the code.
Status CephError(const std::string& shell, const doctor::ProcessResult& r) {
  std::string msg = doctor::Trim(r.err.empty() ? r.out : r.err);
  // Only the last line: the CLI prints its Python warnings before.
  if (const auto nl = msg.rfind('\n'); nl != std::string::npos) msg = msg.substr(nl + 1);
  const std::string what =
      "`" + shell + "` failed (exit " + std::to_string(r.exit_code) + "): " + msg;
  if (msg.find("EACCES") != std::string::npos || msg.find("EPERM") != std::string::npos ||
      msg.find("access denied") != std::string::npos ||
      msg.find("Permission denied") != std::string::npos) {
    return PermissionDenied(what);
  }
  if (msg.find("ENOENT") != std::string::npos) return NotFound(what);
  if (msg.find("ETIMEDOUT") != std::string::npos || r.exit_code == 110 /* ETIMEDOUT */) {
    return TimedOut(what);
  }
  return IoError(what);
}

class Ceph {
 public:
  explicit Ceph(const CephTuneOptions& o) : o_(o) {}

  std::string Shell(const std::vector<std::string>& args) const {
    std::string s;
    for (const auto& a : BaseArgs(o_)) s += (s.empty() ? "" : " ") + Quote(a);
    for (const auto& a : args) s += " " + Quote(a);
    return s;
  }

  Result<std::string> Run(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = BaseArgs(o_);
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = doctor::RunProcess(argv, o_.command_timeout + std::chrono::seconds(5));
    if (!r.ok()) {
      if (r.status().code() == Code::kNotFound) {
        return NotFound("`" + o_.ceph +
                        "` not found (install ceph-common): " + r.status().message());
      }
      return r.status().WithContext("`" + Shell(args) + "`");
    }
    if (r->exit_code != 0) return CephError(Shell(args), *r);
    return r->out;
  }

  Result<json> Json(std::vector<std::string> args) const {
    args.insert(args.end(), {"-f", "json"});
    STOKER_ASSIGN_OR_RETURN(std::string out, Run(args));
    auto j = json::parse(out, nullptr, false);
    if (j.is_discarded()) {
      return IoError("`" + Shell(args) + "` printed no JSON: " + out.substr(0, 200));
    }
    return j;
  }

 private:
  const CephTuneOptions& o_;
};

struct RuleState {
  std::string take;    // "default~hdd"
  std::string domain;  // "osd", "host"
  std::string Text() const { return "take " + take + ", chooseleaf firstn 0 type " + domain; }
};

struct PoolState {
  int size = 0, min_size = 0, pg_num = 0;
  std::string rule, autoscale;
  std::map<std::string, std::map<std::string, std::string>> apps;
};

struct ClusterState {
  int osds = 0, hosts = 0;
  std::map<std::string, int> osds_per_class;
  std::map<std::string, PoolState> pools;
  std::map<std::string, RuleState> rules;
  std::map<std::pair<std::string, std::string>, std::string> config;  // (who, key)
  bool client_exists = false;
  std::map<std::string, std::string> caps;
};

std::string Str(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_null()) return "";
  return j.dump();
}

// What ReadState reads: each part is one `ceph` call (pools need rules, for
// the rules' names).
enum Part : unsigned { kTree = 1, kRules = 2, kPools = 4 | 2, kConfig = 8, kAuth = 16, kAll = 31 };

Result<ClusterState> ReadState(const Ceph& ceph, const CephTuneOptions& o, unsigned parts = kAll) {
  ClusterState s;
  try {
    json tree = json::object();
    if (parts & kTree) {
      STOKER_ASSIGN_OR_RETURN(tree, ceph.Json({"osd", "tree"}));
    }
    for (const auto& n : tree.value("nodes", json::array())) {
      const std::string type = n.value("type", "");
      if (type == "osd") {
        ++s.osds;
        ++s.osds_per_class[n.value("device_class", "")];
      }
      if (type == "host" && !n.value("children", json::array()).empty()) ++s.hosts;
    }
    json rules = json::array(), pools = json::array(), config = json::array();
    if (parts & kRules) {
      STOKER_ASSIGN_OR_RETURN(rules, ceph.Json({"osd", "crush", "rule", "dump"}));
    }
    std::map<int, std::string> rule_names;
    for (const auto& r : rules) {
      rule_names[r.value("rule_id", -1)] = r.value("rule_name", "");
      RuleState rs;
      for (const auto& step : r.value("steps", json::array())) {
        const std::string op = step.value("op", "");
        if (op == "take") rs.take = step.value("item_name", "");
        if (op.rfind("chooseleaf", 0) == 0 || op.rfind("choose_", 0) == 0) {
          rs.domain = step.value("type", "");
        }
      }
      s.rules[r.value("rule_name", "")] = rs;
    }
    if ((parts & kPools) == kPools) {
      STOKER_ASSIGN_OR_RETURN(pools, ceph.Json({"osd", "pool", "ls", "detail"}));
    }
    for (const auto& p : pools) {
      PoolState ps;
      ps.size = p.value("size", 0);
      ps.min_size = p.value("min_size", 0);
      // Since Nautilus pg_num moves towards pg_num_target step by step; the
      // target is what was asked.
      ps.pg_num = p.value("pg_num_target", p.value("pg_num", 0));
      ps.rule = rule_names[p.value("crush_rule", -1)];
      ps.autoscale = p.value("pg_autoscale_mode", "");
      const json apps = p.value("application_metadata", json::object());
      for (const auto& [app, kv] : apps.items()) {
        auto& m = ps.apps[app];
        for (const auto& [k, v] : kv.items()) m[k] = Str(v);
      }
      s.pools[p.value("pool_name", "")] = ps;
    }
    if (parts & kConfig) {
      STOKER_ASSIGN_OR_RETURN(config, ceph.Json({"config", "dump"}));
    }
    for (const auto& c : config) {
      s.config[{c.value("section", ""), c.value("name", "")}] = Str(c.value("value", json()));
    }
    auto auth = (parts & kAuth) ? ceph.Json({"auth", "get", "client." + o.job_client})
                                : Result<json>(NotFound("not read"));
    if (auth.ok()) {
      s.client_exists = true;
      for (const auto& e : *auth) {
        const json caps = e.value("caps", json::object());
        for (const auto& [k, v] : caps.items()) s.caps[k] = Str(v);
      }
    } else if (auth.status().code() != Code::kNotFound) {
      return auth.status();
    }
  } catch (const json::exception& e) {
    return IoError(std::string("tune ceph: unexpected JSON from the ceph command: ") + e.what());
  }
  return s;
}

uint32_t NearestPowerOfTwo(double x) {
  if (x <= 1) return 1;
  return uint32_t(1) << uint32_t(std::lround(std::log2(x)));
}

// What is asked of the cluster, derived from the options and what was read.
struct Desired {
  struct Pool {
    std::string name, role, rule;
    uint32_t pg_num = 0;
  };
  struct Rule {
    std::string name, device_class;
  };
  std::vector<Rule> rules;
  std::vector<Pool> pools;
  std::string domain;
  std::vector<std::tuple<std::string, std::string, std::string>> config;  // who, key, value
  std::string mon_caps, osd_caps;
};

Result<Desired> Derive(const CephTuneOptions& o, const ClusterState& s) {
  if (s.osds == 0) return Unavailable("tune ceph: the cluster has no OSD (ceph osd tree)");
  if (o.replicas == 0 || o.gpus_per_node == 0 || o.data_share <= 0 || o.data_share >= 1) {
    return InvalidArgument(
        "tune ceph: --replicas and --gpus-per-node must be > 0, --data-share in (0, 1)");
  }
  Desired d;
  d.domain = s.hosts >= int(o.replicas) ? "host" : "osd";
  // Checkpoints on the fastest class there is; data on hdd when the cluster
  // has both (capacity), else on the one class. A class with fewer OSDs than
  // copies cannot hold a pool: the other class takes it, or every OSD ("").
  auto fits = [&](const std::string& cls) {
    const auto it = s.osds_per_class.find(cls);
    return it != s.osds_per_class.end() && it->second >= int(o.replicas);
  };
  std::string fast, slow;
  for (const char* c : {"nvme", "ssd"}) {
    if (fast.empty() && fits(c)) fast = c;
  }
  if (fits("hdd")) slow = "hdd";
  for (const auto& [cls, n] : s.osds_per_class) {
    if (fast.empty() && slow.empty() && fits(cls)) fast = slow = cls;
  }
  if (fast.empty()) fast = slow;
  if (slow.empty()) slow = fast;
  auto rule_for = [&](const std::string& cls) {
    return "stoker-" + (cls.empty() ? std::string("any") : cls) + "-" + d.domain;
  };
  for (const std::string& cls : std::set<std::string>{fast, slow}) {
    d.rules.push_back({rule_for(cls), cls});
  }
  auto pgs = [&](const std::string& cls, double share) {
    const int osds = s.osds_per_class.count(cls) ? s.osds_per_class.at(cls) : s.osds;
    return std::max<uint32_t>(8,
                              NearestPowerOfTwo(double(o.pgs_per_osd) * osds * share / o.replicas));
  };
  d.pools.push_back({o.data_pool, "data", rule_for(slow), pgs(slow, o.data_share)});
  d.pools.push_back({o.ckpt_pool, "checkpoint", rule_for(fast), pgs(fast, 1 - o.data_share)});

  const uint64_t memory = o.osd_memory_target
                              ? o.osd_memory_target
                              : std::max<uint64_t>(4ull << 30, uint64_t(o.gpus_per_node) << 30);
  // Two shards per GPU of a client node: each rank keeps its reads in
  // flight on its own shard queue instead of queueing behind another's.
  d.config.emplace_back("osd", "osd_op_num_shards", std::to_string(2 * o.gpus_per_node));
  // The messenger's threads: the default 3 up to 4 GPUs, one per 2 GPUs above.
  d.config.emplace_back("osd", "ms_async_op_threads",
                        std::to_string(std::max<uint32_t>(3, (o.gpus_per_node + 1) / 2)));
  d.config.emplace_back("osd", "osd_memory_target", std::to_string(memory));
  const std::string who = "client." + o.job_client;
  // A rank keeps read_depth objects in flight; twice that lets the next
  // batch's reads start before the last ones land (the default 100 MiB holds
  // less than one 32 x 4 MiB queue).
  const uint64_t bytes = 2ull * o.read_depth * o.object_size;
  d.config.emplace_back(who, "objecter_inflight_op_bytes", std::to_string(bytes));
  d.config.emplace_back(who, "objecter_inflight_ops",
                        std::to_string(std::max<uint64_t>(1024, 8ull * o.read_depth)));
  d.config.emplace_back(who, "rados_osd_op_timeout", std::to_string(o.op_timeout_s));
  d.config.emplace_back(who, "rados_mon_op_timeout", std::to_string(o.op_timeout_s));

  const std::string prefix = o.job_prefix.empty() ? o.job_client : o.job_prefix;
  d.mon_caps = "allow r";
  // Read the data; write checkpoints under the job's prefix only. Reading
  // the whole checkpoint pool is granted because listing needs it (an
  // object_prefix cap refuses pgls: EPERM) and a job resumes from others'.
  d.osd_caps = "allow r pool=" + o.data_pool + ", allow r pool=" + o.ckpt_pool +
               ", allow rw pool=" + o.ckpt_pool + " object_prefix " + prefix + "/";
  return d;
}

uint32_t MinSize(const CephTuneOptions& o) {
  return o.min_size ? o.min_size : std::max<uint32_t>(1, o.replicas - 1);
}

// Every value asked, with the cluster's current one.
std::vector<CephValue> Values(const CephTuneOptions& o, const Desired& d, const ClusterState& s) {
  std::vector<CephValue> v;
  for (const auto& r : d.rules) {
    const std::string take = r.device_class.empty() ? "default" : "default~" + r.device_class;
    const auto it = s.rules.find(r.name);
    v.push_back({"crush rule " + r.name, RuleState{take, d.domain}.Text(),
                 it == s.rules.end() ? "(none)" : it->second.Text()});
  }
  for (const auto& p : d.pools) {
    const auto it = s.pools.find(p.name);
    const bool has = it != s.pools.end();
    auto got = [&](auto f) { return has ? f(it->second) : std::string("(no pool)"); };
    const std::string pre = "pool " + p.name + " ";
    v.push_back({pre + "size", std::to_string(o.replicas),
                 got([](const PoolState& x) { return std::to_string(x.size); })});
    v.push_back({pre + "min_size", std::to_string(MinSize(o)),
                 got([](const PoolState& x) { return std::to_string(x.min_size); })});
    v.push_back({pre + "pg_num", std::to_string(p.pg_num),
                 got([](const PoolState& x) { return std::to_string(x.pg_num); })});
    v.push_back({pre + "crush_rule", p.rule, got([](const PoolState& x) { return x.rule; })});
    v.push_back(
        {pre + "pg_autoscale_mode", "off", got([](const PoolState& x) { return x.autoscale; })});
    v.push_back({pre + "application rados stoker_role", p.role, got([&](const PoolState& x) {
                   const auto a = x.apps.find("rados");
                   if (a == x.apps.end()) return std::string("(not enabled)");
                   const auto r = a->second.find("stoker_role");
                   return r == a->second.end() ? std::string("(unset)") : r->second;
                 })});
  }
  for (const auto& [who, key, value] : d.config) {
    const auto it = s.config.find({who, key});
    v.push_back(
        {"config " + who + " " + key, value, it == s.config.end() ? "(default)" : it->second});
  }
  const std::string entity = "client." + o.job_client;
  auto cap = [&](const char* k) {
    if (!s.client_exists) return std::string("(no client)");
    const auto it = s.caps.find(k);
    return it == s.caps.end() ? std::string("(none)") : it->second;
  };
  v.push_back({"auth " + entity + " caps mon", d.mon_caps, cap("mon")});
  v.push_back({"auth " + entity + " caps osd", d.osd_caps, cap("osd")});
  return v;
}

const CephValue* Find(const std::vector<CephValue>& v, const std::string& what) {
  for (const auto& x : v) {
    if (x.what == what) return &x;
  }
  return nullptr;
}

// The commands that turn the current values into the asked ones, in the
// order they can be applied: rules before the pools that use them, pools
// before their tags, the client last. Each command carries its group, so
// that apply checks a group before it starts the next.
std::vector<CephCommand> Commands(const CephTuneOptions& o, const Desired& d, const ClusterState& s,
                                  const std::vector<CephValue>& v) {
  std::vector<CephCommand> c;
  auto differs = [&](const std::string& what) {
    const CephValue* x = Find(v, what);
    return x && !x->ok();
  };
  for (const auto& r : d.rules) {
    if (!s.rules.count(r.name)) {
      std::vector<std::string> a = {"osd",  "crush",   "rule",  "create-replicated",
                                    r.name, "default", d.domain};
      if (!r.device_class.empty()) a.push_back(r.device_class);
      c.push_back(
          {a, "rules: a replicated rule over " +
                  (r.device_class.empty() ? std::string("every OSD") : r.device_class + " OSDs") +
                  ", one copy per " + d.domain});
    }
  }
  for (const auto& p : d.pools) {
    const auto it = s.pools.find(p.name);
    const std::string pre = "pool " + p.name + " ";
    const std::string pgs = std::to_string(p.pg_num);
    if (it == s.pools.end()) {
      c.push_back({{"osd", "pool", "create", p.name, pgs, pgs, "replicated", p.rule},
                   "pools: the " + p.role + " pool, " + pgs + " PGs"});
    } else {
      if (differs(pre + "crush_rule")) {
        c.push_back({{"osd", "pool", "set", p.name, "crush_rule", p.rule},
                     "pools: " + p.name + " onto " + p.rule + " (data moves)"});
      }
      if (differs(pre + "pg_num")) {
        c.push_back(
            {{"osd", "pool", "set", p.name, "pg_num", pgs},
             "pools: " + p.name + " to " + pgs + " PGs (the cluster moves there gradually)"});
      }
    }
    const bool is_new = it == s.pools.end();
    const int cur_size = is_new ? 0 : it->second.size;
    CephCommand size{{"osd", "pool", "set", p.name, "size", std::to_string(o.replicas)},
                     "pools: " + std::to_string(o.replicas) + " copies"};
    CephCommand min{{"osd", "pool", "set", p.name, "min_size", std::to_string(MinSize(o))},
                    "pools: a write waits for min_size " + std::to_string(MinSize(o)) + " copies"};
    const bool size_change = is_new || differs(pre + "size");
    const bool min_change = is_new || differs(pre + "min_size");
    // min_size may not exceed size: lower min_size first when shrinking.
    if (!is_new && int(o.replicas) < cur_size) {
      if (min_change) c.push_back(min);
      if (size_change) c.push_back(size);
    } else {
      if (size_change) c.push_back(size);
      if (min_change) c.push_back(min);
    }
    if (is_new || differs(pre + "pg_autoscale_mode")) {
      c.push_back({{"osd", "pool", "set", p.name, "pg_autoscale_mode", "off"},
                   "pools: PG count as planned here, not the autoscaler's"});
    }
    const bool enabled = !is_new && it->second.apps.count("rados");
    if (!enabled) {
      c.push_back({{"osd", "pool", "application", "enable", p.name, "rados"},
                   "pools: tagged for librados clients"});
    }
    if (is_new || differs(pre + "application rados stoker_role")) {
      c.push_back({{"osd", "pool", "application", "set", p.name, "rados", "stoker_role", p.role},
                   "pools: stoker's role of the pool"});
    }
  }
  for (const auto& [who, key, value] : d.config) {
    if (differs("config " + who + " " + key)) {
      c.push_back({{"config", "set", who, key, value},
                   "config: " + key +
                       (key == "osd_op_num_shards" || key == "ms_async_op_threads"
                            ? " (read when an OSD starts)"
                            : "")});
    }
  }
  const std::string entity = "client." + o.job_client;
  if (!s.client_exists) {
    c.push_back({{"auth", "get-or-create", entity, "mon", d.mon_caps, "osd", d.osd_caps},
                 "client: the job's key, least privilege"});
  } else if (differs("auth " + entity + " caps mon") || differs("auth " + entity + " caps osd")) {
    c.push_back({{"auth", "caps", entity, "mon", d.mon_caps, "osd", d.osd_caps},
                 "client: the job's caps, least privilege"});
  }
  return c;
}

std::string GroupOf(const CephCommand& c) { return c.why.substr(0, c.why.find(':')); }

struct Planned {
  CephPlan plan;
  Desired desired;
};

Result<Planned> Plan(const Ceph& ceph, const CephTuneOptions& o) {
  STOKER_ASSIGN_OR_RETURN(ClusterState s, ReadState(ceph, o));
  STOKER_ASSIGN_OR_RETURN(Desired d, Derive(o, s));
  Planned p;
  p.desired = d;
  p.plan.osds = s.osds;
  for (const auto& [cls, n] : s.osds_per_class) p.plan.device_classes.push_back(cls);
  p.plan.failure_domain = d.domain;
  p.plan.values = Values(o, d, s);
  p.plan.commands = Commands(o, d, s, p.plan.values);
  return p;
}

// May this key change the cluster? Reading its own caps needs the monitor's
// 'x' on auth; a key that cannot is refused here, before any change.
Status CheckMayChange(const Ceph& ceph, const CephTuneOptions& o) {
  const std::vector<std::string> args = {"auth", "get", "client." + o.id};
  auto me = ceph.Json(args);
  if (!me.ok()) {
    return Status(me.status().code() == Code::kPermissionDenied ? Code::kPermissionDenied
                                                                : me.status().code(),
                  "tune ceph: client." + o.id + " may not change the cluster: " +
                      me.status().message() + "; nothing was applied");
  }
  std::string mon;
  for (const auto& e : *me) mon = Str(e.value("caps", json::object()).value("mon", json()));
  static const std::regex kWrites("allow\\s+(\\*|r?w)|profile\\s+admin");
  if (!std::regex_search(mon, kWrites)) {
    return PermissionDenied("tune ceph: client." + o.id +
                            " may not change the cluster (mon caps '" + mon +
                            "' allow no writes); nothing was applied");
  }
  return Status::Ok();
}

}  // namespace

std::string CephCommand::Shell(const CephTuneOptions& options) const {
  return Ceph(options).Shell(args);
}

std::string CephPlan::Text(const CephTuneOptions& o) const {
  std::string s = "# cluster: " + std::to_string(osds) + " OSD(s), device classes:";
  for (const auto& c : device_classes) s += " " + (c.empty() ? std::string("(none)") : c);
  s += "; one copy per " + failure_domain + "\n# values (asked <- now):\n";
  for (const auto& v : values) {
    s += "#   " + v.what + " = " + v.want + (v.ok() ? "  (as is)" : "  <- " + v.got) + "\n";
  }
  s += "# " + std::to_string(commands.size()) + " change(s):\n";
  for (const auto& c : commands) s += c.Shell(o) + "    # " + c.why + "\n";
  return s;
}

Result<CephPlan> PlanCephLayout(const CephTuneOptions& options) {
  Ceph ceph(options);
  STOKER_ASSIGN_OR_RETURN(Planned p, Plan(ceph, options));
  return p.plan;
}

Result<CephApplyReport> ApplyCephLayout(const CephTuneOptions& o) {
  Ceph ceph(o);
  auto planned = Plan(ceph, o);
  if (!planned.ok()) {
    return Status(planned.status().code(), "tune ceph: reading the cluster as client." + o.id +
                                               ": " + planned.status().message() +
                                               "; nothing was applied");
  }
  Planned& p = *planned;
  CephApplyReport report;
  report.plan = p.plan;
  if (!p.plan.commands.empty()) STOKER_RETURN_IF_ERROR(CheckMayChange(ceph, o));
  auto applied_text = [&] {
    if (report.applied.empty()) return std::string("nothing was applied");
    std::string s = "applied before it (each whole; --apply again finishes the rest):";
    for (const auto& a : report.applied) s += "\n  " + a;
    return s;
  };
  const auto& cmds = p.plan.commands;
  for (size_t i = 0; i < cmds.size(); ++i) {
    auto r = ceph.Run(cmds[i].args);
    if (!r.ok()) {
      return Status(r.status().code(), "tune ceph: step " + std::to_string(i + 1) + " of " +
                                           std::to_string(cmds.size()) + " refused: " +
                                           r.status().message() + "; " + applied_text());
    }
    report.applied.push_back(cmds[i].Shell(o));
    // The end of a group: read the cluster again and check the group's
    // values before the next group builds on them.
    if (i + 1 == cmds.size() || GroupOf(cmds[i + 1]) != GroupOf(cmds[i])) {
      const std::string group = GroupOf(cmds[i]);
      const std::string prefix = group == "rules"    ? "crush rule"
                                 : group == "pools"  ? "pool "
                                 : group == "config" ? "config "
                                                     : "auth ";
      const unsigned part = group == "rules"    ? kRules
                            : group == "pools"  ? kPools
                            : group == "config" ? kConfig
                                                : kAuth;
      STOKER_ASSIGN_OR_RETURN(ClusterState s, ReadState(ceph, o, part));
      for (const auto& v : Values(o, p.desired, s)) {
        if (v.what.rfind(prefix, 0) == 0 && !v.ok()) {
          return Internal("tune ceph: after the " + group + " steps, " + v.what + " reads '" +
                          v.got + "', not '" + v.want + "'; " + applied_text());
        }
      }
    }
  }
  STOKER_ASSIGN_OR_RETURN(ClusterState s, ReadState(ceph, o));
  report.read_back = Values(o, p.desired, s);
  if (!o.job_keyring_out.empty()) {
    // `auth get` prints the keyring; written here so that it is 0600 from
    // its first byte.
    STOKER_ASSIGN_OR_RETURN(std::string keyring,
                            ceph.Run({"auth", "get", "client." + o.job_client}));
    const int fd =
        ::open(o.job_keyring_out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoToStatus(errno, "open " + o.job_keyring_out);
    const bool ok = ::write(fd, keyring.data(), keyring.size()) == ssize_t(keyring.size());
    const int err = errno;
    ::close(fd);
    if (!ok) return ErrnoToStatus(err, "write " + o.job_keyring_out);
  }
  for (const auto& v : report.read_back) {
    if (!v.ok()) {
      return Internal("tune ceph: read back " + v.what + " = '" + v.got + "', asked '" + v.want +
                      "'; " + applied_text());
    }
  }
  return report;
}

}  // namespace stoker
