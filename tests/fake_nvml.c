/* A stand-in for libnvidia-ml.so.1 on machines without a GPU: the NVML
 * functions the exporter calls, for two GPUs with fixed readings, so that the
 * exporter's GPU series (dlopen, each reading, the labels) and the dashboard's
 * GPU queries are tested where there is no driver. The real library is
 * checked by scripts/gpu/metrics.sh on a GPU machine. */
#include <string.h>

typedef struct {
  unsigned int gpu, memory;
} Utilization;
typedef struct {
  unsigned long long total, free, used;
} Memory;

static int devices[2];

int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned* n) {
  *n = 2;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** d) {
  if (i >= 2) return 2;
  *d = &devices[i];
  return 0;
}
static unsigned Index(void* d) { return (unsigned)((int*)d - devices); }
int nvmlDeviceGetUtilizationRates(void* d, Utilization* u) {
  u->gpu = 40 + 10 * Index(d);
  u->memory = 20;
  return 0;
}
int nvmlDeviceGetMemoryInfo(void* d, Memory* m) {
  m->total = 80ull << 30;
  m->used = 10ull << 30;
  m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetPowerUsage(void* d, unsigned* mw) {
  *mw = 250000;
  return 0;
}
int nvmlDeviceGetTemperature(void* d, int sensor, unsigned* c) {
  *c = 55;
  return 0;
}
int nvmlDeviceGetClockInfo(void* d, int type, unsigned* mhz) {
  *mhz = 1980;
  return 0;
}
int nvmlDeviceGetPcieThroughput(void* d, int counter, unsigned* kbs) {
  *kbs = counter == 1 ? 1000000 : 2000;
  return 0;
}
int nvmlDeviceGetCurrentClocksThrottleReasons(void* d, unsigned long long* r) {
  *r = 0x1 | 0x4;
  return 0;
}
int nvmlDeviceGetTotalEccErrors(void* d, int type, int counter, unsigned long long* n) {
  *n = type == 0 ? 3 : 0;
  return 0;
}
/* XID events, as $FAKE_NVML_XIDS says. Unset: registration is
 * NOT_SUPPORTED (3), as on GPUs and VMs without events; the exporter then
 * serves no XID series and says so. "unknown": registration fails with
 * NVML_ERROR_UNKNOWN (999), after which the set must be freed. Else a list
 * "GPU:XID,..." of events that nvmlEventSetWait_v2 delivers one per call,
 * then NVML_ERROR_TIMEOUT (10): GPU 9 is a handle NVML never gave out, and
 * "ecc" an event of another type (a single-bit ECC error). */
#include <stdlib.h>
#include <unistd.h>

typedef struct {
  void* device;
  unsigned long long eventType, eventData;
  unsigned int gpuInstanceId, computeInstanceId;
} EventData;

static int event_set, stranger;
int fake_nvml_live_sets; /* created and not freed, for the tests */
static size_t delivered; /* events of $FAKE_NVML_XIDS delivered so far */

int nvmlEventSetCreate(void** set) {
  *set = &event_set;
  ++fake_nvml_live_sets;
  return 0;
}
int nvmlEventSetFree(void* set) {
  --fake_nvml_live_sets;
  return 0;
}
int nvmlDeviceRegisterEvents(void* d, unsigned long long types, void* set) {
  const char* xids = getenv("FAKE_NVML_XIDS");
  if (xids == NULL) return 3;
  if (strcmp(xids, "unknown") == 0) return 999;
  return types == 0x8 ? 0 : 3;
}
int nvmlEventSetWait_v2(void* set, EventData* e, unsigned timeout_ms) {
  const char* xids = getenv("FAKE_NVML_XIDS");
  const char* at = xids ? xids : "";
  for (size_t i = 0; i < delivered && at; ++i) {
    at = strchr(at, ',');
    if (at) ++at;
  }
  if (at == NULL || *at == '\0') {
    usleep(timeout_ms * 1000u);
    return 10;
  }
  ++delivered;
  memset(e, 0, sizeof *e);
  if (strncmp(at, "ecc", 3) == 0) {
    e->device = &devices[0];
    e->eventType = 0x1;
    return 0;
  }
  const unsigned gpu = (unsigned)strtoul(at, NULL, 10);
  e->device = gpu < 2 ? (void*)&devices[gpu] : (void*)&stranger;
  e->eventType = 0x8;
  e->eventData = strtoull(strchr(at, ':') + 1, NULL, 10);
  return 0;
}
const char* nvmlErrorString(int r) { return r == 0 ? "Success" : "Unknown Error"; }
