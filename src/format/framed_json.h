// "Framed JSON": a one-line ASCII header (magic, version, body length, body
// checksum) followed by a strict JSON body. The dataset manifest
// (docs/format.md §2) and the checkpoint manifest and part records
// (docs/checkpoint.md §2, §3) share it. Internal to stoker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

#include "stoker/status.h"

namespace stoker::format::internal {

using json = nlohmann::json;

struct FramedFormat {
  std::string_view magic;         // with its trailing space: "STOKER-DATASET "
  std::string_view what;          // for messages: "stoker manifest"
  std::string_view version_name;  // for messages: "format", "checkpoint format"
  uint32_t max_version = 1;       // newer ones are Unsupported
  int max_depth = 8;              // JSON nesting limit
  // Longest body a reader accepts (the header's length is checked against it
  // before the body is looked at). Default: no limit but u64's.
  uint64_t max_body_bytes = UINT64_MAX;
};

// MAGIC VERSION LENGTH HASH\n BODY.
std::string EncodeFramed(const FramedFormat& f, uint32_t version, std::string_view body);

// Checks the header, the length and the checksum, then parses the body as
// strict JSON (duplicate keys and excess nesting refused). Errors start with
// `where`. Does not look at the JSON's content.
Status DecodeFramed(std::span<const std::byte> data, std::string_view where, const FramedFormat& f,
                    uint32_t* version, json* root);

// A decimal with 1..max_digits digits, no sign, no leading zero (except "0").
bool ParseDecimal(std::string_view s, size_t max_digits, uint64_t* out);
// hex16 (docs/format.md conventions): 16 lowercase digits.
bool ParseHex16(std::string_view s, uint64_t* out);
int HexValue(char c);

// Builds the Corruption errors of one JSON document; `path` is a JSON path
// like "shards[3].bytes".
class Checker {
 public:
  explicit Checker(std::string_view where) : where_(where) {}

  Status Error(std::string_view path, std::string_view what) const;
  // `obj[key]`, which must exist; `*out` points into obj.
  Status Get(const json& obj, const char* key, const std::string& path, const json** out) const;
  Status TypeError(const std::string& path, const char* expected, const json& v) const;
  Status GetUnsigned(const json& obj, const char* key, const std::string& path, uint64_t max,
                     uint64_t* out) const;
  Status GetString(const json& obj, const char* key, const std::string& path,
                   const std::string** out) const;
  Status GetArray(const json& obj, const char* key, const std::string& path,
                  const json** out) const;
  // The body is an object whose "format_version" equals the header's.
  Status CheckFormatVersion(const json& root, uint32_t header_version) const;

 private:
  std::string_view where_;
};

inline std::string Indexed(const char* name, size_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

}  // namespace stoker::format::internal
