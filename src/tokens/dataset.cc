// TokenDataset and TokenReader: the documents of a token dataset, found
// from the shards' indexes, and reads of their token ranges
// (include/stoker/tokens.h).
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include "stoker/tokens.h"

namespace stoker {
namespace {

using format::DType;
using format::ShardView;

using format::TokenShaped;

// A verified piece's token blocks and their checksums (docs/format.md §3.5)
// lie in two ranges of one record; where no more than this many bytes lie
// between them they are read as one range: a second request costs more
// than reading a few hundred bytes more (the gap is then most often the
// checksums of the blocks before the piece, 8 bytes each).
constexpr uint64_t kMergeGapBytes = 512;

template <typename In>
int64_t Load(const std::byte* p) {
  In v;
  std::memcpy(&v, p, sizeof v);
  return static_cast<int64_t>(v);
}

int64_t LoadToken(DType d, const std::byte* p) {
  switch (d) {
    case DType::kUInt8:
      return Load<uint8_t>(p);
    case DType::kUInt16:
      return Load<uint16_t>(p);
    case DType::kUInt32:
      return Load<uint32_t>(p);
    case DType::kInt32:
      return Load<int32_t>(p);
    default:
      return Load<int64_t>(p);
  }
}

}  // namespace

struct TokenDataset::Impl {
  std::shared_ptr<Store> store;
  format::Manifest manifest;
  TokenDatasetOptions options;
  std::string field;
  uint32_t field_index = 0;
  DType dtype = DType::kUInt16;
  uint32_t token_bytes = 2;
  // The token field's block-sums field (docs/format.md §3.5), or -1 for a
  // dataset packed without (checked by whole records).
  int sums_field = -1;
  uint32_t block_bytes = 0;
  // One per shard: its index, and the view over it.
  std::vector<std::vector<std::byte>> tails;
  std::vector<ShardView> views;
  std::vector<uint32_t> doc_tokens;
  uint64_t total_tokens = 0;
  uint64_t index_bytes = 0;

  Status ReadIndexes();

  // Where document `doc` lies: its shard and its number there.
  uint32_t ShardOf(uint64_t doc, uint32_t* local) const {
    const int64_t s = manifest.shards.ShardOf(doc);
    *local = static_cast<uint32_t>(doc - manifest.shards.first_sample(size_t(s)));
    return static_cast<uint32_t>(s);
  }
  // The token field's offset in shard `s` for its sample `local`, and the
  // record's offset and length.
  // With block sums, `sums_at` is where they lie (else it is left as is).
  void Place(uint32_t s, uint32_t local, uint64_t* tokens_at, uint64_t* record_at,
             uint64_t* record_bytes, uint64_t* sums_at) const {
    const ShardView& v = views[s];
    *record_at = v.RecordOffset(local);
    uint64_t before = 0, all = 0, before_sums = 0;
    for (uint32_t f = 0; f < v.field_count(); ++f) {
      const uint32_t len = v.FieldLength(local, f);
      if (f < field_index) before += len;
      if (int(f) < sums_field) before_sums += len;
      all += len;
    }
    *tokens_at = *record_at + before;
    *record_bytes = all;
    if (sums_field >= 0) *sums_at = *record_at + before_sums;
  }
};

Status TokenDataset::Impl::ReadIndexes() {
  const size_t shards = manifest.shards.size();
  tails.resize(shards);
  views.resize(shards);
  doc_tokens.resize(manifest.sample_count);
  // A few thousand shards at a time: the headers' memory stays small.
  constexpr size_t kChunk = 4096;
  std::vector<std::array<std::byte, format::kShardHeaderBytes>> headers;
  std::vector<uint64_t> offsets;
  std::vector<ReadRequest> requests;
  std::vector<ReadCompletion> done;
  // Declared after the buffers its reads land in, so that it is destroyed
  // (its reads waited for) before them, also after a timeout.
  ReadQueueOptions qo;
  qo.depth = std::max<uint32_t>(1, options.reads_in_flight);
  STOKER_ASSIGN_OR_RETURN(auto queue, store->NewReadQueue(qo));
  for (size_t first = 0; first < shards; first += kChunk) {
    const size_t count = std::min(kChunk, shards - first);
    headers.assign(count, {});
    offsets.assign(count, 0);
    requests.clear();
    for (size_t i = 0; i < count; ++i) {
      const size_t s = first + i;
      const format::ShardExpectation expect = format::ExpectationFor(manifest, uint32_t(s));
      uint64_t length;
      ShardView::IndexRange(expect, &offsets[i], &length);
      tails[s].resize(length);
      const std::string key = manifest.shards.key(s);
      requests.push_back({key, 0, std::span<std::byte>(headers[i]), 2 * i});
      requests.push_back({key, offsets[i], std::span<std::byte>(tails[s]), 2 * i + 1});
    }
    STOKER_RETURN_IF_ERROR(queue->Submit(requests));
    done.clear();
    const Deadline deadline = Clock::now() + options.read_timeout;
    while (done.size() < requests.size()) {
      auto n = queue->Wait(requests.size() - done.size(), deadline, &done);
      if (!n.ok()) return n.status().WithContext("reading the shards' indexes of " + store->uri());
    }
    for (const ReadCompletion& c : done) {
      const ReadRequest& r = requests[c.tag];
      if (!c.status.ok()) {
        return c.status.WithContext("reading the index of shard " + r.key + " of " + store->uri());
      }
      if (c.bytes != r.dst.size()) {
        return Corruption(store->uri() + "/" + r.key + ": truncated: read " +
                          std::to_string(c.bytes) + " bytes at offset " + std::to_string(r.offset) +
                          ", expected " + std::to_string(r.dst.size()));
      }
      index_bytes += c.bytes;
    }
    for (size_t i = 0; i < count; ++i) {
      const size_t s = first + i;
      const format::ShardExpectation expect = format::ExpectationFor(manifest, uint32_t(s));
      auto view = ShardView::ParseIndex(headers[i], tails[s], offsets[i], expect);
      if (!view.ok()) return view.status().WithContext(store->uri());
      views[s] = std::move(view).value();
      const uint64_t base = manifest.shards.first_sample(s);
      for (uint32_t j = 0; j < views[s].sample_count(); ++j) {
        const uint32_t len = views[s].FieldLength(j, field_index);
        if (len % token_bytes != 0) {
          return Corruption(store->uri() + "/" + manifest.shards.key(s) + ": sample " +
                            std::to_string(j) + " (global " + std::to_string(base + j) +
                            "): field '" + field + "' has " + std::to_string(len) +
                            " bytes, not a multiple of " + std::to_string(token_bytes));
        }
        if (sums_field >= 0) {
          const uint64_t want = format::BlockSumsBytes(len, block_bytes);
          const uint32_t got = views[s].FieldLength(j, uint32_t(sums_field));
          if (got != want) {
            return Corruption(store->uri() + "/" + manifest.shards.key(s) + ": sample " +
                              std::to_string(j) + " (global " + std::to_string(base + j) +
                              "): field '" + manifest.fields[sums_field].name + "' has " +
                              std::to_string(got) + " bytes, expected " + std::to_string(want) +
                              " (8 per block of " + std::to_string(block_bytes) + " of the " +
                              std::to_string(len) + " bytes of '" + field + "')");
          }
        }
        doc_tokens[base + j] = len / token_bytes;
        total_tokens += len / token_bytes;
      }
    }
  }
  return Status::Ok();
}

TokenDataset::TokenDataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenDataset::~TokenDataset() = default;

Result<std::unique_ptr<TokenDataset>> TokenDataset::Open(std::shared_ptr<Store> store,
                                                         format::Manifest manifest,
                                                         const TokenDatasetOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  const std::string where = store->uri();
  int f = -1;
  if (!options.field.empty()) {
    f = manifest.FieldIndex(options.field);
    if (f < 0) return InvalidArgument("no token field '" + options.field + "' in " + where);
  } else if ((f = manifest.FieldIndex(kTokenField)) < 0) {
    for (size_t i = 0; i < manifest.fields.size(); ++i) {
      if (!TokenShaped(manifest.fields[i])) continue;
      if (f >= 0) {
        return InvalidArgument(where + " has several token-shaped fields ('" +
                               manifest.fields[f].name + "', '" + manifest.fields[i].name +
                               "'): name one (sequence field)");
      }
      f = int(i);
    }
    if (f < 0) {
      return InvalidArgument(where + " has no token field: windows need a field '" +
                             std::string(kTokenField) +
                             "' or one array of an integer dtype and shape [*] (pack with "
                             "--tokens)");
    }
  }
  const format::FieldSpec& spec = manifest.fields[f];
  if (!TokenShaped(spec)) {
    return InvalidArgument("token field " + spec.Describe() + " of " + where +
                           " is not an array of an integer dtype (uint8, uint16, uint32, "
                           "int32, int64) and shape [*]");
  }
  impl->field = spec.name;
  impl->field_index = uint32_t(f);
  impl->dtype = spec.dtype;
  impl->token_bytes = format::DTypeBytes(spec.dtype);
  for (size_t i = 0; i < manifest.fields.size(); ++i) {
    if (manifest.fields[i].block_sums_of == spec.name) {
      impl->sums_field = int(i);
      impl->block_bytes = manifest.fields[i].block_bytes;
    }
  }
  impl->store = std::move(store);
  impl->manifest = std::move(manifest);
  STOKER_RETURN_IF_ERROR(impl->ReadIndexes());
  return std::unique_ptr<TokenDataset>(new TokenDataset(std::move(impl)));
}

const format::Manifest& TokenDataset::manifest() const { return impl_->manifest; }
Store& TokenDataset::store() const { return *impl_->store; }
uint64_t TokenDataset::documents() const { return impl_->doc_tokens.size(); }
uint64_t TokenDataset::total_tokens() const { return impl_->total_tokens; }
std::span<const uint32_t> TokenDataset::doc_tokens() const { return impl_->doc_tokens; }
format::DType TokenDataset::dtype() const { return impl_->dtype; }
const std::string& TokenDataset::field() const { return impl_->field; }
uint64_t TokenDataset::index_bytes_read() const { return impl_->index_bytes; }

Result<std::unique_ptr<TokenReader>> TokenDataset::NewReader() const {
  ReadQueueOptions qo;
  qo.depth = std::max<uint32_t>(1, impl_->options.reads_in_flight);
  STOKER_ASSIGN_OR_RETURN(auto queue, impl_->store->NewReadQueue(qo));
  return std::unique_ptr<TokenReader>(new TokenReader(impl_.get(), std::move(queue)));
}

TokenReader::TokenReader(const TokenDataset::Impl* ds, std::unique_ptr<ReadQueue> queue)
    : ds_(ds), queue_(std::move(queue)) {}
TokenReader::~TokenReader() = default;

namespace {

// What one piece's read is: where its bytes land in staging, and what it
// checks.
struct PieceRead {
  enum Check : uint8_t {
    kNone,    // only the piece's tokens are read, unchecked
    kRecord,  // the whole record is read and checked against its checksum
    kBlocks,  // the token blocks it touches and their checksums (§3.5)
  };
  uint32_t shard = 0, local = 0;
  Check check = kNone;
  uint64_t staged_at = 0;  // kRecord: where the record lies in staging
  uint64_t tokens_at = 0;  // where the piece's first token lies in staging
  // kBlocks: blocks [first_block, end_block) of the token field, lying from
  // blocks_at in staging, their checksums from sums_at.
  uint64_t first_block = 0, end_block = 0, blocks_at = 0, sums_at = 0;
  uint64_t field_bytes = 0;  // the document's token bytes
  uint64_t record_bytes = 0;  // kRecord
};

}  // namespace

Status TokenReader::Read(std::span<const TokenPiece> pieces, DType out_type,
                         std::span<std::byte> out) {
  const TokenDataset::Impl& ds = *ds_;
  if (!broken_.ok()) return broken_;
  if (out_type != DType::kInt64 && out_type != DType::kInt32) {
    return InvalidArgument("token output type must be int64 or int32, not " +
                           std::string(format::DTypeName(out_type)));
  }
  const uint32_t out_bytes = format::DTypeBytes(out_type);
  uint64_t tokens = 0;
  for (const TokenPiece& p : pieces) tokens += p.count;
  if (out.size() != tokens * out_bytes) {
    return InvalidArgument("token read of " + std::to_string(tokens) + " tokens into " +
                           std::to_string(out.size()) + " bytes");
  }
  thread_local std::vector<PieceRead> reads;
  thread_local std::vector<uint64_t> staged_at;  // per request: where it lands
  reads.assign(pieces.size(), {});
  requests_.clear();
  staged_at.clear();
  uint64_t staged = 0;
  auto add = [&](uint32_t shard, uint64_t at, uint64_t length) {
    requests_.push_back({ds.manifest.shards.key(shard), at, {}, requests_.size()});
    staged_at.push_back(staged);
    staged += length;
    return staged - length;
  };
  const uint64_t B = ds.block_bytes;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const TokenPiece& p = pieces[i];
    PieceRead& r = reads[i];
    if (p.doc >= ds.doc_tokens.size() || p.begin + p.count > ds.doc_tokens[p.doc]) {
      return InvalidArgument("token piece (document " + std::to_string(p.doc) + ", tokens " +
                             std::to_string(p.begin) + "+" + std::to_string(p.count) +
                             ") lies outside the dataset");
    }
    r.shard = ds.ShardOf(p.doc, &r.local);
    uint64_t tokens_at, record_at, record_bytes, sums_at = 0;
    ds.Place(r.shard, r.local, &tokens_at, &record_at, &record_bytes, &sums_at);
    const uint64_t piece_at = tokens_at + p.begin * ds.token_bytes;
    const uint64_t piece_bytes = uint64_t{p.count} * ds.token_bytes;
    if (ds.options.verify && ds.sums_field >= 0) {
      // The blocks the piece touches, and their checksums: one range, or
      // two where the gap between them is large (kMergeGapBytes).
      r.check = PieceRead::kBlocks;
      r.field_bytes = uint64_t{ds.doc_tokens[p.doc]} * ds.token_bytes;
      const uint64_t from = piece_at - tokens_at;
      r.first_block = from / B;
      r.end_block = std::max(r.first_block, (from + piece_bytes + B - 1) / B);
      const uint64_t blocks_from = tokens_at + r.first_block * B;
      const uint64_t blocks_to = tokens_at + std::min(r.end_block * B, r.field_bytes);
      const uint64_t sums_from = sums_at + 8 * r.first_block;
      const uint64_t sums_to = sums_at + 8 * r.end_block;
      const uint64_t lo = std::min(blocks_from, sums_from);
      const uint64_t hi = std::max(blocks_to, sums_to);
      if (hi - lo <= (blocks_to - blocks_from) + (sums_to - sums_from) + kMergeGapBytes) {
        const uint64_t base = add(r.shard, lo, hi - lo);
        r.blocks_at = base + (blocks_from - lo);
        r.sums_at = base + (sums_from - lo);
      } else {
        r.blocks_at = add(r.shard, blocks_from, blocks_to - blocks_from);
        r.sums_at = add(r.shard, sums_from, sums_to - sums_from);
      }
      r.tokens_at = r.blocks_at + (piece_at - blocks_from);
    } else if (ds.options.verify || (piece_at == record_at && piece_bytes == record_bytes)) {
      // Checked whole: a dataset without block sums, or a piece that is
      // its whole record.
      r.check = PieceRead::kRecord;
      r.staged_at = add(r.shard, record_at, record_bytes);
      r.record_bytes = record_bytes;
      r.tokens_at = r.staged_at + (piece_at - record_at);
    } else {
      r.tokens_at = add(r.shard, piece_at, piece_bytes);
    }
  }
  if (staging_.size() < staged) staging_.resize(staged);
  for (size_t i = 0; i < requests_.size(); ++i) {
    const uint64_t end = i + 1 < requests_.size() ? staged_at[i + 1] : staged;
    requests_[i].dst = std::span<std::byte>(staging_.data() + staged_at[i], end - staged_at[i]);
  }
  STOKER_RETURN_IF_ERROR(queue_->Submit(requests_));
  done_.clear();
  const Deadline deadline = Clock::now() + ds.options.read_timeout;
  while (done_.size() < requests_.size()) {
    auto n = queue_->Wait(requests_.size() - done_.size(), deadline, &done_);
    if (!n.ok()) {
      // Reads may still land in staging_: it is not touched again (the
      // queue, declared after it, goes first when the reader does).
      broken_ = n.status().WithContext("reading " + std::to_string(requests_.size()) +
                                       " token ranges of " + ds.store->uri());
      return broken_;
    }
  }
  Status first = Status::Ok();
  for (const ReadCompletion& c : done_) {
    const ReadRequest& q = requests_[c.tag];
    bytes_read_ += c.bytes;
    if (!first.ok()) continue;
    if (!c.status.ok()) {
      first = c.status.WithContext("reading shard " + q.key + " of " + ds.store->uri());
    } else if (c.bytes != q.dst.size()) {
      first = Corruption(ds.store->uri() + "/" + q.key + ": truncated: read " +
                         std::to_string(c.bytes) + " bytes at offset " + std::to_string(q.offset) +
                         ", expected " + std::to_string(q.dst.size()));
    }
  }
  STOKER_RETURN_IF_ERROR(first);
  std::byte* dst = out.data();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PieceRead& r = reads[i];
    if (r.check == PieceRead::kRecord) {
      Status st = ds.views[r.shard].CheckRecord(
          r.local, format::Hash64(std::span(staging_.data() + r.staged_at, r.record_bytes)));
      if (!st.ok()) return st.WithContext(ds.store->uri());
    } else if (r.check == PieceRead::kBlocks && r.end_block > r.first_block) {
      const uint64_t staged = std::min(r.end_block * B, r.field_bytes) - r.first_block * B;
      const int64_t bad = format::FirstBadBlock(
          std::span<const std::byte>(staging_.data() + r.blocks_at, staged),
          std::span<const std::byte>(staging_.data() + r.sums_at, 8 * (r.end_block - r.first_block)),
          uint32_t(B));
      if (bad >= 0) {
        const uint64_t b = r.first_block + uint64_t(bad);
        const uint64_t n = std::min(B, r.field_bytes - b * B);
        return Corruption(ds.store->uri() + ": shard " + ds.manifest.shards.key(r.shard) +
                          ", document " + std::to_string(pieces[i].doc) + " (sample " +
                          std::to_string(r.local) + " of the shard): block " + std::to_string(b) +
                          " of field '" + ds.field + "' (bytes " + std::to_string(b * B) + ".." +
                          std::to_string(b * B + n - 1) + " of " + std::to_string(r.field_bytes) +
                          "): checksum mismatch");
      }
    }
    const std::byte* src = staging_.data() + r.tokens_at;
    const uint32_t n = pieces[i].count;
    if (out_type == DType::kInt64) {
      if (ds.dtype == DType::kInt64) {
        std::memcpy(dst, src, size_t{n} * 8);
      } else {
        for (uint32_t t = 0; t < n; ++t) {
          const int64_t v = LoadToken(ds.dtype, src + size_t{t} * ds.token_bytes);
          std::memcpy(dst + size_t{t} * 8, &v, 8);
        }
      }
    } else {
      for (uint32_t t = 0; t < n; ++t) {
        const int64_t v = LoadToken(ds.dtype, src + size_t{t} * ds.token_bytes);
        if (v > std::numeric_limits<int32_t>::max() || v < std::numeric_limits<int32_t>::min()) {
          return OutOfRange(ds.store->uri() + ": document " + std::to_string(pieces[i].doc) +
                            " token " + std::to_string(pieces[i].begin + t) + " is " +
                            std::to_string(v) + ", which int32 cannot hold (deliver int64)");
        }
        const int32_t v32 = static_cast<int32_t>(v);
        std::memcpy(dst + size_t{t} * 4, &v32, 4);
      }
    }
    dst += size_t{n} * out_bytes;
  }
  return Status::Ok();
}

}  // namespace stoker
