/* Snapshot datagram encoder; layout in schemas/ccl_snapshot.py and docs/ccl-hooks.md. */
#include "wire.h"

#include <string.h>

static void put_u16(uint8_t* p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

size_t acc_wire_entry_size(const struct acc_wire_entry* e) {
  return ACC_WIRE_ENTRY_BYTES + (size_t)e->n_ops * ACC_WIRE_OP_BYTES +
         (size_t)e->n_pending * ACC_WIRE_PEER_BYTES;
}

void acc_wire_put_header(uint8_t* buf, const struct acc_wire_header* h) {
  memcpy(buf, ACC_WIRE_MAGIC, 4);
  buf[4] = ACC_WIRE_VERSION;
  buf[5] = h->flags;
  put_u16(buf + 6, h->n_entries);
  put_u32(buf + 8, h->pid);
  put_u32(buf + 12, h->seq);
  put_u32(buf + 16, h->drops_full);
  put_u32(buf + 20, h->drops_unsent);
  put_u64(buf + 24, h->wall_ns);
  put_u64(buf + 32, h->mono_ns);
}

size_t acc_wire_put_entry(uint8_t* buf, size_t cap, const struct acc_wire_entry* e) {
  if (e->n_ops > ACC_N_KINDS || e->n_pending > ACC_MAX_PENDING) return 0;
  size_t need = acc_wire_entry_size(e);
  if (need > cap) return 0;
  put_u64(buf, e->comm_hash);
  put_u32(buf + 8, e->nranks);
  put_u32(buf + 12, e->rank);
  put_u16(buf + 16, (uint16_t)e->local_gpu);
  buf[18] = e->n_ops;
  buf[19] = e->n_pending;
  put_u16(buf + 20, e->flags);
  put_u16(buf + 22, 0);
  put_u32(buf + 24, e->pending_total);
  put_u32(buf + 28, e->handles_exhausted);
  put_u64(buf + 32, e->last_event_ns);
  uint8_t* p = buf + ACC_WIRE_ENTRY_BYTES;
  for (unsigned i = 0; i < e->n_ops; i++, p += ACC_WIRE_OP_BYTES) {
    const struct acc_wire_op* o = &e->ops[i];
    p[0] = o->kind;
    p[1] = o->n_samples;
    put_u16(p + 2, 0);
    put_u32(p + 4, 0);
    put_u64(p + 8, o->cl);
    put_u64(p + 16, o->wr);
    put_u64(p + 24, o->wc);
    put_u64(p + 32, o->seq);
    put_u64(p + 40, o->td_ns);
    put_u64(p + 48, o->n_ns);
  }
  for (unsigned i = 0; i < e->n_pending; i++, p += ACC_WIRE_PEER_BYTES) put_u32(p, e->pending[i]);
  return need;
}
