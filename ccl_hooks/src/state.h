/*
 * Internal state of the Aegis CCL profiler plugin (Aegis §4.2 CL/WR/WC, §5.2 TD/N).
 *
 * One struct acc_comm per NCCL communicator context (profiler init). Every hot-path
 * update is an atomic on fixed memory allocated at init: no malloc, no lock shared with
 * the reporter thread. Event handles are pointers into two fixed pools per comm:
 *   - a ring of collective slots (Coll and P2p events), reused round-robin;
 *   - a free list of event slots (ProxyOp, ProxyStep, KernelCh); when it is empty,
 *     startEvent returns a NULL handle and counts it (handles_exhausted).
 */
#ifndef AEGIS_CCL_STATE_H_
#define AEGIS_CCL_STATE_H_

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "nccl_profiler_abi.h"
#include "wire.h"

#define ACC_HIDDEN __attribute__((visibility("hidden")))

enum acc_ev_type {
  ACC_EV_FREE = 0,
  ACC_EV_COLL = 1,       /* Coll or P2p event: a ring slot */
  ACC_EV_PROXY_OP = 2,
  ACC_EV_PROXY_STEP = 3,
  ACC_EV_KERNEL_CH = 4
};

enum { ACC_DIR_RECV = 0, ACC_DIR_SEND = 1, ACC_DIR_UNKNOWN = 2 };

struct acc_comm;

/* First member of every handle we hand to NCCL. */
struct acc_hdr {
  uint32_t type;   /* enum acc_ev_type */
  uint32_t index;  /* position in its pool */
  struct acc_comm* comm;
};

/* One launched collective or p2p op; lives until the ring wraps around. */
struct acc_coll {
  struct acc_hdr hdr;
  _Atomic uint64_t ord;        /* CL value at launch: this op is launch number `ord` of its kind */
  _Atomic uint32_t kind;
  _Atomic uint32_t nch;        /* KernelCh events expected (descriptor nChannels) */
  _Atomic uint32_t nch_done;
  _Atomic uint32_t nch_gpu;    /* channels that carried valid GPU timestamps */
  _Atomic uint64_t gpu_start, gpu_stop;  /* min start, max stop (GPU globaltimer, ns) */
  _Atomic uint64_t cpu_start, cpu_stop;  /* the same from CLOCK_MONOTONIC */
};

/* A ProxyOp's step slots, one per step % NCCL_STEPS (NCCL keeps at most 8 in flight). */
#define ACC_OP_STEPS 8u

/* ProxyOp, ProxyStep or KernelCh event. Plain fields: NCCL serialises the calls on one
 * handle, and the free list's acquire/release hands a slot from one owner to the next. */
struct acc_ev {
  struct acc_hdr hdr;
  _Atomic uint32_t next;       /* free list: index + 1 of the next free slot, 0 = end */
  uint8_t kind;
  uint8_t dir;                 /* ACC_DIR_* */
  uint8_t posted;              /* ProxyStep reached SendWait / RecvWait: counted in WR */
  uint8_t completed;           /* ... and then completed: counted in WC */
  int32_t peer;
  uint64_t t_post;             /* CLOCK_MONOTONIC at posting */
  union {
    struct {                   /* KernelCh */
      struct acc_coll* parent; /* its collective */
      uint64_t parent_ord;
      uint64_t gpu_start, gpu_stop, cpu_start;
    };
    /* ProxyOp: index + 1 of its live step per step % ACC_OP_STEPS, 0 = none */
    _Atomic uint32_t steps[ACC_OP_STEPS];
    struct {                   /* ProxyStep */
      int32_t step;            /* NCCL's step number */
      uint32_t op1;            /* index + 1 of its ProxyOp, 0 = none */
    };
  };
};

/* Counters of one op kind on one comm (Aegis §4.2, §5.2). */
struct acc_kind {
  _Atomic uint64_t cl, wr, wc;
  _Atomic uint64_t n_total;            /* network samples taken so far */
  _Atomic uint64_t n_ring[ACC_N_LAST]; /* last L network times, ns */
  atomic_flag td_lock;                 /* guards td_seq and td_ns */
  uint64_t td_seq, td_ns;
} __attribute__((aligned(64)));

struct acc_comm {
  uint64_t hash;
  uint32_t nranks;
  uint32_t rank;
  int nnodes;
  int16_t local_gpu;
  pid_t pid;
  char name[64];
  ncclDebugLogger_t log;

  struct acc_kind kinds[ACC_N_KINDS];

  struct acc_coll* ring;
  uint32_t ring_size;                  /* power of two */
  _Atomic uint64_t ring_next;

  struct acc_ev* pool;
  uint32_t pool_size;
  _Atomic uint64_t free_head;          /* (tag << 32) | (index + 1) */

  _Atomic uint32_t* peer_out;          /* outstanding posted steps per peer rank */
  uint32_t peer_slots;

  _Atomic uint64_t exhausted;          /* NULL handles returned */
  _Atomic uint64_t last_event_ns;      /* CLOCK_MONOTONIC_COARSE of the latest event */

  struct acc_comm* next;               /* registry link, guarded by the registry lock */
};

/* Normalised event descriptor, filled by the v4/v5 adapters. */
struct acc_descr {
  uint64_t type;
  void* parent;
  const char* func;
  uint8_t nch;
  pid_t pid;
  int peer;
  int is_send;
  int step;  /* ProxyStep: NCCL's step number */
  uint64_t ptimer;
};

/* The TD/seq pair of one kind is written and read under this spin lock. */
static inline void lock_td(struct acc_kind* k) {
  while (atomic_flag_test_and_set_explicit(&k->td_lock, memory_order_acquire)) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

static inline void unlock_td(struct acc_kind* k) {
  atomic_flag_clear_explicit(&k->td_lock, memory_order_release);
}

/* events.c */
ACC_HIDDEN uint64_t acc_mono_ns(void);
ACC_HIDDEN uint8_t acc_kind_of(const char* func);
ACC_HIDDEN void acc_start(struct acc_comm* c, void** handle, const struct acc_descr* d);
ACC_HIDDEN void acc_stop(void* handle);
ACC_HIDDEN void acc_record(void* handle, int state, uint64_t ptimer);

/* comm.c */
ACC_HIDDEN struct acc_comm* acc_comm_new(uint64_t hash, int nranks, int rank, int nnodes,
                                         const char* name, ncclDebugLogger_t log);
ACC_HIDDEN void acc_comm_free(struct acc_comm* c);
ACC_HIDDEN void acc_comm_read(struct acc_comm* c, struct acc_wire_entry* e, int final);

/* reporter.c */
ACC_HIDDEN int acc_register(struct acc_comm* c);
ACC_HIDDEN void acc_unregister(struct acc_comm* c);
ACC_HIDDEN int acc_env_int(const char* name, int dflt, int lo, int hi);
ACC_HIDDEN int16_t acc_local_gpu(void);

#endif /* AEGIS_CCL_STATE_H_ */
