// stoker verify URI: reads every byte, checks every checksum, names each bad
// shard and sample; exit 1 if any is bad.
#include <cstdio>

#include "cli/cli.h"
#include "stoker/dataset.h"

namespace stoker::cli {

void RegisterVerify(CLI::App& app, Action* action) {
  struct Args {
    std::string uri;
    uint32_t reads = 8;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("verify", "Read every byte of a dataset and check every checksum");
  cmd->add_option("URI", args->uri, "Dataset URI")->required();
  cmd->add_option("--reads-in-flight", args->reads, "Shard reads in flight")->capture_default_str();
  cmd->callback([args, action] {
    *action = [args] {
      auto store = OpenStore(args->uri);
      if (!store.ok()) return Fail(store.status());
      VerifyOptions o;
      o.reads_in_flight = args->reads;
      o.on_problem = [](const VerifyProblem& p) {
        if (p.sample >= 0) {
          std::printf("BAD  %s sample %ld: %s\n", p.shard_key.c_str(), long(p.sample),
                      p.status.ToString().c_str());
        } else {
          std::printf("BAD  %s: %s\n", p.shard_key.c_str(), p.status.ToString().c_str());
        }
      };
      auto r = VerifyDataset(**store, o);
      if (!r.ok()) return Fail(r.status());
      std::printf("%s: %lu shards, %lu samples, %s checked: %s\n", args->uri.c_str(),
                  (unsigned long)r->shards_checked, (unsigned long)r->samples_checked,
                  HumanBytes(double(r->bytes_read)).c_str(),
                  r->ok() ? "OK" : (std::to_string(r->problems.size()) + " problem(s)").c_str());
      return r->ok() ? 0 : kExitProblems;
    };
  });
}

}  // namespace stoker::cli
