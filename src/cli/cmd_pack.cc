// stoker pack SRC... DST: an ImageFolder tree, a 'PATH LABEL' list, WebDataset
// tars, JSONL files or Megatron .bin/.idx pairs into a dataset.
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "cli/cli.h"
#include "stoker/import.h"
#include "stoker/pack.h"

namespace stoker::cli {
namespace {

struct Args {
  std::vector<std::string> paths;  // SRC... DST
  std::string from;
  std::vector<std::string> fields;
  bool skip_bad = false;
  bool tokens = false;  // --tokens: token documents
  std::string token_key = "tokens";
  std::string token_dtype = "uint32";
  uint32_t token_block_bytes = format::kDefaultTokenBlockBytes;
  double shard_mib = 4;
  uint32_t threads = 0;
  bool quiet = false;
  bool no_shuffle = false;
  uint64_t seed = 0;
};

bool IsJsonlName(const std::string& p) {
  const std::string ext = std::filesystem::path(p).extension().string();
  return ext == ".jsonl" || ext == ".ndjson";
}

// The source kind `--from` names, or the one the paths look like.
std::string SourceKind(const Args& a, std::span<const std::string> srcs) {
  if (!a.from.empty()) return a.from;
  if (LooksLikeWebDataset(srcs)) return "webdataset";
  if (LooksLikeMegatron(srcs)) return "megatron";
  bool jsonl = true;
  for (const std::string& s : srcs) jsonl = jsonl && IsJsonlName(s);
  if (jsonl) return "jsonl";
  return "files";  // an ImageFolder tree or a list: Pack tells them apart
}

int PackFiles(const Args& a, const std::string& src, const std::string& dst) {
  PackOptions o;
  o.shard_bytes = static_cast<uint64_t>(a.shard_mib * (1 << 20));
  o.threads = a.threads;
  o.shuffle = !a.no_shuffle;
  o.shuffle_seed = a.seed;
  ProgressBar bar(isatty(STDERR_FILENO) && !a.quiet);
  o.progress = [&bar](const PackProgress& p) {
    bar.Update(p.bytes_done, p.bytes_total,
               std::to_string(p.files_done) + "/" + std::to_string(p.files_total) + " files  " +
                   std::to_string(p.shards_written) + " shards");
  };
  auto m = Pack(src, dst, o);
  bar.Finish();
  if (!m.ok()) return Fail(m.status());
  const uint64_t bytes = m->shards.total_bytes();
  std::printf("packed %lu samples (%lu classes) into %zu shards, %s, in %.1f s: %s\n",
              (unsigned long)m->sample_count, (unsigned long)m->classes.size(), m->shards.size(),
              HumanBytes(double(bytes)).c_str(), bar.Seconds(), dst.c_str());
  return 0;
}

int Import(const Args& a, const std::string& kind, std::span<const std::string> srcs,
           const std::string& dst) {
  ImportOptions o;
  if (a.tokens && kind == "jsonl") {  // the token list first, then any other --field
    auto spec = format::ParseFieldSpec(a.token_key, a.token_dtype + "[*]");
    if (!spec.ok()) return Fail(spec.status());
    o.fields.push_back(*spec);
  }
  for (const std::string& f : a.fields) {
    auto spec = ParseFieldArg(f);
    if (!spec.ok()) return Fail(spec.status());
    o.fields.push_back(*spec);
  }
  o.skip_bad = a.skip_bad;
  o.writer.shard_bytes = static_cast<uint64_t>(a.shard_mib * (1 << 20));
  o.writer.threads = a.threads;
  o.writer.token_block_bytes = a.token_block_bytes;
  ProgressBar bar(isatty(STDERR_FILENO) && !a.quiet);
  o.progress = [&bar](const ImportProgress& p) {
    std::string extra = std::to_string(p.samples) + " samples";
    if (p.skipped) extra += ", " + std::to_string(p.skipped) + " skipped";
    bar.Update(p.bytes_read, p.bytes_total, extra);
  };
  auto r = kind == "webdataset" ? ImportWebDataset(srcs, dst, o)
           : kind == "megatron" ? ImportMegatron(srcs, dst, o)
                                : ImportJsonl(srcs, dst, o);
  bar.Finish();
  if (!r.ok()) return Fail(r.status());
  const double secs = bar.Seconds();
  std::printf("imported %lu samples from %zu %s file%s", (unsigned long)r->samples,
              r->sources.size(),
              kind == "webdataset" ? "tar"
              : kind == "megatron" ? "Megatron .idx/.bin"
                                   : "JSONL",
              r->sources.size() == 1 ? "" : "s");
  if (r->skipped) std::printf(" (%lu bad skipped)", (unsigned long)r->skipped);
  std::printf(" into %zu shards, %s, in %.1f s (%.0f MB/s of source): %s\n",
              r->manifest.shards.size(),
              HumanBytes(double(r->manifest.shards.total_bytes())).c_str(), secs,
              secs > 0 ? r->source_bytes / secs / 1e6 : 0.0, dst.c_str());
  if (r->skipped) std::fprintf(stderr, "stoker: last skipped: %s\n", r->last_skip_reason.c_str());
  return 0;
}

}  // namespace

void RegisterPack(CLI::App& app, Action* action) {
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "pack",
      "Pack an ImageFolder tree, a 'PATH LABEL' list, WebDataset tars, JSONL files or Megatron "
      ".bin/.idx pairs into a dataset");
  cmd->add_option(
         "SRC... DST", args->paths,
         "Sources (an ImageFolder root, a list file, .tar files or folders of them, "
         ".jsonl files, Megatron PREFIX.idx), then the dataset URI: a folder, file:///path or "
         "rados://POOL/PREFIX")
      ->required();
  cmd->add_option(
         "--from", args->from,
         "Source kind (default: recognised from the paths: .tar files or folders of "
         "them are webdataset, .jsonl files jsonl, .idx/.bin pairs megatron, else imagefolder or "
         "list)")
      ->check(CLI::IsMember({"webdataset", "jsonl", "megatron", "imagefolder", "list"}));
  cmd->add_flag("--tokens", args->tokens,
                "Token documents for sequence_length windows: each JSONL line's --token-key list "
                "as a --token-dtype[*] field of that name, other keys only as --field gives them "
                "(Megatron .idx/.bin pairs always are token documents)");
  cmd->add_option("--token-key", args->token_key, "JSONL key of the token list (--tokens)")
      ->capture_default_str();
  cmd->add_option("--token-dtype", args->token_dtype,
                  "Token dtype (--tokens): uint16, uint32 or int32; a token it cannot hold "
                  "fails the pack naming FILE:LINE")
      ->check(CLI::IsMember({"uint8", "uint16", "uint32", "int32", "int64"}))
      ->capture_default_str();
  cmd->add_option("--token-block-bytes", args->token_block_bytes,
                  "Checksum the token field in blocks of this many bytes, so that a verified "
                  "window reads only the blocks it touches (docs/format.md 3.5); a power of two "
                  "in 64..1048576, or 0 for whole-record checksums only")
      ->capture_default_str();
  cmd->add_option("--field", args->fields,
                  "NAME:TYPE (repeatable): JSONL fields to take (default: inferred from the "
                  "first line); WebDataset: a type override (e.g. cls:int64)")
      ->allow_extra_args(false)  // one value per --field, so SRC... DST stay positional
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_flag("--skip-bad", args->skip_bad,
                "Skip and count bad samples, tars' damaged tails and bad lines (default: the "
                "first fails the pack)");
  cmd->add_option("--shard-mib", args->shard_mib, "Target shard size in MiB")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "Workers (0 = 2 x cores)")->capture_default_str();
  cmd->add_flag("--quiet", args->quiet, "No progress bar");
  cmd->add_flag("--no-shuffle", args->no_shuffle,
                "Keep the source order (default: a seeded shuffle, so shards mix classes; "
                "imagefolder and list only, imports keep the source order)");
  cmd->add_option("--seed", args->seed, "Seed of the pack-time shuffle")->capture_default_str();
  cmd->callback([args, action] {
    *action = [args] {
      if (args->paths.size() < 2) {
        std::fprintf(stderr, "stoker pack: give SRC... DST\n");
        return kExitUsage;
      }
      const std::string dst = args->paths.back();
      const std::span<const std::string> srcs(args->paths.data(), args->paths.size() - 1);
      const std::string kind = SourceKind(*args, srcs);
      if (args->tokens && kind != "jsonl" && kind != "megatron") {
        std::fprintf(stderr, "stoker pack: --tokens is for JSONL (and Megatron) sources\n");
        return kExitUsage;
      }
      if (kind == "webdataset" || kind == "jsonl" || kind == "megatron") {
        return Import(*args, kind, srcs, dst);
      }
      if (srcs.size() != 1) {
        std::fprintf(stderr,
                     "stoker pack: an ImageFolder tree or a list is one SRC (or give --from "
                     "webdataset / jsonl)\n");
        return kExitUsage;
      }
      if (!args->fields.empty() || args->skip_bad) {
        std::fprintf(stderr, "stoker pack: --field and --skip-bad are for webdataset and jsonl\n");
        return kExitUsage;
      }
      return PackFiles(*args, srcs[0], dst);
    };
  });
}

}  // namespace stoker::cli
