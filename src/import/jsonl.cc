// ImportJsonl: one JSON object a line, each declared field taken from its
// key, into a DatasetWriter.
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "import/values.h"
#include "loader/fp16.h"
#include "stoker/import.h"

namespace stoker {
namespace {

using format::DType;
using format::FieldSpec;
using format::FieldType;
using format::FieldValue;
using Json = nlohmann::ordered_json;

// A field's value as the writer takes it, with the bytes it points into.
struct Slot {
  std::string text;
  std::vector<std::byte> bytes;
};

std::string Quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

// The integer range of an integer dtype.
void IntRange(DType d, int64_t* lo, uint64_t* hi) {
  switch (d) {
    case DType::kUInt8:
      *lo = 0, *hi = 0xff;
      return;
    case DType::kUInt16:
      *lo = 0, *hi = 0xffff;
      return;
    case DType::kUInt32:
      *lo = 0, *hi = 0xffffffffu;
      return;
    case DType::kInt32:
      *lo = std::numeric_limits<int32_t>::min(), *hi = std::numeric_limits<int32_t>::max();
      return;
    default:
      *lo = std::numeric_limits<int64_t>::min(), *hi = std::numeric_limits<int64_t>::max();
      return;
  }
}

bool IsFloatDType(DType d) {
  return d == DType::kFloat16 || d == DType::kBFloat16 || d == DType::kFloat32;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

template <typename T>
void Append(std::vector<std::byte>* out, T v) {
  const size_t at = out->size();
  out->resize(at + sizeof v);
  std::memcpy(out->data() + at, &v, sizeof v);
}

// Appends the numbers of `j` (a number or nested arrays of them) to `out`
// as dtype `d`; "" or why not.
std::string AppendArray(const Json& j, DType d, uint64_t* count, std::vector<std::byte>* out) {
  if (j.is_array()) {
    for (const Json& e : j) {
      std::string why = AppendArray(e, d, count, out);
      if (!why.empty()) return why;
    }
    return "";
  }
  const uint64_t n = (*count)++;
  if (!j.is_number()) return "element " + std::to_string(n) + " is " + j.type_name() + ", not a number";
  if (IsFloatDType(d)) {
    const float f = static_cast<float>(j.get<double>());
    if (d == DType::kFloat32) {
      Append(out, f);
    } else if (d == DType::kFloat16) {
      Append(out, FloatToHalf(f));
    } else {
      Append(out, FloatToBFloat16(f));
    }
    return "";
  }
  if (!j.is_number_integer()) {
    return "element " + std::to_string(n) + " is " + j.dump() + ", not an integer (" +
           std::string(format::DTypeName(d)) + ")";
  }
  int64_t lo;
  uint64_t hi;
  IntRange(d, &lo, &hi);
  const bool neg = j.is_number_integer() && !j.is_number_unsigned() && j.get<int64_t>() < 0;
  const bool ok = neg ? j.get<int64_t>() >= lo : j.get<uint64_t>() <= hi;
  if (!ok) {
    return "!element " + std::to_string(n) + " is " + j.dump() + ", outside " +
           std::string(format::DTypeName(d)) + "'s range " + std::to_string(lo) + ".." +
           std::to_string(hi);
  }
  switch (d) {
    case DType::kUInt8:
      Append(out, static_cast<uint8_t>(j.get<uint64_t>()));
      break;
    case DType::kUInt16:
      Append(out, static_cast<uint16_t>(j.get<uint64_t>()));
      break;
    case DType::kUInt32:
      Append(out, static_cast<uint32_t>(j.get<uint64_t>()));
      break;
    case DType::kInt32:
      Append(out, static_cast<int32_t>(j.get<int64_t>()));
      break;
    default:
      Append(out, j.get<int64_t>());
      break;
  }
  return "";
}

// Value `j` of field `f` into *v (pointing into *slot). "" or why not; a
// reason starting with '!' is a number out of range.
std::string Convert(const FieldSpec& f, const Json& j, Slot* slot, FieldValue* v) {
  *v = FieldValue{};
  switch (f.type) {
    case FieldType::kString:
    case FieldType::kBytes:
      if (!j.is_string()) return std::string("is ") + j.type_name() + ", not a string";
      slot->text = j.get_ref<const std::string&>();
      v->bytes = std::as_bytes(std::span(slot->text));
      return "";
    case FieldType::kJson:
      slot->text = j.dump();
      v->bytes = std::as_bytes(std::span(slot->text));
      return "";
    case FieldType::kInt64:
      if (!j.is_number_integer()) return "is " + j.dump() + ", not an integer";
      if (j.is_number_unsigned() &&
          j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return "!is " + j.dump() + ", outside int64's range";
      }
      v->i64 = j.get<int64_t>();
      return "";
    case FieldType::kFloat32:
    case FieldType::kFloat64: {
      if (!j.is_number()) return "is " + j.dump() + ", not a number";
      v->f64 = j.get<double>();
      if (f.type == FieldType::kFloat32 && std::isfinite(v->f64) &&
          std::fabs(v->f64) > std::numeric_limits<float>::max()) {
        return "!is " + j.dump() + ", outside float32's range";
      }
      return "";
    }
    case FieldType::kArray: {
      if (!j.is_array()) return std::string("is ") + j.type_name() + ", not an array";
      slot->bytes.clear();
      uint64_t count = 0;
      std::string why = AppendArray(j, f.dtype, &count, &slot->bytes);
      if (!why.empty()) return why;
      v->bytes = slot->bytes;
      return "";
    }
  }
  return "has a type this importer does not know";
}

// The field a first line's value suggests (see import.h).
FieldSpec Infer(const std::string& key, const Json& j) {
  FieldSpec f;
  f.name = key;
  f.type = FieldType::kJson;
  if (j.is_string()) {
    f.type = FieldType::kString;
  } else if (j.is_number_integer()) {
    f.type = FieldType::kInt64;
  } else if (j.is_number()) {
    f.type = FieldType::kFloat64;
  } else if (j.is_array()) {
    bool ints = true, numbers = true;
    for (const Json& e : j) {
      ints = ints && e.is_number_integer();
      numbers = numbers && e.is_number();
    }
    if (numbers) {
      f.type = FieldType::kArray;
      f.dtype = ints ? DType::kInt64 : DType::kFloat32;
      f.shape = {format::kVariableDim};
    }
  }
  return f;
}

uint64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

bool Blank(const std::string& line) {
  return line.find_first_not_of(" \t\r") == std::string::npos;
}

}  // namespace

Result<ImportResult> ImportJsonl(std::span<const std::string> paths, std::string_view dst_uri,
                                 const ImportOptions& options) {
  if (paths.empty()) return InvalidArgument("no JSONL file given");
  ImportResult result;
  result.sources.assign(paths.begin(), paths.end());
  for (const std::string& p : paths) result.source_bytes += FileSize(p);

  std::vector<FieldSpec> fields = options.fields;
  std::unique_ptr<DatasetWriter> writer;
  std::vector<Slot> slots;
  std::vector<FieldValue> values;
  WriterOptions wo = options.writer;
  if (wo.created_by.empty()) wo.created_by = import::CreatedBy("jsonl");
  ImportProgress progress;
  progress.bytes_total = result.source_bytes;
  uint64_t next_report = 0;
  constexpr uint64_t kReportEvery = 16ull << 20;

  std::string line;
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return ErrnoToStatus(errno, "open " + path);
    uint64_t lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      progress.bytes_read += line.size() + 1;
      if (Blank(line)) continue;
      const std::string where = path + ":" + std::to_string(lineno);
      auto bad = [&](Status st) -> Status {
        if (!options.skip_bad) return st;
        ++result.skipped;
        result.last_skip_reason = st.message();
        return Status::Ok();
      };
      Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) {
        STOKER_RETURN_IF_ERROR(bad(InvalidArgument(where + ": not one JSON value")));
        continue;
      }
      if (!j.is_object()) {
        STOKER_RETURN_IF_ERROR(
            bad(InvalidArgument(where + ": a " + j.type_name() + ", not a JSON object")));
        continue;
      }
      if (writer == nullptr) {
        if (fields.empty()) {
          for (const auto& [k, v] : j.items()) {
            if (!format::ValidFieldName(k)) {
              return InvalidArgument(where + ": key " + Quoted(k) +
                                     " is no field name ([A-Za-z0-9_]{1,64}); declare the "
                                     "fields with --field NAME:TYPE");
            }
            fields.push_back(Infer(k, v));
          }
          if (fields.empty()) return InvalidArgument(where + ": an empty object: no fields");
        }
        STOKER_ASSIGN_OR_RETURN(writer, DatasetWriter::Create(dst_uri, fields, wo));
        slots.resize(fields.size());
        values.resize(fields.size());
      }
      Status line_status;
      for (size_t f = 0; f < fields.size() && line_status.ok(); ++f) {
        auto it = j.find(fields[f].name);
        if (it == j.end()) {
          line_status = InvalidArgument(where + ": no key " + Quoted(fields[f].name) +
                                        " (field " + fields[f].Describe() + ")");
          break;
        }
        std::string why = Convert(fields[f], *it, &slots[f], &values[f]);
        if (!why.empty()) {
          const bool range = why[0] == '!';
          std::string msg = where + ": key " + Quoted(fields[f].name) + " (field " +
                            fields[f].Describe() + "): " + (range ? why.substr(1) : why);
          line_status = range ? OutOfRange(msg) : InvalidArgument(msg);
        }
      }
      if (line_status.ok()) {
        line_status = writer->Write(values);
        if (!line_status.ok() && line_status.code() == Code::kInvalidArgument) {
          line_status = line_status.WithContext(where);
        } else if (!line_status.ok()) {
          return line_status.WithContext(where);
        }
      }
      if (!line_status.ok()) {
        STOKER_RETURN_IF_ERROR(bad(line_status));
        continue;
      }
      if (progress.bytes_read >= next_report) {
        next_report = progress.bytes_read + kReportEvery;
        progress.samples = writer->records();
        progress.skipped = result.skipped;
        if (options.progress) options.progress(progress);
        STOKER_RETURN_IF_ERROR(import::CheckCancelled(options.cancelled, where, progress));
      }
    }
    if (in.bad()) return ErrnoToStatus(errno, "read " + path);
  }
  if (writer == nullptr) return InvalidArgument("no records in " + paths.front());
  STOKER_RETURN_IF_ERROR(import::Finish(*writer, options.progress, &progress, &result));
  return result;
}

}  // namespace stoker
