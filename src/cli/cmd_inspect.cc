// stoker inspect URI [--json]: what a dataset holds, from its manifest.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "stoker/dataset.h"

namespace stoker::cli {

void RegisterInspect(CLI::App& app, Action* action) {
  struct Args {
    std::string uri;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("inspect", "Show a dataset's samples, shards, bytes and classes");
  cmd->add_option("URI", args->uri, "Dataset URI")->required();
  cmd->add_flag("--json", args->json, "Machine-readable output");
  cmd->callback([args, action] {
    *action = [args] {
      auto store = OpenStore(args->uri);
      if (!store.ok()) return Fail(store.status());
      auto m = ReadManifest(**store);
      if (!m.ok()) return Fail(m.status());
      uint64_t bytes = 0;
      for (const auto& s : m->shards) bytes += s.bytes;
      nlohmann::json j;
      j["uri"] = args->uri;
      j["format_version"] = m->format_version;
      j["dataset_id"] = m->IdHex();
      j["samples"] = m->sample_count;
      j["shards"] = m->shards.size();
      j["bytes"] = bytes;
      j["payload_bytes"] = m->payload_bytes;
      j["max_sample_bytes"] = m->max_sample_bytes;
      j["classes"] = m->classes;
      j["created_by"] = m->created_by;
      nlohmann::json fields = nlohmann::json::array();
      for (const auto& f : m->fields) {
        fields.push_back({{"name", f.name}, {"type", std::string(format::FieldTypeName(f.type))}});
      }
      j["fields"] = fields;
      if (args->json) {
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
      }
      std::printf("dataset        %s\n", args->uri.c_str());
      std::printf("format         stoker dataset v%u (id %s)\n", m->format_version,
                  m->IdHex().c_str());
      std::printf("samples        %lu\n", (unsigned long)m->sample_count);
      std::printf("shards         %zu\n", m->shards.size());
      std::printf("bytes          %lu (%s; payload %s, largest sample %s)\n", (unsigned long)bytes,
                  HumanBytes(double(bytes)).c_str(), HumanBytes(double(m->payload_bytes)).c_str(),
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
      return 0;
    };
  });
}

}  // namespace stoker::cli
