// ImportMegatron: Megatron-LM indexed datasets (a .idx index and a .bin of
// raw tokens, the layout of megatron/core/datasets/indexed_dataset.py) into
// a DatasetWriter, one record per sequence, its tokens byte for byte.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "import/values.h"
#include "stoker/import.h"

namespace stoker {
namespace {

using format::DType;
using format::FieldSpec;
using format::FieldValue;

// A file mapped read-only, for the life of the import.
class MappedFile {
 public:
  ~MappedFile() {
    if (data_ != nullptr && size_ > 0) munmap(const_cast<std::byte*>(data_), size_);
  }
  Status Open(const std::string& path) {
    path_ = path;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      return ErrnoToStatus(e, path);
    }
    size_ = uint64_t(st.st_size);
    if (size_ > 0) {
      void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        return ErrnoToStatus(e, "mapping " + path);
      }
      data_ = static_cast<const std::byte*>(p);
      madvise(p, size_, MADV_SEQUENTIAL);
    }
    ::close(fd);
    return Status::Ok();
  }
  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

template <typename T>
T Get(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::string At(const std::string& file, uint64_t offset) {
  return file + ": offset " + std::to_string(offset) + ": ";
}

bool EndsWith(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

}  // namespace

Result<DType> MegatronDType(uint8_t code, std::string* name) {
  // megatron/core/datasets/indexed_dataset.py, DType: 1 uint8, 2 int8,
  // 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16.
  static constexpr const char* kNames[] = {"",      "uint8",   "int8",    "int16", "int32",
                                           "int64", "float64", "float32", "uint16"};
  if (code >= 1 && code <= 8) *name = kNames[code];
  switch (code) {
    case 1:
      return DType::kUInt8;
    case 4:
      return DType::kInt32;
    case 5:
      return DType::kInt64;
    case 7:
      return DType::kFloat32;
    case 8:
      return DType::kUInt16;
    case 2:
    case 3:
    case 6:
      return Unsupported("dtype code " + std::to_string(code) + " (" + *name +
                         ") has no stoker array dtype of the same bytes (uint8, uint16, uint32, "
                         "int32, int64, float32)");
    default:
      return InvalidArgument("dtype code " + std::to_string(code) + " is no Megatron dtype (1..8)");
  }
}

Result<MegatronIndex> ReadMegatronIndex(std::span<const std::byte> idx, const std::string& path) {
  MegatronIndex m;
  if (idx.size() < kMegatronHeaderBytes) {
    return InvalidArgument(At(path, idx.size()) + "truncated: the header needs " +
                           std::to_string(kMegatronHeaderBytes) + " bytes, the file has " +
                           std::to_string(idx.size()));
  }
  if (std::memcmp(idx.data(), kMegatronMagic, sizeof kMegatronMagic) != 0) {
    return InvalidArgument(At(path, 0) +
                           "magic is not MMIDIDX\\0\\0: not a Megatron indexed dataset index");
  }
  const uint64_t version = Get<uint64_t>(idx.data() + 9);
  if (version != 1) {
    return InvalidArgument(At(path, 9) + "version " + std::to_string(version) +
                           ", this importer reads version 1");
  }
  const uint8_t code = Get<uint8_t>(idx.data() + 17);
  std::string name;
  auto dtype = MegatronDType(code, &name);
  if (!dtype.ok()) return Status(dtype.status().code(), At(path, 17) + dtype.status().message());
  m.dtype = *dtype;
  m.dtype_code = code;
  m.sequences = Get<uint64_t>(idx.data() + 18);
  m.documents = Get<uint64_t>(idx.data() + 26);
  // 4 + 8 bytes per sequence, 8 per document index: refuse counts whose
  // arrays cannot fit before multiplying them.
  const uint64_t rest = idx.size() - kMegatronHeaderBytes;
  if (m.sequences > rest / 12 || m.documents > rest / 8 ||
      12 * m.sequences + 8 * m.documents != rest) {
    return InvalidArgument(
        At(path, 18) + "sequence count " + std::to_string(m.sequences) + " and document count " +
        std::to_string(m.documents) + " need " +
        (m.sequences > rest / 12 || m.documents > rest / 8
             ? std::string("more bytes than the file has")
             : std::to_string(kMegatronHeaderBytes + 12 * m.sequences + 8 * m.documents) +
                   " bytes") +
        "; the file has " + std::to_string(idx.size()));
  }
  m.lengths_offset = kMegatronHeaderBytes;
  m.pointers_offset = m.lengths_offset + 4 * m.sequences;
  m.documents_offset = m.pointers_offset + 8 * m.sequences;
  m.idx = idx;
  if (m.documents == 0) {
    return InvalidArgument(At(path, 26) + "document count 0: the document index starts with 0");
  }
  int64_t previous = 0;
  for (uint64_t d = 0; d < m.documents; ++d) {
    const int64_t v = m.DocumentIndex(d);
    if ((d == 0 && v != 0) || v < previous || uint64_t(v) > m.sequences ||
        (d + 1 == m.documents && uint64_t(v) != m.sequences)) {
      return InvalidArgument(
          At(path, m.documents_offset + 8 * d) + "document index " + std::to_string(d) + " is " +
          std::to_string(v) +
          " (document indices run from 0, non-decreasing, to the sequence count " +
          std::to_string(m.sequences) + ")");
    }
    previous = v;
  }
  return m;
}

int32_t MegatronIndex::Length(uint64_t i) const {
  return Get<int32_t>(idx.data() + lengths_offset + 4 * i);
}
int64_t MegatronIndex::Pointer(uint64_t i) const {
  return Get<int64_t>(idx.data() + pointers_offset + 8 * i);
}
int64_t MegatronIndex::DocumentIndex(uint64_t d) const {
  return Get<int64_t>(idx.data() + documents_offset + 8 * d);
}

Result<std::vector<std::string>> ListMegatron(std::span<const std::string> paths) {
  if (paths.empty()) return InvalidArgument("no Megatron dataset given");
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    std::string prefix = p;
    if (EndsWith(p, ".idx") || EndsWith(p, ".bin")) prefix = p.substr(0, p.size() - 4);
    for (const char* ext : {".idx", ".bin"}) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(prefix + ext, ec)) {
        return NotFound(prefix + ext +
                        ": no such file (a Megatron dataset is PREFIX.bin and "
                        "PREFIX.idx)");
      }
    }
    out.push_back(prefix);
  }
  return out;
}

bool LooksLikeMegatron(std::span<const std::string> paths) {
  if (paths.empty()) return false;
  for (const std::string& p : paths) {
    if (!EndsWith(p, ".idx") && !EndsWith(p, ".bin")) return false;
  }
  return true;
}

Result<ImportResult> ImportMegatron(std::span<const std::string> paths, std::string_view dst_uri,
                                    const ImportOptions& options) {
  STOKER_ASSIGN_OR_RETURN(std::vector<std::string> prefixes, ListMegatron(paths));
  struct Source {
    MappedFile idx, bin;
    MegatronIndex index;
  };
  std::vector<std::unique_ptr<Source>> sources;
  ImportResult result;
  bool several_per_document = false;
  DType dtype = DType::kUInt16;
  for (const std::string& prefix : prefixes) {
    auto s = std::make_unique<Source>();
    STOKER_RETURN_IF_ERROR(s->idx.Open(prefix + ".idx"));
    STOKER_RETURN_IF_ERROR(s->bin.Open(prefix + ".bin"));
    STOKER_ASSIGN_OR_RETURN(
        s->index, ReadMegatronIndex(std::span(s->idx.data(), s->idx.size()), s->idx.path()));
    const MegatronIndex& m = s->index;
    if (!sources.empty() && m.dtype != dtype) {
      return InvalidArgument(s->idx.path() + ": dtype code " + std::to_string(m.dtype_code) +
                             " differs from " + sources[0]->idx.path() + "'s (" +
                             std::to_string(sources[0]->index.dtype_code) +
                             "): one dataset has one token dtype");
    }
    dtype = m.dtype;
    // Each sequence within the .bin, and the sizes adding up to it.
    const uint64_t eb = format::DTypeBytes(m.dtype);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < m.sequences; ++i) {
      const int32_t len = m.Length(i);
      const int64_t ptr = m.Pointer(i);
      if (len < 0 || ptr < 0 || uint64_t(ptr) + uint64_t(len) * eb > s->bin.size()) {
        return InvalidArgument(At(s->idx.path(), m.lengths_offset + 4 * i) + "sequence " +
                               std::to_string(i) + " (length " + std::to_string(len) +
                               ", pointer " + std::to_string(ptr) + ") lies outside " +
                               s->bin.path() + " (" + std::to_string(s->bin.size()) + " bytes)");
      }
      sum += uint64_t(len) * eb;
    }
    if (sum != s->bin.size()) {
      return InvalidArgument(s->idx.path() + ": the sequence lengths add up to " +
                             std::to_string(sum) + " bytes of tokens, " + s->bin.path() + " has " +
                             std::to_string(s->bin.size()));
    }
    several_per_document = several_per_document || m.documents - 1 != m.sequences;
    result.source_bytes += s->idx.size() + s->bin.size();
    result.sources.push_back(s->idx.path());
    result.sources.push_back(s->bin.path());
    sources.push_back(std::move(s));
  }
  // The schema: the tokens, and (only where a document holds more than one
  // sequence) each sequence's document number, so the boundaries are kept.
  std::string field_name(kMegatronTokenField);
  if (!options.fields.empty()) {
    if (options.fields.size() != 1 || options.fields[0].type != format::FieldType::kArray ||
        options.fields[0].dtype != dtype) {
      return InvalidArgument("--field for a Megatron import names the token field: NAME:" +
                             std::string(format::DTypeName(dtype)) +
                             "[*] (the .idx's dtype; tokens are imported byte for byte)");
    }
    field_name = options.fields[0].name;
  }
  STOKER_ASSIGN_OR_RETURN(
      FieldSpec tokens,
      format::ParseFieldSpec(field_name, std::string(format::DTypeName(dtype)) + "[*]"));
  std::vector<FieldSpec> fields{tokens};
  if (several_per_document) {
    FieldSpec document;
    document.name = kMegatronDocumentField;
    document.type = format::FieldType::kInt64;
    fields.push_back(document);
  }
  WriterOptions wo = options.writer;
  if (wo.created_by.empty()) wo.created_by = import::CreatedBy("megatron");
  STOKER_ASSIGN_OR_RETURN(auto writer, DatasetWriter::Create(dst_uri, fields, wo));
  ImportProgress progress;
  progress.bytes_total = result.source_bytes;
  uint64_t next_report = 0;
  int64_t document_base = 0;
  FieldValue values[2];
  for (const auto& s : sources) {
    const MegatronIndex& m = s->index;
    const uint64_t eb = format::DTypeBytes(m.dtype);
    uint64_t d = 0;  // the document of sequence i: DocumentIndex(d) <= i < DocumentIndex(d + 1)
    for (uint64_t i = 0; i < m.sequences; ++i) {
      while (uint64_t(m.DocumentIndex(d + 1)) <= i) ++d;
      const uint64_t bytes = uint64_t(m.Length(i)) * eb;
      values[0].bytes = std::span(s->bin.data() + m.Pointer(i), bytes);
      values[1].i64 = document_base + int64_t(d);
      Status st = writer->Write(std::span(values, fields.size()));
      if (!st.ok()) return st.WithContext(s->idx.path() + ": sequence " + std::to_string(i));
      progress.bytes_read += bytes;
      if (progress.bytes_read >= next_report) {
        next_report = progress.bytes_read + (16u << 20);
        progress.samples = writer->records();
        if (options.progress) options.progress(progress);
        STOKER_RETURN_IF_ERROR(import::CheckCancelled(
            options.cancelled, "Megatron import of " + s->idx.path(), progress));
      }
    }
    progress.bytes_read += s->idx.size();
    document_base += int64_t(m.documents - 1);
  }
  STOKER_RETURN_IF_ERROR(import::Finish(*writer, options.progress, &progress, &result));
  return result;
}

}  // namespace stoker
