/*
 * Scenarios from the Aegis §4.2 rules: normal training, a compute hang (one rank stops
 * launching), a network hang (WR posted, WC never comes, peers pending), and the
 * plugin's safety properties: socket absent, socket full, event pool exhausted,
 * malformed calls, many communicators, unload.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sim.h"

#define WAIT_MS 8000

static void set_env(const char* sock, const char* interval_ms) {
  setenv("AEGIS_CCL_SOCKET", sock, 1);
  setenv("AEGIS_CCL_INTERVAL_MS", interval_ms, 1);
  unsetenv("AEGIS_CCL_MAX_EVENTS");
  unsetenv("AEGIS_CCL_EVENT_MASK");
}

static void sleep_ms(int ms) { usleep((useconds_t)ms * 1000); }

/* Forget datagrams encoded while the simulation was still running: those queued, and
 * the one that may have been encoded before the join but sent after it. */
static void rx_drain(struct rx* r) {
  static uint8_t junk[65536];
  static struct hx_dgram g;
  while (recv(r->fd, junk, sizeof(junk), MSG_DONTWAIT) > 0) {
  }
  rx_next(r, &g, WAIT_MS);
}

static void* init_ok(const struct drv* d, const char* name, uint64_t hash, int nranks, int rank) {
  void* ctx = NULL;
  int mask = 0;
  int rc = drv_init(d, &ctx, &mask, name, hash, nranks, rank);
  CHECK(rc == ncclSuccess && ctx != NULL, "init %s rank %d: rc %d", name, rank, rc);
  int want = ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep |
             ncclProfileKernelCh;
  CHECK(mask == want, "init %s: activation mask 0x%x, expected 0x%x", name, mask, want);
  return ctx;
}

/* Two ranks of one communicator in this process, three threads each. */
static void scenario_normal(const struct drv* d) {
  char path[108];
  make_sock_path(path, sizeof(path), "normal");
  struct rx r;
  if (rx_open(&r, path) != 0) return;
  set_env(path, "10");
  setenv("LOCAL_RANK", "1", 1);
  setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7", 1);
  uint64_t hash = 0xA11CE5000000000ull + (uint64_t)d->version;
  static struct sim_rank s[2];
  int n_ops = g_quick ? 30 : 300;
  for (int k = 0; k < 2; k++) {
    sim_setup(&s[k], d, init_ok(d, "normal", hash, 4, k), k, 4, n_ops);
    s[k].send_peer = k + 2;
    s[k].recv_peer = k + 2;
  }
  unsetenv("LOCAL_RANK");
  unsetenv("CUDA_VISIBLE_DEVICES");
  for (int k = 0; k < 2; k++) sim_start(&s[k]);
  for (int k = 0; k < 2; k++) sim_join(&s[k]);
  struct acc_wire_entry e;
  CHECK(rx_wait_entry(&r, hash, 0, 0, SIM_KIND_AR, s[0].cl[SIM_KIND_AR], &e, NULL, WAIT_MS),
        "v%d normal: no periodic snapshot with the final counters", d->version);
  for (int k = 0; k < 2; k++) {
    drv_finalize(d, s[k].ctx);
    char what[64];
    snprintf(what, sizeof(what), "v%d normal rank %d", d->version, k);
    if (!rx_wait_entry(&r, hash, (uint32_t)k, 1, 0, 0, &e, NULL, WAIT_MS)) {
      CHECK(0, "%s: no FINAL entry", what);
      continue;
    }
    sim_check(&s[k], &e, what);
    CHECK(e.local_gpu == 5, "%s: local gpu %d, expected 5 (CUDA_VISIBLE_DEVICES[LOCAL_RANK])",
          what, e.local_gpu);
    CHECK(e.pending_total == 0 && e.n_pending == 0, "%s: pending peers %u", what, e.pending_total);
    CHECK(e.last_event_ns > 0, "%s: no last event time", what);
    const struct acc_wire_op* o = hx_op(&e, SIM_KIND_AR);
    CHECK(o != NULL && o->n_ns > 0, "%s: N not measured", what);
  }
  rx_close(&r);
  printf("ok   v%d normal: 2 ranks x %d ops, CL/WR/WC/TD/N exact, FINAL entries\n", d->version,
         n_ops);
}

/* Rank 1 stops launching: CL(AllReduce, rank 1) < CL(AllReduce, rank 0), and snapshots
 * keep coming while everyone is stuck. */
static void scenario_compute_hang(const struct drv* d) {
  char path[108];
  make_sock_path(path, sizeof(path), "chang");
  struct rx r;
  if (rx_open(&r, path) != 0) return;
  set_env(path, "10");
  uint64_t hash = 0xC0FFEE;
  static struct sim_rank s[2];
  for (int k = 0; k < 2; k++) {
    sim_setup(&s[k], d, init_ok(d, "chang", hash, 2, k), k, 2, k == 0 ? 10 : 9);
    s[k].only_ar = 1;
  }
  s[0].hang_last = 1; /* rank 0 entered op 10 and waits for rank 1's data */
  for (int k = 0; k < 2; k++) sim_start(&s[k]);
  for (int k = 0; k < 2; k++) sim_join(&s[k]);
  rx_drain(&r);
  struct acc_wire_entry e0, e1;
  struct acc_wire_header h0, h1;
  int ok = rx_wait_entry(&r, hash, 0, 0, SIM_KIND_AR, 10, &e0, &h0, WAIT_MS);
  CHECK(ok, "compute hang: rank 0 never showed CL=10");
  /* every later snapshot must show the same stuck state */
  int stalled = 0;
  uint32_t last_seq = h0.seq;
  for (int i = 0; i < 5; i++) {
    if (!rx_wait_entry(&r, hash, 1, 0, SIM_KIND_AR, 9, &e1, &h1, WAIT_MS)) break;
    const struct acc_wire_op* o1 = hx_op(&e1, SIM_KIND_AR);
    CHECK(o1 && o1->cl == 9 && o1->wr == o1->wc && o1->seq == 9, "compute hang: rank 1 state");
    CHECK(h1.seq > last_seq, "compute hang: datagram seq %u after %u", h1.seq, last_seq);
    last_seq = h1.seq;
    stalled++;
  }
  CHECK(stalled == 5, "compute hang: %d snapshots while stalled, expected 5", stalled);
  const struct acc_wire_op* o0 = hx_op(&e0, SIM_KIND_AR);
  CHECK(o0 && o0->cl == 10 && o0->wr == o0->wc + 2 * SIM_STEPS && o0->seq == 9,
        "compute hang: rank 0 CL 10, WR-WC %d, TD seq 9", 2 * SIM_STEPS);
  CHECK(e0.pending_total == 1 && e0.n_pending == 1 && e0.pending[0] == 1,
        "compute hang: rank 0 waits on peer 1");
  for (int k = 0; k < 2; k++) {
    drv_finalize(d, s[k].ctx); /* steps still open, as after ncclCommAbort */
    struct acc_wire_entry f;
    CHECK(rx_wait_entry(&r, hash, (uint32_t)k, 1, 0, 0, &f, NULL, WAIT_MS), "compute hang FINAL");
    sim_check(&s[k], &f, k ? "compute hang rank 1" : "compute hang rank 0");
  }
  rx_close(&r);
  printf("ok   v%d compute hang: CL 10 vs 9 localises rank 1; %d snapshots while stalled\n",
         d->version, stalled);
}

/* Everyone inside op 3; rank 0's sends to 5 and receives from 7 never complete. */
static void scenario_network_hang(const struct drv* d) {
  char path[108];
  make_sock_path(path, sizeof(path), "nhang");
  struct rx r;
  if (rx_open(&r, path) != 0) return;
  set_env(path, "10");
  uint64_t hash = 0xDEAD0BEEF;
  static struct sim_rank s;
  sim_setup(&s, d, init_ok(d, "nhang", hash, 8, 0), 0, 8, 3);
  s.only_ar = 1;
  s.hang_last = 1;
  s.send_peer = 5;
  s.recv_peer = 7;
  sim_start(&s);
  sim_join(&s);
  rx_drain(&r);
  struct acc_wire_entry e;
  CHECK(rx_wait_entry(&r, hash, 0, 0, SIM_KIND_AR, 3, &e, NULL, WAIT_MS), "network hang: no CL=3");
  const struct acc_wire_op* o = hx_op(&e, SIM_KIND_AR);
  CHECK(o && o->wr - o->wc == 2 * SIM_STEPS && o->seq == 2,
        "network hang: WR-WC should be %d with TD seq 2", 2 * SIM_STEPS);
  CHECK(e.pending_total == 2 && e.n_pending == 2 && e.pending[0] == 5 && e.pending[1] == 7,
        "network hang: pending peers should be {5, 7}");
  drv_finalize(d, s.ctx);
  CHECK(rx_wait_entry(&r, hash, 0, 1, 0, 0, &e, NULL, WAIT_MS), "network hang: FINAL");
  sim_check(&s, &e, "network hang");
  rx_close(&r);
  printf("ok   v%d network hang: WR-WC=%d, pending peers {5,7}\n", d->version, 2 * SIM_STEPS);
}

/* No receiver: everything still works; a receiver that appears later learns the loss. */
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
  char path[108];
  make_sock_path(path, sizeof(path), "full");
  struct rx r;
  if (rx_open(&r, path) != 0) return;
  set_env(path, "1");
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
  char path[108];
  make_sock_path(path, sizeof(path), "pool");
  struct rx r;
  if (rx_open(&r, path) != 0) return;
  set_env(path, "1000");
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
  char path[108];
  make_sock_path(path, sizeof(path), "robust");
  struct rx r;
  if (rx_open(&r, path) != 0) return;
  set_env(path, "1000");
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
  if (d->version == 5) {
    uint64_t api[] = {ncclProfileGroupApi, ncclProfileCollApi, ncclProfileP2pApi,
                      ncclProfileKernelLaunch, 1ull << 40};
    for (size_t i = 0; i < sizeof(api) / sizeof(api[0]); i++)
      CHECK(drv_raw(d, ctx, api[i], NULL) == NULL, "v5 type 0x%lx", (unsigned long)api[i]);
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
  char path[108];
  make_sock_path(path, sizeof(path), "many");
  struct rx r;
  if (rx_open(&r, path) != 0) return;
  set_env(path, "20");
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

int run_scenarios(const struct drv* v4, const struct drv* v5, const char* lib_path) {
  (void)lib_path;
  scenario_normal(v4);
  scenario_normal(v5);
  scenario_compute_hang(v4);
  scenario_network_hang(v4);
  scenario_network_hang(v5);
  scenario_socket_absent(v4);
  scenario_socket_full(v4);
  scenario_pool_exhausted(v4);
  scenario_robustness(v4);
  scenario_robustness(v5);
  scenario_many_comms(v4);
  return g_failures;
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
    struct drv d = {4, dlsym(lib, "ncclProfiler_v4"), NULL};
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
