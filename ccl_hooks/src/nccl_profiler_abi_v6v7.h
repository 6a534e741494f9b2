/*
 * NCCL profiler plugin ABI, versions 6 and 7, declared independently (not copied) from
 * NVIDIA/nccl plugins/profiler/example/nccl/profiler_v6.h (NCCL 2.29.2) and
 * src/include/plugin/profiler/profiler_v7.h (NCCL 2.31.2). Included by nccl_profiler_abi.h,
 * whose v5 declarations these build on; the _Static_asserts pin the LP64 offsets we use.
 */
#ifndef AEGIS_NCCL_PROFILER_ABI_V6V7_H_
#define AEGIS_NCCL_PROFILER_ABI_V6V7_H_

/* Copy-engine (CE) descriptors, the same in v6 and v7 apart from v7's appended userTag.
 * NCCL runs some intra-node collectives on the copy engines: such a call emits CollApi and
 * CeColl only (no Coll, no KernelCh, no proxy events), its CeColl stops when the copies are
 * enqueued, and its seqNumber is a separate CE counter (src/ce_coll.cc). */
struct aegisNcclCeCollSyncDescr {
  bool isComplete;
  int nRanks;
};
struct aegisNcclCeCollBatchDescr {
  int numOps;
  size_t totalBytes;
  bool useIntraSync;
};

/* profiler_v6.h: ncclProfilerEventDescr_v6_t (v5's members unchanged, CE members added). */
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
    struct {
      uint64_t seqNumber; /* the communicator's CE sync counter, not the coll sequence */
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
    } ceColl;
    struct aegisNcclCeCollSyncDescr ceCollSync;
    struct aegisNcclCeCollBatchDescr ceCollBatch;
  };
} ncclProfilerEventDescr_v6_t;

/* profiler_v6.h: ncclProfiler_v6_t (table and init as v5). */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                       int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v6_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v6_t eState,
                                   ncclProfilerEventStateArgs_v6_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v6_t;

/* profiler_v7.h: ncclProfilerEventDescr_v7_t. Fields are only appended to v6's members
 * (userTag; coll.kernelVariant and coll.isSymColl), so every v6 offset holds. */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct aegisNcclGroupApiDescr groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
      uint64_t userTag; /* 0 = untagged */
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
      uint64_t userTag;
    } p2pApi;
    struct aegisNcclKernelLaunchDescr kernelLaunch;
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
      void* parentGroup;
      const char* kernelVariant;
      bool isSymColl;
      uint64_t userTag;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
      uint64_t userTag;
    } p2p;
    struct aegisNcclProxyOpDescr proxyOp;
    struct aegisNcclProxyStepDescr proxyStep;
    struct aegisNcclKernelChDescr kernelCh;
    struct aegisNcclNetPluginDescr netPlugin;
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
      uint64_t userTag;
    } ceColl;
    struct aegisNcclCeCollSyncDescr ceCollSync;
    struct aegisNcclCeCollBatchDescr ceCollBatch;
    struct {
      uint8_t channelId;
      uint8_t phaseId; /* 0 initial sync, 1 compute, 2 final sync */
      const char* phaseName;
      uint64_t pTimer;
    } kernelPhase;
  };
} ncclProfilerEventDescr_v7_t;

/* profiler_v7.h: ncclProfiler_v7_t (table and init as v5). */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                       int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v7_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v7_t eState,
                                   ncclProfilerEventStateArgs_v7_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v7_t;

#if defined(__LP64__)
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v6_t, rank) == 16);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v6_t, coll.func) == 32);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v6_t, coll.nChannels) == 80);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v6_t, p2p.nChannels) == 60);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v6_t, proxyOp.isSend) == 44);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v6_t, kernelCh.pTimer) == 32);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v6_t, ceColl.func) == 32);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v6_t, ceColl.syncStrategy) == 80);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v6_t, ceColl.batchSize) == 92);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v6_t, ceColl.stream) == 104);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v6_t, ceCollBatch.useIntraSync) == 40);
AEGIS_ABI_ASSERT(sizeof(ncclProfilerEventDescr_v6_t) == 112);
AEGIS_ABI_ASSERT(sizeof(ncclProfiler_v6_t) == 48);

AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v7_t, rank) == 16);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v7_t, collApi.userTag) == 72);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v7_t, coll.func) == 32);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v7_t, coll.nChannels) == 80);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v7_t, coll.kernelVariant) == 112);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v7_t, coll.userTag) == 128);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v7_t, p2p.nChannels) == 60);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v7_t, p2p.userTag) == 72);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v7_t, proxyOp.isSend) == 44);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v7_t, kernelCh.pTimer) == 32);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v7_t, ceColl.func) == 32);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v7_t, ceColl.userTag) == 112);
AEGIS_ABI_ASSERT(offsetof(ncclProfilerEventDescr_v7_t, kernelPhase.pTimer) == 40);
AEGIS_ABI_ASSERT(sizeof(ncclProfilerEventDescr_v7_t) == 136);
AEGIS_ABI_ASSERT(sizeof(ncclProfiler_v7_t) == 48);
#endif

#endif /* AEGIS_NCCL_PROFILER_ABI_V6V7_H_ */
