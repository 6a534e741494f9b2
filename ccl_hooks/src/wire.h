/*
 * Snapshot datagram encoder, version 1. The layout is defined once, in
 * schemas/ccl_snapshot.py (the Python codec); this file must stay byte-identical to it,
 * which the shared vectors in schemas/vectors/ check from both sides.
 * All integers are little-endian, every field has a fixed size, there is no padding.
 */
#ifndef AEGIS_CCL_WIRE_H_
#define AEGIS_CCL_WIRE_H_

#include <stddef.h>
#include <stdint.h>

#define ACC_WIRE_MAGIC "AGCC"
#define ACC_WIRE_VERSION 1
#define ACC_WIRE_HEADER_BYTES 40
#define ACC_WIRE_ENTRY_BYTES 40
#define ACC_WIRE_OP_BYTES 56
#define ACC_WIRE_PEER_BYTES 4

#define ACC_WIRE_FLAG_MORE 0x01u            /* header: this snapshot continues in the next datagram */
#define ACC_WIRE_ENTRY_FINAL 0x0001u        /* entry: the communicator was finalized */
#define ACC_WIRE_ENTRY_PENDING_CUT 0x0002u  /* entry: more peers pending than listed */

#define ACC_N_KINDS 12     /* op kind codes 0..11, see acc_kind_of() */
#define ACC_N_LAST 5       /* Aegis §5.2: N over the last L = 5 work requests */
#define ACC_MAX_PENDING 32 /* peer ranks listed per entry, at most */

struct acc_wire_header {
  uint8_t flags;
  uint16_t n_entries;
  uint32_t pid;
  uint32_t seq;
  uint32_t drops_full;
  uint32_t drops_unsent;
  uint64_t wall_ns;
  uint64_t mono_ns;
};

struct acc_wire_op {
  uint8_t kind;
  uint8_t n_samples;
  uint64_t cl, wr, wc, seq, td_ns, n_ns;
};

struct acc_wire_entry {
  uint64_t comm_hash;
  uint32_t nranks;
  uint32_t rank;
  int16_t local_gpu;
  uint16_t flags;
  uint32_t pending_total;
  uint32_t handles_exhausted;
  uint64_t last_event_ns;
  uint8_t n_ops;
  uint8_t n_pending;
  struct acc_wire_op ops[ACC_N_KINDS];
  uint32_t pending[ACC_MAX_PENDING];
};

/* Bytes the entry takes on the wire. */
size_t acc_wire_entry_size(const struct acc_wire_entry* e);
/* Write the header into buf[0..40). buf must hold ACC_WIRE_HEADER_BYTES. */
void acc_wire_put_header(uint8_t* buf, const struct acc_wire_header* h);
/* Write one entry at buf; returns the bytes written, or 0 if it does not fit in cap. */
size_t acc_wire_put_entry(uint8_t* buf, size_t cap, const struct acc_wire_entry* e);

#endif /* AEGIS_CCL_WIRE_H_ */
