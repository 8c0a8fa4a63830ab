// Token datasets: documents of token ids (a record's array field of an
// integer dtype and variable length, `tokens: uint16[*]`), cut into
// fixed-length windows of L + 1 tokens that run across document boundaries,
// as Megatron-LM's GPTDataset cuts its samples (docs/architecture.md,
// "Token windows").
//
// The window index is computed when the dataset opens, from the shard table
// and the shards' indexes (each record's field lengths give its document's
// token count): no index file is written, so none can go stale, and every
// rank computes the same index by itself, with no rank-0 barrier.
//
//   TokenDataset: the documents (count, token counts, where each lies) and
//                 reads of token ranges into int64 / int32 rows, each range
//                 being only the bytes a window needs (or, checked, the
//                 blocks that hold them and their checksums).
//   TokenWindows: one epoch's index over the documents' token counts: the
//                 documents in dataset order (shuffle off) or in an order
//                 that is a pure function of (dataset, seed, epoch), their
//                 tokens concatenated, window k being tokens [kL, kL + L + 1)
//                 of that concatenation; with shuffle on, the windows are
//                 also visited in a permuted order.
//
// Thread safety: TokenWindows is immutable once built; share it freely.
// TokenDataset's const methods may be called from many threads at once;
// each thread reads through a TokenReader of its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/format.h"
#include "stoker/plan.h"
#include "stoker/status.h"
#include "stoker/store.h"

namespace stoker {

// The field a token dataset's documents are in unless named: "tokens" (what
// `stoker pack --tokens` and the Megatron importer write).
inline constexpr std::string_view kTokenField = "tokens";

// One stretch of one document's tokens: tokens [begin, begin + count) of
// document `doc` (its dataset-order number).
struct TokenPiece {
  uint64_t doc = 0;
  uint64_t begin = 0;
  uint32_t count = 0;
};

// One epoch's window index. Memory: 8 bytes per block of documents (the
// prefix sums of the blocks' token counts in the epoch's order; a block is
// one document up to 2^24 documents, see Build); nothing per window.
class TokenWindows {
 public:
  // Up to this many documents, every document is its own block: the epoch's
  // document order is one permutation of all of them.
  static constexpr uint64_t kFullShuffleDocuments = uint64_t{1} << 24;
  // Documents a block holds for a dataset of `documents`: 1 up to
  // kFullShuffleDocuments, else the power of two that keeps the blocks at
  // most kFullShuffleDocuments (64 at 10^9 documents, 1,024 at 10^10).
  static uint32_t DocumentsPerBlock(uint64_t documents);

  TokenWindows() = default;
  // `doc_tokens[d]`: document d's token count; with more than
  // kFullShuffleDocuments documents and shuffle on it must outlive the
  // windows (a TokenDataset's doc_tokens(), which its loader holds).
  // `sequence_length` L >= 1. Shuffle off: documents in dataset order,
  // windows in order. Shuffle on: the documents form blocks of B =
  // `documents_per_block` (0: DocumentsPerBlock(documents)) consecutive
  // ones (the last possibly shorter); the blocks are in the order of
  // Permutation(blocks, MixSeed(dataset, seed, epoch, 1)) and each block's
  // documents in the order of Permutation(its size, MixSeed(that key,
  // block)); with B = 1 that is one permutation of all documents. The
  // windows are visited in the order of Permutation(windows, MixSeed(dataset,
  // seed, epoch, 2)). There are floor((T - 1) / L) windows of T tokens (none
  // when T <= L): the last (T - 1) mod L tokens of the epoch's concatenation
  // are in no window of that epoch (with shuffle on, other documents end
  // the next one). Cost: one pass over the counts plus one evaluation of the
  // permutation per block, split over the machine's cores.
  static TokenWindows Build(std::span<const uint32_t> doc_tokens, uint32_t sequence_length,
                            uint64_t dataset_id, bool shuffle, uint64_t seed, uint64_t epoch,
                            uint32_t documents_per_block = 0);

  uint64_t size() const { return windows_; }
  uint64_t total_tokens() const { return prefix_.empty() ? 0 : prefix_.back(); }
  uint64_t documents() const { return documents_; }
  uint32_t sequence_length() const { return length_; }
  uint32_t documents_per_block() const { return block_; }
  // The window at position p of the epoch's visiting order (p < size()).
  uint64_t WindowAt(uint64_t p) const { return shuffle_ ? window_order_(p) : p; }
  // The document at index j of the epoch's document order (j < documents()).
  uint64_t DocAt(uint64_t j) const;
  // Appends window k's pieces (k < size()), in token order: L + 1 tokens in
  // all, the first and last possibly parts of documents. O(log blocks +
  // documents per block + pieces).
  void Pieces(uint64_t k, std::vector<TokenPiece>* out) const;

 private:
  // The block at index q of the epoch's order, and its documents.
  uint64_t BlockAt(uint64_t q) const { return shuffle_ ? block_order_(q) : q; }
  uint64_t BlockSize(uint64_t b) const;
  // The document at index r of block b's order.
  uint64_t DocOfBlock(uint64_t b, uint64_t r) const;

  std::vector<uint64_t> prefix_;  // blocks + 1: tokens before the q-th block of the order
  std::span<const uint32_t> doc_tokens_;  // only where block_ > 1
  uint64_t documents_ = 0;
  uint64_t blocks_ = 0;
  uint64_t short_at_ = 0;  // the index in the order of the last block (the short one)
  uint64_t windows_ = 0;
  uint64_t block_key_ = 0;
  uint32_t length_ = 0;
  uint32_t block_ = 1;
  bool shuffle_ = false;
  Permutation block_order_{0, 0};
  Permutation window_order_{0, 0};
};

struct TokenDatasetOptions {
  // The token field. Default: "" = "tokens", else the schema's only array
  // field of an integer dtype and shape [*].
  std::string field;
  // Default: on: every token delivered is checked first. Where the token
  // field has block checksums (docs/format.md §3.5) a piece is read as the
  // blocks it touches and their checksums, each block checked; in a
  // dataset without them (packed before §3.5) as the whole record that
  // holds it, checked against the record's checksum (§3.3), which reads
  // whole documents where a window holds only part of one. Off: only the
  // pieces' own bytes are read (nothing more than the tokens delivered)
  // and a record is checked only when a piece covers all of it.
  bool verify = true;
  // Index reads in flight at open, and a TokenReader's. Default: 32.
  uint32_t reads_in_flight = 32;
  // Deadline of one batch of reads (the indexes at open, a Read's pieces):
  // past it the read fails with TimedOut naming the dataset, so a dead
  // cluster is an error, not a hang. Default: 60 s (LoaderOptions::read_timeout).
  std::chrono::milliseconds read_timeout{60000};
};

class TokenReader;

class TokenDataset {
 public:
  // Reads every shard's index (the shards' headers and index ranges, never
  // their records) and takes each document's token count and place. Errors:
  // InvalidArgument naming the field when it is missing or not an integer
  // array of shape [*]; the shard reader's errors naming the shard;
  // Corruption naming the shard, the sample and the field for a record
  // whose block checksums (docs/format.md §3.5) do not number one per
  // block of its tokens.
  static Result<std::unique_ptr<TokenDataset>> Open(std::shared_ptr<Store> store,
                                                    format::Manifest manifest,
                                                    const TokenDatasetOptions& options);
  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  const format::Manifest& manifest() const;
  Store& store() const;
  uint64_t documents() const;
  uint64_t total_tokens() const;
  // Document d's token count, d < documents().
  std::span<const uint32_t> doc_tokens() const;
  format::DType dtype() const;
  const std::string& field() const;
  // Bytes of the shards' headers and indexes read at open.
  uint64_t index_bytes_read() const;
  // A reader for one thread.
  Result<std::unique_ptr<TokenReader>> NewReader() const;

  struct Impl;

 private:
  explicit TokenDataset(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class TokenReader;
};

// Reads pieces of a TokenDataset's documents. Not thread-safe (one per
// thread); it must not outlive its dataset.
class TokenReader {
 public:
  ~TokenReader();
  // Reads `pieces` and writes their tokens one after another into `out`
  // (which holds exactly their total count), widened to int64 or narrowed
  // to int32 (kInt64 or kInt32; a token above 2^31 - 1 into int32 is
  // OutOfRange naming the document). All reads are submitted at once.
  // Corruption naming the dataset, the shard, the document and the block
  // for a token block that fails its checksum (the shard and sample for a
  // record, without block checksums); the store's errors naming the shard.
  Status Read(std::span<const TokenPiece> pieces, format::DType out_type, std::span<std::byte> out);
  // Bytes this reader has read from the store.
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  friend class TokenDataset;
  TokenReader(const TokenDataset::Impl* ds, std::unique_ptr<ReadQueue> queue);
  const TokenDataset::Impl* ds_;
  std::vector<ReadRequest> requests_;
  std::vector<ReadCompletion> done_;
  std::vector<std::byte> staging_;
  // After staging_: destroyed first, so no read lands in freed memory.
  std::unique_ptr<ReadQueue> queue_;
  Status broken_;  // a timed-out Read: reads may still be landing in staging_
  uint64_t bytes_read_ = 0;
};

}  // namespace stoker
