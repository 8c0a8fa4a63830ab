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
/* No event support: the exporter then serves no XID series and says so. */
const char* nvmlErrorString(int r) { return r == 0 ? "Success" : "Unknown Error"; }
