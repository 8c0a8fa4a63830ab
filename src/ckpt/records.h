// The checkpoint's objects and their encoding (docs/checkpoint.md). Internal.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "stoker/checkpoint.h"

namespace stoker::ckpt {

// docs/checkpoint.md; a newer version is Unsupported. Version 1 (whole-chunk
// checksums, no layouts) is still read, and written on request
// (SaveOptions::format_version).
inline constexpr uint32_t kCheckpointFormatVersion = kCheckpointFormat;
static_assert(kCheckpointFormatVersion == 2, "docs/checkpoint.md describes version 2");
// Checksum blocks a writer may use (SaveOptions::checksum_block_bytes).
inline constexpr uint64_t kMinChecksumBlockBytes = 4096;
inline constexpr uint64_t kMaxChecksumBlockBytes = 64ull << 20;
inline constexpr std::string_view kLatestKey = "latest";
inline constexpr std::string_view kManifestSuffix = "/manifest.stkc";
// JSON nesting the decoder accepts: the structure needs 4, user metadata
// (a Python state dict's nested containers) more.
inline constexpr int kMaxCheckpointJsonDepth = 64;
// Largest chunk a writer makes: keeps one chunk's read buffer bounded.
inline constexpr uint64_t kMaxChunkBytes = 1ull << 30;
// Longest manifest body (docs/checkpoint.md §2): bounds what a reader holds;
// 2000 tensors make ~300 KB, so this is ~7 million tensors.
inline constexpr uint64_t kMaxManifestBodyBytes = 1ull << 30;

std::string ManifestKey(std::string_view name);
std::string PartKey(std::string_view name, uint32_t rank);
std::string ChunkKey(std::string_view name, uint32_t rank, uint64_t chunk);

// Empty when `name` is a valid tensor name (§3.1), else what is wrong.
std::string TensorNameProblem(std::string_view name);

// What a part record (§3) holds besides the rank's tensors and chunks.
struct PartRecord {
  uint32_t format_version = kCheckpointFormatVersion;
  std::string name;
  uint32_t world_size = 1;
  std::string attempt;
  RankPart part;
};

// The version a part or manifest of these ranks needs at least: 2 where a
// tensor has a layout or a chunk block checksums, else `wanted`.
uint32_t VersionFor(std::span<const RankPart> parts, uint32_t wanted);

std::string EncodePart(const PartRecord& p);
Result<PartRecord> DecodePart(std::span<const std::byte> data, std::string_view where,
                              std::string_view name);

// m.metadata_json must be a JSON object (checked by the caller).
std::string EncodeCheckpointManifest(const CheckpointManifest& m);
Result<CheckpointManifest> DecodeCheckpointManifest(std::span<const std::byte> data,
                                                    std::string_view where, std::string_view name);

}  // namespace stoker::ckpt
