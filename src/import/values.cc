#include "import/values.h"

#include <cerrno>
#include <charconv>
#include <cstdlib>

namespace stoker::import {
namespace {

std::string_view Trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string FieldNameForExt(std::string_view ext) {
  std::string name(ext);
  for (char& c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_';
    if (!ok) c = '_';
  }
  return name;
}

bool ParseInt64Text(std::string_view text, int64_t* out) {
  text = Trim(text);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

bool ParseDoubleText(std::string_view text, double* out) {
  text = Trim(text);
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

std::string CreatedBy(std::string_view kind) {
  return std::string("stoker ") + STOKER_VERSION + " import " + std::string(kind);
}

Status Finish(DatasetWriter& writer, const std::function<void(const ImportProgress&)>& report,
              ImportProgress* progress, ImportResult* result) {
  result->samples = writer.records();
  STOKER_ASSIGN_OR_RETURN(result->manifest, writer.Close());
  if (report) {
    progress->bytes_read = result->source_bytes;
    progress->samples = result->samples;
    progress->shards_stored = result->manifest.shards.size();
    progress->skipped = result->skipped;
    report(*progress);
  }
  return Status::Ok();
}

Status CheckCancelled(const std::function<bool()>& cancelled, const std::string& what,
                      const ImportProgress& progress) {
  if (!cancelled || !cancelled()) return Status::Ok();
  return Cancelled(what + " cancelled after " + std::to_string(progress.bytes_read) + " of " +
                   std::to_string(progress.bytes_total) +
                   " source bytes; nothing was committed");
}

}  // namespace stoker::import
