// The nccl backend: device memory through NCCL, with NCCL and the CUDA
// driver loaded at run time (comm.h), so that no build or machine needs them
// unless this backend is asked for. The declarations below are the stable C
// ABI of nccl.h (2.x) and cuda.h, not the headers: the build needs neither.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/backend.h"

namespace stoker::comm {

namespace {

// cuda.h
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUdeviceptr = unsigned long long;
using CUstream = void*;
// nccl.h
using ncclResult_t = int;
using ncclComm_t = void*;
struct ncclUniqueId {
  char internal[128];
};
constexpr int kNcclSum = 0;
constexpr int kNcclInt32 = 2, kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclBfloat16 = 9;

struct Cuda {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGetCount)(int*);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*DeviceGetPCIBusId)(char*, int, CUdevice);
  CUresult (*MemAlloc)(CUdeviceptr*, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*MemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*StreamCreate)(CUstream*, unsigned);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*GetErrorString)(CUresult, const char**);
};

struct Nccl {
  ncclResult_t (*GetVersion)(int*);
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*AllReduce)(const void*, void*, size_t, int, int, ncclComm_t, CUstream);
  ncclResult_t (*AllGather)(const void*, void*, size_t, int, ncclComm_t, CUstream);
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, int, int, ncclComm_t, CUstream);
  ncclResult_t (*Broadcast)(const void*, void*, size_t, int, int, ncclComm_t, CUstream);
  ncclResult_t (*Send)(const void*, size_t, int, int, ncclComm_t, CUstream);
  ncclResult_t (*Recv)(void*, size_t, int, int, ncclComm_t, CUstream);
  ncclResult_t (*GroupStart)();
  ncclResult_t (*GroupEnd)();
  const char* (*GetErrorString)(ncclResult_t);
};

template <typename F>
Status Bind(void* lib, const char* name, F* fn, const std::string& what) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr) return Unsupported(what + " lacks " + name + " (too old?)");
  return Status::Ok();
}

Status LoadCuda(Cuda* c) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) {
    return Unsupported(std::string("the nccl backend needs a GPU and its driver: no CUDA driver "
                                   "here (dlopen libcuda.so.1: ") +
                       dlerror() + ")");
  }
  const std::string w = "the CUDA driver (libcuda.so.1)";
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuInit", &c->Init, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuDeviceGetCount", &c->DeviceGetCount, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuDeviceGet", &c->DeviceGet, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuDevicePrimaryCtxRetain", &c->DevicePrimaryCtxRetain, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuCtxSetCurrent", &c->CtxSetCurrent, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuDeviceGetPCIBusId", &c->DeviceGetPCIBusId, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuMemAlloc_v2", &c->MemAlloc, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuMemFree_v2", &c->MemFree, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuMemcpyHtoD_v2", &c->MemcpyHtoD, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuMemcpyDtoH_v2", &c->MemcpyDtoH, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuMemsetD8_v2", &c->MemsetD8, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuStreamCreate", &c->StreamCreate, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuStreamSynchronize", &c->StreamSynchronize, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuStreamDestroy_v2", &c->StreamDestroy, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "cuGetErrorString", &c->GetErrorString, w));
  return Status::Ok();
}

Status LoadNccl(Nccl* n, std::string* path) {
  const char* env = std::getenv("STOKER_NCCL_LIBRARY");
  *path = env != nullptr && *env != '\0' ? env : "libnccl.so.2";
  void* lib = dlopen(path->c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) {
    return Unsupported("NCCL is missing here (dlopen " + *path + ": " + dlerror() +
                       "): install NCCL 2, or set STOKER_NCCL_LIBRARY to its libnccl.so.2 "
                       "(e.g. the one in torch's nvidia/nccl/lib)");
  }
  const std::string w = "NCCL (" + *path + ")";
  STOKER_RETURN_IF_ERROR(Bind(lib, "ncclGetVersion", &n->GetVersion, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "ncclGetUniqueId", &n->GetUniqueId, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "ncclCommInitRank", &n->CommInitRank, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "ncclCommDestroy", &n->CommDestroy, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "ncclAllReduce", &n->AllReduce, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "ncclAllGather", &n->AllGather, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "ncclReduceScatter", &n->ReduceScatter, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "ncclBroadcast", &n->Broadcast, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "ncclSend", &n->Send, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "ncclRecv", &n->Recv, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "ncclGroupStart", &n->GroupStart, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "ncclGroupEnd", &n->GroupEnd, w));
  STOKER_RETURN_IF_ERROR(Bind(lib, "ncclGetErrorString", &n->GetErrorString, w));
  return Status::Ok();
}

class NcclBackend final : public CollectiveBackend {
 public:
  NcclBackend(int rank, int size) : rank_(rank), size_(size) {}
  ~NcclBackend() override {
    if (comm_ != nullptr) nccl_.CommDestroy(comm_);
    if (send_) cuda_.MemFree(send_);
    if (recv_) cuda_.MemFree(recv_);
    if (stream_ != nullptr) cuda_.StreamDestroy(stream_);
  }

  // What each rank does alone: the driver, its GPU, the library.
  Status Load(const RankInfo& info) {
    STOKER_RETURN_IF_ERROR(LoadCuda(&cuda_));
    STOKER_RETURN_IF_ERROR(Cu(cuda_.Init(0), "cuInit"));
    int devices = 0;
    STOKER_RETURN_IF_ERROR(Cu(cuda_.DeviceGetCount(&devices), "cuDeviceGetCount"));
    if (devices == 0) return Unsupported("the nccl backend needs a GPU: none is visible here");
    // One rank per GPU, by local rank (local size unknown: the local rank).
    ordinal_ = info.local_rank % devices;
    CUdevice dev = 0;
    STOKER_RETURN_IF_ERROR(Cu(cuda_.DeviceGet(&dev, ordinal_), "cuDeviceGet"));
    CUcontext ctx = nullptr;
    STOKER_RETURN_IF_ERROR(Cu(cuda_.DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain"));
    STOKER_RETURN_IF_ERROR(Cu(cuda_.CtxSetCurrent(ctx), "cuCtxSetCurrent"));
    char bus[32] = {0};
    STOKER_RETURN_IF_ERROR(
        Cu(cuda_.DeviceGetPCIBusId(bus, sizeof bus, dev), "cuDeviceGetPCIBusId"));
    pci_ = bus;
    // A blocking stream: ordered after the synchronous copies and memsets
    // of the legacy default stream (Upload, Poke, ClearOutput).
    STOKER_RETURN_IF_ERROR(Cu(cuda_.StreamCreate(&stream_, 0), "cuStreamCreate"));
    STOKER_RETURN_IF_ERROR(LoadNccl(&nccl_, &path_));
    int v = 0;
    STOKER_RETURN_IF_ERROR(Nc(nccl_.GetVersion(&v), "ncclGetVersion"));
    version_ = "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
               std::to_string(v % 100) + " (" + path_ + ")";
    return Status::Ok();
  }

  // Together: rank 0's unique id to all, then the communicator.
  Status Connect(Bootstrap& boot) {
    ncclUniqueId id{};
    if (boot.rank() == 0) STOKER_RETURN_IF_ERROR(Nc(nccl_.GetUniqueId(&id), "ncclGetUniqueId"));
    STOKER_ASSIGN_OR_RETURN(auto ids, boot.AllGather(std::string(id.internal, sizeof id.internal)));
    std::memcpy(id.internal, ids[0].data(), sizeof id.internal);
    return Nc(nccl_.CommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  }

  std::string version() const override { return version_; }
  std::string device() const override { return pci_; }

  Status Allocate(size_t bytes) override {
    STOKER_RETURN_IF_ERROR(Cu(cuda_.MemAlloc(&send_, bytes), "cuMemAlloc (send buffer)"));
    return Cu(cuda_.MemAlloc(&recv_, bytes), "cuMemAlloc (receive buffer)");
  }
  Status Upload(const void* host, size_t bytes) override {
    return Cu(cuda_.MemcpyHtoD(send_, host, bytes), "cuMemcpyHtoD");
  }
  Status Download(void* host, size_t bytes) override {
    return Cu(cuda_.MemcpyDtoH(host, recv_, bytes), "cuMemcpyDtoH");
  }
  Status Poke(size_t offset, const void* host, size_t bytes) override {
    return Cu(cuda_.MemcpyHtoD(recv_ + offset, host, bytes), "cuMemcpyHtoD");
  }
  Status ClearOutput(size_t bytes) override {
    return Cu(cuda_.MemsetD8(recv_, 0xff, bytes), "cuMemsetD8");
  }

  Status Run(CommOp op, CommDtype dtype, size_t count) override {
    int t = kNcclFloat32;
    if (dtype == CommDtype::kInt32) t = kNcclInt32;
    if (dtype == CommDtype::kBFloat16) t = kNcclBfloat16;
    if (dtype == CommDtype::kFloat16) t = kNcclFloat16;
    const size_t block = count * CommDtypeSize(dtype);
    const void* s = reinterpret_cast<const void*>(send_);
    void* r = reinterpret_cast<void*>(recv_);
    switch (op) {
      case CommOp::kAllReduce:
        return Nc(nccl_.AllReduce(s, r, count, t, kNcclSum, comm_, stream_), "ncclAllReduce");
      case CommOp::kAllGather:
        return Nc(nccl_.AllGather(s, r, count, t, comm_, stream_), "ncclAllGather");
      case CommOp::kReduceScatter:
        return Nc(nccl_.ReduceScatter(s, r, count, t, kNcclSum, comm_, stream_),
                  "ncclReduceScatter");
      case CommOp::kBroadcast:
        return Nc(nccl_.Broadcast(s, r, count, t, 0, comm_, stream_), "ncclBroadcast");
      case CommOp::kAllToAll: {
        // As nccl-tests: a group of a send and a receive per peer.
        STOKER_RETURN_IF_ERROR(Nc(nccl_.GroupStart(), "ncclGroupStart"));
        for (int p = 0; p < size_; ++p) {
          STOKER_RETURN_IF_ERROR(
              Nc(nccl_.Send(static_cast<const char*>(s) + p * block, count, t, p, comm_, stream_),
                 "ncclSend"));
          STOKER_RETURN_IF_ERROR(
              Nc(nccl_.Recv(static_cast<char*>(r) + p * block, count, t, p, comm_, stream_),
                 "ncclRecv"));
        }
        return Nc(nccl_.GroupEnd(), "ncclGroupEnd");
      }
      case CommOp::kSendRecv:
        STOKER_RETURN_IF_ERROR(Nc(nccl_.GroupStart(), "ncclGroupStart"));
        STOKER_RETURN_IF_ERROR(
            Nc(nccl_.Send(s, count, t, (rank_ + 1) % size_, comm_, stream_), "ncclSend"));
        STOKER_RETURN_IF_ERROR(
            Nc(nccl_.Recv(r, count, t, (rank_ + size_ - 1) % size_, comm_, stream_), "ncclRecv"));
        return Nc(nccl_.GroupEnd(), "ncclGroupEnd");
    }
    return Internal("unknown operation");
  }
  Status Wait() override { return Cu(cuda_.StreamSynchronize(stream_), "cuStreamSynchronize"); }

 private:
  Status Cu(CUresult rc, const char* call) {
    if (rc == 0) return Status::Ok();
    const char* text = nullptr;
    if (cuda_.GetErrorString == nullptr || cuda_.GetErrorString(rc, &text) != 0) text = "?";
    return IoError(std::string(call) + ": CUDA error " + std::to_string(rc) + " (" + text + ")");
  }
  Status Nc(ncclResult_t rc, const char* call) {
    if (rc == 0) return Status::Ok();
    return IoError(std::string(call) + ": " + nccl_.GetErrorString(rc) +
                   " (NCCL_DEBUG=WARN says more)");
  }

  int rank_, size_;
  int ordinal_ = 0;
  Cuda cuda_{};
  Nccl nccl_{};
  std::string path_, version_, pci_;
  CUstream stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  CUdeviceptr send_ = 0, recv_ = 0;
};

}  // namespace

Result<std::unique_ptr<CollectiveBackend>> MakeNcclBackend(Bootstrap& boot, const RankInfo& info) {
  auto b = std::make_unique<NcclBackend>(boot.rank(), boot.size());
  // Every rank learns whether every rank could load, before they exchange.
  STOKER_RETURN_IF_ERROR(AgreeOnStatus(boot, b->Load(info)));
  STOKER_RETURN_IF_ERROR(b->Connect(boot));
  return std::unique_ptr<CollectiveBackend>(std::move(b));
}

}  // namespace stoker::comm
