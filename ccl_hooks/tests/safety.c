/*
 * The plugin's safety properties: socket absent, socket full, event pool exhausted,
 * malformed calls, many communicators, unload (no thread outlives the library).
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sim.h"

static void scenario_socket_absent(const struct drv* d) {
  char path[108];
  make_sock_path(path, sizeof(path), "absent");
  unlink(path);
  set_env(path, "5");
  static struct sim_rank s;
  sim_setup(&s, d, init_ok(d, "absent", 0xAB5E, 2, 0), 0, 2, 6);
  sim_start(&s);
  sim_join(&s);
  sleep_ms(60);
  struct rx r;
  if (rx_open(&r, path) != 0) return;
  struct acc_wire_entry e;
  struct acc_wire_header h;
  CHECK(rx_wait_entry(&r, 0xAB5E, 0, 0, SIM_KIND_AR, 2, &e, &h, WAIT_MS), "absent: nothing later");
  CHECK(h.drops_unsent >= 1, "absent: drops_unsent %u", h.drops_unsent);
  drv_finalize(d, s.ctx);
  CHECK(rx_wait_entry(&r, 0xAB5E, 0, 1, 0, 0, &e, NULL, WAIT_MS), "absent: FINAL");
  sim_check(&s, &e, "socket absent");
  rx_close(&r);
  printf("ok   v%d socket absent: events unaffected, %u datagrams counted unsent\n", d->version,
         h.drops_unsent);
}

/* A receiver that never reads: sends fail with EAGAIN, are counted, never block. */
static void scenario_socket_full(const struct drv* d) {
  struct rx r;
  if (rx_start(&r, "full", "1") != 0) return;
  void* ctx = init_ok(d, "full", 0xF011, 2, 1);
  uint64_t worst = 0;
  long pairs = 0;
  /* ~700 reporter ticks: more than the queue holds whether the kernel bounds it by
   * net.unix.max_dgram_qlen (10 by default, 512 on some) or by the sender's sndbuf. */
  for (int burst = 0; burst < 700; burst++) {
    for (int i = 0; i < 20; i++, pairs++) {
      uint64_t t0 = now_ns();
      drv_stop(d, drv_coll(d, ctx, "AllReduce", (uint64_t)pairs, 1));
      uint64_t dt = now_ns() - t0;
      worst = dt > worst ? dt : worst;
    }
    sleep_ms(1);
  }
  rx_drain(&r);
  struct acc_wire_entry e;
  struct acc_wire_header h;
  CHECK(rx_wait_entry(&r, 0xF011, 1, 0, SIM_KIND_AR, (uint64_t)pairs, &e, &h, WAIT_MS),
        "full: no snapshot after draining");
  CHECK(h.drops_full >= 1, "full: drops_full %u", h.drops_full);
  drv_finalize(d, ctx);
  rx_close(&r);
  printf("ok   v%d socket full: %u datagrams dropped and counted; %ld start/stop pairs, slowest "
         "pair %.1f us\n",
         d->version, h.drops_full, pairs, (double)worst / 1000.0);
}

/* A pool of 16 event slots: the 17th open event gets a NULL handle, counted. */
static void scenario_pool_exhausted(const struct drv* d) {
  struct rx r;
  if (rx_start(&r, "pool", "1000") != 0) return;
  setenv("AEGIS_CCL_MAX_EVENTS", "16", 1);
  void* ctx = init_ok(d, "pool", 0x9001, 4, 2);
  unsetenv("AEGIS_CCL_MAX_EVENTS");
  void* coll = drv_coll(d, ctx, "ReduceScatter", 0, 1);
  void* op = drv_proxy_op(d, ctx, coll, getpid(), 3, 1, 20);
  void* steps[20];
  int nulls = 0;
  for (int i = 0; i < 20; i++) {
    steps[i] = drv_proxy_step(d, ctx, op, i);
    nulls += steps[i] == NULL;
    drv_state(d, steps[i], ncclProfilerProxyStepSendWait, 1); /* NULL handles are fine */
  }
  CHECK(nulls == 5, "pool: %d NULL handles, expected 5", nulls);
  for (int i = 0; i < 20; i++) drv_stop(d, steps[i]);
  for (int i = 0; i < 15; i++) {
    steps[i] = drv_proxy_step(d, ctx, op, i);
    CHECK(steps[i] != NULL, "pool: slot %d not recycled", i);
  }
  for (int i = 0; i < 15; i++) drv_stop(d, steps[i]);
  drv_stop(d, op);
  drv_stop(d, coll);
  drv_finalize(d, ctx);
  struct acc_wire_entry e;
  CHECK(rx_wait_entry(&r, 0x9001, 2, 1, 0, 0, &e, NULL, WAIT_MS), "pool: FINAL");
  const struct acc_wire_op* o = hx_op(&e, 3);
  CHECK(e.handles_exhausted == 5, "pool: handles_exhausted %u", e.handles_exhausted);
  CHECK(o && o->cl == 1 && o->wr == 15 && o->wc == 15, "pool: ReduceScatter CL 1 WR 15 WC 15");
  rx_close(&r);
  printf("ok   v%d event pool: 5 NULL handles counted, slots recycled\n", d->version);
}

/* Calls NCCL may legally make, and some it should not. None may crash or count wrongly. */
static void scenario_robustness(const struct drv* d) {
  struct rx r;
  if (rx_start(&r, "robust", "1000") != 0) return;
  void* bad = (void*)0x1;
  CHECK(drv_init(d, &bad, NULL, "x", 1, 4, 4) != ncclSuccess && bad == NULL, "rank >= nranks");
  CHECK(drv_init(d, &bad, NULL, "x", 1, 0, 0) != ncclSuccess, "nranks 0 accepted");
  void* ctx = NULL;
  int mask = 0;
  CHECK(drv_init(d, &ctx, &mask, NULL, 0x0B, 16, 0) == ncclSuccess, "NULL comm name refused");
  drv_stop(d, NULL);
  drv_state(d, NULL, ncclProfilerProxyStepSendWait, 0);
  uint64_t odd[] = {ncclProfileGroup, ncclProfileProxyCtrl, ncclProfileNetPlugin, 0, 1u << 7};
  for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++)
    CHECK(drv_raw(d, ctx, odd[i], NULL) == NULL, "type 0x%lx should get NULL", (unsigned long)odd[i]);
  if (d->version >= 5) {
    uint64_t api[] = {ncclProfileGroupApi, ncclProfileCollApi, ncclProfileP2pApi,
                      ncclProfileKernelLaunch, 1ull << 40};
    for (size_t i = 0; i < sizeof(api) / sizeof(api[0]); i++)
      CHECK(drv_raw(d, ctx, api[i], NULL) == NULL, "v%d type 0x%lx", d->version,
            (unsigned long)api[i]);
  }
  if (d->version >= 6) { /* children of no CeColl, and v7's phases: never counted */
    uint64_t newer[] = {ncclProfileCeSync, ncclProfileCeBatch, ncclProfileKernelPhase, 1ull << 16};
    for (size_t i = 0; i < sizeof(newer) / sizeof(newer[0]); i++)
      CHECK(drv_raw(d, ctx, newer[i], NULL) == NULL, "v%d type 0x%lx", d->version,
            (unsigned long)newer[i]);
  }
  CHECK(drv_kernel_ch(d, ctx, NULL, 0, 5) == NULL, "KernelCh without parent");
  int local = 0;
  void* coll = drv_coll(d, ctx, "Broadcast", 0, 1);
  void* unknown = drv_coll(d, ctx, "FutureCollective", 0, 1);
  void* pxn = drv_proxy_op(d, ctx, &local, getpid() + 1, 9, 1, 1); /* foreign parent: PXN */
  void* wild = drv_proxy_op(d, ctx, &local, getpid(), 10, 0, 1);   /* not our pointer */
  void* orphan = drv_proxy_step(d, ctx, NULL, 0);                  /* no ProxyOp parent */
  void* on_coll = drv_proxy_step(d, ctx, coll, 0);                 /* parent of wrong type */
  void* hs[] = {drv_proxy_step(d, ctx, pxn, 0), drv_proxy_step(d, ctx, wild, 0), orphan, on_coll};
  for (int i = 0; i < 4; i++) {
    CHECK(hs[i] != NULL, "step %d: NULL handle", i);
    drv_state(d, hs[i], i % 2 ? ncclProfilerProxyStepRecvWait : ncclProfilerProxyStepSendWait, 8);
    drv_state(d, hs[i], ncclProfilerProxyOpInProgress_v4, 0); /* wrong event's state: ignored */
    drv_stop(d, hs[i]);
  }
  drv_stop(d, pxn);
  drv_stop(d, wild);
  /* a channel without GPU timestamps: TD falls back to CLOCK_MONOTONIC */
  void* ch = drv_kernel_ch(d, ctx, coll, 0, 0);
  drv_state(d, ch, ncclProfilerKernelChStop, 0);
  sleep_ms(2);
  drv_stop(d, ch);
  drv_stop(d, coll);
  drv_stop(d, unknown);
  drv_finalize(d, ctx);
  struct acc_wire_entry e;
  CHECK(rx_wait_entry(&r, 0x0B, 0, 1, 0, 0, &e, NULL, WAIT_MS), "robustness: FINAL");
  const struct acc_wire_op* other = hx_op(&e, 0);
  const struct acc_wire_op* bc = hx_op(&e, 4);
  CHECK(other && other->cl == 1 && other->wr == 4 && other->wc == 4,
        "robustness: unattributed kind should have CL 1 (unknown func), WR 4, WC 4");
  CHECK(bc && bc->cl == 1 && bc->seq == 1 && bc->td_ns >= 1000000,
        "robustness: Broadcast TD from CPU clock, >= 1 ms");
  CHECK(e.pending_total == 0, "robustness: pending %u", e.pending_total);
  rx_close(&r);
  printf("ok   v%d robustness: NULL/unknown/foreign handles, PXN parent, CPU-clock TD\n",
         d->version);
}

/* 200 communicators: one snapshot spans two datagrams, the first flagged MORE. */
static void scenario_many_comms(const struct drv* d) {
  struct rx r;
  if (rx_start(&r, "many", "20") != 0) return;
  setenv("AEGIS_CCL_MAX_EVENTS", "16", 1);
  enum { N = 200 };
  static void* ctx[N];
  for (int i = 0; i < N; i++) {
    ctx[i] = init_ok(d, "many", 0x5000 + (uint64_t)i, 8, i % 8);
    drv_stop(d, drv_coll(d, ctx[i], "AllReduce", 0, 1));
  }
  unsetenv("AEGIS_CCL_MAX_EVENTS");
  static struct hx_dgram g;
  static char seen[N];
  int more = 0, got = 0, tries = 0;
  memset(seen, 0, sizeof(seen));
  while (got < N && tries++ < 400 && rx_next(&r, &g, WAIT_MS)) {
    more += (g.h.flags & ACC_WIRE_FLAG_MORE) != 0;
    for (unsigned i = 0; i < g.h.n_entries; i++) {
      uint64_t k = g.e[i].comm_hash - 0x5000;
      if (k < N && !seen[k]) {
        seen[k] = 1;
        got++;
      }
    }
  }
  CHECK(got == N && more >= 1, "many comms: %d of %d seen, %d MORE datagrams", got, N, more);
  for (int i = 0; i < N; i++) drv_finalize(d, ctx[i]);
  rx_close(&r);
  printf("ok   v%d many comms: %d entries split over datagrams (MORE seen %d times)\n",
         d->version, N, more);
}

/* drivers: v4, v5, v6, v7 (harness.c load). */
void run_safety(const struct drv drivers[N_VERSIONS]) {
  const struct drv* v4 = &drivers[0];
  scenario_socket_absent(v4);
  scenario_socket_full(v4);
  scenario_pool_exhausted(v4);
  for (int i = 0; i < N_VERSIONS; i++) scenario_robustness(&drivers[i]);
  scenario_many_comms(v4);
}

static int count_threads(void) {
  DIR* dir = opendir("/proc/self/task");
  int n = 0;
  if (dir == NULL) return -1;
  for (struct dirent* de; (de = readdir(dir)) != NULL;) n += de->d_name[0] != '.';
  closedir(dir);
  return n;
}

/* NCCL dlclose()s the plugin after the last finalize: no thread may outlive the code. */
void check_reload(const char* lib_path) {
  int before = count_threads();
  for (int round = 0; round < 3; round++) {
    void* lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL, "reload: dlopen %s", dlerror());
    if (lib == NULL) return;
    struct drv d = {.version = 4, .v4 = dlsym(lib, "ncclProfiler_v4")};
    set_env("/nonexistent/aegis.sock", "1");
    void* ctx = init_ok(&d, "reload", 0x7E10AD, 2, 0);
    CHECK(count_threads() == before + 1, "reload: reporter thread not running");
    drv_stop(&d, drv_coll(&d, ctx, "AllGather", 0, 1));
    sleep_ms(5);
    drv_finalize(&d, ctx);
    dlclose(lib);
    CHECK(count_threads() == before, "reload: %d threads after unload, %d before",
          count_threads(), before);
  }
  printf("ok   reload: 3 dlopen/init/finalize/dlclose rounds, no thread left behind\n");
}
