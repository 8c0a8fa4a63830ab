/* Stand-ins for libcuda.so.1 and libnccl.so.2 with one rank, in host
 * memory: the nccl backend's whole path (dlopen, device choice, buffers,
 * the alltoall/sendrecv groups, offsets, the check) runs on machines with
 * no GPU. A collective of one rank is a copy, so every result is exact.
 * Built twice by tests/CMakeLists.txt (FAKE_CUDA, FAKE_NCCL). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FAKE_CUDA
int cuInit(unsigned flags) { return 0; }
int cuDeviceGetCount(int* n) {
  const char* v = getenv("FAKE_CUDA_DEVICES");
  *n = v ? atoi(v) : 1;
  return 0;
}
int cuDeviceGet(int* dev, int ordinal) { *dev = ordinal; return 0; }
int cuDevicePrimaryCtxRetain(void** ctx, int dev) { *ctx = (void*)1; return 0; }
int cuCtxSetCurrent(void* ctx) { return 0; }
int cuDeviceGetPCIBusId(char* bus, int len, int dev) {
  snprintf(bus, len, "0000:%02x:00.0", 0x17 + dev);
  return 0;
}
int cuMemAlloc_v2(unsigned long long* p, size_t n) {
  void* m = malloc(n);
  *p = (unsigned long long)(uintptr_t)m;
  return m ? 0 : 2; /* CUDA_ERROR_OUT_OF_MEMORY */
}
int cuMemFree_v2(unsigned long long p) { free((void*)(uintptr_t)p); return 0; }
int cuMemcpyHtoD_v2(unsigned long long d, const void* s, size_t n) {
  memcpy((void*)(uintptr_t)d, s, n);
  return 0;
}
int cuMemcpyDtoH_v2(void* d, unsigned long long s, size_t n) {
  memcpy(d, (void*)(uintptr_t)s, n);
  return 0;
}
int cuMemsetD8_v2(unsigned long long d, unsigned char v, size_t n) {
  memset((void*)(uintptr_t)d, v, n);
  return 0;
}
int cuStreamCreate(void** s, unsigned flags) { *s = (void*)2; return 0; }
int cuStreamSynchronize(void* s) { return 0; }
int cuStreamDestroy_v2(void* s) { return 0; }
int cuGetErrorString(int rc, const char** text) { *text = "fake error"; return 0; }
#endif

#ifdef FAKE_NCCL
typedef struct { char internal[128]; } ncclUniqueId;
static size_t Size(int t) { return t == 6 || t == 9 ? 2 : 4; }
static const void* g_send[64];
static size_t g_send_bytes[64];
static void* g_recv[64];
static int g_sends, g_recvs;

int ncclGetVersion(int* v) { *v = 22703; return 0; }
int ncclGetUniqueId(ncclUniqueId* id) { memset(id, 7, sizeof *id); return 0; }
int ncclCommInitRank(void** comm, int n, ncclUniqueId id, int rank) {
  if (n != 1 || rank != 0 || id.internal[0] != 7) return 4; /* ncclInvalidArgument */
  *comm = (void*)3;
  return 0;
}
int ncclCommDestroy(void* comm) { return 0; }
int ncclAllReduce(const void* s, void* r, size_t n, int t, int op, void* c, void* st) {
  memcpy(r, s, n * Size(t));
  return 0;
}
int ncclAllGather(const void* s, void* r, size_t n, int t, void* c, void* st) {
  memcpy(r, s, n * Size(t));
  return 0;
}
int ncclReduceScatter(const void* s, void* r, size_t n, int t, int op, void* c, void* st) {
  memcpy(r, s, n * Size(t));
  return 0;
}
int ncclBroadcast(const void* s, void* r, size_t n, int t, int root, void* c, void* st) {
  memcpy(r, s, n * Size(t));
  return 0;
}
int ncclSend(const void* s, size_t n, int t, int peer, void* c, void* st) {
  g_send_bytes[g_sends] = n * Size(t);
  g_send[g_sends++] = s;
  return peer == 0 ? 0 : 4;
}
int ncclRecv(void* r, size_t n, int t, int peer, void* c, void* st) {
  g_recv[g_recvs++] = r;
  return peer == 0 ? 0 : 4;
}
int ncclGroupStart(void) { g_sends = g_recvs = 0; return 0; }
int ncclGroupEnd(void) {
  if (g_sends != g_recvs) return 5; /* ncclInvalidUsage */
  for (int i = 0; i < g_sends; ++i) memcpy(g_recv[i], g_send[i], g_send_bytes[i]);
  return 0;
}
const char* ncclGetErrorString(int rc) { return "fake NCCL error"; }
#endif
