/* CUDA emulation: streams and events. A stream is a queue; nothing runs when it is enqueued.
 * Work runs, in order, only when the host waits for it: cudaStreamSynchronize, cudaEventSynchronize,
 * cudaEventQuery/cudaStreamQuery (which run the work and then report it done), cudaDeviceSynchronize,
 * and the calls that are synchronous in CUDA (cudaMemcpy to host, cudaFree). An NCCL call's op
 * finishes only when its peers have taken part: the queries return cudaErrorNotReady until then
 * (the rest of the stream waits behind it), the synchronising calls poll it. So a host read that
 * is not ordered after a kernel sees the memory as it was before the kernel. cudaStreamWaitEvent
 * queues a wait: running it first runs the other stream up to the event. The legacy default
 * stream (NULL) waits for all earlier work of the device's blocking streams and they wait for it;
 * cudaStreamNonBlocking streams do neither, as in CUDA. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <memory>
#include <unordered_map>

#include "emu_int.h"

struct dt_emu_event {
  unsigned flags;
  dt_emu::stream_t *s; /* stream of the last record, NULL before any */
  uint64_t seq;        /* that stream's op count at the record */
  uint64_t gen;        /* records so far; the record op stamps t when its gen is still current */
  double t;
};

namespace dt_emu {

/* by id; destroyed ones stay (events may name them). Never destroyed, like the fiber lists
 * (fiber.cpp): the streams stay reachable for LeakSanitizer's exit check. */
static std::vector<stream_t *> &g_streams = *new std::vector<stream_t *>;
static std::vector<stream_t *> &g_legacy = *new std::vector<stream_t *>; /* per device */
static std::unordered_map<void *, std::shared_ptr<dt_emu_event>> g_events;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static stream_t *new_stream(int dev, unsigned flags, int legacy) {
  stream_t *s = new stream_t();
  s->device = dev;
  s->id = (int)g_streams.size();
  s->flags = flags;
  s->legacy = legacy;
  g_streams.push_back(s);
  return s;
}

static stream_t *legacy_stream(int dev) {
  if ((int)g_legacy.size() <= dev) g_legacy.resize((size_t)dev + 1, NULL);
  if (!g_legacy[dev]) g_legacy[dev] = new_stream(dev, cudaStreamDefault, 1);
  return g_legacy[dev];
}

stream_t *get_stream(cudaStream_t h, cudaError_t *err) {
  *err = cudaSuccess;
  if (h == NULL || h == cudaStreamLegacy) {
    if (device_count() == 0) {
      *err = fail(cudaErrorNoDevice, "DTRAIN_EMU_DEVICES=0: the emulation has no devices");
      return NULL;
    }
    return legacy_stream(current_device());
  }
  for (stream_t *s : g_streams)
    if ((void *)s == (void *)h && !s->destroyed) return s;
  *err = fail(cudaErrorInvalidResourceHandle, "stream %p is not a live stream", (void *)h);
  return NULL;
}

op_t wait_op(stream_t *on, uint64_t seq) {
  op_t w;
  w.what = "wait";
  w.wait_s = on;
  w.wait_seq = seq;
  return w;
}

static void push(stream_t *s, op_t op) {
  s->q.push_back(std::move(op));
  s->enq++;
}

void enqueue(stream_t *s, op_t op) {
  if (s->legacy) { /* after all earlier work of the device's blocking streams */
    for (stream_t *o : g_streams) {
      if (o == s || o->destroyed || o->device != s->device || o->legacy || (o->flags & cudaStreamNonBlocking)) continue;
      if (s->seen.size() <= (size_t)o->id) s->seen.resize((size_t)o->id + 1, 0);
      if (o->enq > s->seen[o->id]) {
        push(s, wait_op(o, o->enq));
        s->seen[o->id] = o->enq;
      }
    }
  } else if (!(s->flags & cudaStreamNonBlocking)) { /* after earlier legacy-stream work */
    stream_t *l = legacy_stream(s->device);
    if (l->enq > s->legacy_seen) {
      push(s, wait_op(l, l->enq));
      s->legacy_seen = l->enq;
    }
  }
  push(s, std::move(op));
}

static thread_local const char *t_op;
const char *stream_op(void) { return t_op; }

/* An op that waits for peers: 1 once it has finished; with block, polls until then. */
static int step_op(op_t &op, int block) {
  for (;;) {
    t_op = op.what;
    bool done = op.step();
    t_op = NULL;
    if (done) return 1;
    if (!block) return 0;
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
}

/* Runs s up to its op number seq; 0 (only without block) when a step op or a stream waited for
 * is not finished: that op stays first in its queue. */
static int advance(stream_t *s, uint64_t seq, int block) {
  if (s->done >= seq) return 1;
  heap_open();
  int reached = 1;
  while (s->done < seq && !s->q.empty()) {
    if (s->q.front().step && sticky(s->device) == cudaSuccess && !step_op(s->q.front(), block)) {
      reached = 0;
      break;
    }
    op_t op = std::move(s->q.front());
    s->q.pop_front();
    if (op.wait_s && !advance(op.wait_s, op.wait_seq, block)) {
      s->q.push_front(std::move(op));
      reached = 0;
      break;
    }
    if (!op.wait_s && !op.step && sticky(s->device) == cudaSuccess) {
      t_op = op.what;
      op.run();
      t_op = NULL;
    }
    s->done++;
  }
  heap_close();
  return reached;
}

void run_until(stream_t *s, uint64_t seq) { advance(s, seq, 1); }

int try_run_until(stream_t *s, uint64_t seq) { return advance(s, seq, 0); }

void run_stream(stream_t *s) { run_until(s, s->enq); }

/* DTRAIN_EMU_WAITS=1: the host waits by call, one line at exit */
static std::vector<std::pair<const char *, unsigned long>> &g_waits = *new std::vector<std::pair<const char *, unsigned long>>;

static void print_waits(void) {
  unsigned long n = 0;
  char by[512] = "";
  size_t k = 0;
  for (const auto &w : g_waits) {
    n += w.second;
    k += (size_t)snprintf(by + k, k < sizeof by ? sizeof by - k : 0, "%s%s %lu", k ? ", " : "", w.first, w.second);
    if (k >= sizeof by) k = sizeof by;
  }
  fprintf(stderr, "dt_emu: host waits %lu (%s)\n", n, by);
}

void note_host_wait(const char *call) {
  static int on = -1;
  if (on < 0) {
    const char *v = env_str("DTRAIN_EMU_WAITS");
    on = v && strcmp(v, "0") != 0;
    if (on) atexit(print_waits);
  }
  if (!on) return;
  for (auto &w : g_waits)
    if (!strcmp(w.first, call)) {
      w.second++;
      return;
    }
  g_waits.push_back({call, 1});
}

void sync_device(int dev) {
  for (size_t i = 0; i < g_streams.size(); i++)
    if (g_streams[i]->device == dev) run_stream(g_streams[i]);
}

void drop_device_streams(int dev) {
  for (stream_t *s : g_streams)
    if (s->device == dev) {
      s->done += s->q.size();
      s->q.clear();
    }
}

static const char *stream_kind(const stream_t *s) {
  return s->legacy ? "the legacy default stream" : (s->flags & cudaStreamNonBlocking) ? "a non-blocking stream" : "a blocking stream";
}

int pending_writer(int dev, uintptr_t lo, uintptr_t hi, const stream_t *except, char *out, size_t n) {
  for (const stream_t *s : g_streams) {
    if (s == except || s->device != dev) continue;
    for (const op_t &op : s->q)
      for (const range_t &r : op.writes)
        if (r.lo < hi && lo < r.hi) {
          snprintf(out, n, "%s, queued on %s (stream #%d) and not yet ordered before this read, may write %zu of these bytes",
                   op.what, stream_kind(s), s->id, (size_t)((r.hi < hi ? r.hi : hi) - (r.lo > lo ? r.lo : lo)));
          return 1;
        }
  }
  return 0;
}

static dt_emu_event *get_event(cudaEvent_t e) {
  auto it = g_events.find((void *)e);
  return it == g_events.end() ? NULL : it->second.get();
}

}  // namespace dt_emu

using namespace dt_emu;

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  if (device_count() == 0) return fail(cudaErrorNoDevice, "DTRAIN_EMU_DEVICES=0: the emulation has no devices");
  if (flags & ~(unsigned)cudaStreamNonBlocking) return fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags(0x%x)", flags);
  *stream = (cudaStream_t)new_stream(current_device(), flags, 0);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

/* Runs what is queued (CUDA finishes it after the call returns), then retires the handle. */
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  cudaError_t e;
  if (stream == NULL || stream == cudaStreamLegacy)
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of the legacy default stream");
  stream_t *s = get_stream(stream, &e);
  if (!s) return e;
  run_stream(s);
  s->destroyed = 1;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  stream_t *s = get_stream(stream, &e);
  if (!s) return e;
  note_host_wait("cudaStreamSynchronize");
  run_stream(s);
  return entry();
}

/* Runs what it can; cudaErrorNotReady while an NCCL call waits for its peers (not an error:
 * nothing is recorded). */
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  stream_t *s = get_stream(stream, &e);
  if (!s) return e;
  if (!try_run_until(s, s->enq)) return cudaErrorNotReady;
  return entry();
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  stream_t *s = get_stream(stream, &e);
  if (!s) return e;
  dt_emu_event *ev = get_event(event);
  if (!ev) return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: %p is not a live event", (void *)event);
  if (flags != 0) return fail(cudaErrorInvalidValue, "cudaStreamWaitEvent: flags 0x%x", flags);
  if (ev->s && ev->s != s && ev->s->done < ev->seq) enqueue(s, wait_op(ev->s, ev->seq));
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  if (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming))
    return fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags(0x%x)", flags);
  auto ev = std::make_shared<dt_emu_event>();
  ev->flags = flags;
  *event = ev.get();
  g_events[(void *)ev.get()] = ev;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!g_events.erase((void *)event))
    return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy: %p is not a live event", (void *)event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  stream_t *s = get_stream(stream, &e);
  if (!s) return e;
  auto it = g_events.find((void *)event);
  if (it == g_events.end()) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: %p is not a live event", (void *)event);
  std::shared_ptr<dt_emu_event> ev = it->second;
  uint64_t gen = ++ev->gen;
  op_t op;
  op.what = "cudaEventRecord";
  op.run = [ev, gen]() {
    if (ev->gen == gen) ev->t = now_ms();
  };
  enqueue(s, std::move(op));
  ev->s = s;
  ev->seq = s->enq;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  dt_emu_event *ev = get_event(event);
  if (!ev) return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: %p is not a live event", (void *)event);
  note_host_wait("cudaEventSynchronize");
  if (ev->s) run_until(ev->s, ev->seq);
  return entry();
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  cudaError_t e = entry();
  if (e != cudaSuccess) return e;
  dt_emu_event *ev = get_event(event);
  if (!ev) return fail(cudaErrorInvalidResourceHandle, "cudaEventQuery: %p is not a live event", (void *)event);
  if (ev->s && !try_run_until(ev->s, ev->seq)) return cudaErrorNotReady;
  return entry();
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  dt_emu_event *a = get_event(start), *b = get_event(end);
  if (!a || !b) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: not a live event");
  if ((a->flags | b->flags) & cudaEventDisableTiming)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event created with cudaEventDisableTiming");
  if (!a->s || !b->s) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event never recorded");
  if (a->s->done < a->seq || b->s->done < b->seq) return fail(cudaErrorNotReady, "cudaEventElapsedTime: not complete");
  *ms = (float)(b->t - a->t);
  return cudaSuccess;
}

}  // extern "C"
