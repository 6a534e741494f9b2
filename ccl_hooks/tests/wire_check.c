/*
 * Wire format checks from the C side: the encoder (src/wire.c) must produce the shared
 * vectors in schemas/vectors/ byte for byte, and a small bounds-checked decoder reads
 * the plugin's datagrams back for the scenarios.
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static uint64_t get_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

int hx_decode(const uint8_t* buf, size_t len, struct hx_dgram* g) {
  memset(&g->h, 0, sizeof(g->h));
  if (len < ACC_WIRE_HEADER_BYTES || memcmp(buf, ACC_WIRE_MAGIC, 4) != 0 ||
      buf[4] != ACC_WIRE_VERSION)
    return -1;
  g->h.flags = buf[5];
  g->h.n_entries = (uint16_t)get_le(buf + 6, 2);
  g->h.pid = (uint32_t)get_le(buf + 8, 4);
  g->h.seq = (uint32_t)get_le(buf + 12, 4);
  g->h.drops_full = (uint32_t)get_le(buf + 16, 4);
  g->h.drops_unsent = (uint32_t)get_le(buf + 20, 4);
  g->h.wall_ns = get_le(buf + 24, 8);
  g->h.mono_ns = get_le(buf + 32, 8);
  if (g->h.n_entries > HX_MAX_ENTRIES) return -1;
  size_t off = ACC_WIRE_HEADER_BYTES;
  for (unsigned i = 0; i < g->h.n_entries; i++) {
    struct acc_wire_entry* e = &g->e[i];
    memset(e, 0, sizeof(*e));
    if (off + ACC_WIRE_ENTRY_BYTES > len) return -1;
    const uint8_t* p = buf + off;
    e->comm_hash = get_le(p, 8);
    e->nranks = (uint32_t)get_le(p + 8, 4);
    e->rank = (uint32_t)get_le(p + 12, 4);
    e->local_gpu = (int16_t)get_le(p + 16, 2);
    e->n_ops = p[18];
    e->n_pending = p[19];
    e->flags = (uint16_t)get_le(p + 20, 2);
    e->pending_total = (uint32_t)get_le(p + 24, 4);
    e->handles_exhausted = (uint32_t)get_le(p + 28, 4);
    e->last_event_ns = get_le(p + 32, 8);
    if (e->n_ops > ACC_N_KINDS || e->n_pending > ACC_MAX_PENDING) return -1;
    if (off + acc_wire_entry_size(e) > len) return -1;
    p += ACC_WIRE_ENTRY_BYTES;
    for (unsigned j = 0; j < e->n_ops; j++, p += ACC_WIRE_OP_BYTES) {
      struct acc_wire_op* o = &e->ops[j];
      o->kind = p[0];
      o->n_samples = p[1];
      o->cl = get_le(p + 8, 8);
      o->wr = get_le(p + 16, 8);
      o->wc = get_le(p + 24, 8);
      o->seq = get_le(p + 32, 8);
      o->td_ns = get_le(p + 40, 8);
      o->n_ns = get_le(p + 48, 8);
    }
    for (unsigned j = 0; j < e->n_pending; j++, p += 4) e->pending[j] = (uint32_t)get_le(p, 4);
    off += acc_wire_entry_size(e);
  }
  return off == len ? 0 : -1;
}

const struct acc_wire_op* hx_op(const struct acc_wire_entry* e, uint8_t kind) {
  for (unsigned i = 0; i < e->n_ops; i++)
    if (e->ops[i].kind == kind) return &e->ops[i];
  return NULL;
}

const struct acc_wire_entry* hx_find(const struct hx_dgram* g, uint64_t hash, uint32_t rank) {
  for (unsigned i = 0; i < g->h.n_entries; i++)
    if (g->e[i].comm_hash == hash && g->e[i].rank == rank) return &g->e[i];
  return NULL;
}

/* ---- the shared vectors: the same states schemas/vectors/ccl_snapshot_v1.json lists ---- */

#define W 1733000000123456789ull

static struct acc_wire_op op(uint8_t kind, uint64_t cl, uint64_t wr, uint64_t wc, uint64_t seq,
                             uint64_t td, uint64_t n, uint8_t samples) {
  struct acc_wire_op o = {kind, samples, cl, wr, wc, seq, td, n};
  return o;
}

static size_t encode(uint8_t* buf, size_t cap, const struct acc_wire_header* h,
                     const struct acc_wire_entry* es, unsigned n) {
  acc_wire_put_header(buf, h);
  size_t off = ACC_WIRE_HEADER_BYTES;
  for (unsigned i = 0; i < n; i++) {
    size_t w = acc_wire_put_entry(buf + off, cap - off, &es[i]);
    if (w == 0) return 0;
    off += w;
  }
  return off;
}

static int compare_file(const char* dir, const char* name, const uint8_t* buf, size_t len) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE* f = fopen(path, "rb");
  if (f == NULL) {
    CHECK(0, "cannot open vector %s", path);
    return -1;
  }
  uint8_t want[4096];
  size_t n = fread(want, 1, sizeof(want), f);
  fclose(f);
  CHECK(n == len, "%s: vector has %zu bytes, encoder wrote %zu", name, n, len);
  if (n != len) return -1;
  for (size_t i = 0; i < n; i++) {
    if (want[i] != buf[i]) {
      CHECK(0, "%s: byte %zu is 0x%02x, encoder wrote 0x%02x", name, i, want[i], buf[i]);
      return -1;
    }
  }
  struct hx_dgram* g = malloc(sizeof(*g));
  int rc = g ? hx_decode(buf, len, g) : -1;
  free(g);
  CHECK(rc == 0, "%s: the harness decoder rejects the vector", name);
  return rc;
}

int check_vectors(const char* dir) {
  uint8_t buf[4096];
  struct acc_wire_entry es[2];
  int before = g_failures;

  memset(es, 0, sizeof(es));
  struct acc_wire_header h1 = {0, 1, 4242, 7, 0, 0, W, 987654321000ull};
  es[0].comm_hash = 0x0123456789ABCDEFull;
  es[0].nranks = 16;
  es[0].rank = 3;
  es[0].local_gpu = 3;
  es[0].last_event_ns = 987654000000ull;
  es[0].n_ops = 2;
  es[0].ops[0] = op(1, 120, 960, 960, 119, 1500000, 25000, 5);
  es[0].ops[1] = op(2, 4, 0, 0, 4, 80000, 0, 0);
  compare_file(dir, "ccl_v1_one_rank.bin", buf, encode(buf, sizeof(buf), &h1, es, 1));

  memset(es, 0, sizeof(es));
  struct acc_wire_header h2 = {ACC_WIRE_FLAG_MORE, 2, 31337, 8, 3, 1, W + 1000000000ull,
                               988654321000ull};
  es[0].comm_hash = 0xFEDCBA9876543210ull;
  es[0].nranks = 64;
  es[0].rank = 10;
  es[0].local_gpu = 2;
  es[0].n_ops = 3;
  es[0].ops[0] = op(0, 0, 5, 2, 0, 0, 7000, 2);
  es[0].ops[1] = op(3, 55, 440, 437, 54, 2000000, 30000, 5);
  es[0].ops[2] = op(9, 9, 18, 18, 9, 12345, 4096, 5);
  es[0].n_pending = 2;
  es[0].pending[0] = 11;
  es[0].pending[1] = 42;
  es[0].pending_total = 2;
  es[0].handles_exhausted = 17;
  es[0].last_event_ns = 988000000000ull;
  es[1].comm_hash = 0xFEDCBA9876543210ull;
  es[1].nranks = 64;
  es[1].rank = 11;
  es[1].local_gpu = -1;
  es[1].n_ops = 1;
  es[1].ops[0] = op(3, 54, 432, 432, 54, 2600000, 29000, 5);
  es[1].last_event_ns = 987000000000ull;
  es[1].flags = ACC_WIRE_ENTRY_FINAL;
  compare_file(dir, "ccl_v1_two_ranks_hang.bin", buf, encode(buf, sizeof(buf), &h2, es, 2));

  memset(es, 0, sizeof(es));
  struct acc_wire_header h3 = {0, 1, 7, 1, 0, 0, W + 2000000000ull, 5000000000ull};
  es[0].comm_hash = 0xFF;
  es[0].nranks = 100;
  es[0].rank = 99;
  es[0].local_gpu = 7;
  es[0].n_ops = 1;
  es[0].ops[0] = op(6, 3, 300, 250, 2, 9999999, 1000000, 5);
  es[0].n_pending = 32;
  for (int i = 0; i < 32; i++) es[0].pending[i] = (uint32_t)(2 * i);
  es[0].pending_total = 40;
  es[0].flags = ACC_WIRE_ENTRY_PENDING_CUT;
  es[0].handles_exhausted = 4294967295u;
  es[0].last_event_ns = 4999000000ull;
  compare_file(dir, "ccl_v1_pending_cut.bin", buf, encode(buf, sizeof(buf), &h3, es, 1));

  struct acc_wire_header h4 = {0, 0, 1, 4294967295u, 0, 0, W, 1};
  compare_file(dir, "ccl_v1_empty.bin", buf, encode(buf, sizeof(buf), &h4, es, 0));

  if (g_failures == before) printf("ok   wire vectors: 4 match schemas/vectors byte for byte\n");
  return g_failures == before ? 0 : -1;
}
