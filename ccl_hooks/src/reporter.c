/*
 * Registry of live communicators and the reporter thread.
 *
 * Every AEGIS_CCL_INTERVAL_MS (default 1000) the thread encodes one entry per live
 * communicator into datagrams of at most ACC_MAX_DGRAM bytes and sends them to the Unix
 * datagram socket AEGIS_CCL_SOCKET (default /run/aegis/ccl.sock) with MSG_DONTWAIT. It
 * keeps sending while training is stalled: a hang is what the counters are for
 * (Aegis §4.2). A full socket drops the datagram and counts it (drops_full); a missing
 * receiver counts drops_unsent; neither blocks nor fails anything. The thread starts at
 * the first init and is joined at the last finalize, because NCCL dlclose()s the plugin
 * when its last communicator goes away.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "state.h"

#define ACC_MAX_DGRAM 16384
#define ACC_DEFAULT_SOCKET "/run/aegis/ccl.sock"

static pthread_mutex_t g_life = PTHREAD_MUTEX_INITIALIZER; /* init/finalize lifecycle */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;   /* registry + send buffer */
static pthread_cond_t g_cv;
static struct acc_comm* g_comms;
static int g_running, g_stop;
static pthread_t g_thread;
static int g_fd = -1;
static struct sockaddr_un g_addr;
static socklen_t g_addr_len;
static uint32_t g_interval_ms;
static uint32_t g_seq, g_drops_full, g_drops_unsent; /* guarded by g_mu; process lifetime */
static uint8_t g_buf[ACC_MAX_DGRAM];

int acc_env_int(const char* name, int dflt, int lo, int hi) {
  const char* s = getenv(name);
  if (s == NULL || *s == '\0') return dflt;
  char* end = NULL;
  long v = strtol(s, &end, 0);
  if (end == s || *end != '\0') return dflt;
  return v < lo ? lo : v > hi ? hi : (int)v;
}

static int parse_int(const char* s, long* out) {
  char* end = NULL;
  if (s == NULL || *s == '\0') return 0;
  long v = strtol(s, &end, 10);
  if (end == s || (*end != '\0' && *end != ',')) return 0;
  *out = v;
  return 1;
}

/* Local GPU index: AEGIS_CCL_LOCAL_GPU; else the CUDA_VISIBLE_DEVICES entry at the local
 * rank (LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID), or its only
 * entry; else the local rank itself; else -1 (unknown). UUID entries cannot be mapped. */
int16_t acc_local_gpu(void) {
  long v;
  if (parse_int(getenv("AEGIS_CCL_LOCAL_GPU"), &v) && v >= 0 && v < 32768) return (int16_t)v;
  static const char* const rank_vars[] = {"LOCAL_RANK", "SLURM_LOCALID",
                                          "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"};
  long local = -1;
  for (size_t i = 0; i < sizeof(rank_vars) / sizeof(rank_vars[0]) && local < 0; i++)
    if (parse_int(getenv(rank_vars[i]), &v) && v >= 0) local = v;
  const char* cvd = getenv("CUDA_VISIBLE_DEVICES");
  long devs[64];
  int n = 0, ok = cvd != NULL && *cvd != '\0';
  for (const char* p = cvd; ok && n < 64;) {
    if (!parse_int(p, &v) || v < 0 || v >= 32768) {
      ok = 0;
      break;
    }
    devs[n++] = v;
    p = strchr(p, ',');
    if (p == NULL) break;
    p++;
  }
  if (ok && n == 1) return (int16_t)devs[0];
  if (ok && local >= 0 && local < n) return (int16_t)devs[local];
  return local >= 0 && local < 32768 ? (int16_t)local : -1;
}

static void send_datagram(size_t len) {
  ssize_t r = sendto(g_fd, g_buf, len, MSG_DONTWAIT | MSG_NOSIGNAL,
                     (const struct sockaddr*)&g_addr, g_addr_len);
  if (r >= 0) return;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)
    g_drops_full++;
  else
    g_drops_unsent++;
}

static void put_header(uint8_t flags, uint16_t n_entries) {
  struct timespec wall, mono;
  clock_gettime(CLOCK_REALTIME, &wall);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  struct acc_wire_header h = {
      .flags = flags,
      .n_entries = n_entries,
      .pid = (uint32_t)getpid(),
      .seq = ++g_seq,
      .drops_full = g_drops_full,
      .drops_unsent = g_drops_unsent,
      .wall_ns = (uint64_t)wall.tv_sec * 1000000000ull + (uint64_t)wall.tv_nsec,
      .mono_ns = (uint64_t)mono.tv_sec * 1000000000ull + (uint64_t)mono.tv_nsec,
  };
  acc_wire_put_header(g_buf, &h);
}

/* Encode and send every live comm (only == NULL) or one finalized comm. Holds g_mu. */
static void send_snapshot_locked(struct acc_comm* only) {
  if (g_fd < 0) return;
  struct acc_wire_entry e;
  size_t off = ACC_WIRE_HEADER_BYTES;
  uint16_t n = 0;
  for (struct acc_comm* c = only ? only : g_comms; c != NULL; c = only ? NULL : c->next) {
    acc_comm_read(c, &e, only != NULL);
    size_t w = acc_wire_put_entry(g_buf + off, sizeof(g_buf) - off, &e);
    if (w == 0 && n > 0) { /* full: send what we have, continue in a new datagram */
      put_header(ACC_WIRE_FLAG_MORE, n);
      send_datagram(off);
      off = ACC_WIRE_HEADER_BYTES;
      n = 0;
      w = acc_wire_put_entry(g_buf + off, sizeof(g_buf) - off, &e);
    }
    if (w == 0) continue; /* cannot happen: one entry is far below ACC_MAX_DGRAM */
    off += w;
    n++;
  }
  put_header(0, n);
  send_datagram(off);
}

static void* reporter_main(void* arg) {
  (void)arg;
  pthread_mutex_lock(&g_mu);
  uint64_t next = acc_mono_ns() + (uint64_t)g_interval_ms * 1000000ull;
  while (!g_stop) {
    struct timespec ts = {(time_t)(next / 1000000000ull), (long)(next % 1000000000ull)};
    int rc = pthread_cond_timedwait(&g_cv, &g_mu, &ts);
    if (g_stop) break;
    if (rc != ETIMEDOUT) continue;
    send_snapshot_locked(NULL);
    uint64_t now = acc_mono_ns();
    next += (uint64_t)g_interval_ms * 1000000ull;
    if (next <= now) next = now + (uint64_t)g_interval_ms * 1000000ull;
  }
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

static void open_socket(void) {
  const char* path = getenv("AEGIS_CCL_SOCKET");
  if (path == NULL || *path == '\0') path = ACC_DEFAULT_SOCKET;
  memset(&g_addr, 0, sizeof(g_addr));
  g_addr.sun_family = AF_UNIX;
  size_t len = strlen(path);
  if (len >= sizeof(g_addr.sun_path)) return; /* cannot address it: report nothing */
  memcpy(g_addr.sun_path, path, len + 1);
  g_addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + 1);
  g_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
}

/* Start the reporter if needed. Holds g_life. */
static int start_reporter(void) {
  g_interval_ms = (uint32_t)acc_env_int("AEGIS_CCL_INTERVAL_MS", 1000, 1, 3600000);
  open_socket();
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&g_cv, &attr);
  pthread_condattr_destroy(&attr);
  g_stop = 0;
  if (pthread_create(&g_thread, NULL, reporter_main, NULL) != 0) {
    pthread_cond_destroy(&g_cv);
    if (g_fd >= 0) close(g_fd);
    g_fd = -1;
    return -1;
  }
  g_running = 1;
  return 0;
}

/* Stop and join the reporter. Holds g_life, not g_mu. */
static void stop_reporter(void) {
  if (!g_running) return;
  pthread_mutex_lock(&g_mu);
  g_stop = 1;
  pthread_cond_signal(&g_cv);
  pthread_mutex_unlock(&g_mu);
  pthread_join(g_thread, NULL);
  pthread_cond_destroy(&g_cv);
  if (g_fd >= 0) close(g_fd);
  g_fd = -1;
  g_running = 0;
}

int acc_register(struct acc_comm* c) {
  pthread_mutex_lock(&g_life);
  if (!g_running && start_reporter() != 0) {
    pthread_mutex_unlock(&g_life);
    return -1;
  }
  pthread_mutex_lock(&g_mu);
  c->next = g_comms;
  g_comms = c;
  pthread_mutex_unlock(&g_mu);
  pthread_mutex_unlock(&g_life);
  return 0;
}

void acc_unregister(struct acc_comm* c) {
  pthread_mutex_lock(&g_life);
  pthread_mutex_lock(&g_mu);
  for (struct acc_comm** p = &g_comms; *p != NULL; p = &(*p)->next) {
    if (*p == c) {
      *p = c->next;
      break;
    }
  }
  send_snapshot_locked(c); /* the final counters, flagged FINAL */
  int last = g_comms == NULL;
  pthread_mutex_unlock(&g_mu);
  if (last) stop_reporter();
  pthread_mutex_unlock(&g_life);
}

/* Unloaded without a finalize (process exit, or NCCL skipped it): the thread must not
 * outlive the library's code. Comms are not freed here: another thread may still hold one. */
__attribute__((destructor)) static void acc_unload(void) {
  pthread_mutex_lock(&g_life);
  stop_reporter();
  pthread_mutex_unlock(&g_life);
}
