/*
 * NCCL profiler plugin ABI, declared independently for the Aegis CCL hooks.
 *
 * Layouts follow NVIDIA/nccl's public plugin headers (declared here field by field,
 * not copied):
 *   plugins/profiler/example/nccl/err.h          ncclResult_t
 *   plugins/profiler/example/nccl/common.h       ncclDebugLogLevel, ncclDebugLogger_t
 *   plugins/profiler/example/nccl/profiler.h     event type bits, ncclProfilerEventState_t
 *   plugins/profiler/example/nccl/profiler_v4.h  ncclProfilerEventDescr_v4_t,
 *                                                ncclProfilerEventStateArgs_v4_t, ncclProfiler_v4_t
 *   plugins/profiler/example/nccl/profiler_v5.h  ncclProfilerEventDescr_v5_t,
 *                                                ncclProfilerEventStateArgs_v5_t, ncclProfiler_v5_t
 * and, in nccl_profiler_abi_v6v7.h, profiler_v6.h (NCCL 2.29) and NCCL 2.31's
 * src/include/plugin/profiler/profiler_v7.h.
 * NCCL's loader (src/plugin/profiler.cc) looks up ncclProfiler_v7, v6, v5, v4, ... in that
 * order and adapts its internal events to the version it finds (src/plugin/profiler/
 * profiler_v4.cc, profiler_v5.cc). The _Static_asserts at the end pin every offset we
 * depend on for LP64 (x86_64, aarch64).
 */
#ifndef AEGIS_NCCL_PROFILER_ABI_H_
#define AEGIS_NCCL_PROFILER_ABI_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* err.h */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6
} ncclResult_t;

/* common.h */
typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

#define AEGIS_NCCL_INIT_SUBSYS 1UL /* common.h: NCCL_INIT = 1 */

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file,
                                  int line, const char* fmt, ...);

/* profiler.h: event type bits (descriptor .type and the activation mask). */
enum {
  ncclProfileGroup = (1 << 0),
  ncclProfileColl = (1 << 1),
  ncclProfileP2p = (1 << 2),
  ncclProfileProxyOp = (1 << 3),
  ncclProfileProxyStep = (1 << 4),
  ncclProfileProxyCtrl = (1 << 5),
  ncclProfileKernelCh = (1 << 6),
  ncclProfileNetPlugin = (1 << 7),
  ncclProfileGroupApi = (1 << 8),     /* v5 */
  ncclProfileCollApi = (1 << 9),      /* v5 */
  ncclProfileP2pApi = (1 << 10),      /* v5 */
  ncclProfileKernelLaunch = (1 << 11), /* v5 */
  ncclProfileCeColl = (1 << 12),       /* v6: a collective run by the copy engines */
  ncclProfileCeSync = (1 << 13),       /* v6: its memory-operation syncs (parent: the CeColl) */
  ncclProfileCeBatch = (1 << 14),      /* v6: its copy batches (parent: the CeColl) */
  ncclProfileKernelPhase = (1 << 15)   /* v7: symmetric-kernel barrier phase */
};

/* profiler.h: event states (one enum shared by every API version). */
typedef enum {
  ncclProfilerProxyOpSendPosted = 0,      /* deprecated in v4 */
  ncclProfilerProxyOpSendRemFifoWait = 1, /* deprecated in v4 */
  ncclProfilerProxyOpSendTransmitted = 2, /* deprecated in v4 */
  ncclProfilerProxyOpSendDone = 3,        /* deprecated in v4 */
  ncclProfilerProxyOpRecvPosted = 4,      /* deprecated in v4 */
  ncclProfilerProxyOpRecvReceived = 5,    /* deprecated in v4 */
  ncclProfilerProxyOpRecvTransmitted = 6, /* deprecated in v4 */
  ncclProfilerProxyOpRecvDone = 7,        /* deprecated in v4 */
  ncclProfilerProxyOpInProgress_v4 = 19,

  ncclProfilerProxyStepSendGPUWait = 8,
  ncclProfilerProxyStepSendPeerWait_v4 = 20,
  ncclProfilerProxyStepSendWait = 9,
  ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11,
  ncclProfilerProxyStepRecvGPUWait = 12,

  ncclProfilerProxyCtrlIdle = 13,
  ncclProfilerProxyCtrlActive = 14,
  ncclProfilerProxyCtrlSleep = 15,
  ncclProfilerProxyCtrlWakeup = 16,
  ncclProfilerProxyCtrlAppend = 17,
  ncclProfilerProxyCtrlAppendEnd = 18,

  ncclProfilerNetPluginUpdate = 21,
  ncclProfilerKernelChStop = 22,

  ncclProfilerGroupStartApiStop = 23, /* v5 */
  ncclProfilerGroupEndApiStart = 24,  /* v5 */

  ncclProfilerCeCollStart = 25,    /* v6; declared, never sent by NCCL 2.29-2.31 */
  ncclProfilerCeCollComplete = 26, /* v6 */
  ncclProfilerCeSyncStart = 27,    /* v6 */
  ncclProfilerCeSyncComplete = 28, /* v6 */
  ncclProfilerCeBatchStart = 29,   /* v6 */
  ncclProfilerCeBatchComplete = 30, /* v6 */
  ncclProfilerKernelPhaseStop = 31  /* v7 */
} ncclProfilerEventState_t;

typedef ncclProfilerEventState_t ncclProfilerEventState_v4_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v5_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v6_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v7_t;

/* Union members shared, with identical layout, by the v4 and v5 descriptors. */
struct aegisNcclProxyOpDescr {
  pid_t pid;         /* pid of the process that created the proxy op (PXN: maybe another) */
  uint8_t channelId;
  int peer;          /* remote rank */
  int nSteps;
  int chunkSize;
  int isSend;
};
struct aegisNcclProxyStepDescr {
  int step;
};
struct aegisNcclKernelChDescr {
  uint8_t channelId;
  uint64_t pTimer;   /* GPU globaltimer at kernel start on this channel */
};
struct aegisNcclNetPluginDescr {
  int64_t id;
  void* data;
};

/* profiler_v4.h: ncclProfilerEventDescr_v4_t */
typedef struct {
  uint8_t type;      /* one ncclProfile* bit */
  void* parentObj;   /* parent event handle (coll: the group; proxyOp: the coll/p2p) */
  int rank;
  union {
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
    } p2p;
    struct aegisNcclProxyOpDescr proxyOp;
    struct aegisNcclProxyStepDescr proxyStep;
    struct aegisNcclKernelChDescr kernelCh;
    struct aegisNcclNetPluginDescr netPlugin;
  };
} ncclProfilerEventDescr_v4_t;

/* profiler_v4.h: ncclProfilerEventStateArgs_v4_t */
typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;   /* GPU globaltimer at kernel stop (state ncclProfilerKernelChStop) */
  } kernelCh;
} ncclProfilerEventStateArgs_v4_t;

/* profiler_v4.h: ncclProfiler_v4_t. Member order: name, init, startEvent, stopEvent,
 * recordEventState, finalize. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName,
                       uint64_t commHash, int nNodes, int nranks, int rank,
                       ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v4_t eState,
                                   ncclProfilerEventStateArgs_v4_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v4_t;

/* Union members with one layout from v5 on, where v6 reuses them unchanged (v7 appends
 * fields to some, so it declares its own). */
struct aegisNcclGroupApiDescr {
  bool graphCaptured;
  int groupDepth;
};
struct aegisNcclCollApiDescr_v5 {
  const char* func;
  size_t count;
  const char* datatype;
  int root;
  void* stream;
  bool graphCaptured;
};
struct aegisNcclP2pApiDescr_v5 {
  const char* func;
  size_t count;
  const char* datatype;
  void* stream;
  bool graphCaptured;
};
struct aegisNcclKernelLaunchDescr {
  void* stream;
};
struct aegisNcclCollDescr_v5 {
  uint64_t seqNumber;
  const char* func;
  void const* sendBuff;
  void* recvBuff;
  size_t count;
  int root;
  const char* datatype;
  uint8_t nChannels;
  uint8_t nWarps;
  const char* algo;
  const char* proto;
  void* parentGroup;
};
struct aegisNcclP2pDescr_v5 {
  const char* func;
  void* buff;
  const char* datatype;
  size_t count;
  int peer;
  uint8_t nChannels;
  void* parentGroup;
};

/* profiler_v5.h: ncclProfilerEventDescr_v5_t (type widened to 64 bits, API events added). */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct aegisNcclGroupApiDescr groupApi;
    struct aegisNcclCollApiDescr_v5 collApi;
    struct aegisNcclP2pApiDescr_v5 p2pApi;
    struct aegisNcclKernelLaunchDescr kernelLaunch;
    struct aegisNcclCollDescr_v5 coll;
    struct aegisNcclP2pDescr_v5 p2p;
    struct aegisNcclProxyOpDescr proxyOp;
    struct aegisNcclProxyStepDescr proxyStep;
    struct aegisNcclKernelChDescr kernelCh;
    struct aegisNcclNetPluginDescr netPlugin;
  };
} ncclProfilerEventDescr_v5_t;

/* profiler_v5.h: ncclProfilerEventStateArgs_v5_t */
typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;   /* also the v7 KernelPhase stop */
  } kernelCh;
} ncclProfilerEventStateArgs_v5_t;

/* v6 and v7 reuse the v5 state arguments (v7 names its own typedef of the same union). */
typedef ncclProfilerEventStateArgs_v5_t ncclProfilerEventStateArgs_v6_t;
typedef ncclProfilerEventStateArgs_v5_t ncclProfilerEventStateArgs_v7_t;

/* profiler_v5.h: ncclProfiler_v5_t. init takes the comm id second and the name after the mask. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                       int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v5_t eState,
                                   ncclProfilerEventStateArgs_v5_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v5_t;

/* Offsets for LP64, worked out by hand from the NVIDIA headers above. */
#if defined(__LP64__)
#define AEGIS_ABI_ASSERT(cond) _Static_assert(cond, #cond)
AEGIS_ABI_ASSERT(sizeof(ncclResult_t) == 4);
AEGIS_ABI_ASSERT(sizeof(ncclProfilerEventState_t) == 4);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, type) == 0);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, parentObj) == 8);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, rank) == 16);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, coll.seqNumber) == 24);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, coll.func) == 32);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, coll.count) == 56);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, coll.root) == 64);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, coll.datatype) == 72);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, coll.nChannels) == 80);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, coll.nWarps) == 81);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, coll.algo) == 88);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, coll.proto) == 96);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, p2p.func) == 24);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, p2p.count) == 48);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, p2p.peer) == 56);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, p2p.nChannels) == 60);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, proxyOp.pid) == 24);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, proxyOp.channelId) == 28);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, proxyOp.peer) == 32);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, proxyOp.nSteps) == 36);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, proxyOp.chunkSize) == 40);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, proxyOp.isSend) == 44);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, proxyStep.step) == 24);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, kernelCh.channelId) == 24);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, kernelCh.pTimer) == 32);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v4_t, netPlugin.data) == 32);
AEGIS_ABI_ASSERT(sizeof(ncclProfilerEventDescr_v4_t) == 104);
AEGIS_ABI_ASSERT(sizeof(ncclProfilerEventStateArgs_v4_t) == 8);
AEGIS_ABI_ASSERT(offsetof(ncclProfiler_v4_t, init) == 8);
AEGIS_ABI_ASSERT(offsetof(ncclProfiler_v4_t, startEvent) == 16);
AEGIS_ABI_ASSERT(offsetof(ncclProfiler_v4_t, stopEvent) == 24);
AEGIS_ABI_ASSERT(offsetof(ncclProfiler_v4_t, recordEventState) == 32);
AEGIS_ABI_ASSERT(offsetof(ncclProfiler_v4_t, finalize) == 40);
AEGIS_ABI_ASSERT(sizeof(ncclProfiler_v4_t) == 48);

AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v5_t, parentObj) == 8);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v5_t, rank) == 16);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v5_t, collApi.root) == 48);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v5_t, collApi.graphCaptured) == 64);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v5_t, coll.func) == 32);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v5_t, coll.nChannels) == 80);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v5_t, coll.parentGroup) == 104);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v5_t, p2p.peer) == 56);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v5_t, p2p.nChannels) == 60);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v5_t, p2p.parentGroup) == 64);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v5_t, proxyOp.peer) == 32);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v5_t, proxyOp.isSend) == 44);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v5_t, kernelCh.pTimer) == 32);
AEGIS_ABI_ASSERT(sizeof(ncclProfilerEventDescr_v5_t) == 112);
AEGIS_ABI_ASSERT(sizeof(ncclProfilerEventStateArgs_v5_t) == 8);
AEGIS_ABI_ASSERT(sizeof(ncclProfiler_v5_t) == 48);
#endif

#include "nccl_profiler_abi_v6v7.h" /* v6, v7: built on the v5 declarations */

#endif /* AEGIS_NCCL_PROFILER_ABI_H_ */
