// A probe for issue 16's last target (40 GB/s into HBM): can the DMA read
// records straight from the page cache, one host-memory crossing fewer per
// byte than the loader's path, and what does registering the page cache
// cost? Not part of stoker; built with the CUDA build (pagecache_dma_probe)
// and run on the GPU machine by `scripts/gpu/loader.sh` (step "dma").
//
// The files under DIR (hot in the page cache) are cut into records of
// --record-kib; records are visited in a shuffled order, --batch-mib of them
// to a batch, by --threads workers claiming chunks of 8 records. Three
// paths, each a whole pass over the files per round, the paths taking turns
// round by round, GB/s into HBM, medians:
//
//   copy:        the loader's read_unit "sample". pread each record into its
//                slot of a pinned batch, XXH3 over the slot; the batch's
//                last chunk starts its H2D copy (one per batch) on a stream.
//                Crossings per byte: page cache read, pinned write (which
//                the kernel's rep movsb reads in first), DMA read.
//   mapped:      the loader's read_unit "map". Every file mapped read-only;
//                XXH3 over the mapped record, then a copy with streaming
//                stores into its slot of the pinned batch; one H2D a batch.
//                Crossings per byte: page cache read, pinned write, DMA read.
//   registered:  every file mapped read-only and registered with CUDA once
//                (cudaHostRegisterReadOnly); XXH3 over the mapped record,
//                then one cudaMemcpyAsync per record from the mapping into
//                its slot of the device batch, on the worker's own stream.
//                Crossings per byte: the checksum's read, the DMA's read.
//
// It also reports what registering costs: all the files once (kept for every
// round), and register + unregister per file (what a path that cannot keep
// the page cache pinned would pay per shard).
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/stream_copy.h"

namespace {

using Clock = std::chrono::steady_clock;

#define CHECK_CUDA(call)                                                                          \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

struct Options {
  std::string dir;
  unsigned threads = std::thread::hardware_concurrency();
  size_t record = 128 << 10;
  size_t batch = 32 << 20;
  int rounds = 3;
  std::string modes = "copy,mapped,registered";
};

struct File {
  std::string path;
  int fd = -1;
  size_t size = 0;
  const std::byte* map = nullptr;    // registered
  const std::byte* plain = nullptr;  // mapped, not registered
};

enum class Path { kCopy, kMapped, kRegistered };

struct Record {
  uint32_t file;
  uint64_t offset;
};

constexpr uint32_t kChunk = 8;  // records a worker claims at once
constexpr int kRing = 8;        // batches in flight

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Records a batch holds: whole chunks, so that no chunk straddles two.
size_t RecordsPerBatch(const Options& o) { return o.batch / o.record / kChunk * kChunk; }

// One pass over `records` into device batches along `path`; returns seconds.
double Pass(const Options& o, const std::vector<File>& files, const std::vector<Record>& records,
            Path path, std::vector<std::byte*>& pinned, std::vector<std::byte*>& device,
            std::atomic<uint64_t>* sink) {
  const bool registered = path == Path::kRegistered;
  const size_t per_batch = RecordsPerBatch(o);
  const size_t chunks_per_batch = (per_batch + kChunk - 1) / kChunk;
  const size_t chunks = (records.size() + kChunk - 1) / kChunk;
  // A batch slot of the ring may be reused once the batch kRing before it has
  // landed: its events (one per chunk on the registered path, one per batch
  // on the copy path) are waited for by the first worker to claim into it.
  struct Slot {
    std::mutex mu;
    uint64_t batch = UINT64_MAX;  // the batch now using the slot
    std::vector<cudaEvent_t> pending;
    std::atomic<uint32_t> left{0};
  };
  std::vector<Slot> slots(kRing);
  std::vector<cudaEvent_t> free_events;
  std::mutex events_mu;
  auto take_event = [&] {
    std::lock_guard l(events_mu);
    cudaEvent_t e;
    if (free_events.empty()) {
      CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    } else {
      e = free_events.back();
      free_events.pop_back();
    }
    return e;
  };
  auto give_events = [&](std::vector<cudaEvent_t>& es) {
    std::lock_guard l(events_mu);
    free_events.insert(free_events.end(), es.begin(), es.end());
    es.clear();
  };
  std::atomic<uint64_t> next{0};
  cudaStream_t batch_stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&batch_stream, cudaStreamNonBlocking));
  // Enter slot for batch b: the first claimer of b waits out the batch that
  // used the slot before (kRing earlier) and takes it over.
  auto enter = [&](uint64_t b) -> Slot& {
    Slot& s = slots[b % kRing];
    while (true) {
      std::unique_lock l(s.mu);
      if (s.batch == b) return s;
      if (s.batch == UINT64_MAX || s.batch + kRing == b) {
        if (s.batch != UINT64_MAX && s.left.load() != 0) {  // the old batch is not built yet
          l.unlock();
          std::this_thread::yield();
          continue;
        }
        for (cudaEvent_t e : s.pending) CHECK_CUDA(cudaEventSynchronize(e));
        give_events(s.pending);
        s.batch = b;
        const size_t first = b * per_batch;
        s.left =
            uint32_t(std::min(chunks_per_batch, (records.size() - first + kChunk - 1) / kChunk));
        return s;
      }
      l.unlock();
      std::this_thread::yield();  // an older batch still holds the slot
    }
  };
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < o.threads; ++t) {
    workers.emplace_back([&] {
      CHECK_CUDA(cudaSetDevice(0));
      cudaStream_t stream;
      CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      uint64_t acc = 0;
      while (true) {
        const uint64_t c = next.fetch_add(1);
        if (c >= chunks) break;
        const size_t r0 = c * kChunk, r1 = std::min(records.size(), r0 + kChunk);
        const uint64_t b = r0 / per_batch;
        Slot& s = enter(b);
        std::byte* host = pinned[b % kRing];
        std::byte* dev = device[b % kRing];
        for (size_t r = r0; r < r1; ++r) {
          const Record& rec = records[r];
          const size_t at = (r - b * per_batch) * o.record;
          if (registered) {
            const std::byte* src = files[rec.file].map + rec.offset;
            acc += XXH3_64bits(src, o.record);
            CHECK_CUDA(cudaMemcpyAsync(dev + at, src, o.record, cudaMemcpyHostToDevice, stream));
          } else if (path == Path::kMapped) {
            const std::byte* src = files[rec.file].plain + rec.offset;
            acc += XXH3_64bits(src, o.record);
            stoker::StreamCopy(host + at, src, o.record);
          } else {
            if (pread(files[rec.file].fd, host + at, o.record, off_t(rec.offset)) !=
                ssize_t(o.record)) {
              std::perror(files[rec.file].path.c_str());
              std::exit(1);
            }
            acc += XXH3_64bits(host + at, o.record);
          }
        }
        if (path == Path::kMapped) stoker::StreamFence();
        cudaEvent_t e = nullptr;
        if (registered) {
          e = take_event();
          CHECK_CUDA(cudaEventRecord(e, stream));
        }
        std::lock_guard l(s.mu);
        if (e) s.pending.push_back(e);
        if (--s.left == 0 && !registered) {  // the batch is built: one copy
          const size_t first = b * per_batch;
          const size_t n = std::min(per_batch, records.size() - first) * o.record;
          CHECK_CUDA(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, batch_stream));
          cudaEvent_t be = take_event();
          CHECK_CUDA(cudaEventRecord(be, batch_stream));
          s.pending.push_back(be);
        }
      }
      CHECK_CUDA(cudaStreamSynchronize(stream));
      CHECK_CUDA(cudaStreamDestroy(stream));
      sink->fetch_add(acc);
    });
  }
  for (auto& w : workers) w.join();
  for (auto& s : slots) {
    for (cudaEvent_t e : s.pending) CHECK_CUDA(cudaEventSynchronize(e));
    give_events(s.pending);
  }
  CHECK_CUDA(cudaStreamSynchronize(batch_stream));
  const double secs = Seconds(Clock::now() - start);
  CHECK_CUDA(cudaStreamDestroy(batch_stream));
  for (cudaEvent_t e : free_events) CHECK_CUDA(cudaEventDestroy(e));
  return secs;
}

enum class Way { kReadOnly, kWritable };

const char* WayName(Way way) { return way == Way::kReadOnly ? "read-only" : "writable shared"; }

// Maps `f` and registers the mapping with CUDA; f.map is set on success.
cudaError_t Register(File& f, Way way, bool populate) {
  int fd = f.fd;
  if (way == Way::kWritable) {
    fd = open(f.path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      std::perror(f.path.c_str());
      return cudaErrorInvalidValue;
    }
  }
  const int prot = way == Way::kReadOnly ? PROT_READ : PROT_READ | PROT_WRITE;
  void* m = mmap(nullptr, f.size, prot, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  if (fd != f.fd) close(fd);
  if (m == MAP_FAILED) {
    std::perror(f.path.c_str());
    return cudaErrorInvalidValue;
  }
  const cudaError_t e = cudaHostRegister(
      m, f.size, way == Way::kReadOnly ? cudaHostRegisterReadOnly : cudaHostRegisterDefault);
  if (e != cudaSuccess) {
    munmap(m, f.size);
    return e;
  }
  f.map = static_cast<const std::byte*>(m);
  return cudaSuccess;
}

void Unregister(File& f) {
  if (!f.map) return;
  void* m = const_cast<std::byte*>(f.map);
  (void)cudaHostUnregister(m);
  munmap(m, f.size);
  f.map = nullptr;
}

// After a pass: each ring slot's device batch holds the records of the last
// batch that used it, byte for byte (read back and compared with the files).
bool CheckLastBatches(const Options& o, const std::vector<File>& files,
                      const std::vector<Record>& records, const std::vector<std::byte*>& device) {
  const size_t per_batch = RecordsPerBatch(o);
  const size_t batches = (records.size() + per_batch - 1) / per_batch;
  std::vector<std::byte> got(o.batch), want(o.record);
  for (size_t b = batches > kRing ? batches - kRing : 0; b < batches; ++b) {
    const size_t first = b * per_batch, n = std::min(per_batch, records.size() - first);
    CHECK_CUDA(cudaMemcpy(got.data(), device[b % kRing], n * o.record, cudaMemcpyDeviceToHost));
    for (size_t k = 0; k < n; ++k) {
      const Record& rec = records[first + k];
      if (pread(files[rec.file].fd, want.data(), o.record, off_t(rec.offset)) !=
              ssize_t(o.record) ||
          std::memcmp(got.data() + k * o.record, want.data(), o.record) != 0) {
        std::fprintf(stderr, "batch %zu record %zu (%s at %llu): wrong bytes on the device\n", b, k,
                     files[rec.file].path.c_str(), static_cast<unsigned long long>(rec.offset));
        return false;
      }
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads")
      o.threads = unsigned(std::stoul(value()));
    else if (a == "--record-kib")
      o.record = std::stoul(value()) << 10;
    else if (a == "--batch-mib")
      o.batch = std::stoul(value()) << 20;
    else if (a == "--rounds")
      o.rounds = std::stoi(value());
    else if (a == "--modes")
      o.modes = value();
    else if (!a.empty() && a[0] != '-' && o.dir.empty())
      o.dir = a;
    else {
      std::fprintf(stderr,
                   "usage: %s DIR [--threads N] [--record-kib K] [--batch-mib M] [--rounds R] "
                   "[--modes copy,mapped,registered]\n",
                   argv[0]);
      return 2;
    }
  }
  if (o.dir.empty() || o.threads == 0 || o.record == 0 || o.batch < kChunk * o.record) {
    std::fprintf(stderr, "need DIR, threads > 0, and a batch of at least %u records\n", kChunk);
    return 2;
  }
  std::vector<File> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(o.dir)) {
    if (!e.is_regular_file() || e.file_size() < o.record) continue;
    File f;
    f.path = e.path();
    f.size = e.file_size();
    f.fd = open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) {
      std::perror(f.path.c_str());
      return 1;
    }
    files.push_back(std::move(f));
  }
  std::vector<Record> records;
  uint64_t bytes_total = 0;
  for (uint32_t i = 0; i < files.size(); ++i) {
    for (uint64_t off = 0; off + o.record <= files[i].size; off += o.record) {
      records.push_back({i, off});
      bytes_total += o.record;
    }
  }
  if (records.empty()) {
    std::fprintf(stderr, "%s: no file of %zu bytes or more\n", o.dir.c_str(), o.record);
    return 1;
  }
  std::shuffle(records.begin(), records.end(), std::mt19937_64(7));
  // Hot: every file read once.
  {
    std::vector<std::byte> buf(4 << 20);
    for (const File& f : files) {
      for (off_t off = 0; pread(f.fd, buf.data(), buf.size(), off) > 0; off += off_t(buf.size())) {
      }
    }
  }
  CHECK_CUDA(cudaSetDevice(0));
  std::vector<std::byte*> pinned(kRing), device(kRing);
  for (int i = 0; i < kRing; ++i) {
    CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&pinned[i]), o.batch, cudaHostAllocDefault));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&device[i]), o.batch));
    std::memset(pinned[i], 0, o.batch);
  }
  std::printf("%zu files, %zu records of %zu KiB (%.2f GiB), batches of %zu MiB, %u threads\n",
              files.size(), records.size(), o.record >> 10, double(bytes_total) / (1 << 30),
              o.batch >> 20, o.threads);
  std::atomic<uint64_t> sink{0};
  const bool want_copy = o.modes.find("copy") != std::string::npos;
  const bool want_mapped = o.modes.find("mapped") != std::string::npos;
  const bool want_registered = o.modes.find("registered") != std::string::npos;
  if (want_mapped) {
    for (File& f : files) {
      void* m = mmap(nullptr, f.size, PROT_READ, MAP_SHARED, f.fd, 0);
      if (m == MAP_FAILED) {
        std::perror(f.path.c_str());
        return 1;
      }
      f.plain = static_cast<const std::byte*>(m);
    }
  }
  bool registered_ok = false;
  if (want_registered) {
    int ro_supported = 0;
    (void)cudaDeviceGetAttribute(&ro_supported, cudaDevAttrHostRegisterReadOnlySupported, 0);
    std::printf("cudaDevAttrHostRegisterReadOnlySupported: %d\n", ro_supported);
    // The ways to register a file's pages, tried in order: read-only (the
    // flag, where the device supports it), then a writable shared mapping
    // (the driver pins for writing; kernels from 6.5 refuse that for most
    // file systems' page cache, not for tmpfs).
    for (Way way : {Way::kReadOnly, Way::kWritable}) {
      if (way == Way::kReadOnly && !ro_supported) continue;
      // Register + unregister one file at a time: the per-shard cost.
      double per_file = 0;
      const size_t sample = std::min<size_t>(files.size(), 64);
      cudaError_t e = cudaSuccess;
      for (size_t i = 0; i < sample && e == cudaSuccess; ++i) {
        const auto t0 = Clock::now();
        e = Register(files[i], way, false);
        if (e == cudaSuccess) Unregister(files[i]);
        per_file += Seconds(Clock::now() - t0);
      }
      if (e != cudaSuccess) {
        std::printf("registering %s mappings failed: %s\n", WayName(way), cudaGetErrorString(e));
        (void)cudaGetLastError();
        continue;
      }
      std::printf(
          "%s mappings: map + register + unregister one file: %.1f us per MiB (%zu files)\n",
          WayName(way), 1e6 * per_file / double(sample) / (double(files[0].size) / (1 << 20)),
          sample);
      const auto t0 = Clock::now();
      uint64_t mapped = 0;
      for (File& f : files) {
        e = Register(f, way, true);
        if (e != cudaSuccess) {
          std::printf("registering %s failed after %.2f GiB: %s\n", f.path.c_str(),
                      double(mapped) / (1 << 30), cudaGetErrorString(e));
          (void)cudaGetLastError();
          break;
        }
        mapped += f.size;
      }
      if (e != cudaSuccess) {
        for (File& f : files) Unregister(f);
        continue;
      }
      const double secs = Seconds(Clock::now() - t0);
      std::printf("map + register every file once: %.2f s, %.2f GB/s\n", secs,
                  double(mapped) / secs / 1e9);
      registered_ok = true;
      break;
    }
  }
  struct Mode {
    const char* name;
    Path path;
    std::vector<double> gbps;
  };
  std::vector<Mode> modes;
  if (want_copy) modes.push_back({"copy", Path::kCopy, {}});
  if (want_mapped) modes.push_back({"mapped", Path::kMapped, {}});
  if (want_registered && registered_ok) modes.push_back({"registered", Path::kRegistered, {}});
  for (Mode& m : modes) {
    Pass(o, files, records, m.path, pinned, device, &sink);  // warm-up
    if (!CheckLastBatches(o, files, records, device)) return 1;
  }
  for (int r = 0; r < o.rounds; ++r) {  // the paths take turns: a noisy VM
    for (Mode& m : modes) {
      const double s = Pass(o, files, records, m.path, pinned, device, &sink);
      m.gbps.push_back(double(bytes_total) / s / 1e9);
    }
  }
  for (const Mode& m : modes) {
    std::printf("%-10s into HBM GB/s, median of %d: %.2f  (", m.name, o.rounds, Median(m.gbps));
    for (size_t i = 0; i < m.gbps.size(); ++i) std::printf("%s%.2f", i ? ", " : "", m.gbps[i]);
    std::printf(")\n");
  }
  for (File& f : files) {
    Unregister(f);
    if (f.plain) munmap(const_cast<std::byte*>(f.plain), f.size);
    close(f.fd);
  }
  for (int i = 0; i < kRing; ++i) {
    CHECK_CUDA(cudaFreeHost(pinned[i]));
    CHECK_CUDA(cudaFree(device[i]));
  }
  std::printf("(the last batches' bytes on the device checked; checksum sink %llx)\n",
              static_cast<unsigned long long>(sink.load()));
  return 0;
}
