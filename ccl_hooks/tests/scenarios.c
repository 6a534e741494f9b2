/*
 * Scenarios from the Aegis §4.2 rules: normal training, a compute hang (one rank stops
 * launching), a network hang (WR posted, WC never comes, peers pending). The plugin's
 * safety properties are in safety.c.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sim.h"

void set_env(const char* sock, const char* interval_ms) {
  setenv("AEGIS_CCL_SOCKET", sock, 1);
  setenv("AEGIS_CCL_INTERVAL_MS", interval_ms, 1);
  unsetenv("AEGIS_CCL_MAX_EVENTS");
  unsetenv("AEGIS_CCL_EVENT_MASK");
}

/* A receiving socket named after the scenario, and the plugin's environment pointed at it. */
int rx_start(struct rx* r, const char* tag, const char* interval_ms) {
  char path[108];
  make_sock_path(path, sizeof(path), tag);
  if (rx_open(r, path) != 0) return -1;
  set_env(r->path, interval_ms);
  return 0;
}

void sleep_ms(int ms) { usleep((useconds_t)ms * 1000); }

/* Forget datagrams encoded while the simulation was still running: those queued, and
 * the one that may have been encoded before the join but sent after it. */
void rx_drain(struct rx* r) {
  static uint8_t junk[65536];
  static struct hx_dgram g;
  while (recv(r->fd, junk, sizeof(junk), MSG_DONTWAIT) > 0) {
  }
  rx_next(r, &g, WAIT_MS);
}

void* init_ok(const struct drv* d, const char* name, uint64_t hash, int nranks, int rank) {
  void* ctx = NULL;
  int mask = 0;
  int rc = drv_init(d, &ctx, &mask, name, hash, nranks, rank);
  CHECK(rc == ncclSuccess && ctx != NULL, "init %s rank %d: rc %d", name, rank, rc);
  int want = ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep |
             ncclProfileKernelCh | (d->version >= 6 ? ncclProfileCeColl : 0);
  CHECK(mask == want, "init %s: activation mask 0x%x, expected 0x%x", name, mask, want);
  return ctx;
}

/* Two ranks of one communicator in this process, three threads each. */
static void scenario_normal(const struct drv* d) {
  struct rx r;
  if (rx_start(&r, "normal", "10") != 0) return;
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
  /* rank 1's recv steps are re-started before they post, as NCCL does: enough times to
   * drain the 8192 slots if re-started handles were not reused */
  s[1].restarts = g_quick ? 120 : 12;
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
  printf("ok   v%d normal: 2 ranks x %d ops (rank 1 re-starting its recv steps), CL/WR/WC/TD/N "
         "exact, FINAL entries\n", d->version, n_ops);
}

/* Rank 1 stops launching: CL(AllReduce, rank 1) < CL(AllReduce, rank 0), and snapshots
 * keep coming while everyone is stuck. */
static void scenario_compute_hang(const struct drv* d) {
  struct rx r;
  if (rx_start(&r, "chang", "10") != 0) return;
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
  struct rx r;
  if (rx_start(&r, "nhang", "10") != 0) return;
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

/* v6+: collectives on the copy engines come as CeColl events only (no Coll, no channels,
 * no proxy steps), stopped once enqueued, with CeSync/CeBatch children. Each is a launch:
 * CL counts it; it has no WR/WC and no TD. A kernel collective beside it counts as usual. */
static void scenario_copy_engine(const struct drv* d) {
  struct rx r;
  if (rx_start(&r, "ce", "10") != 0) return;
  uint64_t hash = 0xCE0000000ull + (uint64_t)d->version;
  enum { N_CE = 25 };
  void* ctx[2];
  for (int k = 0; k < 2; k++) ctx[k] = init_ok(d, "ce", hash, 2, k);
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < N_CE; i++) {
      void* api = drv_raw(d, ctx[k], ncclProfileCollApi, NULL);
      CHECK(api == NULL, "v%d CollApi got a handle", d->version);
      void* ce = drv_ce_coll(d, ctx[k], api, "AllGather", 2 * (uint64_t)i + 1);
      CHECK(ce != NULL, "v%d CeColl got no handle", d->version);
      void* sync = drv_raw(d, ctx[k], ncclProfileCeSync, ce);
      void* batch = drv_raw(d, ctx[k], ncclProfileCeBatch, ce);
      CHECK(sync == NULL && batch == NULL, "v%d CeSync/CeBatch should get NULL", d->version);
      drv_state(d, ce, ncclProfilerCeCollStart, 0); /* declared, never sent: ignored */
      drv_stop(d, batch);
      drv_stop(d, sync);
      drv_stop(d, ce); /* enqueued: the copies may still run */
    }
    /* one kernel AllReduce on one channel beside them, timed by the GPU */
    void* coll = drv_coll(d, ctx[k], "AllReduce", 1, 1);
    void* ch = drv_kernel_ch(d, ctx[k], coll, 0, 1000);
    void* phase = drv_raw(d, ctx[k], ncclProfileKernelPhase, ch); /* v7: not asked for */
    CHECK(phase == NULL, "v%d KernelPhase should get NULL", d->version);
    drv_state(d, phase, ncclProfilerKernelPhaseStop, 1500);
    drv_stop(d, phase);
    drv_state(d, ch, ncclProfilerKernelChStop, 1000 + 250000);
    drv_stop(d, ch);
    drv_stop(d, coll);
  }
  for (int k = 0; k < 2; k++) {
    drv_finalize(d, ctx[k]);
    struct acc_wire_entry e;
    if (!rx_wait_entry(&r, hash, (uint32_t)k, 1, 0, 0, &e, NULL, WAIT_MS)) {
      CHECK(0, "v%d copy engine rank %d: no FINAL entry", d->version, k);
      continue;
    }
    const struct acc_wire_op* ag = hx_op(&e, SIM_KIND_AG);
    const struct acc_wire_op* ar = hx_op(&e, SIM_KIND_AR);
    CHECK(ag && ag->cl == N_CE && ag->wr == 0 && ag->wc == 0 && ag->seq == 0 && ag->td_ns == 0,
          "v%d copy engine rank %d: AllGather should have CL %d, no WR/WC, no TD", d->version,
          k, N_CE);
    CHECK(ar && ar->cl == 1 && ar->seq == 1 && ar->td_ns == 250000,
          "v%d copy engine rank %d: AllReduce CL 1, TD 250 us from the GPU", d->version, k);
    CHECK(hx_op(&e, 0) == NULL, "v%d copy engine rank %d: events counted as kind other",
          d->version, k);
    CHECK(e.handles_exhausted == 0, "v%d copy engine: handles exhausted", d->version);
  }
  rx_close(&r);
  printf("ok   v%d copy engine: %d CeColl counted as AllGather launches (no WR/WC/TD), "
         "CeSync/CeBatch/KernelPhase ignored\n", d->version, N_CE);
}

/* drivers: v4, v5, v6, v7 (harness.c load). */
int run_scenarios(const struct drv drivers[N_VERSIONS], const char* lib_path) {
  (void)lib_path;
  const struct drv *v4 = &drivers[0], *v6 = &drivers[2], *v7 = &drivers[3];
  for (int i = 0; i < N_VERSIONS; i++) scenario_normal(&drivers[i]);
  scenario_compute_hang(v4);
  scenario_compute_hang(v7);
  for (int i = 0; i < N_VERSIONS; i++) scenario_network_hang(&drivers[i]);
  scenario_copy_engine(v6);
  scenario_copy_engine(v7);
  run_safety(drivers);
  return g_failures;
}
