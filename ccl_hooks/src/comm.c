/*
 * A communicator's state: created at ncclProfiler init, freed at finalize (plugin.c), and
 * read by the reporter thread (reporter.c) into one wire entry per report.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "state.h"

#define ACC_RING_SIZE 1024u

struct acc_comm* acc_comm_new(uint64_t hash, int nranks, int rank, int nnodes, const char* name,
                              ncclDebugLogger_t log) {
  struct acc_comm* c = calloc(1, sizeof(*c));
  if (c == NULL) return NULL;
  c->hash = hash;
  c->nranks = (uint32_t)nranks;
  c->rank = (uint32_t)rank;
  c->nnodes = nnodes;
  c->pid = getpid();
  c->log = log;
  c->local_gpu = acc_local_gpu();
  if (name != NULL) strncpy(c->name, name, sizeof(c->name) - 1);
  for (int k = 0; k < ACC_N_KINDS; k++) atomic_flag_clear(&c->kinds[k].td_lock);

  c->ring_size = ACC_RING_SIZE;
  c->pool_size = (uint32_t)acc_env_int("AEGIS_CCL_MAX_EVENTS", 8192, 16, 1 << 20);
  c->peer_slots = c->nranks < (1u << 20) ? c->nranks : (1u << 20);
  c->ring = calloc(c->ring_size, sizeof(*c->ring));
  c->pool = calloc(c->pool_size, sizeof(*c->pool));
  c->peer_out = calloc(c->peer_slots, sizeof(*c->peer_out));
  if (c->ring == NULL || c->pool == NULL || c->peer_out == NULL) {
    acc_comm_free(c);
    return NULL;
  }
  for (uint32_t i = 0; i < c->ring_size; i++) {
    c->ring[i].hdr = (struct acc_hdr){ACC_EV_COLL, i, c};
  }
  for (uint32_t i = 0; i < c->pool_size; i++) {
    c->pool[i].hdr = (struct acc_hdr){ACC_EV_FREE, i, c};
    atomic_init(&c->pool[i].next, i + 1 < c->pool_size ? i + 2 : 0);
  }
  atomic_init(&c->free_head, 1);
  return c;
}

void acc_comm_free(struct acc_comm* c) {
  if (c == NULL) return;
  free(c->ring);
  free(c->pool);
  free((void*)c->peer_out);
  free(c);
}

/* ---- reading a consistent-enough view for the reporter ---- */

void acc_comm_read(struct acc_comm* c, struct acc_wire_entry* e, int final) {
  memset(e, 0, sizeof(*e));
  e->comm_hash = c->hash;
  e->nranks = c->nranks;
  e->rank = c->rank;
  e->local_gpu = c->local_gpu;
  for (uint8_t kind = 0; kind < ACC_N_KINDS; kind++) {
    struct acc_kind* k = &c->kinds[kind];
    /* Read the later fact first: a completion before its posting (wc before wr), an op's
     * TD before its launch count (td_seq before cl). So wc <= wr and seq <= cl hold. */
    lock_td(k);
    uint64_t seq = k->td_seq, td = k->td_ns;
    unlock_td(k);
    uint64_t wc = atomic_load_explicit(&k->wc, memory_order_acquire);
    uint64_t wr = atomic_load_explicit(&k->wr, memory_order_acquire);
    uint64_t cl = atomic_load_explicit(&k->cl, memory_order_acquire);
    if ((cl | wr | wc) == 0) continue;
    struct acc_wire_op* o = &e->ops[e->n_ops++];
    o->kind = kind;
    o->cl = cl;
    o->wr = wr;
    o->wc = wc;
    o->seq = seq <= cl ? seq : cl;
    o->td_ns = td;
    uint64_t total = atomic_load_explicit(&k->n_total, memory_order_relaxed);
    uint64_t n = total < ACC_N_LAST ? total : ACC_N_LAST, sum = 0;
    for (uint64_t i = 0; i < n; i++) sum += atomic_load_explicit(&k->n_ring[i], memory_order_relaxed);
    o->n_samples = (uint8_t)n;
    o->n_ns = n ? sum / n : 0;
  }
  uint32_t total = 0;
  for (uint32_t p = 0; p < c->peer_slots; p++) {
    if (atomic_load_explicit(&c->peer_out[p], memory_order_relaxed) == 0) continue;
    if (e->n_pending < ACC_MAX_PENDING) e->pending[e->n_pending++] = p;
    total++;
  }
  e->pending_total = total;
  uint64_t ex = atomic_load_explicit(&c->exhausted, memory_order_relaxed);
  e->handles_exhausted = ex > UINT32_MAX ? UINT32_MAX : (uint32_t)ex;
  e->last_event_ns = atomic_load_explicit(&c->last_event_ns, memory_order_relaxed);
  e->flags = (uint16_t)((final ? ACC_WIRE_ENTRY_FINAL : 0) |
                        (total > e->n_pending ? ACC_WIRE_ENTRY_PENDING_CUT : 0));
}
