/*
 * Exported NCCL profiler tables: ncclProfiler_v4 (NCCL 2.27), ncclProfiler_v5 (2.28),
 * ncclProfiler_v6 (2.29, copy-engine collectives) and ncclProfiler_v7 (2.31); NCCL's
 * loader takes the newest it finds. Each adapts its descriptors to struct acc_descr and
 * shares the handlers in events.c. Aegis §4.2 (CL/WR/WC), §5.2 (TD/N).
 *
 * Every entry point returns ncclSuccess except init on bad arguments or out of memory,
 * which makes NCCL run that communicator without the plugin (plugins/profiler/README.md,
 * "Error codes"). Nothing here blocks, allocates or logs after init.
 */
#include <string.h>

#include "state.h"

#define ACC_EXPORT __attribute__((visibility("default")))

static const int acc_default_mask =
    ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep |
    ncclProfileKernelCh;
/* v6+: a collective run on the copy engines emits CeColl instead of Coll. */
static const int acc_default_mask_ce = acc_default_mask | ncclProfileCeColl;

static ncclResult_t acc_init_common(void** context, int* mask, const char* name, uint64_t hash,
                                    int nnodes, int nranks, int rank, ncclDebugLogger_t log,
                                    int default_mask) {
  if (context == NULL) return ncclInvalidArgument;
  *context = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  struct acc_comm* c = acc_comm_new(hash, nranks, rank, nnodes, name, log);
  if (c == NULL) return ncclSystemError;
  if (acc_register(c) != 0) {
    acc_comm_free(c);
    return ncclSystemError;
  }
  if (mask != NULL) *mask = acc_env_int("AEGIS_CCL_EVENT_MASK", default_mask, 0, 0x7fffffff);
  *context = c;
  if (log != NULL)
    log(NCCL_LOG_INFO, AEGIS_NCCL_INIT_SUBSYS, __FILE__, __LINE__,
        "AEGIS/CCL: profiling comm %s hash 0x%016lx rank %d/%d local gpu %d",
        c->name[0] ? c->name : "-", (unsigned long)hash, rank, nranks, (int)c->local_gpu);
  return ncclSuccess;
}

static ncclResult_t acc_finalize(void* context) {
  struct acc_comm* c = context;
  if (c == NULL) return ncclSuccess;
  acc_unregister(c);
  acc_comm_free(c);
  return ncclSuccess;
}

static ncclResult_t acc_stop_event(void* handle) {
  acc_stop(handle);
  return ncclSuccess;
}

/* The descriptors differ in layout between versions but name these members alike, so one
 * body (expanded per version) copies what the accounting needs into a version-free
 * acc_descr. EXTRA_CASES: the cases only newer descriptors have members for. */
#define ACC_DEFINE_START(NAME, DESCR_T, EXTRA_CASES)                             \
  static ncclResult_t NAME(void* context, void** handle, DESCR_T* d) {           \
    if (handle == NULL) return ncclSuccess;                                      \
    *handle = NULL;                                                              \
    if (d == NULL) return ncclSuccess;                                           \
    struct acc_descr a;                                                          \
    memset(&a, 0, sizeof(a));                                                    \
    a.type = d->type;                                                            \
    a.parent = d->parentObj;                                                     \
    switch (d->type) {                                                           \
      case ncclProfileColl:                                                      \
        a.func = d->coll.func;                                                   \
        a.nch = d->coll.nChannels;                                               \
        break;                                                                   \
      case ncclProfileP2p:                                                       \
        a.func = d->p2p.func;                                                    \
        a.nch = d->p2p.nChannels;                                                \
        break;                                                                   \
      case ncclProfileProxyOp:                                                   \
        a.pid = d->proxyOp.pid;                                                  \
        a.peer = d->proxyOp.peer;                                                \
        a.is_send = d->proxyOp.isSend;                                           \
        break;                                                                   \
      case ncclProfileProxyStep:                                                 \
        a.step = d->proxyStep.step;                                              \
        break;                                                                   \
      case ncclProfileKernelCh:                                                  \
        a.ptimer = d->kernelCh.pTimer;                                           \
        break;                                                                   \
        EXTRA_CASES                                                              \
      default:                                                                   \
        break;                                                                   \
    }                                                                            \
    acc_start(context, handle, &a);                                              \
    return ncclSuccess;                                                          \
  }

/* ---- v4 ---- */

static ncclResult_t acc_init_v4(void** context, int* mask, const char* name, uint64_t hash,
                                int nnodes, int nranks, int rank, ncclDebugLogger_t log) {
  return acc_init_common(context, mask, name, hash, nnodes, nranks, rank, log, acc_default_mask);
}

ACC_DEFINE_START(acc_start_v4, ncclProfilerEventDescr_v4_t, /* none */)

static ncclResult_t acc_record_v4(void* handle, ncclProfilerEventState_v4_t state,
                                  ncclProfilerEventStateArgs_v4_t* args) {
  uint64_t ptimer = 0;
  if (state == ncclProfilerKernelChStop && args != NULL) ptimer = args->kernelCh.pTimer;
  acc_record(handle, (int)state, ptimer);
  return ncclSuccess;
}

ACC_EXPORT ncclProfiler_v4_t ncclProfiler_v4 = {
    "aegis-ccl", acc_init_v4, acc_start_v4, acc_stop_event, acc_record_v4, acc_finalize,
};

/* ---- v5 ---- */

static ncclResult_t acc_init_v5(void** context, uint64_t comm_id, int* mask, const char* name,
                                int nnodes, int nranks, int rank, ncclDebugLogger_t log) {
  return acc_init_common(context, mask, name, comm_id, nnodes, nranks, rank, log,
                         acc_default_mask);
}

ACC_DEFINE_START(acc_start_v5, ncclProfilerEventDescr_v5_t, /* none */)

static ncclResult_t acc_record_v5(void* handle, ncclProfilerEventState_v5_t state,
                                  ncclProfilerEventStateArgs_v5_t* args) {
  uint64_t ptimer = 0;
  if (state == ncclProfilerKernelChStop && args != NULL) ptimer = args->kernelCh.pTimer;
  acc_record(handle, (int)state, ptimer);
  return ncclSuccess;
}

ACC_EXPORT ncclProfiler_v5_t ncclProfiler_v5 = {
    "aegis-ccl", acc_init_v5, acc_start_v5, acc_stop_event, acc_record_v5, acc_finalize,
};

/* ---- v6 and v7: v5's table and state arguments; CeColl counts as a launch ---- */

/* A CE collective: its func names the kind; no channels, so no KernelCh and no TD. */
#define ACC_CE_CASES            \
  case ncclProfileCeColl:       \
    a.func = d->ceColl.func;    \
    a.nch = 0;                  \
    break;

static ncclResult_t acc_init_v6(void** context, uint64_t comm_id, int* mask, const char* name,
                                int nnodes, int nranks, int rank, ncclDebugLogger_t log) {
  return acc_init_common(context, mask, name, comm_id, nnodes, nranks, rank, log,
                         acc_default_mask_ce);
}

ACC_DEFINE_START(acc_start_v6, ncclProfilerEventDescr_v6_t, ACC_CE_CASES)
ACC_DEFINE_START(acc_start_v7, ncclProfilerEventDescr_v7_t, ACC_CE_CASES)

ACC_EXPORT ncclProfiler_v6_t ncclProfiler_v6 = {
    "aegis-ccl", acc_init_v6, acc_start_v6, acc_stop_event, acc_record_v5, acc_finalize,
};

ACC_EXPORT ncclProfiler_v7_t ncclProfiler_v7 = {
    "aegis-ccl", acc_init_v6, acc_start_v7, acc_stop_event, acc_record_v5, acc_finalize,
};
