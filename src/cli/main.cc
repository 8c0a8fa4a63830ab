// stoker: the command an operator uses around the data plane.
#include <cstdio>
#include <iostream>

#include "cli/cli.h"
#include "core/text.h"

namespace stoker::cli {

int Fail(const Status& status) {
  std::fprintf(stderr, "stoker: %s\n", status.ToString().c_str());
  return 10 + static_cast<int>(status.code());
}

std::string HumanBytes(double bytes) { return internal::HumanBytes(bytes); }

}  // namespace stoker::cli

int main(int argc, char** argv) {
  using namespace stoker::cli;
  CLI::App app{"stoker: keeps GPUs fed (pack, inspect, verify, bench, ckpt, demo)", "stoker"};
  app.set_version_flag("--version", VersionText());
  app.require_subcommand(1);
  Action action;
  RegisterPack(app, &action);
  RegisterExport(app, &action);
  RegisterInspect(app, &action);
  RegisterVerify(app, &action);
  RegisterBench(app, &action);
  RegisterBenchH2d(app.get_subcommand("bench"), &action);
  RegisterBenchGpuLoader(app.get_subcommand("bench"), &action);
  RegisterBenchNode(app.get_subcommand("bench"), &action);
  RegisterBenchScale(app.get_subcommand("bench"), &action);
  RegisterDemo(app, &action);
  RegisterCkpt(app, &action);
  RegisterCompletion(app, &action);
  RegisterExporter(app, &action);
  RegisterReport(app, &action);
  RegisterDoctor(app, &action);
  RegisterTune(app, &action);
  RegisterBenchComm(app.get_subcommand("bench"), &action);
  RegisterTopo(app, &action);
  RegisterTuneComm(app, &action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }
  return action ? action() : kExitUsage;
}
