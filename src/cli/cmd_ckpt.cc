// stoker ckpt ls|show|verify|rm URI: the checkpoints under a root
// (docs/checkpoint.md), for an operator.
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "stoker/checkpoint.h"

namespace stoker::cli {

namespace {

std::string When(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  std::time_t t = unix_ms / 1000;
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string Shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

int Ls(Checkpointer& c, bool as_json) {
  auto list = c.List();
  if (!list.ok()) return Fail(list.status());
  if (as_json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const CheckpointListing& l : *list) {
      j.push_back({{"name", l.name},
                   {"committed", l.committed},
                   {"latest", l.latest},
                   {"sequence", l.sequence},
                   {"bytes", l.bytes},
                   {"tensors", l.tensors},
                   {"world_size", l.world_size},
                   {"created_unix_ms", l.created_unix_ms},
                   {"objects", l.objects},
                   {"problem", l.problem}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%-28s %5s %10s %8s %5s  %-20s %s\n", "NAME", "SEQ", "SIZE", "TENSORS", "RANKS",
              "CREATED (UTC)", "STATE");
  for (const CheckpointListing& l : *list) {
    if (!l.problem.empty()) {
      std::printf("%-28s %5s %10s %8s %5s  %-20s damaged: %s\n", l.name.c_str(), "-", "-", "-", "-",
                  "-", l.problem.c_str());
    } else if (l.committed) {
      std::printf("%-28s %5lu %10s %8lu %5u  %-20s %s\n", l.name.c_str(), (unsigned long)l.sequence,
                  HumanBytes(double(l.bytes)).c_str(), (unsigned long)l.tensors, l.world_size,
                  When(l.created_unix_ms).c_str(), l.latest ? "committed, latest" : "committed");
    } else {
      std::printf("%-28s %5s %10s %8s %5s  %-20s incomplete (%lu objects, no manifest)\n",
                  l.name.c_str(), "-", "-", "-", "-", "-", (unsigned long)l.objects);
    }
  }
  return 0;
}

int Show(Checkpointer& c, const std::string& name, bool as_json) {
  auto m = c.ReadManifest(name);
  if (!m.ok()) return Fail(m.status());
  if (as_json) {
    nlohmann::ordered_json j;
    j["name"] = m->name;
    j["format_version"] = m->format_version;
    j["sequence"] = m->sequence;
    j["created_by"] = m->created_by;
    j["created_unix_ms"] = m->created_unix_ms;
    j["world_size"] = m->world_size;
    j["bytes"] = m->bytes();
    j["metadata"] = nlohmann::ordered_json::parse(m->metadata_json, nullptr, false);
    auto& tensors = j["tensors"] = nlohmann::ordered_json::array();
    for (const RankPart& r : m->ranks) {
      for (const TensorInfo& t : r.tensors) {
        tensors.push_back({{"name", t.name},
                           {"rank", t.rank},
                           {"dtype", DTypeName(t.dtype)},
                           {"shape", t.shape},
                           {"bytes", t.bytes}});
      }
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  size_t chunks = 0;
  for (const RankPart& r : m->ranks) chunks += r.chunks.size();
  std::printf("checkpoint  %s (sequence %lu, format v%u)\n", m->name.c_str(),
              (unsigned long)m->sequence, m->format_version);
  std::printf("created     %s by %s\n", When(m->created_unix_ms).c_str(), m->created_by.c_str());
  std::printf("ranks       %u\n", m->world_size);
  std::printf("size        %s in %zu tensors, %zu chunks\n", HumanBytes(double(m->bytes())).c_str(),
              m->tensor_count(), chunks);
  std::printf("metadata    %.200s%s\n", m->metadata_json.c_str(),
              m->metadata_json.size() > 200 ? "..." : "");
  std::printf("\n%-5s %-40s %-10s %-20s %s\n", "RANK", "TENSOR", "DTYPE", "SHAPE", "SIZE");
  for (const RankPart& r : m->ranks) {
    for (const TensorInfo& t : r.tensors) {
      std::printf("%-5u %-40s %-10s %-20s %s\n", t.rank, t.name.c_str(),
                  std::string(DTypeName(t.dtype)).c_str(), Shape(t.shape).c_str(),
                  HumanBytes(double(t.bytes)).c_str());
    }
  }
  return 0;
}

int VerifyCkpt(Checkpointer& c, const std::string& name) {
  CheckpointVerifyReport r;
  Status s = c.Verify(name, &r);
  if (!s.ok() && r.chunks == 0) return Fail(s);
  for (const std::string& p : r.problems) std::printf("BAD  %s\n", p.c_str());
  std::printf(
      "%s %s: %lu chunks, %lu tensors, %s checked: %s\n", c.uri().c_str(),
      name.empty() ? "latest" : name.c_str(), (unsigned long)r.chunks, (unsigned long)r.tensors,
      HumanBytes(double(r.bytes)).c_str(),
      r.problems.empty() ? "OK" : (std::to_string(r.problems.size()) + " problem(s)").c_str());
  return r.problems.empty() ? 0 : kExitProblems;
}

}  // namespace

void RegisterCkpt(CLI::App& app, Action* action) {
  struct Args {
    std::string uri, name;
    std::vector<std::string> names;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto* ckpt = app.add_subcommand("ckpt", "List, show, verify and remove checkpoints");
  ckpt->require_subcommand(1);
  auto open = [args]() { return OpenCheckpointer(args->uri); };

  auto* ls = ckpt->add_subcommand("ls", "Checkpoints under a root, oldest first");
  ls->add_option("URI", args->uri, "Checkpoint root (a path or rados:// URI)")->required();
  ls->add_flag("--json", args->json, "Machine-readable output");
  ls->callback([args, action, open] {
    *action = [args, open] {
      auto c = open();
      return c.ok() ? Ls(**c, args->json) : Fail(c.status());
    };
  });

  auto* show = ckpt->add_subcommand("show", "A checkpoint's tensors and metadata");
  show->add_option("URI", args->uri, "Checkpoint root")->required();
  show->add_option("NAME", args->name, "Checkpoint name (default: latest)");
  show->add_flag("--json", args->json, "Machine-readable output");
  show->callback([args, action, open] {
    *action = [args, open] {
      auto c = open();
      return c.ok() ? Show(**c, args->name, args->json) : Fail(c.status());
    };
  });

  auto* verify = ckpt->add_subcommand(
      "verify", "Read every chunk and check every checksum; exit 1 if any is bad");
  verify->add_option("URI", args->uri, "Checkpoint root")->required();
  verify->add_option("NAME", args->name, "Checkpoint name (default: latest)");
  verify->callback([args, action, open] {
    *action = [args, open] {
      auto c = open();
      return c.ok() ? VerifyCkpt(**c, args->name) : Fail(c.status());
    };
  });

  auto* rm = ckpt->add_subcommand("rm", "Remove checkpoints (committed or incomplete)");
  rm->add_option("URI", args->uri, "Checkpoint root")->required();
  rm->add_option("NAME", args->names, "Checkpoint names")->required();
  rm->callback([args, action, open] {
    *action = [args, open] {
      auto c = open();
      if (!c.ok()) return Fail(c.status());
      for (const std::string& n : args->names) {
        Status s = (*c)->Remove(n);
        if (!s.ok()) return Fail(s);
        std::printf("removed %s\n", n.c_str());
      }
      return 0;
    };
  });
}

}  // namespace stoker::cli
