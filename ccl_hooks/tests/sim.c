/* Simulated NCCL rank: user, proxy and kernel threads (see sim.h). */
#include "sim.h"

#include <string.h>
#include <unistd.h>

static void q_init(struct sim_queue* q) {
  memset(q, 0, sizeof(*q));
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->cv, NULL);
}

static void q_destroy(struct sim_queue* q) {
  pthread_mutex_destroy(&q->mu);
  pthread_cond_destroy(&q->cv);
}

static void q_push(struct sim_queue* q, const struct sim_work* w) {
  pthread_mutex_lock(&q->mu);
  q->items[q->tail++ % SIM_QCAP] = *w;
  pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

static void q_close(struct sim_queue* q) {
  pthread_mutex_lock(&q->mu);
  q->closed = 1;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

static int q_pop(struct sim_queue* q, struct sim_work* w) {
  pthread_mutex_lock(&q->mu);
  while (q->head == q->tail && !q->closed) pthread_cond_wait(&q->cv, &q->mu);
  int ok = q->head != q->tail;
  if (ok) *w = q->items[q->head++ % SIM_QCAP];
  pthread_mutex_unlock(&q->mu);
  return ok;
}

void sim_setup(struct sim_rank* s, const struct drv* d, void* ctx, int rank, int nranks,
               int n_ops) {
  memset(s, 0, sizeof(*s));
  s->d = d;
  s->ctx = ctx;
  s->rank = rank;
  s->nranks = nranks;
  s->n_ops = n_ops;
  s->send_peer = (rank + 1) % nranks;
  s->recv_peer = (rank + nranks - 1) % nranks;
  q_init(&s->to_proxy);
  q_init(&s->to_kernel);
}

static void* user_main(void* arg) {
  struct sim_rank* s = arg;
  for (int i = 0; i < s->n_ops; i++) {
    struct sim_work w = {NULL, i, 0, SIM_KIND_AR, s->hang_last && i == s->n_ops - 1};
    if (!s->only_ar) w.kind = i % 3 == 0 ? SIM_KIND_AR : i % 3 == 1 ? SIM_KIND_AG : SIM_KIND_SEND;
    if (w.kind == SIM_KIND_SEND)
      w.coll = drv_p2p(s->d, s->ctx, "Send", s->send_peer, 1);
    else
      w.coll = drv_coll(s->d, s->ctx, w.kind == SIM_KIND_AR ? "AllReduce" : "AllGather",
                        (uint64_t)i, SIM_NCH);
    CHECK(w.coll != NULL, "rank %d op %d: NULL collective handle", s->rank, i);
    w.ord = ++s->cl[w.kind];
    q_push(&s->to_proxy, &w);
    drv_stop(s->d, w.coll); /* NCCL: the op is enqueued; the handle stays the children's parent */
  }
  q_close(&s->to_proxy);
  return NULL;
}

static void run_steps(struct sim_rank* s, void* op, int send, int hang, void** steps) {
  for (int k = 0; k < SIM_STEPS; k++) {
    for (int r = 0; !send && r < s->restarts; r++) {
      void* again = drv_proxy_step(s->d, s->ctx, op, k);
      CHECK(again != NULL, "rank %d: NULL handle for a re-started step", s->rank);
    }
    steps[k] = drv_proxy_step(s->d, s->ctx, op, k);
    CHECK(steps[k] != NULL, "rank %d: NULL step handle", s->rank);
    if (send) {
      drv_state(s->d, steps[k], ncclProfilerProxyStepSendGPUWait, 0);
      drv_state(s->d, steps[k], ncclProfilerProxyStepSendPeerWait_v4, 65536);
      drv_state(s->d, steps[k], ncclProfilerProxyStepSendWait, 65536);
    } else {
      drv_state(s->d, steps[k], ncclProfilerProxyStepRecvWait, 0);
    }
  }
  if (hang) return;
  for (int k = 0; k < SIM_STEPS; k++) {
    if (!send) {
      drv_state(s->d, steps[k], ncclProfilerProxyStepRecvFlushWait, 65536);
      drv_state(s->d, steps[k], ncclProfilerProxyStepRecvGPUWait, 65536);
    }
    drv_stop(s->d, steps[k]);
  }
}

static void* proxy_main(void* arg) {
  struct sim_rank* s = arg;
  struct sim_work w;
  pid_t pid = getpid();
  while (q_pop(&s->to_proxy, &w)) {
    void* steps[2][SIM_STEPS];
    int two = w.kind != SIM_KIND_SEND;
    void* send_op = drv_proxy_op(s->d, s->ctx, w.coll, pid, s->send_peer, 1, SIM_STEPS);
    void* recv_op = two ? drv_proxy_op(s->d, s->ctx, w.coll, pid, s->recv_peer, 0, SIM_STEPS) : NULL;
    CHECK(send_op != NULL && (recv_op != NULL || !two), "rank %d: NULL proxy op", s->rank);
    run_steps(s, send_op, 1, w.hang, steps[0]);
    if (two) run_steps(s, recv_op, 0, w.hang, steps[1]);
    uint64_t posted = (uint64_t)SIM_STEPS * (two ? 2 : 1);
    s->wr[w.kind] += posted;
    if (w.hang) continue; /* stuck in the network: nothing completes, nothing stops */
    s->wc[w.kind] += posted;
    drv_stop(s->d, send_op);
    if (two) drv_stop(s->d, recv_op);
    q_push(&s->to_kernel, &w);
  }
  q_close(&s->to_kernel);
  return NULL;
}

static void* kernel_main(void* arg) {
  struct sim_rank* s = arg;
  struct sim_work w;
  while (q_pop(&s->to_kernel, &w)) {
    int nch = w.kind == SIM_KIND_SEND ? 1 : SIM_NCH;
    uint64_t base = (uint64_t)(w.index + 1) * 10000000ull;
    uint64_t dur = 5000 + (uint64_t)w.index * 7 + (uint64_t)s->rank * 1000;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int ch = 0; ch < nch; ch++) {
      uint64_t t0 = base + (uint64_t)ch * 100, t1 = t0 + dur - (uint64_t)ch * 150;
      void* h = drv_kernel_ch(s->d, s->ctx, w.coll, (uint8_t)ch, t0);
      CHECK(h != NULL, "rank %d: NULL kernel channel handle", s->rank);
      drv_state(s->d, h, ncclProfilerKernelChStop, t1);
      drv_stop(s->d, h);
      lo = t0 < lo ? t0 : lo;
      hi = t1 > hi ? t1 : hi;
    }
    s->seq[w.kind] = w.ord;
    s->td[w.kind] = hi - lo;
  }
  return NULL;
}

void sim_start(struct sim_rank* s) {
  pthread_create(&s->kernel, NULL, kernel_main, s);
  pthread_create(&s->proxy, NULL, proxy_main, s);
  pthread_create(&s->user, NULL, user_main, s);
}

void sim_join(struct sim_rank* s) {
  pthread_join(s->user, NULL);
  pthread_join(s->proxy, NULL);
  pthread_join(s->kernel, NULL);
  q_destroy(&s->to_proxy);
  q_destroy(&s->to_kernel);
}

void sim_check(const struct sim_rank* s, const struct acc_wire_entry* e, const char* what) {
  CHECK(e->nranks == (uint32_t)s->nranks && e->rank == (uint32_t)s->rank, "%s: rank %u/%u", what,
        e->rank, e->nranks);
  CHECK(e->handles_exhausted == 0, "%s: %u handles exhausted", what, e->handles_exhausted);
  for (uint8_t k = 0; k < ACC_N_KINDS; k++) {
    const struct acc_wire_op* o = hx_op(e, k);
    if (s->cl[k] == 0 && s->wr[k] == 0) {
      CHECK(o == NULL, "%s: kind %u reported but never used", what, k);
      continue;
    }
    CHECK(o != NULL, "%s: kind %u missing", what, k);
    if (o == NULL) continue;
    CHECK(o->cl == s->cl[k], "%s kind %u: CL %lu, expected %lu", what, k, (unsigned long)o->cl,
          (unsigned long)s->cl[k]);
    CHECK(o->wr == s->wr[k], "%s kind %u: WR %lu, expected %lu", what, k, (unsigned long)o->wr,
          (unsigned long)s->wr[k]);
    CHECK(o->wc == s->wc[k], "%s kind %u: WC %lu, expected %lu", what, k, (unsigned long)o->wc,
          (unsigned long)s->wc[k]);
    CHECK(o->seq == s->seq[k], "%s kind %u: TD seq %lu, expected %lu", what, k,
          (unsigned long)o->seq, (unsigned long)s->seq[k]);
    CHECK(o->td_ns == s->td[k], "%s kind %u: TD %lu ns, expected %lu", what, k,
          (unsigned long)o->td_ns, (unsigned long)s->td[k]);
    uint64_t samples = s->wc[k] < ACC_N_LAST ? s->wc[k] : ACC_N_LAST;
    CHECK(o->n_samples == samples, "%s kind %u: N over %u samples, expected %lu", what, k,
          o->n_samples, (unsigned long)samples);
  }
}
