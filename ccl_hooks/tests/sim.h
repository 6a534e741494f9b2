/*
 * One simulated NCCL rank: a user thread launches ops (Coll/P2p start, then stop once
 * "enqueued"), a proxy thread runs their ProxyOp/ProxyStep events through NCCL's state
 * sequence, a kernel thread reports their KernelCh events with GPU timestamps.
 *   send step: start, SendGPUWait, SendPeerWait_v4, SendWait, stop
 *   recv step: start, RecvWait, RecvFlushWait, RecvGPUWait, stop
 */
#ifndef AEGIS_CCL_SIM_H_
#define AEGIS_CCL_SIM_H_

#include <pthread.h>

#include "harness.h"

#define WAIT_MS 8000 /* how long a scenario waits for a datagram */
#define SIM_QCAP 4096
#define SIM_STEPS 4   /* network steps per proxy op */
#define SIM_NCH 2     /* channels per collective */

enum { SIM_KIND_AR = 1, SIM_KIND_AG = 2, SIM_KIND_SEND = 9 };

struct sim_work {
  void* coll;
  int index;     /* 0-based launch index on this rank */
  uint64_t ord;  /* launch number within its kind: the CL value it makes */
  int kind;   /* SIM_KIND_* */
  int hang;   /* post this op's steps and never complete them */
};

struct sim_queue {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct sim_work items[SIM_QCAP];
  int head, tail, closed;
};

struct sim_rank {
  const struct drv* d;
  void* ctx;
  int rank, nranks;
  int n_ops;        /* ops to launch */
  int only_ar;      /* every op an AllReduce (else AR, AG, Send in turn) */
  int hang_last;    /* the last op's steps never complete */
  int restarts;     /* each recv step is started this many extra times first, never stopped
                       (net.cc recvProxyProgress when it cannot post yet) */
  int send_peer, recv_peer;
  struct sim_queue to_proxy, to_kernel;
  pthread_t user, proxy, kernel;
  /* expectations, filled as the threads run */
  uint64_t cl[ACC_N_KINDS], wr[ACC_N_KINDS], wc[ACC_N_KINDS], seq[ACC_N_KINDS], td[ACC_N_KINDS];
};

void sim_setup(struct sim_rank* s, const struct drv* d, void* ctx, int rank, int nranks, int n_ops);
void sim_start(struct sim_rank* s);
void sim_join(struct sim_rank* s);
/* Compare one received entry with what the simulation did. */
void sim_check(const struct sim_rank* s, const struct acc_wire_entry* e, const char* what);

/* scenarios.c: helpers the scenarios share with safety.c */
void set_env(const char* sock, const char* interval_ms);
int rx_start(struct rx* r, const char* tag, const char* interval_ms);
void sleep_ms(int ms);
void rx_drain(struct rx* r);
void* init_ok(const struct drv* d, const char* name, uint64_t hash, int nranks, int rank);

/* safety.c */
void run_safety(const struct drv drivers[N_VERSIONS]);

#endif /* AEGIS_CCL_SIM_H_ */
