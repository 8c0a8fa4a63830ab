// Writes the fuzzers' seed corpus: a few small, valid manifests and shards
// (each under 20 KB), deterministic so that regenerating changes nothing.
// Usage: make_fuzz_seeds OUT_DIR   (writes OUT_DIR/manifest/*, OUT_DIR/shard/*)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "stoker/format.h"

namespace fs = std::filesystem;
using namespace stoker::format;

namespace {

void Write(const fs::path& p, const void* data, size_t n) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", p.c_str());
    std::exit(1);
  }
  std::printf("%s: %zu bytes\n", p.c_str(), n);
}

DatasetId Id(uint8_t seed) {
  DatasetId id;
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(seed * 17 + i * 3);
  return id;
}

std::vector<std::byte> Bytes(size_t n, uint32_t seed) {
  std::vector<std::byte> b(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& c : b) {
    x = x * 1103515245u + 12345u;
    c = std::byte(x >> 24);
  }
  return b;
}

// A dataset of `n` samples over `fields`, shards of at most `target` bytes;
// shard objects go to `shard_dir` (the first `keep_shards` of them).
Manifest Pack(const std::vector<FieldSpec>& fields, uint32_t n, size_t max_len, uint64_t target,
              uint8_t seed, const fs::path& shard_dir, const std::string& prefix,
              size_t keep_shards) {
  Manifest m;
  m.dataset_id = Id(seed);
  m.fields = fields;
  m.created_by = "make_fuzz_seeds";
  if (fields.size() > 1) m.classes = {"cat", "dog"};
  std::vector<std::vector<std::byte>> vals;
  auto finish = [&](ShardBuilder& b) {
    ShardInfo info;
    info.key = ShardKey(static_cast<uint32_t>(m.shards.size()));
    info.samples = b.sample_count();
    info.first_sample = m.sample_count;
    m.sample_count += b.sample_count();
    m.payload_bytes += b.payload_bytes();
    m.max_sample_bytes = std::max(m.max_sample_bytes, b.max_sample_bytes());
    std::vector<std::byte> shard = b.Finish(&info.index_hash);
    info.bytes = shard.size();
    if (m.shards.size() < keep_shards) {
      Write(shard_dir / (prefix + "-" + std::to_string(m.shards.size()) + ".stks"), shard.data(),
            shard.size());
    }
    m.shards.push_back(info);
  };
  auto b = std::make_unique<ShardBuilder>(fields, m.dataset_id, 0);
  for (uint32_t i = 0; i < n; ++i) {
    std::vector<FieldValue> v(fields.size());
    for (size_t f = 0; f < fields.size(); ++f) {
      vals.push_back(
          Bytes((i * 307 + f * 131) % (max_len + 1), i * 100 + static_cast<uint32_t>(f)));
      v[f].bytes = vals.back();
      v[f].i64 = static_cast<int64_t>(i % 2);
    }
    if (b->sample_count() > 0 && b->SizeWith(v) > target) {
      finish(*b);
      b = std::make_unique<ShardBuilder>(fields, m.dataset_id,
                                         static_cast<uint32_t>(m.shards.size()));
    }
    if (!b->Add(v).ok()) std::exit(1);
  }
  if (b->sample_count() > 0) finish(*b);
  return m;
}

// A format 1 manifest, which lists its shards (docs/format.md §2.5), and a
// format 2 one (NAME-v2), which names its shard table.
void WriteManifest(const fs::path& dir, const std::string& name, const Manifest& m) {
  Manifest v2 = m;
  (void)EncodeShardTable(v2, &v2.table);
  const std::string text2 = EncodeManifest(v2);
  Write(dir / (name + "-v2.stoker"), text2.data(), text2.size());
  std::string text = EncodeManifestV1(m);
  Write(dir / (name + ".stoker"), text.data(), text.size());
  // The body alone: the manifest fuzzer also feeds inputs as bodies.
  std::string body = text.substr(text.find('\n') + 1);
  Write(dir / (name + ".json"), body.data(), body.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path md = out / "manifest", sd = out / "shard";
  fs::create_directories(md);
  fs::create_directories(sd);

  const std::vector<FieldSpec> image_label = {{"image", FieldType::kBytes},
                                              {"label", FieldType::kInt64}};
  // Several 4 KiB shards of image + label.
  WriteManifest(md, "image_label", Pack(image_label, 40, 300, 4096, 1, sd, "image_label", 2));
  // One field (index entries with padding), one shard.
  WriteManifest(md, "one_field",
                Pack({{"blob", FieldType::kBytes}}, 5, 50, 4096, 2, sd, "one_field", 1));
  // Three fields, an 8 KiB shard.
  WriteManifest(md, "three_fields",
                Pack({{"a", FieldType::kBytes}, {"b", FieldType::kInt64}, {"c", FieldType::kBytes}},
                     12, 900, 8192, 3, sd, "three_fields", 1));
  // The widest schema: 64 fields, one sample.
  std::vector<FieldSpec> wide;
  for (int f = 0; f < 64; ++f) {
    wide.push_back({"f" + std::to_string(f), f % 2 ? FieldType::kInt64 : FieldType::kBytes});
  }
  Pack(wide, 1, 8, 4096, 4, sd, "wide", 1);
  // The empty dataset.
  Manifest empty;
  empty.dataset_id = Id(5);
  empty.fields = image_label;
  empty.created_by = "make_fuzz_seeds";
  WriteManifest(md, "empty", empty);
  return 0;
}
