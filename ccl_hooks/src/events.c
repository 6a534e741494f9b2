/*
 * Event handling: the Aegis §4.2 counters (CL, WR, WC) and the §5.2 figures (TD, N),
 * kept per communicator and per collective kind.
 *
 *   CL  Coll/P2p startEvent calls (NCCL starts them when it launches the op's kernel plan),
 *       and from v6 CeColl ones (an intra-node collective run on the copy engines, which
 *       has no Coll event; it has no channels, so it gets no TD).
 *   WR  ProxyStep events that reach ncclProfilerProxyStepSendWait (isend posted) or
 *       ncclProfilerProxyStepRecvWait (irecv posted); each step counts once.
 *   WC  those posted steps that complete: a send step when it stops (the network test
 *       reported done), a recv step at RecvFlushWait / RecvGPUWait or stop, whichever first.
 *   N   mean of (completion - posting) over the last L = 5 completed steps, in ns.
 *   TD  duration of the last completed op: the GPU globaltimer span of its KernelCh
 *       events (min start .. max stop over its nChannels channels); CLOCK_MONOTONIC
 *       when a channel carried no GPU timestamps. seq says which launch it was.
 * Pending peers: per peer rank, posted-but-not-completed steps.
 */
#include <string.h>
#include <time.h>

#include "state.h"

uint64_t acc_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t coarse_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Kind codes shared with schemas/ccl_snapshot.py (OP_KINDS). 0 = other / unattributed. */
uint8_t acc_kind_of(const char* f) {
  if (f == NULL) return 0;
  switch (f[0]) {
    case 'A':
      if (strcmp(f, "AllReduce") == 0) return 1;
      if (strcmp(f, "AllGather") == 0) return 2;
      if (strcmp(f, "AlltoAll") == 0) return 6;
      return 0;
    case 'R':
      if (strcmp(f, "ReduceScatter") == 0) return 3;
      if (strcmp(f, "Reduce") == 0) return 5;
      if (strcmp(f, "Recv") == 0) return 10;
      return 0;
    case 'B':
      return strcmp(f, "Broadcast") == 0 ? 4 : 0;
    case 'G':
      return strcmp(f, "Gather") == 0 ? 7 : 0;
    case 'S':
      if (strcmp(f, "Scatter") == 0) return 8;
      if (strcmp(f, "Send") == 0) return 9;
      if (strcmp(f, "SendRecv") == 0) return 11;
      return 0;
    default:
      return 0;
  }
}

/* ---- bounded free list of event slots (Treiber stack with an ABA tag) ---- */

static struct acc_ev* pool_pop(struct acc_comm* c) {
  uint64_t head = atomic_load_explicit(&c->free_head, memory_order_acquire);
  for (;;) {
    uint32_t idx1 = (uint32_t)head;
    if (idx1 == 0) return NULL;
    struct acc_ev* ev = &c->pool[idx1 - 1];
    uint32_t next = atomic_load_explicit(&ev->next, memory_order_relaxed);
    uint64_t nh = (((head >> 32) + 1) << 32) | next;
    if (atomic_compare_exchange_weak_explicit(&c->free_head, &head, nh, memory_order_acquire,
                                              memory_order_acquire))
      return ev;
  }
}

static void pool_push(struct acc_comm* c, struct acc_ev* ev) {
  ev->hdr.type = ACC_EV_FREE;
  uint64_t head = atomic_load_explicit(&c->free_head, memory_order_relaxed);
  uint64_t nh;
  do {
    atomic_store_explicit(&ev->next, (uint32_t)head, memory_order_relaxed);
    nh = (((head >> 32) + 1) << 32) | (uint64_t)(ev->hdr.index + 1);
  } while (!atomic_compare_exchange_weak_explicit(&c->free_head, &head, nh, memory_order_release,
                                                  memory_order_relaxed));
}

/* A parent pointer from NCCL is used only if it points at one of this comm's slots. */
static struct acc_coll* as_coll(struct acc_comm* c, void* p) {
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)c->ring;
  if (p == NULL || a < lo || a >= lo + (uintptr_t)c->ring_size * sizeof(*c->ring)) return NULL;
  if ((a - lo) % sizeof(*c->ring) != 0) return NULL;
  return (struct acc_coll*)p;
}

static struct acc_ev* as_ev(struct acc_comm* c, void* p, uint32_t type) {
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)c->pool;
  if (p == NULL || a < lo || a >= lo + (uintptr_t)c->pool_size * sizeof(*c->pool)) return NULL;
  if ((a - lo) % sizeof(*c->pool) != 0) return NULL;
  struct acc_ev* ev = (struct acc_ev*)p;
  return ev->hdr.type == type ? ev : NULL;
}

/* Latest event time, written at most once per millisecond to keep the line shared. */
static void touch_at(struct acc_comm* c, uint64_t now) {
  uint64_t last = atomic_load_explicit(&c->last_event_ns, memory_order_relaxed);
  if (now > last + 1000000ull) atomic_store_explicit(&c->last_event_ns, now, memory_order_relaxed);
}

static void atomic_min_u64(_Atomic uint64_t* a, uint64_t v) {
  uint64_t cur = atomic_load_explicit(a, memory_order_relaxed);
  while (v < cur &&
         !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
}

static void atomic_max_u64(_Atomic uint64_t* a, uint64_t v) {
  uint64_t cur = atomic_load_explicit(a, memory_order_relaxed);
  while (v > cur &&
         !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
}

/* ---- starting events ---- */

static void start_coll(struct acc_comm* c, void** handle, const struct acc_descr* d) {
  uint8_t kind = acc_kind_of(d->func);
  uint64_t ord = atomic_fetch_add_explicit(&c->kinds[kind].cl, 1, memory_order_relaxed) + 1;
  uint64_t n = atomic_fetch_add_explicit(&c->ring_next, 1, memory_order_relaxed);
  struct acc_coll* s = &c->ring[n & (c->ring_size - 1)];
  atomic_store_explicit(&s->kind, kind, memory_order_relaxed);
  atomic_store_explicit(&s->nch, d->nch, memory_order_relaxed);
  atomic_store_explicit(&s->nch_done, 0, memory_order_relaxed);
  atomic_store_explicit(&s->nch_gpu, 0, memory_order_relaxed);
  atomic_store_explicit(&s->gpu_start, UINT64_MAX, memory_order_relaxed);
  atomic_store_explicit(&s->gpu_stop, 0, memory_order_relaxed);
  atomic_store_explicit(&s->cpu_start, UINT64_MAX, memory_order_relaxed);
  atomic_store_explicit(&s->cpu_stop, 0, memory_order_relaxed);
  atomic_store_explicit(&s->ord, ord, memory_order_release);
  *handle = s;
}

static void start_proxy_op(struct acc_comm* c, void** handle, const struct acc_descr* d) {
  struct acc_ev* ev = pool_pop(c);
  if (ev == NULL) {
    atomic_fetch_add_explicit(&c->exhausted, 1, memory_order_relaxed);
    return;
  }
  /* PXN: an op created by another process carries a parent from its address space. */
  struct acc_coll* parent = d->pid == c->pid ? as_coll(c, d->parent) : NULL;
  ev->hdr.type = ACC_EV_PROXY_OP;
  ev->kind = parent ? (uint8_t)atomic_load_explicit(&parent->kind, memory_order_relaxed) : 0;
  ev->dir = d->is_send ? ACC_DIR_SEND : ACC_DIR_RECV;
  ev->peer = d->peer;
  ev->posted = ev->completed = 0;
  for (uint32_t i = 0; i < ACC_OP_STEPS; i++)
    atomic_store_explicit(&ev->steps[i], 0, memory_order_relaxed);
  *handle = ev;
}

/* NCCL starts a step again when it could not post it yet (net.cc recvProxyProgress: the
 * kernel has not started on a registered buffer, irecv gave no request, maxDepth) and
 * never stops the handle it got before. A ProxyOp's unposted step in the same step % 8
 * slot is that handle: it is handed out again, so a spinning proxy cannot drain the pool
 * (it did: 8192 leaked slots froze WR, WC and N for the communicator's lifetime). */
static void start_proxy_step(struct acc_comm* c, void** handle, const struct acc_descr* d) {
  struct acc_ev* op = as_ev(c, d->parent, ACC_EV_PROXY_OP);
  _Atomic uint32_t* slot =
      op != NULL && d->step >= 0 ? &op->steps[(uint32_t)d->step % ACC_OP_STEPS] : NULL;
  if (slot != NULL) {
    uint32_t prev = atomic_load_explicit(slot, memory_order_relaxed);
    struct acc_ev* old = prev != 0 && prev <= c->pool_size ? &c->pool[prev - 1] : NULL;
    if (old != NULL && old->hdr.type == ACC_EV_PROXY_STEP && old->op1 == op->hdr.index + 1 &&
        !old->posted) {
      old->step = d->step;
      *handle = old;
      return;
    }
  }
  struct acc_ev* ev = pool_pop(c);
  if (ev == NULL) {
    atomic_fetch_add_explicit(&c->exhausted, 1, memory_order_relaxed);
    return;
  }
  ev->hdr.type = ACC_EV_PROXY_STEP;
  ev->kind = op ? op->kind : 0;
  ev->dir = op ? op->dir : ACC_DIR_UNKNOWN;
  ev->peer = op ? op->peer : -1;
  ev->posted = ev->completed = 0;
  ev->t_post = 0;
  ev->step = d->step;
  ev->op1 = op ? op->hdr.index + 1 : 0;
  if (slot != NULL) atomic_store_explicit(slot, ev->hdr.index + 1, memory_order_relaxed);
  *handle = ev;
}

/* A stopped step leaves its ProxyOp's slot (if the op still holds it there). */
static void step_released(struct acc_comm* c, struct acc_ev* ev) {
  if (ev->op1 == 0 || ev->op1 > c->pool_size || ev->step < 0) return;
  struct acc_ev* op = &c->pool[ev->op1 - 1];
  uint32_t mine = ev->hdr.index + 1;
  if (op->hdr.type == ACC_EV_PROXY_OP)
    atomic_compare_exchange_strong_explicit(&op->steps[(uint32_t)ev->step % ACC_OP_STEPS],
                                            &mine, 0, memory_order_relaxed,
                                            memory_order_relaxed);
}

static void start_kernel_ch(struct acc_comm* c, void** handle, const struct acc_descr* d) {
  struct acc_coll* parent = as_coll(c, d->parent);
  if (parent == NULL) return; /* nothing to time it against */
  struct acc_ev* ev = pool_pop(c);
  if (ev == NULL) {
    atomic_fetch_add_explicit(&c->exhausted, 1, memory_order_relaxed);
    return;
  }
  ev->hdr.type = ACC_EV_KERNEL_CH;
  ev->parent = parent;
  ev->parent_ord = atomic_load_explicit(&parent->ord, memory_order_acquire);
  ev->gpu_start = d->ptimer;
  ev->gpu_stop = 0;
  ev->cpu_start = acc_mono_ns();
  *handle = ev;
}

void acc_start(struct acc_comm* c, void** handle, const struct acc_descr* d) {
  *handle = NULL;
  if (c == NULL || d == NULL) return;
  touch_at(c, coarse_ns());
  if (d->type == ncclProfileColl || d->type == ncclProfileP2p || d->type == ncclProfileCeColl) {
    start_coll(c, handle, d);
  } else if (d->type == ncclProfileProxyOp) {
    start_proxy_op(c, handle, d);
  } else if (d->type == ncclProfileProxyStep) {
    start_proxy_step(c, handle, d);
  } else if (d->type == ncclProfileKernelCh) {
    start_kernel_ch(c, handle, d);
  }
}

/* ---- step posting and completion ---- */

static void step_posted(struct acc_comm* c, struct acc_ev* ev, uint8_t dir) {
  if (ev->posted) return;
  ev->posted = 1;
  if (ev->dir == ACC_DIR_UNKNOWN) ev->dir = dir;
  ev->t_post = acc_mono_ns();
  touch_at(c, ev->t_post);
  if (ev->peer >= 0 && (uint32_t)ev->peer < c->peer_slots)
    atomic_fetch_add_explicit(&c->peer_out[ev->peer], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&c->kinds[ev->kind].wr, 1, memory_order_release);
}

static void step_completed(struct acc_comm* c, struct acc_ev* ev) {
  if (!ev->posted || ev->completed) return;
  ev->completed = 1;
  struct acc_kind* k = &c->kinds[ev->kind];
  uint64_t now = acc_mono_ns(), dt = now - ev->t_post;
  touch_at(c, now);
  uint64_t i = atomic_fetch_add_explicit(&k->n_total, 1, memory_order_relaxed);
  atomic_store_explicit(&k->n_ring[i % ACC_N_LAST], dt, memory_order_relaxed);
  if (ev->peer >= 0 && (uint32_t)ev->peer < c->peer_slots)
    atomic_fetch_sub_explicit(&c->peer_out[ev->peer], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&k->wc, 1, memory_order_release);
}

void acc_record(void* handle, int state, uint64_t ptimer) {
  if (handle == NULL) return;
  struct acc_hdr* h = handle;
  struct acc_comm* c = h->comm;
  if (h->type == ACC_EV_PROXY_STEP) {
    struct acc_ev* ev = handle;
    switch (state) {
      case ncclProfilerProxyStepSendWait:
        step_posted(c, ev, ACC_DIR_SEND);
        break;
      case ncclProfilerProxyStepRecvWait:
        step_posted(c, ev, ACC_DIR_RECV);
        break;
      case ncclProfilerProxyStepRecvFlushWait:
      case ncclProfilerProxyStepRecvGPUWait:
        step_completed(c, ev);
        break;
      default:
        break; /* SendGPUWait, SendPeerWait_v4: not yet on the network */
    }
  } else if (h->type == ACC_EV_KERNEL_CH && state == ncclProfilerKernelChStop) {
    ((struct acc_ev*)handle)->gpu_stop = ptimer;
  }
}

/* ---- stopping events ---- */

static void kernel_ch_done(struct acc_comm* c, struct acc_ev* ev) {
  struct acc_coll* s = ev->parent;
  if (atomic_load_explicit(&s->ord, memory_order_acquire) != ev->parent_ord) return; /* reused */
  if (ev->gpu_start != 0 && ev->gpu_stop >= ev->gpu_start) {
    atomic_min_u64(&s->gpu_start, ev->gpu_start);
    atomic_max_u64(&s->gpu_stop, ev->gpu_stop);
    atomic_fetch_add_explicit(&s->nch_gpu, 1, memory_order_relaxed);
  }
  uint64_t now = acc_mono_ns();
  touch_at(c, now);
  atomic_min_u64(&s->cpu_start, ev->cpu_start);
  atomic_max_u64(&s->cpu_stop, now);
  uint32_t done = atomic_fetch_add_explicit(&s->nch_done, 1, memory_order_acq_rel) + 1;
  uint32_t nch = atomic_load_explicit(&s->nch, memory_order_relaxed);
  if (done != nch) return;
  uint64_t td;
  if (atomic_load_explicit(&s->nch_gpu, memory_order_relaxed) == nch)
    td = atomic_load_explicit(&s->gpu_stop, memory_order_relaxed) -
         atomic_load_explicit(&s->gpu_start, memory_order_relaxed);
  else
    td = atomic_load_explicit(&s->cpu_stop, memory_order_relaxed) -
         atomic_load_explicit(&s->cpu_start, memory_order_relaxed);
  struct acc_kind* k = &c->kinds[atomic_load_explicit(&s->kind, memory_order_relaxed)];
  lock_td(k);
  if (ev->parent_ord >= k->td_seq) {
    k->td_seq = ev->parent_ord;
    k->td_ns = td;
  }
  unlock_td(k);
}

void acc_stop(void* handle) {
  if (handle == NULL) return;
  struct acc_hdr* h = handle;
  struct acc_comm* c = h->comm;
  switch (h->type) {
    case ACC_EV_PROXY_STEP:
      step_completed(c, handle);
      step_released(c, handle);
      pool_push(c, handle);
      break;
    case ACC_EV_KERNEL_CH:
      kernel_ch_done(c, handle);
      pool_push(c, handle);
      break;
    case ACC_EV_PROXY_OP:
      pool_push(c, handle);
      break;
    default:
      break; /* Coll/P2p stop means "enqueued"; the ring slot stays for its children */
  }
}
