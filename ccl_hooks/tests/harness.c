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
  switch (d->version) {
    case 4:
      return d->v4->init(ctx, mask, name, hash, nnodes, nranks, rank, noop_logger);
    case 5:
      return d->v5->init(ctx, hash, mask, name, nnodes, nranks, rank, noop_logger);
    case 6:
      return d->v6->init(ctx, hash, mask, name, nnodes, nranks, rank, noop_logger);
    default:
      return d->v7->init(ctx, hash, mask, name, nnodes, nranks, rank, noop_logger);
  }
}

void drv_finalize(const struct drv* d, void* ctx) {
  switch (d->version) {
    case 4: d->v4->finalize(ctx); break;
    case 5: d->v5->finalize(ctx); break;
    case 6: d->v6->finalize(ctx); break;
    default: d->v7->finalize(ctx); break;
  }
}

/* One event's descriptor in every version's layout; SET writes a member into all four. */
struct descrs {
  ncclProfilerEventDescr_v4_t a;
  ncclProfilerEventDescr_v5_t b;
  ncclProfilerEventDescr_v6_t c;
  ncclProfilerEventDescr_v7_t e;
};
#define SET(x, member, value) \
  ((x).a.member = (x).b.member = (x).c.member = (x).e.member = (value))

static void zero(struct descrs* x, uint64_t type, void* parent) {
  memset(x, 0, sizeof(*x));
  x->a.type = (uint8_t)type;
  x->b.type = x->c.type = x->e.type = type;
  SET(*x, parentObj, parent);
}

/* The descriptor goes in a heap block of exactly its version's size, so ASan and valgrind
 * see any read past it (a v6 descriptor is 112 bytes, v7's 136). */
static void* start(const struct drv* d, void* ctx, struct descrs* x) {
  void* h = (void*)0x1; /* NCCL does not clear it; the plugin must */
  const void* src = &x->e;
  size_t size = sizeof(x->e);
  switch (d->version) {
    case 4: src = &x->a, size = sizeof(x->a); break;
    case 5: src = &x->b, size = sizeof(x->b); break;
    case 6: src = &x->c, size = sizeof(x->c); break;
    default: break;
  }
  void* copy = malloc(size);
  if (copy == NULL) return NULL;
  memcpy(copy, src, size);
  switch (d->version) {
    case 4: d->v4->startEvent(ctx, &h, copy); break;
    case 5: d->v5->startEvent(ctx, &h, copy); break;
    case 6: d->v6->startEvent(ctx, &h, copy); break;
    default: d->v7->startEvent(ctx, &h, copy); break;
  }
  free(copy);
  return h;
}

void* drv_coll(const struct drv* d, void* ctx, const char* func, uint64_t seqno, uint8_t nch) {
  struct descrs x;
  zero(&x, ncclProfileColl, NULL);
  SET(x, coll.seqNumber, seqno);
  SET(x, coll.func, func);
  SET(x, coll.datatype, "ncclFloat32");
  SET(x, coll.count, (size_t)1 << 20);
  SET(x, coll.nChannels, nch);
  SET(x, coll.nWarps, 16);
  SET(x, coll.algo, "RING");
  SET(x, coll.proto, "SIMPLE");
  x.e.coll.kernelVariant = "default";
  x.e.coll.userTag = 0x7a6;
  return start(d, ctx, &x);
}

void* drv_ce_coll(const struct drv* d, void* ctx, void* parent, const char* func,
                  uint64_t ce_seq) {
  struct descrs x;
  zero(&x, ncclProfileCeColl, parent);
  x.c.ceColl.seqNumber = x.e.ceColl.seqNumber = ce_seq;
  x.c.ceColl.ceSeqNum = x.e.ceColl.ceSeqNum = (uint32_t)ce_seq;
  x.c.ceColl.func = x.e.ceColl.func = func;
  x.c.ceColl.count = x.e.ceColl.count = 1 << 16;
  x.c.ceColl.datatype = x.e.ceColl.datatype = "ncclBfloat16";
  x.c.ceColl.syncStrategy = x.e.ceColl.syncStrategy = "MC";
  x.e.ceColl.userTag = 0x7a6;
  return start(d, ctx, &x);
}

void* drv_p2p(const struct drv* d, void* ctx, const char* func, int peer, uint8_t nch) {
  struct descrs x;
  zero(&x, ncclProfileP2p, NULL);
  SET(x, p2p.func, func);
  SET(x, p2p.datatype, "ncclInt8");
  SET(x, p2p.count, (size_t)4096);
  SET(x, p2p.peer, peer);
  SET(x, p2p.nChannels, nch);
  return start(d, ctx, &x);
}

void* drv_proxy_op(const struct drv* d, void* ctx, void* parent, pid_t pid, int peer, int send,
                   int nsteps) {
  struct descrs x;
  zero(&x, ncclProfileProxyOp, parent);
  SET(x, proxyOp.pid, pid);
  SET(x, proxyOp.channelId, 1);
  SET(x, proxyOp.peer, peer);
  SET(x, proxyOp.nSteps, nsteps);
  SET(x, proxyOp.chunkSize, 1 << 19);
  SET(x, proxyOp.isSend, send);
  return start(d, ctx, &x);
}

void* drv_proxy_step(const struct drv* d, void* ctx, void* op, int step) {
  struct descrs x;
  zero(&x, ncclProfileProxyStep, op);
  SET(x, proxyStep.step, step);
  return start(d, ctx, &x);
}

void* drv_kernel_ch(const struct drv* d, void* ctx, void* parent, uint8_t ch, uint64_t ptimer) {
  struct descrs x;
  zero(&x, ncclProfileKernelCh, parent);
  SET(x, kernelCh.channelId, ch);
  SET(x, kernelCh.pTimer, ptimer);
  return start(d, ctx, &x);
}

void* drv_raw(const struct drv* d, void* ctx, uint64_t type, void* parent) {
  struct descrs x;
  zero(&x, type, parent);
  return start(d, ctx, &x);
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
    return;
  }
  ncclProfilerEventStateArgs_v5_t b; /* = the v6 and v7 arguments */
  memset(&b, 0, sizeof(b));
  if (s == ncclProfilerKernelChStop || s == ncclProfilerKernelPhaseStop)
    b.kernelCh.pTimer = arg;
  else
    b.proxyStep.transSize = (size_t)arg;
  switch (d->version) {
    case 5: d->v5->recordEventState(h, s, &b); break;
    case 6: d->v6->recordEventState(h, s, &b); break;
    default: d->v7->recordEventState(h, s, &b); break;
  }
}

void drv_stop(const struct drv* d, void* h) {
  switch (d->version) {
    case 4: d->v4->stopEvent(h); break;
    case 5: d->v5->stopEvent(h); break;
    case 6: d->v6->stopEvent(h); break;
    default: d->v7->stopEvent(h); break;
  }
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

static int load(const char* path, void** lib, struct drv drivers[N_VERSIONS]) {
  *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (*lib == NULL) {
    fprintf(stderr, "FAIL dlopen %s: %s\n", path, dlerror());
    return -1;
  }
  memset(drivers, 0, sizeof(struct drv) * N_VERSIONS);
  drivers[0].version = 4;
  drivers[0].v4 = dlsym(*lib, "ncclProfiler_v4");
  drivers[1].version = 5;
  drivers[1].v5 = dlsym(*lib, "ncclProfiler_v5");
  drivers[2].version = 6;
  drivers[2].v6 = dlsym(*lib, "ncclProfiler_v6");
  drivers[3].version = 7;
  drivers[3].v7 = dlsym(*lib, "ncclProfiler_v7");
  CHECK(dlsym(*lib, "acc_start") == NULL, "internal symbol acc_start is visible");
  int bad = 0;
#define CHECK_TABLE(t, v)                                                                   \
  do {                                                                                      \
    CHECK((t) != NULL, "ncclProfiler_v%d not exported", v);                                 \
    if ((t) == NULL) {                                                                      \
      bad = 1;                                                                              \
      break;                                                                                \
    }                                                                                       \
    CHECK((t)->name && strcmp((t)->name, "aegis-ccl") == 0, "v%d name", v);                 \
    CHECK((t)->init && (t)->startEvent && (t)->stopEvent && (t)->recordEventState &&        \
              (t)->finalize,                                                                \
          "v%d table has a NULL entry", v);                                                 \
  } while (0)
  CHECK_TABLE(drivers[0].v4, 4);
  CHECK_TABLE(drivers[1].v5, 5);
  CHECK_TABLE(drivers[2].v6, 6);
  CHECK_TABLE(drivers[3].v7, 7);
#undef CHECK_TABLE
  return bad ? -1 : 0;
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
    struct drv drivers[N_VERSIONS];
    if (load(lib_path, &lib, drivers) == 0) {
      if (bench)
        run_bench(&drivers[0]);
      else
        run_scenarios(drivers, lib_path);
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
