// Field types: dtypes, shapes, the length rule of each type, and the type
// names users write. docs/format.md §2.2, §3.2.
#include <algorithm>
#include <charconv>

#include "stoker/format.h"

namespace stoker::format {
namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  uint32_t bytes;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::kUInt8, "uint8", 1},    {DType::kUInt16, "uint16", 2},
    {DType::kUInt32, "uint32", 4},  {DType::kInt32, "int32", 4},
    {DType::kInt64, "int64", 8},    {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2}, {DType::kFloat32, "float32", 4},
};

const DTypeEntry* FindDType(DType d) {
  for (const auto& e : kDTypes) {
    if (e.dtype == d) return &e;
  }
  return nullptr;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ",";
    s += shape[i] == kVariableDim ? "*" : std::to_string(shape[i]);
  }
  return s + "]";
}

// Empty when an array's dtype and shape follow §3.2, else why not.
std::string ArrayProblem(const FieldSpec& f) {
  if (FindDType(f.dtype) == nullptr) return "unknown dtype";
  if (f.shape.size() > kMaxArrayDims) {
    return "shape has " + std::to_string(f.shape.size()) + " dimensions, at most " +
           std::to_string(kMaxArrayDims) + " are allowed";
  }
  uint64_t row = DTypeBytes(f.dtype);
  for (size_t i = 0; i < f.shape.size(); ++i) {
    const int64_t d = f.shape[i];
    if (d == kVariableDim) {
      if (i != 0) return "only the first dimension may vary (shape " + ShapeText(f.shape) + ")";
      continue;
    }
    if (d < 1 || static_cast<uint64_t>(d) > kMaxShardBytes) {
      return "dimension " + std::to_string(i) + " is " + std::to_string(d) +
             ", expected 1.." + std::to_string(kMaxShardBytes) + " or variable";
    }
    if (__builtin_mul_overflow(row, static_cast<uint64_t>(d), &row) || row > kMaxShardBytes) {
      return "shape " + ShapeText(f.shape) + " is larger than a shard can hold";
    }
  }
  return {};
}

bool ValidExt(std::string_view ext) {
  if (ext.empty() || ext.size() > kMaxFieldNameBytes) return false;
  return std::all_of(ext.begin(), ext.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == '-';
  });
}

}  // namespace

std::string_view DTypeName(DType d) {
  const DTypeEntry* e = FindDType(d);
  return e ? e->name : "unknown";
}

uint32_t DTypeBytes(DType d) {
  const DTypeEntry* e = FindDType(d);
  return e ? e->bytes : 0;
}

bool ParseDType(std::string_view name, DType* out) {
  for (const auto& e : kDTypes) {
    if (e.name == name) {
      *out = e.dtype;
      return true;
    }
  }
  return false;
}

std::string_view FieldTypeName(FieldType t) {
  switch (t) {
    case FieldType::kBytes:
      return "bytes";
    case FieldType::kInt64:
      return "int64";
    case FieldType::kFloat32:
      return "float32";
    case FieldType::kFloat64:
      return "float64";
    case FieldType::kString:
      return "str";
    case FieldType::kJson:
      return "json";
    case FieldType::kArray:
      return "array";
  }
  return "unknown";
}

bool ValidFieldName(std::string_view name) {
  if (name.empty() || name.size() > kMaxFieldNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

uint64_t FieldSpec::RowBytes() const {
  if (type != FieldType::kArray) return 0;
  uint64_t row = DTypeBytes(dtype);
  for (int64_t d : shape) {
    if (d != kVariableDim) row *= static_cast<uint64_t>(d);
  }
  return row;
}

uint64_t FieldSpec::FixedBytes() const {
  switch (type) {
    case FieldType::kInt64:
    case FieldType::kFloat64:
      return 8;
    case FieldType::kFloat32:
      return 4;
    case FieldType::kArray:
      if (!shape.empty() && shape[0] == kVariableDim) return 0;
      return RowBytes();
    default:
      return 0;
  }
}

std::string FieldSpec::LengthProblem(uint64_t length) const {
  if (const uint64_t fixed = FixedBytes(); fixed != 0) {
    if (length == fixed) return {};
    return "has length " + std::to_string(length) + ", expected " + std::to_string(fixed);
  }
  if (type == FieldType::kArray) {
    const uint64_t row = RowBytes();
    if (row != 0 && length % row == 0) return {};
    const std::string what = shape.size() <= 1
                                 ? std::string(DTypeName(dtype)) + " elements"
                                 : "rows of " + ShapeText({shape.begin() + 1, shape.end()}) +
                                       " " + std::string(DTypeName(dtype));
    return "has length " + std::to_string(length) + ", not a multiple of " + std::to_string(row) +
           " (" + what + ")";
  }
  return {};
}

std::string FieldSpec::Describe() const {
  std::string s = "'" + name + "' (" + std::string(FieldTypeName(type));
  if (type == FieldType::kArray) s += " " + std::string(DTypeName(dtype)) + ShapeText(shape);
  return s + ")";
}

Status CheckSchema(std::span<const FieldSpec> fields) {
  if (fields.empty() || fields.size() > kMaxFields) {
    return InvalidArgument(std::to_string(fields.size()) + " fields, expected 1.." +
                           std::to_string(kMaxFields));
  }
  for (size_t j = 0; j < fields.size(); ++j) {
    const FieldSpec& f = fields[j];
    if (!ValidFieldName(f.name)) {
      return InvalidArgument("field name '" + f.name + "' is not [A-Za-z0-9_]{1,64}");
    }
    for (size_t k = 0; k < j; ++k) {
      if (fields[k].name == f.name) return InvalidArgument("duplicate field name '" + f.name + "'");
    }
    if (FieldTypeName(f.type) == "unknown") {
      return InvalidArgument("field '" + f.name + "': unknown type");
    }
    if (f.type == FieldType::kArray) {
      if (std::string why = ArrayProblem(f); !why.empty()) {
        return InvalidArgument("field '" + f.name + "': " + why);
      }
    }
    if (!f.ext.empty() && !ValidExt(f.ext)) {
      return InvalidArgument("field '" + f.name + "': ext '" + f.ext +
                             "' is not [A-Za-z0-9_.-]{1,64}");
    }
    if (std::string why = BlockSumsProblem(fields, j); !why.empty()) {
      return InvalidArgument("field '" + f.name + "': " + why);
    }
  }
  return Status::Ok();
}

std::string BlockSumsProblem(std::span<const FieldSpec> fields, size_t j) {
  const FieldSpec& f = fields[j];
  if (f.block_sums_of.empty()) {
    return f.block_bytes == 0 ? std::string() : "block_bytes without block_sums_of";
  }
  if (f.type != FieldType::kBytes) return "a block-sums field is of type bytes";
  const uint32_t b = f.block_bytes;
  if (b < kMinTokenBlockBytes || b > kMaxTokenBlockBytes || (b & (b - 1)) != 0) {
    return "block_bytes " + std::to_string(b) + " is not a power of two in " +
           std::to_string(kMinTokenBlockBytes) + ".." + std::to_string(kMaxTokenBlockBytes);
  }
  for (size_t k = 0; k < fields.size(); ++k) {
    if (k != j && !fields[k].block_sums_of.empty() &&
        fields[k].block_sums_of == f.block_sums_of) {
      return "block_sums_of '" + f.block_sums_of + "': field '" + fields[k].name +
             "' holds that field's block sums too";
    }
    if (fields[k].name != f.block_sums_of) continue;
    if (!TokenShaped(fields[k])) {
      return "block_sums_of '" + f.block_sums_of + "' (" + fields[k].Describe() +
             ") is not an integer array of shape [*]";
    }
    return {};
  }
  return "block_sums_of '" + f.block_sums_of + "' names no field of the schema";
}

bool TokenShaped(const FieldSpec& f) {
  const DType d = f.dtype;
  return f.type == FieldType::kArray && f.shape.size() == 1 && f.shape[0] == kVariableDim &&
         (d == DType::kUInt8 || d == DType::kUInt16 || d == DType::kUInt32 ||
          d == DType::kInt32 || d == DType::kInt64);
}

std::string BlockSumsFieldName(std::string_view name) {
  return std::string(name.substr(0, kMaxFieldNameBytes - 5)) + "_sums";
}

FieldSpec BlockSumsFieldFor(const FieldSpec& tokens, uint32_t block_bytes) {
  FieldSpec s;
  s.name = BlockSumsFieldName(tokens.name);
  s.type = FieldType::kBytes;
  s.block_sums_of = tokens.name;
  s.block_bytes = block_bytes;
  return s;
}

void FillBlockSums(std::span<const std::byte> tokens, uint32_t block_bytes,
                   std::span<std::byte> sums) {
  for (size_t b = 0, at = 0; at < tokens.size(); ++b, at += block_bytes) {
    const uint64_t h =
        Hash64(tokens.subspan(at, std::min<size_t>(block_bytes, tokens.size() - at)));
    for (int i = 0; i < 8; ++i) sums[8 * b + i] = std::byte(h >> (8 * i));
  }
}

int64_t FirstBadBlock(std::span<const std::byte> tokens, std::span<const std::byte> sums,
                      uint32_t block_bytes) {
  for (size_t b = 0, at = 0; at < tokens.size(); ++b, at += block_bytes) {
    const uint64_t h =
        Hash64(tokens.subspan(at, std::min<size_t>(block_bytes, tokens.size() - at)));
    uint64_t want = 0;
    for (int i = 0; i < 8; ++i) want |= uint64_t(sums[8 * b + i]) << (8 * i);
    if (h != want) return int64_t(b);
  }
  return -1;
}

Result<FieldSpec> ParseFieldSpec(std::string_view name, std::string_view type) {
  FieldSpec f;
  f.name = std::string(name);
  if (type == "bytes" || type == "jpeg" || type == "png" || type == "image") {
    f.type = FieldType::kBytes;
  } else if (type == "int64" || type == "int") {
    f.type = FieldType::kInt64;
  } else if (type == "float32") {
    f.type = FieldType::kFloat32;
  } else if (type == "float64" || type == "float") {
    f.type = FieldType::kFloat64;
  } else if (type == "str" || type == "string" || type == "text") {
    f.type = FieldType::kString;
  } else if (type == "json") {
    f.type = FieldType::kJson;
  } else {
    const size_t open = type.find('[');
    if (open == std::string_view::npos || !type.ends_with(']') ||
        !ParseDType(type.substr(0, open), &f.dtype)) {
      return InvalidArgument(
          "field '" + f.name + "': unknown type '" + std::string(type) +
          "' (expected bytes, int64, float32, float64, str, json, jpeg, or an array such as "
          "uint32[*] or float32[3,224,224])");
    }
    f.type = FieldType::kArray;
    std::string_view dims = type.substr(open + 1, type.size() - open - 2);
    while (!dims.empty()) {
      const size_t comma = dims.find(',');
      std::string_view d = dims.substr(0, comma);
      while (!d.empty() && d.front() == ' ') d.remove_prefix(1);
      while (!d.empty() && d.back() == ' ') d.remove_suffix(1);
      int64_t v = 0;
      if (d == "*" || d == "None" || d == "null") {
        v = kVariableDim;
      } else {
        auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), v);
        if (ec != std::errc() || end != d.data() + d.size()) {
          return InvalidArgument("field '" + f.name + "': bad dimension '" + std::string(d) +
                                 "' in '" + std::string(type) + "'");
        }
      }
      f.shape.push_back(v);
      if (comma == std::string_view::npos) break;
      dims.remove_prefix(comma + 1);
    }
  }
  STOKER_RETURN_IF_ERROR(CheckSchema(std::span(&f, 1)));
  return f;
}

uint32_t FormatVersionFor(std::span<const FieldSpec> fields) {
  for (const FieldSpec& f : fields) {
    if ((f.type != FieldType::kBytes && f.type != FieldType::kInt64) || !f.ext.empty() ||
        !f.block_sums_of.empty()) {
      return 3;
    }
  }
  return 2;
}

}  // namespace stoker::format
