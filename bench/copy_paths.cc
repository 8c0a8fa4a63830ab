// How many times does a record cross host memory on its way into a batch?
// Issue 16's question for read_unit "map" (docs/benchmarks.md, "Into HBM").
//
//   copy_paths_probe DIR [--record-kib 128] [--rounds 3] [--max-mib 1024]
//
// 1. Stores into memory not in cache, one thread, 1 GiB: rep movsb (what
//    the kernel's copy of a pread uses on a CPU with fast strings), plain
//    vector stores (memcpy), streaming stores (StreamCopy). A kind that
//    reads each line in before writing it (read for ownership) moves twice
//    the bytes and runs at about half the speed of one that does not.
// 2. Does the checksum after a pread read the record from cache? XXH3 of
//    the record just preaded, against the same on a record flushed from
//    cache and one hashed just before.
// 3. The record paths on the files under DIR (a data set's shards, hot in
//    the page cache), GB/s on one thread: pread into the batch + XXH3
//    ("sample"), and each file mapped, XXH3 in place + StreamCopy into the
//    batch ("map"), mapped and unmapped one after another as the loader
//    does. Records are --record-kib pieces of each file; files up to
//    --max-mib in all.
//
// Built with the rest (CMake target copy_paths_probe); not installed.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/stream_copy.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

void RepMovsb(std::byte* d, const std::byte* s, size_t n) {
#if defined(__x86_64__)
  asm volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
#else
  std::memcpy(d, s, n);
#endif
}

void Memcpy(std::byte* d, const std::byte* s, size_t n) { std::memcpy(d, s, n); }

void Stream(std::byte* d, const std::byte* s, size_t n) {
  stoker::StreamCopy(d, s, n);
  stoker::StreamFence();
}

void Flush(const std::byte* p, size_t n) {
#if defined(__x86_64__)
  for (size_t o = 0; o < n; o += 64) _mm_clflush(p + o);
  _mm_mfence();
#else
  (void)p;
  (void)n;
#endif
}

std::byte* Fresh(size_t n) {
  auto* p = static_cast<std::byte*>(std::aligned_alloc(4096, n));
  if (p == nullptr) {
    std::perror("aligned_alloc");
    std::exit(1);
  }
  std::memset(p, 1, n);  // faulted in, so that no timing pays for it
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [--record-kib N] [--rounds N] [--max-mib N]\n", argv[0]);
    return 2;
  }
  size_t record = 128 << 10;
  int rounds = 3;
  size_t max_bytes = 1ull << 30;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--record-kib") {
      record = std::strtoul(argv[i + 1], nullptr, 10) << 10;
    } else if (flag == "--rounds") {
      rounds = std::atoi(argv[i + 1]);
    } else if (flag == "--max-mib") {
      max_bytes = std::strtoull(argv[i + 1], nullptr, 10) << 20;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  struct File {
    int fd;
    size_t size;  // whole records
  };
  std::vector<File> files;
  size_t total = 0;
  const std::filesystem::path root = argv[1];
  std::vector<std::filesystem::path> paths;
  if (std::filesystem::is_directory(root)) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
      if (e.is_regular_file()) paths.push_back(e.path());
    }
  } else {
    paths.push_back(root);
  }
  for (const auto& p : paths) {
    if (total >= max_bytes) break;
    const size_t size = std::filesystem::file_size(p) / record * record;
    if (size == 0) continue;
    const int fd = open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      std::perror(p.c_str());
      return 1;
    }
    files.push_back({fd, size});
    total += size;
  }
  if (files.empty() || record == 0) {
    std::fprintf(stderr, "%s: no file of a record (%zu KiB) or more\n", argv[1], record >> 10);
    return 1;
  }
  constexpr size_t kDst = 1ull << 30;  // a rotating batch, far larger than the caches
  std::byte* dst = Fresh(kDst);
  std::byte* src = Fresh(record);
  size_t slot = 0;
  auto next = [&] {
    if (slot + record > kDst) slot = 0;
    std::byte* d = dst + slot;
    slot += record;
    return d;
  };
  uint64_t sink = 0;
  const double gb = double(total) / 1e9;
  for (int r = 0; r < rounds; ++r) {
    std::printf("round %d, records of %zu KiB\n", r + 1, record >> 10);
    // 1. Store kinds.
    struct Kind {
      const char* name;
      void (*copy)(std::byte*, const std::byte*, size_t);
    };
    for (const Kind& k :
         {Kind{"rep movsb", RepMovsb}, Kind{"memcpy", Memcpy}, Kind{"streaming stores", Stream}}) {
      const auto t = Clock::now();
      for (size_t o = 0; o + record <= kDst; o += record) k.copy(dst + o, src, record);
      std::printf("  stores into memory not in cache, %-16s %6.1f GB/s\n", k.name,
                  double(kDst) / Seconds(t) / 1e9);
    }
    // 2. The checksum after a pread.
    double after_pread = 0, flushed = 0, hot = 0;
    for (const File& f : files) {
      for (size_t o = 0; o < f.size; o += record) {
        std::byte* d = next();
        if (pread(f.fd, d, record, off_t(o)) != ssize_t(record)) std::abort();
        auto t = Clock::now();
        sink += XXH3_64bits(d, record);
        after_pread += Seconds(t);
        Flush(d, record);
        t = Clock::now();
        sink += XXH3_64bits(d, record);
        flushed += Seconds(t);
        t = Clock::now();
        sink += XXH3_64bits(d, record);
        hot += Seconds(t);
      }
    }
    std::printf("  XXH3 of the record just preaded %6.1f GB/s, flushed %6.1f, hot %6.1f\n",
                gb / after_pread, gb / flushed, gb / hot);
    // 3. The record paths.
    auto t = Clock::now();
    for (const File& f : files) {
      for (size_t o = 0; o < f.size; o += record) {
        std::byte* d = next();
        if (pread(f.fd, d, record, off_t(o)) != ssize_t(record)) std::abort();
        sink += XXH3_64bits(d, record);
      }
    }
    const double sample = Seconds(t);
    t = Clock::now();
    for (const File& f : files) {
      void* m = mmap(nullptr, f.size, PROT_READ, MAP_SHARED, f.fd, 0);
      if (m == MAP_FAILED) {
        std::perror("mmap");
        return 1;
      }
      const auto* base = static_cast<const std::byte*>(m);
      for (size_t o = 0; o < f.size; o += record) {
        sink += XXH3_64bits(base + o, record);
        stoker::StreamCopy(next(), base + o, record);
      }
      stoker::StreamFence();
      munmap(m, f.size);
    }
    const double mapped = Seconds(t);
    std::printf(
        "  pread + XXH3 (sample) %6.2f GB/s; map + XXH3 + streaming copy (map) %6.2f GB/s"
        " (%.2fx)\n",
        gb / sample, gb / mapped, sample / mapped);
  }
  std::free(dst);
  std::free(src);
  for (const File& f : files) close(f.fd);
  return sink == 42 ? 3 : 0;
}
