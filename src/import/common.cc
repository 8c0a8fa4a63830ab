// What the importers share: the sources a WebDataset path list names, the
// `--field NAME:TYPE` parser.
#include <algorithm>
#include <filesystem>
#include <system_error>

#include "stoker/import.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

bool EndsWith(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

bool IsTarName(std::string_view name) {
  return EndsWith(name, ".tar") || EndsWith(name, ".tar.gz") || EndsWith(name, ".tgz");
}

// The tar files directly in `dir`, in name order.
std::vector<std::string> TarsIn(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code ec2;
    if (IsTarName(e.path().filename().string()) && e.is_regular_file(ec2)) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

Result<std::vector<std::string>> ListTars(std::span<const std::string> paths) {
  if (paths.empty()) return InvalidArgument("no WebDataset source given");
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    std::error_code ec;
    const fs::file_status st = fs::status(p, ec);
    if (ec || !fs::exists(st)) return NotFound(p + ": no such file or folder");
    if (fs::is_directory(st)) {
      std::vector<std::string> tars = TarsIn(p);
      if (tars.empty()) return InvalidArgument(p + ": a folder without .tar files");
      out.insert(out.end(), tars.begin(), tars.end());
    } else if (IsTarName(p)) {
      out.push_back(p);
    } else {
      return InvalidArgument(p + ": not a .tar file (WebDataset shards are NAME.tar)");
    }
  }
  return out;
}

bool LooksLikeWebDataset(std::span<const std::string> paths) {
  if (paths.empty()) return false;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      if (TarsIn(p).empty()) return false;
    } else if (!IsTarName(p)) {
      return false;
    }
  }
  return true;
}

Result<format::FieldSpec> ParseFieldArg(std::string_view arg) {
  const size_t colon = arg.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == arg.size()) {
    return InvalidArgument("--field '" + std::string(arg) +
                           "': expected NAME:TYPE (e.g. caption:str, tokens:uint32[*])");
  }
  return format::ParseFieldSpec(arg.substr(0, colon), arg.substr(colon + 1));
}

}  // namespace stoker
