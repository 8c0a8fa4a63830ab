// stoker inspect URI [--json] [--objects [--sizes]]: what a dataset holds,
// from its manifest and its shard table (streamed, never held whole); with
// --objects, what the store holds under the dataset's URI besides.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "cli/cli.h"
#include "stoker/dataset.h"

namespace stoker::cli {
namespace {

// What the shard list adds up to, streamed.
struct ShardSummary {
  uint64_t shards = 0;
  uint64_t bytes = 0;
  uint64_t min_bytes = UINT64_MAX, max_bytes = 0;
  uint32_t min_samples = UINT32_MAX, max_samples = 0;
};

// Each object listed under the dataset, and what it is to the dataset.
struct Listed {
  std::string key;
  uint64_t bytes = 0;
  std::string role;
};

Result<std::vector<Listed>> ListObjects(Store& store, const format::Manifest& m, bool sizes,
                                        uint64_t* shards_found) {
  std::vector<Listed> out;
  if (sizes) {
    STOKER_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, store.List(""));
    for (auto& o : objects) out.push_back({std::move(o.key), o.size, {}});
  } else {
    // Names only: no stat per object (RADOS would stat every one).
    STOKER_ASSIGN_OR_RETURN(std::vector<std::string> keys, store.ListKeys(""));
    for (auto& k : keys) out.push_back({std::move(k), 0, {}});
  }
  // A v1 manifest's keys of their own; every other key follows ShardKey.
  std::unordered_map<std::string, uint32_t> own;
  if (m.shards.has_own_keys()) {
    for (uint32_t i = 0; i < m.shards.size(); ++i) own.emplace(m.shards.key(i), i);
  }
  const uint64_t shards = m.table.key.empty() ? m.shards.size() : m.table.records;
  *shards_found = 0;
  for (Listed& o : out) {
    int64_t n = -1;
    if (m.shards.has_own_keys()) {
      auto it = own.find(o.key);
      if (it != own.end()) n = it->second;
    } else {
      n = format::ShardKeyNumber(o.key);
      if (n >= 0 && uint64_t(n) >= shards) n = -1;
    }
    if (o.key == format::kManifestKey) {
      o.role = "manifest";
    } else if (!m.table.key.empty() && o.key == m.table.key) {
      o.role = "shard table";
    } else if (n >= 0) {
      o.role = "shard " + std::to_string(n);
      ++*shards_found;
    } else if (o.key == "pack.pending") {
      o.role = "a pack's note (an unfinished pack, or one killed)";
    } else {
      o.role = "not part of the dataset";
    }
  }
  return out;
}

std::string HexHash(uint64_t h) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  return hex;
}

}  // namespace

void RegisterInspect(CLI::App& app, Action* action) {
  struct Args {
    std::string uri;
    bool json = false;
    bool objects = false;
    bool sizes = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("inspect", "Show a dataset's samples, shards, bytes and classes");
  cmd->add_option("URI", args->uri, "Dataset URI")->required();
  cmd->add_flag("--json", args->json, "Machine-readable output");
  cmd->add_flag("--objects", args->objects,
                "Also list the objects under URI, and what each is to the dataset (a listing: "
                "on RADOS, a walk of the pool)");
  cmd->add_flag("--sizes", args->sizes, "With --objects: each object's size (a stat each)")
      ->needs("--objects");
  cmd->callback([args, action] {
    *action = [args] {
      auto store = OpenStore(args->uri);
      if (!store.ok()) return Fail(store.status());
      auto m = ReadManifestOnly(**store);
      if (!m.ok()) return Fail(m.status());
      ShardSummary sum;
      Status st = ForEachShard(**store, *m, [&](uint32_t, const format::ShardInfo& s) {
        sum.shards++;
        sum.bytes += s.bytes;
        sum.min_bytes = std::min(sum.min_bytes, s.bytes);
        sum.max_bytes = std::max(sum.max_bytes, s.bytes);
        sum.min_samples = std::min(sum.min_samples, s.samples);
        sum.max_samples = std::max(sum.max_samples, s.samples);
        return Status::Ok();
      });
      if (!st.ok()) return Fail(st);
      if (sum.shards == 0) sum.min_bytes = sum.min_samples = 0;
      std::vector<Listed> objects;
      uint64_t shards_found = 0;
      if (args->objects) {
        auto listed = ListObjects(**store, *m, args->sizes, &shards_found);
        if (!listed.ok()) return Fail(listed.status());
        objects = std::move(*listed);
      }

      nlohmann::json j;
      j["uri"] = args->uri;
      j["format_version"] = m->format_version;
      j["dataset_id"] = m->IdHex();
      j["samples"] = m->sample_count;
      j["shards"] = sum.shards;
      j["bytes"] = sum.bytes;
      j["payload_bytes"] = m->payload_bytes;
      j["max_sample_bytes"] = m->max_sample_bytes;
      j["classes"] = m->classes;
      j["created_by"] = m->created_by;
      nlohmann::json fields = nlohmann::json::array();
      for (const auto& f : m->fields) {
        fields.push_back({{"name", f.name}, {"type", std::string(format::FieldTypeName(f.type))}});
      }
      j["fields"] = fields;
      if (m->table.key.empty()) {
        j["shard_table"] = nullptr;  // v1: the manifest lists the shards
      } else {
        j["shard_table"] = {{"key", m->table.key},
                            {"records", m->table.records},
                            {"bytes", m->table.bytes},
                            {"header_hash", HexHash(m->table.header_hash)}};
      }
      if (args->objects) {
        nlohmann::json list = nlohmann::json::array();
        for (const Listed& o : objects) {
          nlohmann::json e = {{"key", o.key}, {"role", o.role}};
          if (args->sizes) e["bytes"] = o.bytes;
          list.push_back(e);
        }
        j["objects"] = list;
        j["shards_missing"] = sum.shards - shards_found;
      }
      if (args->json) {
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
      }
      std::printf("dataset        %s\n", args->uri.c_str());
      std::printf("format         stoker dataset v%u (id %s)\n", m->format_version,
                  m->IdHex().c_str());
      std::printf("samples        %lu\n", (unsigned long)m->sample_count);
      std::printf("shards         %lu (%s to %s, %u to %u samples each)\n",
                  (unsigned long)sum.shards, HumanBytes(double(sum.min_bytes)).c_str(),
                  HumanBytes(double(sum.max_bytes)).c_str(), sum.min_samples, sum.max_samples);
      if (m->table.key.empty()) {
        std::printf("shard table    in the manifest (format v1)\n");
      } else {
        std::printf("shard table    %s: %lu records, %s\n", m->table.key.c_str(),
                    (unsigned long)m->table.records, HumanBytes(double(m->table.bytes)).c_str());
      }
      std::printf("bytes          %lu (%s; payload %s, largest sample %s)\n",
                  (unsigned long)sum.bytes, HumanBytes(double(sum.bytes)).c_str(),
                  HumanBytes(double(m->payload_bytes)).c_str(),
                  HumanBytes(double(m->max_sample_bytes)).c_str());
      std::string fl;
      for (const auto& f : m->fields) {
        fl += (fl.empty() ? "" : ", ") + f.name + ":" + std::string(format::FieldTypeName(f.type));
      }
      std::printf("fields         %s\n", fl.c_str());
      std::string cl;
      for (size_t i = 0; i < m->classes.size() && i < 10; ++i)
        cl += (i ? ", " : "") + m->classes[i];
      if (m->classes.size() > 10) cl += ", ...";
      std::printf("classes        %zu%s%s\n", m->classes.size(), cl.empty() ? "" : ": ",
                  cl.c_str());
      std::printf("created by     %s\n", m->created_by.c_str());
      if (args->objects) {
        std::printf("objects        %zu, %lu shards of %lu the table names\n", objects.size(),
                    (unsigned long)shards_found, (unsigned long)sum.shards);
        for (const Listed& o : objects) {
          if (args->sizes) {
            std::printf("  %-32s %12lu  %s\n", o.key.c_str(), (unsigned long)o.bytes,
                        o.role.c_str());
          } else {
            std::printf("  %-32s %s\n", o.key.c_str(), o.role.c_str());
          }
        }
      }
      return 0;
    };
  });
}

}  // namespace stoker::cli
