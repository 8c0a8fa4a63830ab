// The checkpoint's objects and their encoding (docs/checkpoint.md). Internal.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "stoker/checkpoint.h"

namespace stoker::ckpt {

// docs/checkpoint.md; a newer version is Unsupported.
inline constexpr uint32_t kCheckpointFormatVersion = 1;
inline constexpr std::string_view kLatestKey = "latest";
inline constexpr std::string_view kManifestSuffix = "/manifest.stkc";
// JSON nesting the decoder accepts: the structure needs 4, user metadata
// (a Python state dict's nested containers) more.
inline constexpr int kMaxCheckpointJsonDepth = 64;
// Largest chunk a writer makes: keeps one chunk's read buffer bounded.
inline constexpr uint64_t kMaxChunkBytes = 1ull << 30;

std::string ManifestKey(std::string_view name);
std::string PartKey(std::string_view name, uint32_t rank);
std::string ChunkKey(std::string_view name, uint32_t rank, uint64_t chunk);

// Empty when `name` is a valid tensor name (§3.1), else what is wrong.
std::string TensorNameProblem(std::string_view name);

// What a part record (§3) holds besides the rank's tensors and chunks.
struct PartRecord {
  std::string name;
  uint32_t world_size = 1;
  std::string attempt;
  RankPart part;
};

std::string EncodePart(const PartRecord& p);
Result<PartRecord> DecodePart(std::span<const std::byte> data, std::string_view where,
                              std::string_view name);

// m.metadata_json must be a JSON object (checked by the caller).
std::string EncodeCheckpointManifest(const CheckpointManifest& m);
Result<CheckpointManifest> DecodeCheckpointManifest(std::span<const std::byte> data,
                                                    std::string_view where, std::string_view name);

}  // namespace stoker::ckpt
