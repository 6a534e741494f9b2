/*
 * Per-event cost of the plugin, measured side by side with an empty call through a
 * function pointer (what NCCL pays with any plugin at all). Prints figures, then one
 * JSON object as the last line.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static void __attribute__((noinline)) empty_call(void* p) { __asm__ volatile("" : : "r"(p) : "memory"); }

struct worker {
  const struct drv* d;
  void* ctx;
  long n;
  pthread_barrier_t* go;
  double ns_per_pair;
};

static double coll_pairs(const struct drv* d, void* ctx, long n) {
  ncclProfilerEventDescr_v4_t desc;
  memset(&desc, 0, sizeof(desc));
  desc.type = ncclProfileColl;
  desc.coll.func = "AllReduce";
  desc.coll.nChannels = 2;
  uint64_t t0 = now_ns();
  for (long i = 0; i < n; i++) {
    void* h;
    d->v4->startEvent(ctx, &h, &desc);
    d->v4->stopEvent(h);
  }
  return (double)(now_ns() - t0) / (double)n;
}

static void* worker_main(void* arg) {
  struct worker* w = arg;
  pthread_barrier_wait(w->go);
  w->ns_per_pair = coll_pairs(w->d, w->ctx, w->n);
  return NULL;
}

static double empty_pairs(long n) {
  void (*volatile fn)(void*) = empty_call;
  uint64_t t0 = now_ns();
  for (long i = 0; i < n; i++) {
    fn(&i);
    fn(&i);
  }
  return (double)(now_ns() - t0) / (double)n;
}

static double step_lifecycles(const struct drv* d, void* ctx, long n) {
  ncclProfilerEventDescr_v4_t cd, od, sd;
  memset(&cd, 0, sizeof(cd));
  memset(&od, 0, sizeof(od));
  memset(&sd, 0, sizeof(sd));
  cd.type = ncclProfileColl;
  cd.coll.func = "AllReduce";
  cd.coll.nChannels = 1;
  void *coll, *op;
  d->v4->startEvent(ctx, &coll, &cd);
  od.type = ncclProfileProxyOp;
  od.parentObj = coll;
  od.proxyOp.pid = getpid();
  od.proxyOp.peer = 3;
  od.proxyOp.isSend = 1;
  d->v4->startEvent(ctx, &op, &od);
  sd.type = ncclProfileProxyStep;
  sd.parentObj = op;
  ncclProfilerEventStateArgs_v4_t args;
  memset(&args, 0, sizeof(args));
  uint64_t t0 = now_ns();
  for (long i = 0; i < n; i++) {
    void* h;
    d->v4->startEvent(ctx, &h, &sd);
    d->v4->recordEventState(h, ncclProfilerProxyStepSendWait, &args);
    d->v4->stopEvent(h);
  }
  double ns = (double)(now_ns() - t0) / (double)n;
  d->v4->stopEvent(op);
  d->v4->stopEvent(coll);
  return ns;
}

static double min2(double a, double b) { return a < b ? a : b; }

/* Each figure is the best of ROUNDS interleaved rounds: the machine may be shared. */
int run_bench(const struct drv* d) {
  enum { ROUNDS = 5, T = 4 };
  long n = g_quick ? 200000 : 1000000;
  setenv("AEGIS_CCL_SOCKET", "/nonexistent/aegis-bench.sock", 1);
  unsetenv("AEGIS_CCL_INTERVAL_MS");
  unsetenv("AEGIS_CCL_MAX_EVENTS");
  void* ctx = NULL;
  int mask = 0;
  if (drv_init(d, &ctx, &mask, "bench", 0xBE4C4, 8, 0) != ncclSuccess) {
    CHECK(0, "bench: init failed");
    return -1;
  }
  coll_pairs(d, ctx, n / 10); /* warm up */
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  double base = 1e18, one = 1e18, step = 1e18, four = 1e18;
  for (int round = 0; round < ROUNDS; round++) {
    base = min2(base, empty_pairs(n));
    one = min2(one, coll_pairs(d, ctx, n));
    step = min2(step, step_lifecycles(d, ctx, n));
    /* CPU cost per pair under contention: wall time x busy CPUs / pairs. */
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, T + 1);
    pthread_t th[T];
    struct worker w[T];
    for (int i = 0; i < T; i++) {
      w[i] = (struct worker){d, ctx, n, &go, 0};
      pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    pthread_barrier_wait(&go);
    uint64_t t0 = now_ns();
    for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
    double busy = (double)(cpus < T ? cpus : T);
    four = min2(four, (double)(now_ns() - t0) * busy / ((double)n * T));
    pthread_barrier_destroy(&go);
  }
  drv_finalize(d, ctx);

  printf("best of %d rounds of %ld; baseline measured side by side\n", ROUNDS, n);
  printf("empty call pair (baseline):           %8.1f ns\n", base);
  printf("Coll start+stop, 1 thread:            %8.1f ns  (%.1f M pairs/s)\n", one, 1e3 / one);
  printf("Coll start+stop, %d threads, 1 comm:   %8.1f ns CPU per pair (wall x %ld busy cpus / pairs)\n",
         T, four, cpus < T ? cpus : (long)T);
  printf("ProxyStep start+SendWait+stop:        %8.1f ns\n", step);
  printf("{\"ns_per_event_1thread\": %.1f, \"ns_per_event_4threads\": %.1f, "
         "\"ns_per_step_lifecycle_1thread\": %.1f, \"baseline_ns_empty_call\": %.1f, "
         "\"ratio_1thread_vs_baseline\": %.1f, \"pairs_per_sec_1thread\": %.0f, \"cpus\": %ld}\n",
         one, four, step, base, one / base, 1e9 / one, cpus);
  return 0;
}
