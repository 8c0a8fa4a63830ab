// The checkpointer's DeviceRuntime on the CUDA runtime (CUDA builds; the
// interface is src/ckpt/device_runtime.h). Each call makes its device
// current for the calling thread and puts the previous one back.
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "ckpt/device_runtime.h"
#include "gpu/cuda_util.h"

namespace stoker::gpu {

// Made from src/ckpt/device_runtime.cc when this build has CUDA.
std::shared_ptr<ckpt::DeviceRuntime> NewCudaCkptRuntime();

namespace {

// The host's NUMA nodes (/sys/devices/system/node/nodeN); 1 where that
// cannot be read.
int HostNumaNodes() {
  DIR* d = opendir("/sys/devices/system/node");
  if (d == nullptr) return 1;
  int n = 0;
  while (const dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, "node", 4) == 0 && e->d_name[4] >= '0' && e->d_name[4] <= '9') ++n;
  }
  closedir(d);
  return n < 1 ? 1 : n;
}

// The host NUMA node closest to `device`: the driver's answer
// (cudaDevAttrHostNumaId), else the GPU's PCI function's numa_node in
// sysfs; -1 when neither says.
int HostNodeOf(int device) {
  int node = -1;
  if (cudaDeviceGetAttribute(&node, cudaDevAttrHostNumaId, device) == cudaSuccess && node >= 0) {
    return node;
  }
  (void)cudaGetLastError();
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  for (char* c = bus; *c != 0; ++c) *c = char(std::tolower(static_cast<unsigned char>(*c)));
  const std::string path = std::string("/sys/bus/pci/devices/") + bus + "/numa_node";
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return -1;
  if (std::fscanf(f, "%d", &node) != 1) node = -1;
  std::fclose(f);
  return node;
}

class CudaCkptRuntime final : public ckpt::DeviceRuntime {
 public:
  Result<void*> HostAlloc(int device, size_t bytes) override {
    const std::string what = std::to_string(bytes) + " bytes of pinned memory";
    const int node = device >= 0 && HostNumaNodes() > 1 ? HostNodeOf(device) : -1;
    if (node < 0) {
      void* p = nullptr;
      const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
      if (err != cudaSuccess) return CudaStatus(device, "cudaHostAlloc(" + what + ")", err);
      return p;
    }
    // Pages bound to the GPU's node by preference (taken elsewhere only when
    // that node is full), faulted in there by the registration.
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return NoSpace("cuda:" + std::to_string(device) + ": mmap(" + what +
                     "): " + std::strerror(errno));
    }
    unsigned long mask[16] = {};
    if (node < int(sizeof(mask) * 8)) {
      mask[node / 64] |= 1ul << (node % 64);
      (void)syscall(SYS_mbind, p, bytes, MPOL_PREFERRED, mask, sizeof(mask) * 8, 0);
    }
    const cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (err != cudaSuccess) {
      munmap(p, bytes);
      return CudaStatus(device,
                        "cudaHostRegister(" + what + " on NUMA node " + std::to_string(node) + ")",
                        err);
    }
    std::lock_guard l(mu_);
    mapped_[p] = bytes;
    return p;
  }
  void HostFree(void* p) override {
    size_t bytes = 0;
    {
      std::lock_guard l(mu_);
      auto it = mapped_.find(p);
      if (it != mapped_.end()) bytes = it->second, mapped_.erase(it);
    }
    if (bytes == 0) {
      (void)cudaFreeHost(p);
      return;
    }
    (void)cudaHostUnregister(p);
    munmap(p, bytes);
  }

  Result<Stream> NewStream(int device) override {
    DeviceGuard g(device);
    STOKER_RETURN_IF_ERROR(CudaStatus(device, "cudaSetDevice", g.status()));
    cudaStream_t s = nullptr;
    STOKER_RETURN_IF_ERROR(CudaStatus(device, "cudaStreamCreateWithFlags(non-blocking)",
                                      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
    return static_cast<Stream>(s);
  }
  void DestroyStream(int device, Stream s) override {
    DeviceGuard g(device);
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(s));
  }
  Result<Event> NewEvent(int device) override {
    DeviceGuard g(device);
    STOKER_RETURN_IF_ERROR(CudaStatus(device, "cudaSetDevice", g.status()));
    cudaEvent_t e = nullptr;
    STOKER_RETURN_IF_ERROR(CudaStatus(device, "cudaEventCreateWithFlags(disable timing)",
                                      cudaEventCreateWithFlags(&e, cudaEventDisableTiming)));
    return static_cast<Event>(e);
  }
  void DestroyEvent(int device, Event e) override {
    DeviceGuard g(device);
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  Status Record(int device, Event e, Stream s) override {
    DeviceGuard g(device);
    return CudaStatus(device, "cudaEventRecord",
                      cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)));
  }
  Status StreamWait(int device, Stream s, Event e) override {
    DeviceGuard g(device);
    return CudaStatus(
        device, "cudaStreamWaitEvent",
        cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0));
  }
  Status CopyD2H(int device, void* dst, const void* src, size_t n, Stream s) override {
    DeviceGuard g(device);
    return CudaStatus(
        device, "cudaMemcpyAsync(device to host, " + std::to_string(n) + " bytes)",
        cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(s)));
  }
  Status CopyH2D(int device, void* dst, const void* src, size_t n, Stream s) override {
    DeviceGuard g(device);
    return CudaStatus(
        device, "cudaMemcpyAsync(host to device, " + std::to_string(n) + " bytes)",
        cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(s)));
  }
  Status Synchronize(int device, Event e) override {
    return CudaStatus(device, "cudaEventSynchronize",
                      cudaEventSynchronize(static_cast<cudaEvent_t>(e)));
  }

 private:
  std::mutex mu_;
  std::map<void*, size_t> mapped_;  // HostAlloc's NUMA-placed areas: their sizes
};

}  // namespace

std::shared_ptr<ckpt::DeviceRuntime> NewCudaCkptRuntime() {
  return std::make_shared<CudaCkptRuntime>();
}

}  // namespace stoker::gpu
