// Loader options as command-line flags, shared by `bench loader` and `demo`.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>

#include "cli/cli.h"
#include "stoker/decode.h"
#include "stoker/loader.h"

namespace stoker::cli {

struct LoaderFlags {
  LoaderOptions options;
  double budget_mib = 0;  // 0: automatic (LoaderOptions::memory_budget)
  std::string decode_size = "224x224";
  bool decode = false;
  bool no_shuffle = false;
  double cache_gib = 0;
  double keep_mapped_mib = 0;  // 0: the machine's memory (StoreOptions::keep_mapped_bytes)
  // Augmentation (any of these implies --decode); empty: the default.
  std::string crop, scale, ratio, normalize, dtype, layout;
  float flip = 0;
  bool skip_corrupt = false;

  void Add(CLI::App* cmd) {
    cmd->add_option("--batch-size", options.batch_size, "Samples per batch")->capture_default_str();
    cmd->add_option("--threads", options.threads, "Collate/decode workers (0 = cores)")
        ->capture_default_str();
    cmd->add_option("--reads-in-flight", options.reads_in_flight,
                    "Whole-shard reads in flight (0 = the workers' count, 8 to 64)")
        ->capture_default_str();
    cmd->add_option("--budget-mib", budget_mib,
                    "Memory budget for shard and batch buffers (0 = sized from the dataset and the "
                    "machine)")
        ->capture_default_str();
    cmd->add_option("--window", options.shuffle_window_shards, "Shuffle window in shards")
        ->capture_default_str();
    cmd->add_option("--prefetch", options.prefetch_batches, "Batches built ahead")
        ->capture_default_str();
    cmd->add_option("--seed", options.seed, "Shuffle seed")->capture_default_str();
    cmd->add_flag("--no-shuffle", no_shuffle, "Read in packed order");
    cmd->add_flag("--direct", options.direct_io, "O_DIRECT reads (POSIX store)");
    cmd->add_option("--read-unit", options.read_unit,
                    "auto, shard (read shards whole), sample (read each record into the batch) "
                    "or map (check each record in the mapped shard file, copy it into the batch)")
        ->capture_default_str();
    cmd->add_option("--keep-mapped-mib", keep_mapped_mib,
                    "--read-unit map: shard files kept mapped from epoch to epoch (0 = up to the "
                    "machine's memory; less than a shard keeps none)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    cmd->add_flag("--decode", decode, "Decode the 'image' field as JPEG and resize");
    cmd->add_option("--decode-size", decode_size, "HxW of decoded images")->capture_default_str();
    cmd->add_option("--decode-device", options.decode.device,
                    "Decode JPEGs on this GPU (cuda:N, nvJPEG), the CPU taking what it does not; "
                    "implies --decode");
    cmd->add_option("--decode-cpu-share", options.decode.cpu_share,
                    "With --decode-device: the fraction of the GPU's images the workers decode "
                    "instead (CPU and GPU together)")
        ->capture_default_str();
    cmd->add_flag("--decode-cpu-share-balance", options.decode.cpu_share_balance,
                  "With --decode-device: move the CPU's share at run time, from --decode-cpu-share, "
                  "so neither path idles");
    cmd->add_option("--decode-worker-nice", options.decode.worker_nice,
                    "With --decode-device: raise the workers' nice by this much, so that the "
                    "thread feeding the GPU keeps a core (0-19)")
        ->capture_default_str();
    cmd->add_option("--cache", options.cache_dir,
                    "Node cache folder on local disk, shared by the node's ranks and jobs");
    cmd->add_option("--cache-gib", cache_gib,
                    "Node cache limit (0 = the disk's free space less 5%)")
        ->capture_default_str();
    cmd->add_option("--cache-policy", options.cache_policy, "planned (Belady) or lru")
        ->capture_default_str();
    AddAugment(cmd);
  }

  // torchvision's training and evaluation transforms, in the decode workers.
  void AddAugment(CLI::App* cmd) {
    cmd->add_option("--crop", crop,
                    "resize (default), center (Resize(H*256/224) + CenterCrop) or "
                    "random-resized (RandomResizedCrop); any case, _ for -");
    cmd->add_option("--scale", scale, "random-resized: area fraction MIN,MAX (default 0.08,1)");
    cmd->add_option("--ratio", ratio, "random-resized: aspect w/h MIN,MAX (default 0.75,1.3333)");
    cmd->add_option("--flip", flip, "horizontal flip probability (default 0)");
    cmd->add_option("--normalize", normalize,
                    "imagenet or MEAN,MEAN,MEAN/STD,STD,STD: (x/255 - mean) / std into float32 "
                    "(or --dtype float16)");
    cmd->add_option("--dtype", dtype, "uint8 (default), float32, float16 or bfloat16 (any case)");
    cmd->add_option("--layout", layout, "nhwc (default) or nchw (any case)");
    cmd->add_flag("--skip-corrupt", skip_corrupt,
                  "zero-fill and count undecodable images instead of failing");
  }

  // Call after parsing.
  Status Finish() {
    options.memory_budget = static_cast<uint64_t>(budget_mib * (1 << 20));
    options.shuffle = !no_shuffle;
    options.cache_bytes = static_cast<uint64_t>(cache_gib * (1ull << 30));
    // A fraction of a MiB that rounds to 0 bytes still asks to keep none.
    options.store.keep_mapped_bytes =
        keep_mapped_mib > 0 ? std::max<uint64_t>(1, uint64_t(keep_mapped_mib * (1 << 20))) : 0;
    const bool augment = !crop.empty() || !scale.empty() || !ratio.empty() || !normalize.empty() ||
                         !dtype.empty() || !layout.empty() || flip != 0 || skip_corrupt ||
                         !options.decode.device.empty();
    if (decode || augment) {
      options.decode.field = "image";
      unsigned h = 0, w = 0;
      char x = 0;
      if (std::sscanf(decode_size.c_str(), "%u%c%u", &h, &x, &w) != 3 || x != 'x' || !h || !w) {
        return InvalidArgument("--decode-size must look like 224x224, not '" + decode_size + "'");
      }
      options.decode.height = h;
      options.decode.width = w;
      STOKER_RETURN_IF_ERROR(FinishAugment(&options.decode));
      return ValidateDecodeOptions(options.decode);
    }
    return Status::Ok();
  }

 private:
  // "A,B" or "A,B,C" into floats; false unless exactly n numbers.
  static bool Floats(const std::string& s, float* out, int n) {
    int used = 0;
    float v[3];
    const int got = n == 2 ? std::sscanf(s.c_str(), "%f,%f%n", &v[0], &v[1], &used)
                           : std::sscanf(s.c_str(), "%f,%f,%f%n", &v[0], &v[1], &v[2], &used);
    if (got != n || size_t(used) != s.size()) return false;
    std::copy(v, v + n, out);
    return true;
  }

  // decode.h's Parse* messages, named as the flag ("--crop must be ...").
  template <typename E>
  static Status Choice(Result<E> (*parse)(std::string_view), const std::string& given, E* out) {
    if (given.empty()) return Status::Ok();
    Result<E> r = parse(given);
    if (!r.ok()) return InvalidArgument("--" + r.status().message());
    *out = *r;
    return Status::Ok();
  }

  Status FinishAugment(DecodeOptions* d) {
    STOKER_RETURN_IF_ERROR(Choice(ParseCropMode, crop, &d->crop));
    float pair[2];
    if (!scale.empty()) {
      if (!Floats(scale, pair, 2)) return InvalidArgument("--scale must be MIN,MAX, not " + scale);
      d->scale_min = pair[0], d->scale_max = pair[1];
    }
    if (!ratio.empty()) {
      if (!Floats(ratio, pair, 2)) return InvalidArgument("--ratio must be MIN,MAX, not " + ratio);
      d->ratio_min = pair[0], d->ratio_max = pair[1];
    }
    d->flip = flip;
    if (!normalize.empty()) {
      d->normalize = true;
      d->dtype = ImageDType::kFloat32;
      const size_t slash = normalize.find('/');
      if (normalize != "imagenet" &&  // DecodeOptions' defaults are ImageNet's
          (slash == std::string::npos || !Floats(normalize.substr(0, slash), d->mean, 3) ||
           !Floats(normalize.substr(slash + 1), d->std, 3))) {
        return InvalidArgument("--normalize must be imagenet or MEAN,MEAN,MEAN/STD,STD,STD, not " +
                               normalize);
      }
    }
    STOKER_RETURN_IF_ERROR(Choice(ParseImageDType, dtype, &d->dtype));
    STOKER_RETURN_IF_ERROR(Choice(ParseImageLayout, layout, &d->layout));
    d->skip_corrupt = skip_corrupt;
    return Status::Ok();
  }
};

}  // namespace stoker::cli
