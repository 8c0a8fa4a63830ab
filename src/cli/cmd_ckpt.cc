// stoker ckpt ls|show|get|verify|rm URI: the checkpoints under a root
// (docs/checkpoint.md), for an operator.
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "stoker/checkpoint.h"
#include "stoker/metrics.h"

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

// The local folder a root URI names (a path or file:///path), or "" for a
// root elsewhere (rados://), where an empty prefix is just empty.
std::string LocalFolder(const std::string& uri) {
  if (uri.starts_with("file://")) return uri.substr(7);
  return uri.find("://") == std::string::npos ? uri : "";
}

int Ls(Checkpointer& c, bool as_json) {
  auto list = c.List();
  if (!list.ok()) return Fail(list.status());
  // A store lists a folder that is not there as empty: a mistyped root would
  // look like a root without checkpoints.
  if (const std::string folder = LocalFolder(c.uri());
      list->empty() && !folder.empty() && !std::filesystem::is_directory(folder)) {
    return Fail(NotFound("no checkpoint root at " + c.uri() + ": no such folder"));
  }
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

// Each rank's saved structure (docs/checkpoint.md §8), if it saved one:
// (rank, structure) pairs. A rank without one (a flat set of tensors) is
// left out; another error is returned.
Result<std::vector<std::pair<uint32_t, StateStructure>>> Structures(Checkpointer& c,
                                                                    const CheckpointManifest& m) {
  std::vector<std::pair<uint32_t, StateStructure>> out;
  for (const RankPart& r : m.ranks) {
    auto s = ReadStateStructure(c, m.name, r.rank);
    if (s.ok()) {
      out.emplace_back(r.rank, std::move(*s));
    } else if (s.status().code() != Code::kNotFound) {
      return s.status();
    }
  }
  return out;
}

const TensorInfo* TensorNamed(const CheckpointManifest& m, uint32_t rank, const std::string& n) {
  for (const TensorInfo& t : m.ranks[rank].tensors) {
    if (t.name == n) return &t;
  }
  return nullptr;
}

nlohmann::ordered_json StructureJson(const CheckpointManifest& m, uint32_t rank,
                                     const StateStructure& s) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const StateEntry& e : s.entries()) {
    nlohmann::ordered_json j = {{"rank", rank}, {"path", e.path}, {"type", e.type}};
    if (!e.tensor.empty()) {
      j["tensor"] = e.tensor;
      if (const TensorInfo* t = TensorNamed(m, rank, e.tensor)) {
        j["dtype"] = DTypeName(t->dtype);
        j["shape"] = t->shape;
      }
    } else if (!e.value.empty()) {
      j["value"] = nlohmann::ordered_json::parse(e.value, nullptr, false);
      // An integer beyond 64 bits would come back as a rounded float:
      // given as its digits instead, every one exact.
      if (j["value"].is_number_float() && e.type == "int") j["value"] = e.value;
    } else {
      j["items"] = e.items;
    }
    out.push_back(std::move(j));
  }
  return out;
}

void PrintStructure(const CheckpointManifest& m, uint32_t rank, const StateStructure& s) {
  std::printf("\nSTRUCTURE (rank %u)\n", rank);
  for (const StateEntry& e : s.entries()) {
    const std::string key = e.path.empty() ? "(root)" : e.path;
    std::string what = e.type;
    if (!e.tensor.empty()) {
      if (const TensorInfo* t = TensorNamed(m, rank, e.tensor)) {
        what += " " + std::string(DTypeName(t->dtype)) + " " + Shape(t->shape);
      }
    } else if (!e.value.empty()) {
      what += " " + e.value.substr(0, 60) + (e.value.size() > 60 ? "..." : "");
    } else {
      what += " of " + std::to_string(e.items);
    }
    std::printf("  %*s%-40s %s\n", 2 * e.depth, "", key.c_str(), what.c_str());
  }
}

int Show(Checkpointer& c, const std::string& name, bool as_json) {
  auto m = c.ReadManifest(name);
  if (!m.ok()) return Fail(m.status());
  auto structures = Structures(c, *m);
  if (!structures.ok()) return Fail(structures.status());
  if (as_json) {
    nlohmann::ordered_json j;
    j["name"] = m->name;
    j["format_version"] = m->format_version;
    j["sequence"] = m->sequence;
    j["created_by"] = m->created_by;
    j["created_unix_ms"] = m->created_unix_ms;
    j["world_size"] = m->world_size;
    j["bytes"] = m->bytes();
    j["step"] = m->step ? nlohmann::ordered_json(*m->step) : nlohmann::ordered_json(nullptr);
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
    auto& structure = j["structure"] = nlohmann::ordered_json::array();
    for (const auto& [rank, st] : *structures) {
      for (auto& e : StructureJson(*m, rank, st)) structure.push_back(std::move(e));
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
  if (m->step) std::printf("step        %llu\n", (unsigned long long)*m->step);
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
  for (const auto& [rank, st] : *structures) PrintStructure(*m, rank, st);
  return 0;
}

// stoker ckpt get: the value at a key path, restored by C++ alone: a
// scalar printed as JSON, a tensor's bytes written to `out`.
int Get(Checkpointer& c, const std::string& name, const std::string& path, uint32_t rank,
        const std::string& out) {
  auto m = c.ReadManifest(name);
  if (!m.ok()) return Fail(m.status());
  auto s = ReadStateStructure(c, m->name, rank);
  if (!s.ok()) return Fail(s.status());
  auto e = s->Find(path);
  if (!e.ok()) return Fail(e.status().WithContext(c.uri() + ": checkpoint " + m->name));
  if (e->tensor.empty()) {
    std::printf("%s\n", e->value.empty() ? (e->type + " of " + std::to_string(e->items)).c_str()
                                         : e->value.c_str());
    return 0;
  }
  if (out.empty()) {
    return Fail(InvalidArgument("key path '" + path + "' holds a tensor: give --out FILE"));
  }
  const TensorInfo* t = TensorNamed(*m, rank, e->tensor);
  if (t == nullptr) return Fail(Corruption("tensor '" + e->tensor + "' is not in the manifest"));
  std::vector<std::byte> bytes(t->bytes);
  auto got = RestoreStatePath(c, m->name, path, bytes, rank);
  if (!got.ok()) return Fail(got.status());
  FILE* f = std::fopen(out.c_str(), "wb");
  if (f == nullptr) return Fail(ErrnoToStatus(errno, "open " + out));
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !written) return Fail(ErrnoToStatus(errno, "write " + out));
  std::printf("%s %s %s -> %s\n", path.c_str(), std::string(DTypeName(t->dtype)).c_str(),
              Shape(t->shape).c_str(), out.c_str());
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
    std::string uri, name, path, out;
    std::vector<std::string> names;
    uint32_t rank = 0;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto* ckpt = app.add_subcommand("ckpt", "List, show, verify and remove checkpoints");
  ckpt->require_subcommand(1);
  auto open = [args]() { return metrics::OpenCheckpointer(args->uri); };

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

  auto* get = ckpt->add_subcommand(
      "get", "The value at a key path of a saved state: a scalar printed, a tensor to --out");
  get->add_option("URI", args->uri, "Checkpoint root")->required();
  get->add_option("NAME", args->name, "Checkpoint name ('latest' for the latest)")->required();
  get->add_option("PATH", args->path, "Key path, e.g. model.layer1.weight")->required();
  get->add_option("--rank", args->rank, "Whose state (default 0)");
  get->add_option("--out", args->out, "File for a tensor's raw bytes (little-endian, row-major)");
  get->callback([args, action, open] {
    *action = [args, open] {
      auto c = open();
      return c.ok() ? Get(**c, args->name, args->path, args->rank, args->out) : Fail(c.status());
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
