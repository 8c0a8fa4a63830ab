// stoker export DS --webdataset OUTDIR: a dataset back to WebDataset tars.
#include <unistd.h>

#include <cstdio>

#include "cli/cli.h"
#include "stoker/import.h"

namespace stoker::cli {

void RegisterExport(CLI::App& app, Action* action) {
  struct Args {
    std::string ds, out;
    uint64_t samples_per_tar = ExportOptions{}.samples_per_tar;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("export", "Write a dataset out as WebDataset tars");
  cmd->add_option("DS", args->ds, "Dataset URI")->required();
  cmd->add_option("--webdataset", args->out,
                  "Folder for the tars OUTDIR/000000.tar, ... (new or empty)")
      ->required();
  cmd->add_option("--samples-per-tar", args->samples_per_tar, "Samples in each tar")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--quiet", args->quiet, "No progress bar");
  cmd->callback([args, action] {
    *action = [args] {
      ExportOptions o;
      o.samples_per_tar = args->samples_per_tar;
      ProgressBar bar(isatty(STDERR_FILENO) && !args->quiet);
      o.progress = [&bar](const ExportProgress& p) {
        bar.Update(p.bytes, p.bytes_total,
                   std::to_string(p.samples) + " samples  " + std::to_string(p.tars) + " tars");
      };
      auto r = ExportWebDataset(args->ds, args->out, o);
      bar.Finish();
      if (!r.ok()) return Fail(r.status());
      std::printf("exported %lu samples into %lu tars, %s of members, in %.1f s: %s\n",
                  (unsigned long)r->samples, (unsigned long)r->tars,
                  HumanBytes(double(r->bytes)).c_str(), bar.Seconds(), args->out.c_str());
      return 0;
    };
  });
}

}  // namespace stoker::cli
