/*
 * ccl_harness: drives libaegis_ccl_profiler.so as NCCL would.
 *   ccl_harness --vectors DIR       C encoder vs schemas/vectors
 *   ccl_harness --lib PATH [--quick] scenarios (normal, compute hang, network hang,
 *                                   socket absent, socket full, pool exhaustion, ...)
 *   ccl_harness --bench [--quick] --lib PATH   per-event cost; last line JSON
 */
#include "harness.h"

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

int g_failures;
int g_quick;

uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the driver: descriptors filled the way NCCL fills them (zeroed, then fields) ---- */

static void noop_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                        const char* fmt, ...) {
  (void)level, (void)flags, (void)file, (void)line, (void)fmt;
}

int drv_init(const struct drv* d, void** ctx, int* mask, const char* name, uint64_t hash,
             int nranks, int rank) {
  int nnodes = nranks > 8 ? nranks / 8 : 1;
  if (d->version == 4)
    return d->v4->init(ctx, mask, name, hash, nnodes, nranks, rank, noop_logger);
  return d->v5->init(ctx, hash, mask, name, nnodes, nranks, rank, noop_logger);
}

void drv_finalize(const struct drv* d, void* ctx) {
  if (d->version == 4)
    d->v4->finalize(ctx);
  else
    d->v5->finalize(ctx);
}

static void* start(const struct drv* d, void* ctx, ncclProfilerEventDescr_v4_t* a,
                   ncclProfilerEventDescr_v5_t* b) {
  void* h = (void*)0x1; /* NCCL does not clear it; the plugin must */
  if (d->version == 4)
    d->v4->startEvent(ctx, &h, a);
  else
    d->v5->startEvent(ctx, &h, b);
  return h;
}

void* drv_coll(const struct drv* d, void* ctx, const char* func, uint64_t seqno, uint8_t nch) {
  ncclProfilerEventDescr_v4_t a;
  ncclProfilerEventDescr_v5_t b;
  memset(&a, 0, sizeof(a));
  memset(&b, 0, sizeof(b));
  a.type = ncclProfileColl;
  b.type = ncclProfileColl;
  a.coll.seqNumber = b.coll.seqNumber = seqno;
  a.coll.func = b.coll.func = func;
  a.coll.datatype = b.coll.datatype = "ncclFloat32";
  a.coll.count = b.coll.count = 1 << 20;
  a.coll.nChannels = b.coll.nChannels = nch;
  a.coll.nWarps = b.coll.nWarps = 16;
  a.coll.algo = b.coll.algo = "RING";
  a.coll.proto = b.coll.proto = "SIMPLE";
  return start(d, ctx, &a, &b);
}

void* drv_p2p(const struct drv* d, void* ctx, const char* func, int peer, uint8_t nch) {
  ncclProfilerEventDescr_v4_t a;
  ncclProfilerEventDescr_v5_t b;
  memset(&a, 0, sizeof(a));
  memset(&b, 0, sizeof(b));
  a.type = ncclProfileP2p;
  b.type = ncclProfileP2p;
  a.p2p.func = b.p2p.func = func;
  a.p2p.datatype = b.p2p.datatype = "ncclInt8";
  a.p2p.count = b.p2p.count = 4096;
  a.p2p.peer = b.p2p.peer = peer;
  a.p2p.nChannels = b.p2p.nChannels = nch;
  return start(d, ctx, &a, &b);
}

void* drv_proxy_op(const struct drv* d, void* ctx, void* parent, pid_t pid, int peer, int send,
                   int nsteps) {
  ncclProfilerEventDescr_v4_t a;
  ncclProfilerEventDescr_v5_t b;
  memset(&a, 0, sizeof(a));
  memset(&b, 0, sizeof(b));
  a.type = ncclProfileProxyOp;
  b.type = ncclProfileProxyOp;
  a.parentObj = b.parentObj = parent;
  a.proxyOp.pid = b.proxyOp.pid = pid;
  a.proxyOp.channelId = b.proxyOp.channelId = 1;
  a.proxyOp.peer = b.proxyOp.peer = peer;
  a.proxyOp.nSteps = b.proxyOp.nSteps = nsteps;
  a.proxyOp.chunkSize = b.proxyOp.chunkSize = 1 << 19;
  a.proxyOp.isSend = b.proxyOp.isSend = send;
  return start(d, ctx, &a, &b);
}

void* drv_proxy_step(const struct drv* d, void* ctx, void* op, int step) {
  ncclProfilerEventDescr_v4_t a;
  ncclProfilerEventDescr_v5_t b;
  memset(&a, 0, sizeof(a));
  memset(&b, 0, sizeof(b));
  a.type = ncclProfileProxyStep;
  b.type = ncclProfileProxyStep;
  a.parentObj = b.parentObj = op;
  a.proxyStep.step = b.proxyStep.step = step;
  return start(d, ctx, &a, &b);
}

void* drv_kernel_ch(const struct drv* d, void* ctx, void* parent, uint8_t ch, uint64_t ptimer) {
  ncclProfilerEventDescr_v4_t a;
  ncclProfilerEventDescr_v5_t b;
  memset(&a, 0, sizeof(a));
  memset(&b, 0, sizeof(b));
  a.type = ncclProfileKernelCh;
  b.type = ncclProfileKernelCh;
  a.parentObj = b.parentObj = parent;
  a.kernelCh.channelId = b.kernelCh.channelId = ch;
  a.kernelCh.pTimer = b.kernelCh.pTimer = ptimer;
  return start(d, ctx, &a, &b);
}

void* drv_raw(const struct drv* d, void* ctx, uint64_t type, void* parent) {
  ncclProfilerEventDescr_v4_t a;
  ncclProfilerEventDescr_v5_t b;
  memset(&a, 0, sizeof(a));
  memset(&b, 0, sizeof(b));
  a.type = (uint8_t)type;
  b.type = type;
  a.parentObj = b.parentObj = parent;
  return start(d, ctx, &a, &b);
}

void drv_state(const struct drv* d, void* h, ncclProfilerEventState_t s, uint64_t arg) {
  if (d->version == 4) {
    ncclProfilerEventStateArgs_v4_t a;
    memset(&a, 0, sizeof(a));
    if (s == ncclProfilerKernelChStop)
      a.kernelCh.pTimer = arg;
    else
      a.proxyStep.transSize = (size_t)arg;
    d->v4->recordEventState(h, s, &a);
  } else {
    ncclProfilerEventStateArgs_v5_t b;
    memset(&b, 0, sizeof(b));
    if (s == ncclProfilerKernelChStop)
      b.kernelCh.pTimer = arg;
    else
      b.proxyStep.transSize = (size_t)arg;
    d->v5->recordEventState(h, s, &b);
  }
}

void drv_stop(const struct drv* d, void* h) {
  if (d->version == 4)
    d->v4->stopEvent(h);
  else
    d->v5->stopEvent(h);
}

/* ---- the receiving socket ---- */

void make_sock_path(char* out, size_t n, const char* tag) {
  static int counter;
  const char* dir = getenv("TMPDIR");
  if (dir == NULL || strlen(dir) > 60) dir = "/tmp";
  snprintf(out, n, "%s/acc-%d-%s-%d.sock", dir, (int)getpid(), tag, counter++);
}

int rx_open(struct rx* r, const char* path) {
  struct sockaddr_un a;
  memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  snprintf(r->path, sizeof(r->path), "%s", path);
  snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
  unlink(path);
  r->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (r->fd < 0 || bind(r->fd, (struct sockaddr*)&a, sizeof(a)) != 0) {
    CHECK(0, "cannot bind %s: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

void rx_close(struct rx* r) {
  if (r->fd >= 0) close(r->fd);
  unlink(r->path);
  r->fd = -1;
}

int rx_next(struct rx* r, struct hx_dgram* g, int timeout_ms) {
  static uint8_t buf[65536];
  struct pollfd p = {r->fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return 0;
  ssize_t n = recv(r->fd, buf, sizeof(buf), 0);
  if (n <= 0) return 0;
  int rc = hx_decode(buf, (size_t)n, g);
  CHECK(rc == 0, "undecodable datagram of %zd bytes", n);
  return rc == 0;
}

int rx_wait_entry(struct rx* r, uint64_t hash, uint32_t rank, int final, uint8_t kind,
                  uint64_t min_cl, struct acc_wire_entry* out, struct acc_wire_header* hdr,
                  int timeout_ms) {
  struct hx_dgram* g = malloc(sizeof(*g));
  uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000ull;
  int found = 0;
  while (g != NULL && !found && now_ns() < deadline) {
    int left = (int)((deadline - now_ns()) / 1000000ull) + 1;
    if (!rx_next(r, g, left)) continue;
    const struct acc_wire_entry* e = hx_find(g, hash, rank);
    if (e == NULL) continue;
    if (final) {
      found = (e->flags & ACC_WIRE_ENTRY_FINAL) != 0;
    } else {
      const struct acc_wire_op* o = hx_op(e, kind);
      found = o != NULL && o->cl >= min_cl;
    }
    if (found) {
      *out = *e;
      if (hdr) *hdr = g->h;
    }
  }
  free(g);
  return found;
}

/* ---- main ---- */

static int load(const char* path, void** lib, struct drv* v4, struct drv* v5) {
  *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (*lib == NULL) {
    fprintf(stderr, "FAIL dlopen %s: %s\n", path, dlerror());
    return -1;
  }
  v4->version = 4;
  v4->v4 = dlsym(*lib, "ncclProfiler_v4");
  v5->version = 5;
  v5->v5 = dlsym(*lib, "ncclProfiler_v5");
  CHECK(v4->v4 != NULL && v5->v5 != NULL, "ncclProfiler_v4/v5 not exported");
  CHECK(dlsym(*lib, "acc_start") == NULL, "internal symbol acc_start is visible");
  if (v4->v4 == NULL || v5->v5 == NULL) return -1;
  CHECK(v4->v4->name && strcmp(v4->v4->name, "aegis-ccl") == 0, "v4 name");
  CHECK(v5->v5->name && strcmp(v5->v5->name, "aegis-ccl") == 0, "v5 name");
  CHECK(v4->v4->init && v4->v4->startEvent && v4->v4->stopEvent && v4->v4->recordEventState &&
            v4->v4->finalize,
        "v4 table has a NULL entry");
  CHECK(v5->v5->init && v5->v5->startEvent && v5->v5->stopEvent && v5->v5->recordEventState &&
            v5->v5->finalize,
        "v5 table has a NULL entry");
  return 0;
}

int main(int argc, char** argv) {
  const char* lib_path = NULL;
  const char* vectors = NULL;
  int bench = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--lib") == 0 && i + 1 < argc)
      lib_path = argv[++i];
    else if (strcmp(argv[i], "--vectors") == 0 && i + 1 < argc)
      vectors = argv[++i];
    else if (strcmp(argv[i], "--quick") == 0)
      g_quick = 1;
    else if (strcmp(argv[i], "--bench") == 0)
      bench = 1;
    else {
      fprintf(stderr, "usage: %s [--vectors DIR] [--lib PATH [--quick] [--bench]]\n", argv[0]);
      return 2;
    }
  }
  if (vectors != NULL) check_vectors(vectors);
  if (lib_path != NULL) {
    void* lib = NULL;
    struct drv v4, v5;
    if (load(lib_path, &lib, &v4, &v5) == 0) {
      if (bench)
        run_bench(&v4);
      else
        run_scenarios(&v4, &v5, lib_path);
      dlclose(lib);
      if (!bench) check_reload(lib_path);
    }
  }
  if (g_failures) {
    fprintf(stderr, "ccl_harness: %d check(s) failed\n", g_failures);
    return 1;
  }
  return 0;
}
