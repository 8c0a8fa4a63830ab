// Framed JSON: header line + strict JSON body. See framed_json.h.
#include "format/framed_json.h"

#include <algorithm>
#include <charconv>
#include <unordered_set>
#include <vector>

#include "format/coding.h"
#include "stoker/format.h"

namespace stoker::format::internal {

namespace {

// The header line's longest allowed length, shared by every framed object.
constexpr size_t kMaxHeaderBytes = kMaxManifestHeaderBytes;

// ---- strict JSON ------------------------------------------------------------

// nlohmann's DOM parser, wrapped to refuse duplicate keys (nlohmann keeps the
// last one silently, so two readers could disagree on a manifest) and nesting
// deeper than a limit. Never throws: errors land in error().
class StrictSax {
 public:
  StrictSax(json& root, int max_depth)
      : dom_(root, /*allow_exceptions=*/false), max_depth_(max_depth) {}

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) {
    return dom_.number_float(v, s);
  }
  bool string(json::string_t& v) { return dom_.string(v); }
  bool binary(json::binary_t& v) { return dom_.binary(v); }

  bool start_object(std::size_t n) {
    if (!Enter()) return false;
    if (keys_.size() < static_cast<size_t>(depth_)) keys_.resize(depth_);
    keys_[depth_ - 1].clear();
    return dom_.start_object(n);
  }
  bool key(json::string_t& k) {
    if (!keys_[depth_ - 1].insert(k).second) {
      error_ = "duplicate key \"" + k + "\"";
      return false;
    }
    return dom_.key(k);
  }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (!Enter()) return false;
    return dom_.start_array(n);
  }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(std::size_t /*pos*/, const std::string& /*token*/, const json::exception& ex) {
    // "[json.exception.parse_error.101] parse error at line 1, ..." without
    // the bracketed id.
    std::string_view what = ex.what();
    size_t cut = what.find("] ");
    error_ = std::string(cut == std::string_view::npos ? what : what.substr(cut + 2));
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  bool Enter() {
    if (++depth_ > max_depth_) {
      error_ = "nested deeper than " + std::to_string(max_depth_) + " levels";
      return false;
    }
    return true;
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  int max_depth_;
  int depth_ = 0;
  // Keys seen in each open object, by depth; reused to avoid reallocating.
  std::vector<std::unordered_set<std::string>> keys_;
  std::string error_;
};

}  // namespace

// A decimal with 1..max_digits digits, no sign, no leading zero (except "0").
bool ParseDecimal(std::string_view s, size_t max_digits, uint64_t* out) {
  if (s.empty() || s.size() > max_digits) return false;
  if (s.size() > 1 && s[0] == '0') return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // uppercase is not accepted: the writer writes lowercase
}

// hex16 (docs/format.md conventions).
bool ParseHex16(std::string_view s, uint64_t* out) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d = HexValue(c);
    if (d < 0) return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

std::string EncodeFramed(const FramedFormat& f, uint32_t version, std::string_view body) {
  std::string out = std::string(f.magic) + std::to_string(version) + " " +
                    std::to_string(body.size()) + " " +
                    Hex16(Hash64(std::as_bytes(std::span(body.data(), body.size())))) + "\n";
  out += body;
  return out;
}

Status DecodeFramed(std::span<const std::byte> data, std::string_view where, const FramedFormat& f,
                    uint32_t* version_out, json* root) {
  const std::string w(where);
  const char* text = reinterpret_cast<const char*>(data.data());
  std::string_view head(text, std::min(data.size(), kMaxHeaderBytes));

  // §2.1: magic and version first, so that a newer version may change the
  // rest of the line.
  if (!head.starts_with(f.magic)) {
    return Corruption(w + ": not a " + std::string(f.what) + " (does not start with \"" +
                      std::string(f.magic) + "\")");
  }
  size_t nl = head.find('\n');
  if (nl == std::string_view::npos) {
    return Corruption(w + ": header line: no newline in the first " +
                      std::to_string(kMaxHeaderBytes) + " bytes");
  }
  std::string_view line = head.substr(f.magic.size(), nl - f.magic.size());
  size_t sp = line.find(' ');
  std::string_view version_tok = line.substr(0, sp);
  uint64_t version;
  if (!ParseDecimal(version_tok, 10, &version) || version > UINT32_MAX) {
    return Corruption(w + ": header line: bad format version '" + std::string(version_tok) + "'");
  }
  if (version == 0) return Corruption(w + ": header line: format version 0");
  if (version > f.max_version) {
    const std::string vn(f.version_name);
    return Unsupported(w + ": written by a newer stoker (" + vn + " v" + std::to_string(version) +
                       "; this build reads v" + std::to_string(f.max_version) + ")");
  }
  if (sp == std::string_view::npos) {
    return Corruption(w + ": header line: missing body length and hash");
  }
  std::string_view rest = line.substr(sp + 1);
  sp = rest.find(' ');
  std::string_view length_tok = rest.substr(0, sp);
  uint64_t body_length;
  if (!ParseDecimal(length_tok, 20, &body_length)) {
    return Corruption(w + ": header line: bad body length '" + std::string(length_tok) + "'");
  }
  if (body_length > f.max_body_bytes) {
    return Corruption(w + ": header line: body length " + std::to_string(body_length) +
                      " is more than a " + std::string(f.what) + " may hold (" +
                      std::to_string(f.max_body_bytes) + " bytes)");
  }
  std::string_view hash_tok = sp == std::string_view::npos ? "" : rest.substr(sp + 1);
  uint64_t body_hash;
  if (!ParseHex16(hash_tok, &body_hash)) {
    return Corruption(w + ": header line: bad body hash '" + std::string(hash_tok) +
                      "' (expected 16 lowercase hex digits)");
  }

  // §2.2: the body, exactly.
  std::span<const std::byte> body = data.subspan(nl + 1);
  if (body.size() != body_length) {
    return Corruption(w + (body.size() < body_length ? ": truncated: body is " : ": body is ") +
                      std::to_string(body.size()) + " bytes, header says " +
                      std::to_string(body_length));
  }
  uint64_t actual = Hash64(body);
  if (actual != body_hash) {
    return Corruption(w + ": body checksum mismatch (header says " + Hex16(body_hash) +
                      ", body hashes to " + Hex16(actual) + ")");
  }

  // nlohmann skips a UTF-8 byte order mark; Python's json.loads refuses one.
  // Refuse it here too, so that every reader agrees on what is a manifest.
  if (body.size() >= 3 && body[0] == std::byte{0xEF} && body[1] == std::byte{0xBB} &&
      body[2] == std::byte{0xBF}) {
    return Corruption(w + ": invalid JSON: body starts with a byte order mark");
  }
  StrictSax sax(*root, f.max_depth);
  const char* b = reinterpret_cast<const char*>(body.data());
  if (!json::sax_parse(b, b + body.size(), &sax, json::input_format_t::json, /*strict=*/true,
                       /*ignore_comments=*/false)) {
    return Corruption(
        w + ": invalid JSON: " + (sax.error().empty() ? std::string("parse failed") : sax.error()));
  }
  *version_out = static_cast<uint32_t>(version);
  return Status::Ok();
}

// ---- Checker ----------------------------------------------------------------

Status Checker::Error(std::string_view path, std::string_view what) const {
  return Corruption(std::string(where_) + ": " + std::string(path) + ": " + std::string(what));
}

Status Checker::Get(const json& obj, const char* key, const std::string& path,
                    const json** out) const {
  auto it = obj.find(key);
  if (it == obj.end()) {
    return Corruption(std::string(where_) + ": missing key \"" + path + "\"");
  }
  *out = &*it;
  return Status::Ok();
}

Status Checker::TypeError(const std::string& path, const char* expected, const json& v) const {
  return Error(path, std::string("expected ") + expected + ", got " + v.type_name());
}

Status Checker::GetUnsigned(const json& obj, const char* key, const std::string& path, uint64_t max,
                            uint64_t* out) const {
  const json* v;
  STOKER_RETURN_IF_ERROR(Get(obj, key, path, &v));
  // Negative numbers, fractions and integers beyond u64 (which nlohmann
  // parses as floats) are all refused here.
  if (!v->is_number_unsigned()) return TypeError(path, "an unsigned integer", *v);
  uint64_t n = v->get<uint64_t>();
  if (n > max) return Error(path, std::to_string(n) + " is larger than " + std::to_string(max));
  *out = n;
  return Status::Ok();
}

Status Checker::GetString(const json& obj, const char* key, const std::string& path,
                          const std::string** out) const {
  const json* v;
  STOKER_RETURN_IF_ERROR(Get(obj, key, path, &v));
  if (!v->is_string()) return TypeError(path, "a string", *v);
  *out = v->get_ptr<const std::string*>();
  return Status::Ok();
}

Status Checker::GetArray(const json& obj, const char* key, const std::string& path,
                         const json** out) const {
  STOKER_RETURN_IF_ERROR(Get(obj, key, path, out));
  if (!(*out)->is_array()) return TypeError(path, "an array", **out);
  return Status::Ok();
}

Status Checker::CheckFormatVersion(const json& root, uint32_t header_version) const {
  if (!root.is_object()) return TypeError("body", "an object", root);
  uint64_t u;
  STOKER_RETURN_IF_ERROR(GetUnsigned(root, "format_version", "format_version", UINT32_MAX, &u));
  if (u != header_version) {
    return Error("format_version",
                 std::to_string(u) + ", header says " + std::to_string(header_version));
  }
  return Status::Ok();
}

}  // namespace stoker::format::internal
