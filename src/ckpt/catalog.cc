#include "ckpt/catalog.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdio>
#include <limits>
#include <map>

#include "ckpt/records.h"

namespace stoker::ckpt {

namespace {

// The index (docs/checkpoint.md §7). Its keys start with '_', which no
// checkpoint name does, so no checkpoint is taken for part of it.
constexpr std::string_view kHeadKey = "_catalog/head";
constexpr std::string_view kFloorKey = "_catalog/floor";
constexpr std::string_view kAutoKey = "_catalog/auto";
// Probes past a stale hint before a claim gives up.
constexpr uint64_t kMaxProbes = 1u << 20;
// How long a checkpoint's folder that holds nothing (no object, no
// temporary file: what a save killed between making the folder and writing
// its first file leaves) must have been unchanged before retention or a
// removal takes it for dead. A writer makes a folder and creates its first
// file in it at once, so this only has to outlast a writer that is stopped
// or starved of CPU in between.
constexpr std::chrono::seconds kLeftoverAge{600};

std::string SequenceKey(uint64_t s) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "_catalog/seq/%020llu", static_cast<unsigned long long>(s));
  return buf;
}

std::span<const std::byte> Bytes(const std::string& s) { return std::as_bytes(std::span(s)); }

bool Ignorable(const Status& s) { return s.ok() || s.code() == Code::kNotFound; }

}  // namespace

Result<std::string> Catalog::Latest() {
  auto raw = store_->ReadAll(kLatestKey);
  if (!raw.ok()) {
    if (raw.status().code() == Code::kNotFound) {
      return NotFound("no checkpoint at " + uri() + " (no 'latest' pointer)");
    }
    return raw.status();
  }
  std::string s(reinterpret_cast<const char*>(raw->data()), raw->size());
  if (s.empty() || s.back() != '\n' || !ValidateCheckpointName(s.substr(0, s.size() - 1)).ok()) {
    return Corruption(KeyUri(kLatestKey) + ": not a checkpoint name and a newline");
  }
  s.pop_back();
  return s;
}

Result<std::string> Catalog::Resolve(std::string_view name) {
  if (name.empty() || name == kLatestKey) {
    STOKER_ASSIGN_OR_RETURN(std::string n, Latest());
    STOKER_ASSIGN_OR_RETURN(bool has, HasManifest(n));
    if (!has) {
      return NotFound(KeyUri(kLatestKey) + " names " + n + ", which has no manifest (" +
                      KeyUri(ManifestKey(n)) + " is missing)");
    }
    return n;
  }
  STOKER_RETURN_IF_ERROR(ValidateCheckpointName(name));
  return std::string(name);
}

Result<CheckpointManifest> Catalog::ReadManifest(const std::string& name) {
  auto raw = store_->ReadAll(ManifestKey(name));
  if (!raw.ok()) {
    if (raw.status().code() == Code::kNotFound) {
      // An error path only (commits never come here): a listing may cost.
      auto any = store_->List(name + "/");
      const bool partial = any.ok() && !any->empty();
      return NotFound("no checkpoint " + name + " at " + uri() +
                      (partial ? " (it has objects but no manifest: a save that is running or "
                                 "was interrupted)"
                               : ""));
    }
    return raw.status();
  }
  return DecodeCheckpointManifest(*raw, KeyUri(ManifestKey(name)), name);
}

Result<bool> Catalog::HasManifest(const std::string& name) {
  auto st = store_->Stat(ManifestKey(name));
  if (st.ok()) return true;
  if (st.status().code() == Code::kNotFound) return false;
  return st.status();
}

// ---- numbers and entries --------------------------------------------------

Result<uint64_t> Catalog::ReadNumber(std::string_view key) {
  STOKER_ASSIGN_OR_RETURN(std::vector<std::byte> raw, store_->ReadAll(key));
  const char* b = reinterpret_cast<const char*>(raw.data());
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(b, b + raw.size(), n);
  if (ec != std::errc() || end + 1 != b + raw.size() || *end != '\n') {
    return Corruption(KeyUri(key) + ": not a decimal number and a newline");
  }
  return n;
}

Status Catalog::PutNumber(std::string_view key, uint64_t n) {
  const std::string s = std::to_string(n) + "\n";
  return store_->Put(key, Bytes(s));
}

// A hint (the head, the last automatic name): atomic like every object, but
// its durability is left to the store's next sync (a lost hint only costs
// probes), so a commit pays for one durable write more than before the
// index, not two.
void Catalog::PutHint(std::string_view key, uint64_t n) {
  const std::string s = std::to_string(n) + "\n";
  (void)store_->Put(key, Bytes(s), {.durability = Durability::kDeferred});
}

Result<std::string> Catalog::ReadEntry(uint64_t sequence) {
  const std::string key = SequenceKey(sequence);
  STOKER_ASSIGN_OR_RETURN(std::vector<std::byte> raw, store_->ReadAll(key));
  std::string s(reinterpret_cast<const char*>(raw.data()), raw.size());
  if (s.empty() || s.back() != '\n' || !ValidateCheckpointName(s.substr(0, s.size() - 1)).ok()) {
    return Corruption(KeyUri(key) + ": not a checkpoint name and a newline");
  }
  s.pop_back();
  return s;
}

// A head lost or cut short by a machine crash (it is a hint, PutHint) is
// rebuilt like a missing one.
Result<uint64_t> Catalog::Head() {
  auto head = ReadNumber(kHeadKey);
  if (head.ok()) return head;
  const Code code = head.status().code();
  if (code != Code::kNotFound && code != Code::kCorruption) return head.status();
  return BuildIndex();
}

// A root written before the index (or by hand): one listing builds it, with
// an entry per commit, the floor at the oldest and the head at the newest;
// the head is written last, so that an interrupted build is redone.
Result<uint64_t> Catalog::BuildIndex() {
  STOKER_ASSIGN_OR_RETURN(std::vector<CheckpointListing> all, ListAll());
  uint64_t lo = 0, hi = 0;
  for (const CheckpointListing& l : all) {
    if (!l.committed || !l.problem.empty() || l.sequence == 0) continue;
    const std::string entry = l.name + "\n";
    Status s = store_->Put(SequenceKey(l.sequence), Bytes(entry), {.if_absent = true});
    if (!s.ok() && s.code() != Code::kAlreadyExists) return s.WithContext("indexing " + uri());
    lo = lo == 0 ? l.sequence : std::min(lo, l.sequence);
    hi = std::max(hi, l.sequence);
  }
  STOKER_RETURN_IF_ERROR(PutNumber(kFloorKey, std::max<uint64_t>(lo, 1)));
  STOKER_RETURN_IF_ERROR(PutNumber(kHeadKey, hi));
  return hi;
}

// Only a claim whose checkpoint has no manifest: a save that failed after
// its commit (moving `latest`, retention) keeps its entry.
void Catalog::Release(const std::string& name, uint64_t sequence) {
  auto has = HasManifest(name);
  if (has.ok() && !*has) (void)store_->Remove(SequenceKey(sequence));
}

Result<uint64_t> Catalog::Claim(const std::string& name) {
  STOKER_ASSIGN_OR_RETURN(uint64_t head, Head());
  const std::string entry = name + "\n";
  for (uint64_t s = head + 1; s <= head + kMaxProbes; ++s) {
    Status c = store_->Put(SequenceKey(s), Bytes(entry),
                           {.durability = Durability::kDeferred, .if_absent = true});
    if (c.code() == Code::kAlreadyExists) {
      // Ours after all when a retried create had reached the store.
      auto e = ReadEntry(s);
      if (!e.ok() || *e != name) continue;
      c = Status::Ok();
    }
    if (!c.ok()) return c.WithContext("commit of " + Where(name) + ": claiming sequence number");
    PutHint(kHeadKey, s);
    return s;
  }
  return Internal("commit of " + Where(name) + ": no free sequence number after " +
                  std::to_string(head));
}

// ---- commit, retention, removal ---------------------------------------------

Status Catalog::PutLatest(const std::string& name) {
  const std::string pointer = name + "\n";
  return store_->Put(kLatestKey, Bytes(pointer));
}

Status Catalog::Commit(const std::string& name, uint64_t sequence, std::vector<RankPart> parts,
                       const SaveOptions& o) {
  CheckpointManifest m;
  m.format_version = o.format_version;  // or 2, where a part needs it (VersionFor)
  m.name = name;
  m.created_by = std::string("stoker ") + STOKER_VERSION;
  m.created_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  m.world_size = o.world_size;
  m.attempt = o.attempt;
  m.metadata_json = o.metadata_json;
  m.step = o.step;
  m.ranks = std::move(parts);
  m.sequence = sequence;
  const std::string encoded = EncodeCheckpointManifest(m);
  // Nothing is committed that a reader would refuse (§2: a body of 1 GiB at most).
  if (const size_t body = encoded.size() - encoded.find('\n') - 1; body > kMaxManifestBodyBytes) {
    return InvalidArgument("commit of " + Where(name) + ": its manifest would be " +
                           std::to_string(body) + " bytes, more than the " +
                           std::to_string(kMaxManifestBodyBytes) +
                           " a reader accepts (fewer tensors or less metadata)");
  }
  Status s = store_->Put(ManifestKey(name), Bytes(encoded));
  if (!s.ok()) return s.WithContext("commit of " + Where(name));
  s = PutLatest(name);
  if (!s.ok()) {
    return s.WithContext(Where(name) + " is committed, but moving 'latest' to it failed");
  }
  if (o.keep_last > 0) return Retain(m.sequence, o.keep_last, name);
  return Status::Ok();
}

// §1.1 step 5 from the index: walks down from `sequence` to the floor
// (below which retention has removed everything), keeps the newest
// `keep_last` commits and removes the older ones. Never removes an entry
// without a manifest (a save in progress) or with a damaged one. The floor
// then moves up to the oldest commit kept, so that the next walk is as
// short: keep_last entries and the gaps between them.
Status Catalog::Retain(uint64_t sequence, uint32_t keep_last, const std::string& name) {
  auto floor_read = ReadNumber(kFloorKey);
  if (!floor_read.ok() && floor_read.status().code() != Code::kNotFound) {
    return floor_read.status();
  }
  const uint64_t floor = std::max<uint64_t>(floor_read.ok() ? *floor_read : 1, 1);
  uint64_t kept = 0, new_floor = sequence;
  for (uint64_t q = sequence; q >= floor; --q) {
    auto entry = ReadEntry(q);
    if (!entry.ok()) {
      if (entry.status().code() == Code::kNotFound) continue;
      return entry.status();
    }
    STOKER_ASSIGN_OR_RETURN(bool has, HasManifest(*entry));
    if (!has && kept >= keep_last && RemovedLeftover(*entry, q)) continue;
    if (!has || kept < keep_last) {
      new_floor = q;
      if (has) ++kept;
      continue;
    }
    auto m = ReadManifest(*entry);
    if (!m.ok() && m.status().code() != Code::kNotFound) continue;  // damaged: kept, by hand
    Status s = RemoveOne(*entry, /*repoint=*/false);
    if (!Ignorable(s)) {
      return s.WithContext(Where(name) + " is committed, but removing " + *entry + " (keep_last " +
                           std::to_string(keep_last) + ") failed");
    }
  }
  if (new_floor != floor) return PutNumber(kFloorKey, new_floor);
  return Status::Ok();
}

// An entry without a manifest, older than the commits retention keeps, is a
// save in progress or a dead one. Dead for sure when its folder holds
// nothing and has not changed for kLeftoverAge: then the folder and the
// entry go (and no longer hold the floor down). Only where folders are cheap
// to look into: a store without (RADOS) has no empty ones, and asking would
// list the pool at every commit.
bool Catalog::RemovedLeftover(const std::string& name, uint64_t sequence) {
  if (!store_->capabilities().prefix_listing) return false;
  auto gone = store_->RemoveEmptyFolder(name + "/", kLeftoverAge);
  if (!gone.ok() || !*gone) return false;
  return Ignorable(store_->Remove(SequenceKey(sequence)));
}

Status Catalog::Remove(std::string_view name) {
  STOKER_RETURN_IF_ERROR(ValidateCheckpointName(name));
  return RemoveOne(std::string(name), /*repoint=*/true);
}

// The manifest first (from then on it is no checkpoint, whatever remains),
// its index entry, `latest` if it named it, then the rest: the folder where
// a listing of it is cheap (with what a killed save left that no listing
// shows: a POSIX store's temporary files), else the objects the manifest
// names.
Status Catalog::RemoveOne(const std::string& name, bool repoint) {
  auto m = ReadManifest(name);
  const bool by_folder = store_->capabilities().prefix_listing;
  if (!m.ok()) {
    const Code code = m.status().code();
    if (code != Code::kNotFound && code != Code::kCorruption && code != Code::kUnsupported) {
      return m.status();
    }
    STOKER_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, store_->List(name + "/"));
    if (objects.empty()) return RemoveEmptyLeftover(name);
    Status s = store_->Remove(ManifestKey(name));
    if (!Ignorable(s)) return s;
    auto latest = Latest();
    if (repoint && latest.ok() && *latest == name) {
      STOKER_RETURN_IF_ERROR(RepointLatest(std::numeric_limits<uint64_t>::max()));
    }
    return store_->RemoveFolder(name + "/");
  }
  Status s = store_->Remove(ManifestKey(name));
  if (!Ignorable(s)) return s;
  if (auto e = ReadEntry(m->sequence); e.ok() && *e == name) {
    s = store_->Remove(SequenceKey(m->sequence));
    if (!Ignorable(s)) return s;
  }
  auto latest = Latest();
  if (repoint && latest.ok() && *latest == name) STOKER_RETURN_IF_ERROR(RepointLatest(m->sequence));
  if (by_folder) return store_->RemoveFolder(name + "/");
  std::vector<std::string> keys = {name + "/claim"};
  for (const RankPart& p : m->ranks) {
    keys.push_back(PartKey(name, p.rank));
    for (const ChunkInfo& c : p.chunks) keys.push_back(c.key);
  }
  for (const std::string& k : keys) {
    s = store_->Remove(k);
    if (!Ignorable(s)) return s;
  }
  return Status::Ok();
}

// NAME/ without objects: what a save killed before its first object landed
// left (folders, temporary files), if unchanged for kLeftoverAge; else
// NotFound, saying what is there.
Status Catalog::RemoveEmptyLeftover(const std::string& name) {
  auto gone = store_->RemoveEmptyFolder(name + "/", kLeftoverAge);
  if (gone.ok() && *gone) return Status::Ok();
  if (!gone.ok() && gone.status().code() != Code::kNotFound) return gone.status();
  std::string why;
  if (gone.ok()) {
    why = " (its folder holds no object, but changes of the last " +
          std::to_string(kLeftoverAge.count()) +
          " s or files no killed save leaves: a save may be writing it; left alone)";
  }
  return NotFound("no checkpoint " + name + " at " + uri() + why);
}

// `latest` to the newest commit below sequence `below`, found in the index
// (built first if the root has none); removed when there is none.
Status Catalog::RepointLatest(uint64_t below) {
  STOKER_ASSIGN_OR_RETURN(uint64_t head, Head());
  auto floor_read = ReadNumber(kFloorKey);
  const uint64_t floor = std::max<uint64_t>(floor_read.ok() ? *floor_read : 1, 1);
  for (uint64_t q = std::min(head, below - 1); q >= floor && q > 0; --q) {
    auto entry = ReadEntry(q);
    if (!entry.ok()) {
      if (entry.status().code() == Code::kNotFound) continue;
      return entry.status();
    }
    STOKER_ASSIGN_OR_RETURN(bool has, HasManifest(*entry));
    if (has) return PutLatest(*entry);
  }
  Status s = store_->Remove(kLatestKey);
  return Ignorable(s) ? Status::Ok() : s;
}

Result<std::string> Catalog::ClaimName(std::string_view prefix) {
  auto hint = ReadNumber(kAutoKey);
  const Code code = hint.status().code();
  if (!hint.ok() && code != Code::kNotFound && code != Code::kCorruption) return hint.status();
  const uint64_t start = hint.ok() ? *hint + 1 : 1;
  // Who claims: a retried create that had reached the store finds its own
  // claim (AlreadyExists, with these bytes) and takes the name after all.
  static std::atomic<uint64_t> claims{0};
  const std::string token = std::to_string(::getpid()) + " " +
                            std::to_string(Clock::now().time_since_epoch().count()) + " " +
                            std::to_string(claims.fetch_add(1)) + "\n";
  for (uint64_t n = start; n < start + kMaxProbes; ++n) {
    char digits[32];
    std::snprintf(digits, sizeof digits, "%06llu", static_cast<unsigned long long>(n));
    const std::string name = std::string(prefix) + digits;
    STOKER_RETURN_IF_ERROR(ValidateCheckpointName(name));
    STOKER_ASSIGN_OR_RETURN(bool committed, HasManifest(name));
    if (committed) continue;  // a checkpoint of a stoker without claims
    Status c = store_->Put(name + "/claim", Bytes(token), {.if_absent = true});
    if (c.code() == Code::kAlreadyExists) {
      auto theirs = store_->ReadAll(name + "/claim");
      if (!theirs.ok() || !std::ranges::equal(*theirs, Bytes(token))) continue;
      c = Status::Ok();
    }
    STOKER_RETURN_IF_ERROR(c.WithContext("claiming checkpoint name " + name + " at " + uri()));
    PutHint(kAutoKey, n);
    return name;
  }
  return Internal("no free checkpoint name " + std::string(prefix) + "N at " + uri());
}

// ---- listing --------------------------------------------------------------

Result<std::vector<CheckpointListing>> Catalog::List() { return ListAll(); }

Result<std::vector<CheckpointListing>> Catalog::ListAll() {
  STOKER_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, store_->List(""));
  std::map<std::string, CheckpointListing> by_name;
  for (const ObjectInfo& o : objects) {
    size_t slash = o.key.find('/');
    if (slash == std::string::npos) continue;  // `latest`, strays
    std::string name = o.key.substr(0, slash);
    if (!ValidateCheckpointName(name).ok()) continue;  // the index, strays
    CheckpointListing& l = by_name[name];
    l.name = name;
    ++l.objects;
    if (o.key == ManifestKey(name)) l.committed = true;
  }
  std::string latest;
  if (auto lt = Latest(); lt.ok()) latest = *lt;
  std::vector<CheckpointListing> out;
  for (auto& [name, l] : by_name) {
    l.latest = name == latest;
    if (l.committed) {
      auto m = ReadManifest(name);
      if (!m.ok()) {
        const Code code = m.status().code();
        if (code != Code::kCorruption && code != Code::kUnsupported) return m.status();
        l.problem = m.status().ToString();
        out.push_back(std::move(l));
        continue;
      }
      l.sequence = m->sequence;
      l.bytes = m->bytes();
      l.tensors = m->tensor_count();
      l.world_size = m->world_size;
      l.created_unix_ms = m->created_unix_ms;
    }
    out.push_back(std::move(l));
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    if (a.committed != b.committed) return a.committed;
    return a.committed ? a.sequence < b.sequence : a.name < b.name;
  });
  return out;
}

}  // namespace stoker::ckpt
