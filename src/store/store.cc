// What every backend shares: the key rules, the synchronous reads built on a
// ReadQueue, and OpenStore, which picks the backend from a URI.
#include "stoker/store.h"

#include <cctype>
#include <cstdio>
#include <limits>

#include "store/store_internal.h"

#ifdef STOKER_HAVE_RADOS
#include "store/rados_store.h"
#endif

namespace stoker {

using store_internal::Quote;

namespace store_internal {

std::string Quote(std::string_view key) {
  std::string out = "\"";
  for (char c : key) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == '"' || c == '\\') {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\x%02x", u);
        out += buf;
      }
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

Status ValidatePrefix(std::string_view prefix) {
  if (prefix.empty()) return Status::Ok();
  if (prefix.find('\0') != std::string_view::npos) {
    return InvalidArgument("invalid list prefix " + Quote(prefix) + ": contains NUL");
  }
  if (prefix.front() == '/') {
    return InvalidArgument("invalid list prefix " + Quote(prefix) + ": starts with '/'");
  }
  const size_t slash = prefix.rfind('/');
  if (slash == std::string_view::npos) return Status::Ok();
  Status st = ValidateKey(prefix.substr(0, slash));
  if (!st.ok()) {
    return InvalidArgument("invalid list prefix " + Quote(prefix) + ": " + st.message());
  }
  return Status::Ok();
}

size_t MoveCompletions(std::vector<ReadCompletion>& ready, std::vector<ReadCompletion>* out) {
  const size_t n = ready.size();
  out->insert(out->end(), std::make_move_iterator(ready.begin()),
              std::make_move_iterator(ready.end()));
  ready.clear();
  return n;
}

size_t TakeReady(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                 std::vector<ReadCompletion>& ready, size_t min, Deadline deadline,
                 std::vector<ReadCompletion>* out) {
  auto enough = [&] { return ready.size() >= min; };
  if (deadline == Deadline::max()) {
    cv.wait(lock, enough);
  } else {
    cv.wait_until(lock, deadline, enough);
  }
  return MoveCompletions(ready, out);
}

Result<size_t> EndWait(size_t n, size_t min, size_t* outstanding, std::string_view queue) {
  *outstanding -= n;
  if (n < min) {
    return TimedOut(std::string(queue) + ": " + std::to_string(n) + " of " + std::to_string(min) +
                    " completions arrived by the deadline");
  }
  return n;
}

Status ValidateFolder(std::string_view folder) {
  if (folder.size() < 2 || folder.back() != '/') {
    return InvalidArgument("invalid folder " + Quote(folder) +
                           ": a folder is a key prefix that ends with '/'");
  }
  Status st = ValidateKey(folder.substr(0, folder.size() - 1));
  if (!st.ok()) return InvalidArgument("invalid folder " + Quote(folder) + ": " + st.message());
  return Status::Ok();
}

Status ValidateQueueOptions(const ReadQueueOptions& options) {
  if (options.depth == 0) return InvalidArgument("ReadQueueOptions::depth must be at least 1");
  return Status::Ok();
}

}  // namespace store_internal

Status ValidateKey(std::string_view key) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument("invalid object key " + Quote(key) + ": " + std::string(why));
  };
  if (key.empty()) return bad("empty");
  if (key.front() == '/') return bad("starts with '/' (keys are relative to the store)");
  if (key.find('\0') != std::string_view::npos) return bad("contains NUL");
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(key.find('/', begin), key.size());
    const std::string_view part = key.substr(begin, end - begin);
    if (part.empty()) return bad("empty component");
    // One rule covers ".", "..", and the POSIX store's temporary files
    // (".NAME.tmp.PID.N"), which must never be addressable or listed.
    if (part.front() == '.') {
      return bad("component " + Quote(part) + " starts with '.' (reserved)");
    }
    if (end == key.size()) break;
    begin = end + 1;
  }
  return Status::Ok();
}

ReadCompletion ReadNow(Store& store, const ReadRequest& r) {
  ReadCompletion c;
  c.tag = r.tag;
  auto n = store.Read(r.key, r.offset, r.dst);
  if (n.ok()) {
    c.bytes = *n;
  } else {
    c.status = n.status();
  }
  return c;
}

Result<size_t> Store::Read(std::string_view key, uint64_t offset, std::span<std::byte> dst) {
  ReadQueueOptions options;
  options.depth = 1;
  STOKER_ASSIGN_OR_RETURN(std::unique_ptr<ReadQueue> queue, NewReadQueue(options));
  const ReadRequest request{std::string(key), offset, dst, 0};
  STOKER_RETURN_IF_ERROR(queue->Submit({&request, 1}));
  std::vector<ReadCompletion> done;
  done.reserve(1);
  STOKER_ASSIGN_OR_RETURN(size_t n, queue->Wait(1, Deadline::max(), &done));
  if (n != 1 || done.size() != 1) {
    return Internal(Quote(key) + ": read queue returned " + std::to_string(done.size()) +
                    " completions for one request");
  }
  if (!done[0].status.ok()) return done[0].status;
  return done[0].bytes;
}

namespace {

// Store::OpenReader's default: each piece is one Store::Read.
class StoreObjectReader final : public ObjectReader {
 public:
  StoreObjectReader(Store* store, std::string key) : store_(store), key_(std::move(key)) {}

  Result<size_t> ReadV(uint64_t offset, std::span<const std::span<std::byte>> dsts) override {
    size_t done = 0;
    for (std::span<std::byte> d : dsts) {
      if (d.empty()) continue;
      STOKER_ASSIGN_OR_RETURN(size_t n, store_->Read(key_, offset + done, d));
      done += n;
      if (n < d.size()) break;  // the object's end
    }
    return done;
  }

 private:
  Store* store_;  // outlives the reader (OpenReader's contract)
  std::string key_;
};

}  // namespace

Result<std::unique_ptr<ObjectReader>> Store::OpenReader(std::string_view key) {
  STOKER_RETURN_IF_ERROR(Stat(key).status());
  return std::unique_ptr<ObjectReader>(std::make_unique<StoreObjectReader>(this, std::string(key)));
}

StoreDescription Store::Describe() const {
  StoreDescription d;
  d.location = uri();
  return d;
}

std::string StoreDescription::ToString() const {
  std::string out = kind + " " + location;
  if (!prefix.empty()) out += "/" + prefix;
  if (!engine.empty()) out += " (" + engine + ")";
  for (size_t i = 0; i < layers.size(); ++i) out += (i == 0 ? " through " : ", ") + layers[i];
  return out;
}

Result<std::vector<std::string>> Store::ListKeys(std::string_view prefix) {
  STOKER_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, List(prefix));
  std::vector<std::string> keys;
  keys.reserve(objects.size());
  for (ObjectInfo& o : objects) keys.push_back(std::move(o.key));
  return keys;
}

Status Store::RemoveFolder(std::string_view folder) {
  STOKER_RETURN_IF_ERROR(store_internal::ValidateFolder(folder));
  STOKER_ASSIGN_OR_RETURN(std::vector<std::string> keys, ListKeys(folder));
  for (const std::string& key : keys) {
    Status s = Remove(key);
    if (!s.ok() && s.code() != Code::kNotFound) return s;
  }
  return Status::Ok();
}

Result<bool> Store::RemoveEmptyFolder(std::string_view folder, std::chrono::seconds) {
  STOKER_RETURN_IF_ERROR(store_internal::ValidateFolder(folder));
  STOKER_ASSIGN_OR_RETURN(std::vector<std::string> keys, ListKeys(folder));
  if (!keys.empty()) return false;
  return NotFound("no folder " + Quote(folder) + " at " + uri());
}

Result<std::vector<std::byte>> Store::ReadAll(std::string_view key) {
  STOKER_ASSIGN_OR_RETURN(ObjectInfo info, Stat(key));
  if (info.size >= std::numeric_limits<size_t>::max() / 2) {
    return InvalidArgument(Quote(key) + ": object too large to read whole");
  }
  // One byte more than Stat said, so that growth is noticed as well as
  // shrinkage: Stat and the read are two operations, and a Put in between
  // replaces the object.
  std::vector<std::byte> data(static_cast<size_t>(info.size) + 1);
  STOKER_ASSIGN_OR_RETURN(size_t n, Read(key, 0, data));
  if (n != info.size) {
    return IoError(Quote(key) + ": object changed size while read (stat said " +
                       std::to_string(info.size) + " bytes, read " + std::to_string(n) + ")",
                   /*retryable=*/true);
  }
  data.resize(n);
  return data;
}

namespace {

// RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ).
bool IsScheme(std::string_view s) {
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') {
      return false;
    }
  }
  return true;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> PercentDecode(std::string_view s, std::string_view uri) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    const int hi = i + 2 < s.size() ? HexValue(s[i + 1]) : -1;
    const int lo = i + 2 < s.size() ? HexValue(s[i + 2]) : -1;
    if (hi < 0 || lo < 0) {
      return InvalidArgument("store URI " + Quote(uri) + ": bad percent escape");
    }
    const char c = static_cast<char>(hi * 16 + lo);
    if (c == '\0') return InvalidArgument("store URI " + Quote(uri) + ": contains %00");
    out += c;
    i += 2;
  }
  return out;
}

Result<std::shared_ptr<Store>> OpenFileUri(std::string_view uri, std::string_view rest,
                                           const StoreOptions& options) {
  const size_t slash = rest.find('/');
  const std::string_view host = rest.substr(0, slash);
  if (!host.empty()) {
    return InvalidArgument("store URI " + Quote(uri) + " names host " + Quote(host) +
                           "; only local paths are supported (file:///abs/path)");
  }
  if (slash == std::string_view::npos) {
    return InvalidArgument("store URI " + Quote(uri) + " has no path (file:///abs/path)");
  }
  const std::string_view path = rest.substr(slash);
  if (path.find_first_of("?#") != std::string_view::npos) {
    return InvalidArgument("store URI " + Quote(uri) +
                           ": file URIs take no query or fragment (escape '?' as %3F)");
  }
  STOKER_ASSIGN_OR_RETURN(std::string root, PercentDecode(path, uri));
  return store_internal::NewPosixStoreForUri(std::move(root), std::string(uri), options);
}

}  // namespace

Result<std::shared_ptr<Store>> OpenStore(std::string_view uri, const StoreOptions& options) {
  if (uri.empty()) return InvalidArgument("empty store URI");
  const size_t sep = uri.find("://");
  if (sep == std::string_view::npos || !IsScheme(uri.substr(0, sep))) {
    if (uri.find('\0') != std::string_view::npos) {
      return InvalidArgument("store path " + Quote(uri) + " contains NUL");
    }
    return store_internal::NewPosixStoreForUri(std::string(uri), std::string(uri), options);
  }
  std::string scheme(uri.substr(0, sep));
  for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string_view rest = uri.substr(sep + 3);
  if (scheme == "file") return OpenFileUri(uri, rest, options);
  if (scheme == "mem") {
    if (rest.empty()) {
      return InvalidArgument("store URI " + Quote(uri) + " needs a name: mem://NAME");
    }
    return store_internal::OpenNamedMemoryStore(rest);
  }
  if (scheme == "rados") {
#ifdef STOKER_HAVE_RADOS
    return NewRadosStore(uri, options);
#else
    return Unsupported("store URI " + Quote(uri) +
                       ": stoker was built without RADOS support (-DSTOKER_WITH_RADOS=ON)");
#endif
  }
  return InvalidArgument("store URI " + Quote(uri) + " has unknown scheme " + Quote(scheme) +
                         " (known: file://, mem://, rados://, or a plain path)");
}

}  // namespace stoker
