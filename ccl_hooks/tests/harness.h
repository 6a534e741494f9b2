/*
 * Test harness for the Aegis CCL profiler plugin. It dlopen()s the built library and
 * drives it the way NCCL does (src/misc/profiler.cc, src/transport/net.cc): init per
 * communicator, Coll/P2p events from the user thread, ProxyOp/ProxyStep events and their
 * state transitions from a proxy thread, KernelCh events from a third thread, finalize.
 * It checks the counters through the datagrams it receives on a socket it binds.
 */
#ifndef AEGIS_CCL_HARNESS_H_
#define AEGIS_CCL_HARNESS_H_

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "nccl_profiler_abi.h"
#include "wire.h"

extern int g_failures;
extern int g_quick;

#define CHECK(cond, ...)                                                      \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);         \
      fprintf(stderr, __VA_ARGS__);                                           \
      fprintf(stderr, "\n");                                                  \
      g_failures++;                                                           \
    }                                                                         \
  } while (0)

/* The plugin as NCCL sees it, through one API version (the table of that version set). */
#define N_VERSIONS 4 /* v4, v5, v6, v7 */
struct drv {
  int version; /* 4 .. 7 */
  ncclProfiler_v4_t* v4;
  ncclProfiler_v5_t* v5;
  ncclProfiler_v6_t* v6;
  ncclProfiler_v7_t* v7;
};

int drv_init(const struct drv* d, void** ctx, int* mask, const char* name, uint64_t hash,
             int nranks, int rank);
void drv_finalize(const struct drv* d, void* ctx);
void* drv_coll(const struct drv* d, void* ctx, const char* func, uint64_t seqno, uint8_t nch);
/* v6+: a collective run on the copy engines (parent: its CollApi event, or NULL). */
void* drv_ce_coll(const struct drv* d, void* ctx, void* parent, const char* func, uint64_t ce_seq);
void* drv_p2p(const struct drv* d, void* ctx, const char* func, int peer, uint8_t nch);
void* drv_proxy_op(const struct drv* d, void* ctx, void* parent, pid_t pid, int peer, int send,
                   int nsteps);
void* drv_proxy_step(const struct drv* d, void* ctx, void* op, int step);
void* drv_kernel_ch(const struct drv* d, void* ctx, void* parent, uint8_t ch, uint64_t ptimer);
void* drv_raw(const struct drv* d, void* ctx, uint64_t type, void* parent);
void drv_state(const struct drv* d, void* h, ncclProfilerEventState_t s, uint64_t arg);
void drv_stop(const struct drv* d, void* h);

/* A decoded datagram (wire_check.c). */
#define HX_MAX_ENTRIES 512
struct hx_dgram {
  struct acc_wire_header h;
  struct acc_wire_entry e[HX_MAX_ENTRIES];
};
int hx_decode(const uint8_t* buf, size_t len, struct hx_dgram* out);
const struct acc_wire_op* hx_op(const struct acc_wire_entry* e, uint8_t kind);
const struct acc_wire_entry* hx_find(const struct hx_dgram* g, uint64_t hash, uint32_t rank);
int check_vectors(const char* dir);

/* Receiver socket (scenarios.c). */
struct rx {
  int fd;
  char path[108];
};
int rx_open(struct rx* r, const char* path);
void rx_close(struct rx* r);
/* Next datagram within timeout_ms: 1 got one, 0 timeout. */
int rx_next(struct rx* r, struct hx_dgram* g, int timeout_ms);
/* Wait for an entry (hash, rank) with FINAL set, or (final=0) any entry whose op of `kind`
 * has cl >= min_cl. Copies it to *out and the header to *hdr. 1 found, 0 timeout. */
int rx_wait_entry(struct rx* r, uint64_t hash, uint32_t rank, int final, uint8_t kind,
                  uint64_t min_cl, struct acc_wire_entry* out, struct acc_wire_header* hdr,
                  int timeout_ms);
void make_sock_path(char* out, size_t n, const char* tag);

int run_scenarios(const struct drv drivers[N_VERSIONS], const char* lib_path);
int run_bench(const struct drv* d);
void check_reload(const char* lib_path);
uint64_t now_ns(void);

#endif /* AEGIS_CCL_HARNESS_H_ */
