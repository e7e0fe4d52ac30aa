/* CUDA emulation: the SIMT executor. Blocks run one after another (x fastest); the threads of a
 * block are fibers on the calling host thread, grouped into warps of 32 consecutive linear thread
 * ids. The scheduler runs warp by warp, each lane until it blocks: at __syncthreads (released
 * when every live thread of the block waits at the same call site) or at a warp operation
 * (completed when every lane named in its mask has arrived; the last one computes every lane's
 * result). Misuse that hangs or is undefined on a GPU stops the kernel with a sticky
 * cudaErrorLaunchFailure naming kernel, block and thread: a barrier no thread can pass, threads at
 * different barriers, a mask naming a lane that exited or does not exist, a shuffle from a lane
 * outside the mask. DTRAIN_EMU_SCHEDULE=reverse runs warps and lanes in reverse order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fiber.h"

extern "C" char __start_dt_emu_shared[] __attribute__((weak));
extern "C" char __stop_dt_emu_shared[] __attribute__((weak));

dt_emu_ids_t dt_emu_ids;

namespace dt_emu {

enum { T_NEW, T_RUN, T_READY, T_BAR, T_WARP, T_DONE };

struct thr_t {
  fiber_t *f;
  int state;
  uint3 tid;
  /* warp operation */
  int wkind, warg, wwidth;
  unsigned wmask;
  uint64_t wval, wres;
  const char *wwhat;
  /* barrier */
  int bkind, bpred, bres, bline;
  const char *bfile;
};

/* The warp operation being gathered in a warp: its kind and mask, lanes arrived so far. */
struct warp_t {
  int kind, arrived, need;
  unsigned mask;
};

static std::vector<thr_t> g_thr;
static std::vector<warp_t> g_warp;
static thr_t *g_cur;
static const dt_emu_launch_t *g_l;
static int g_dev, g_failed, g_active, g_order = -1, g_no_barrier = -1;
static unsigned g_n;
static sigjmp_buf g_jmp;
static char g_where[320];

static unsigned lin_of(const thr_t *t) { return (unsigned)(t - g_thr.data()); }

static const char *where_thread(const thr_t *t) {
  const uint3 &b = dt_emu_ids.bid;
  if (t)
    snprintf(g_where, sizeof g_where, "kernel %s block (%u,%u,%u) thread (%u,%u,%u)", g_l->name, b.x, b.y, b.z,
             t->tid.x, t->tid.y, t->tid.z);
  else
    snprintf(g_where, sizeof g_where, "kernel %s block (%u,%u,%u)", g_l->name, b.x, b.y, b.z);
  return g_where;
}

const char *exec_where(void) { return g_active ? where_thread(g_cur) : NULL; }

void exec_abandon(void) {
  if (g_active) siglongjmp(g_jmp, 1);
}

/* A misuse found by the scheduler (t == NULL) or by thread t: sticky error, kernel abandoned. */
static void kernel_fail(thr_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void kernel_fail(thr_t *t, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fail_sticky(g_dev, cudaErrorLaunchFailure, "%s: %s", where_thread(t), msg);
  g_failed = 1;
  if (t) {
    t->state = T_DONE;
    fiber_yield(t->f); /* never resumed */
  }
}

/* The lane at position li of a pass over the warp whose first thread is b (nl lanes). */
static thr_t *lane_at(unsigned b, unsigned nl, unsigned li) { return &g_thr[b + (g_order ? nl - 1 - li : li)]; }

/* The scheduler's pass over one warp's lanes (positions 0..nl-1, lane_at order): pos is the lane
 * running now. A new lane starts on a fresh fiber that goes on with the next lanes while they are
 * new (a call per thread instead of two stack switches), and a lane that blocks (a barrier, a
 * warp operation) hands over to the next lane of the pass that can run, fiber to fiber, instead
 * of through the scheduler: the order threads run in stays the scheduler's (and
 * DTRAIN_EMU_SCHEDULE=reverse's), at half the switches. At the pass's end, or when a chain meets
 * a lane that is not new, control goes back to the scheduler, which frees the fiber that exited. */
static struct {
  unsigned b, nl, pos;
  fiber_t *fresh;  /* the fiber chain_entry starts on */
  fiber_t *exited; /* the fiber that returned to the scheduler for good, to be freed there */
} g_pass;

static void enter(thr_t *t) {
  g_cur = t;
  dt_emu_ids.tid = t->tid;
  t->state = T_RUN;
}

static void chain_entry(void) {
  fiber_t *f = g_pass.fresh;
  for (;;) {
    thr_t *t = lane_at(g_pass.b, g_pass.nl, g_pass.pos);
    enter(t);
    t->f = f;
    g_l->body(g_l->ctx);
    t->state = T_DONE;
    t->f = NULL;
    /* g_pass.pos is t's again (whoever resumed t set it): the next lane, if new, runs here */
    if (g_pass.pos + 1 >= g_pass.nl || lane_at(g_pass.b, g_pass.nl, g_pass.pos + 1)->state != T_NEW) break;
    g_pass.pos++;
  }
  g_pass.exited = f;
  fiber_exit(f); /* never returns */
}

static fiber_t *fresh_fiber(void) {
  fiber_t *f = fiber_acquire();
  fiber_prepare(f, chain_entry);
  g_pass.fresh = f;
  return f;
}

/* Thread t (state set to T_BAR or T_WARP) blocks: the next lane of the pass that can run goes on
 * from here; none: back to the scheduler. Returns when t is resumed (its resumer called enter). */
static void block(thr_t *t) {
  for (unsigned q = g_pass.pos + 1; q < g_pass.nl; q++) {
    thr_t *u = lane_at(g_pass.b, g_pass.nl, q);
    if (u->state != T_READY && u->state != T_NEW) continue;
    g_pass.pos = q;
    if (u->state == T_NEW) {
      fiber_switch(t->f, fresh_fiber());
    } else {
      enter(u);
      fiber_switch(t->f, u->f);
    }
    return;
  }
  fiber_yield(t->f);
}

/* The scheduler runs the lane at position li of warp b's pass (new or ready) and whatever follows
 * it from there; returns the position of the lane that gave control back. */
static unsigned run_at(unsigned b, unsigned nl, unsigned li) {
  thr_t *t = lane_at(b, nl, li);
  g_pass.b = b;
  g_pass.nl = nl;
  g_pass.pos = li;
  g_pass.exited = NULL;
  fiber_t *f = t->f;
  if (t->state == T_NEW) f = fresh_fiber();
  else enter(t);
  fiber_resume(f);
  if (g_pass.exited && !g_failed) fiber_release(g_pass.exited);
  g_pass.exited = NULL;
  g_cur = NULL;
  return g_pass.pos;
}

static const char *state_name(const thr_t *u) {
  static char b[160];
  switch (u->state) {
    case T_DONE: return "has exited";
    case T_BAR: snprintf(b, sizeof b, "waits at __syncthreads (%s:%d)", u->bfile, u->bline); return b;
    case T_WARP: snprintf(b, sizeof b, "waits in %s with mask 0x%08x", u->wwhat, u->wmask); return b;
    default: return "is running";
  }
}

/* ---- warp operations ------------------------------------------------------------------------ */

static unsigned src_lane(const thr_t *u, unsigned l) {
  unsigned w = (unsigned)u->wwidth, seg = l & ~(w - 1), a = (unsigned)u->warg;
  switch (u->wkind) {
    case DT_EMU_W_IDX: return seg + (a & (w - 1));
    case DT_EMU_W_UP: return (l & (w - 1)) < a ? l : l - a;
    case DT_EMU_W_DOWN: return (l & (w - 1)) + a >= w ? l : l + a;
    case DT_EMU_W_XOR: return ((l ^ a) & 31) >= seg + w ? l : (l ^ a) & 31; /* no later segment */
  }
  return l;
}

static uint64_t reduce(const thr_t *base, unsigned mask, int kind, int is_signed) {
  uint64_t r = 0;
  int first = 1;
  for (unsigned l = 0; l < 32; l++) {
    if (!(mask >> l & 1)) continue;
    uint64_t v = base[l].wval;
    if (first) r = v;
    else if (kind == DT_EMU_W_RADD) r += v;
    else if (kind == DT_EMU_W_RAND) r &= v;
    else if (kind == DT_EMU_W_ROR) r |= v;
    else if (kind == DT_EMU_W_RXOR) r ^= v;
    else {
      int less = is_signed ? (int64_t)v < (int64_t)r : v < r;
      if ((kind == DT_EMU_W_RMIN) == less) r = v;
    }
    first = 0;
  }
  return r;
}

/* Every lane of mask has arrived: each one's result, then all may go on. */
static void complete(thr_t *base, unsigned mask) {
  uint64_t ballot = 0;
  for (unsigned l = 0; l < 32; l++)
    if (mask >> l & 1) ballot |= (uint64_t)(base[l].wval != 0) << l;
  for (unsigned l = 0; l < 32; l++) {
    if (!(mask >> l & 1)) continue;
    thr_t *u = &base[l];
    switch (u->wkind) {
      case DT_EMU_W_SYNC: u->wres = 0; break;
      case DT_EMU_W_BALLOT: u->wres = ballot; break;
      case DT_EMU_W_IDX:
      case DT_EMU_W_UP:
      case DT_EMU_W_DOWN:
      case DT_EMU_W_XOR: {
        unsigned s = src_lane(u, l);
        if (!(mask >> s & 1))
          kernel_fail(g_cur, "%s: lane %u reads lane %u, which is not in the mask 0x%08x (undefined on a GPU)", u->wwhat,
                      l, s, mask);
        u->wres = base[s].wval;
        break;
      }
      default: u->wres = reduce(base, mask, u->wkind, u->warg); break;
    }
    u->state = T_READY;
  }
}

}  // namespace dt_emu

using namespace dt_emu;

uint64_t dt_emu_warp(int kind, unsigned mask, uint64_t val, int arg, int width, const char *what) {
  thr_t *t = g_cur;
  if (!t || !g_active) {
    fprintf(stderr, "dt_emu: %s called outside a kernel\n", what);
    abort();
  }
  unsigned lin = lin_of(t), lane = lin % 32, wbase = lin - lane, nl = g_n - wbase < 32 ? g_n - wbase : 32;
  thr_t *base = &g_thr[wbase];
  if (!(mask >> lane & 1)) kernel_fail(t, "%s: the calling lane %u is not in its mask 0x%08x", what, lane, mask);
  if (nl < 32 && (mask >> nl) != 0)
    kernel_fail(t, "%s: mask 0x%08x names lanes %u..31, which do not exist (the block has %u threads)", what, mask, nl,
                g_n);
  if (width < 1 || width > 32 || (width & (width - 1)))
    kernel_fail(t, "%s: width %d is not a power of 2 in [1, 32]", what, width);
  t->wkind = kind;
  t->wmask = mask;
  t->wval = val;
  t->warg = arg;
  t->wwidth = width;
  t->wwhat = what;
  t->state = T_WARP;
  warp_t &w = g_warp[lin / 32];
  if (w.arrived == 0) { /* the first lane: every lane of the mask must still be alive */
    w.kind = kind;
    w.mask = mask;
    w.need = __builtin_popcount(mask);
    for (unsigned l = 0; l < nl; l++)
      if ((mask >> l & 1) && base[l].state == T_DONE)
        kernel_fail(t, "%s with mask 0x%08x: lane %u of the mask has exited", what, mask, l);
  } else if (w.mask != mask || w.kind != kind) {
    for (unsigned l = 0; l < nl; l++)
      if (base[l].state == T_WARP && &base[l] != t)
        kernel_fail(t, "%s with mask 0x%08x while lane %u of the warp %s", what, mask, l, state_name(&base[l]));
  }
  int all = ++w.arrived == w.need;
  if (all) w.arrived = 0;
  if (all) complete(base, mask);
  else block(t);
  t->state = T_RUN;
  return t->wres;
}

unsigned dt_emu_activemask(void) {
  thr_t *t = g_cur;
  if (!t) return 0;
  unsigned lin = lin_of(t), wbase = lin - lin % 32, m = 0;
  for (unsigned l = 0; l < 32 && wbase + l < g_n; l++)
    if (g_thr[wbase + l].state != T_DONE) m |= 1u << l;
  return m;
}

int dt_emu_barrier(int kind, int pred, const char *file, int line) {
  thr_t *t = g_cur;
  if (!t || !g_active) {
    fprintf(stderr, "dt_emu: __syncthreads called outside a kernel (%s:%d)\n", file, line);
    abort();
  }
  if (g_no_barrier) return pred; /* planted: emu_no_barrier */
  t->bkind = kind;
  t->bpred = pred;
  t->bfile = file;
  t->bline = line;
  t->state = T_BAR;
  block(t);
  t->state = T_RUN;
  return t->bres;
}

namespace dt_emu {

/* Every live thread waits at a barrier: check it is one barrier, give results, release. */
static void release_barrier(void) {
  const thr_t *first = NULL;
  int count = 0, all = 1, any = 0;
  for (thr_t &t : g_thr) {
    if (t.state != T_BAR) continue;
    if (!first) first = &t;
    else if (t.bline != first->bline || t.bkind != first->bkind ||
             (t.bfile != first->bfile && strcmp(t.bfile, first->bfile))) {
      kernel_fail(NULL, "threads (%u,%u,%u) and (%u,%u,%u) wait at different barriers, %s:%d and %s:%d (a "
                  "__syncthreads in divergent code)", first->tid.x, first->tid.y, first->tid.z, t.tid.x, t.tid.y,
                  t.tid.z, first->bfile, first->bline, t.bfile, t.bline);
      return;
    }
    count += t.bpred;
    all &= t.bpred;
    any |= t.bpred;
  }
  int res = first->bkind == DT_EMU_BAR_COUNT ? count : first->bkind == DT_EMU_BAR_AND ? all : any;
  for (thr_t &t : g_thr)
    if (t.state == T_BAR) {
      t.bres = res;
      t.state = T_READY;
    }
}

/* Nothing can run and not every live thread is at a barrier: a lane waits for lanes that never come. */
static void deadlock(void) {
  for (unsigned i = 0; i < g_n; i++) {
    thr_t *t = &g_thr[i];
    if (t->state != T_WARP) continue;
    thr_t *base = &g_thr[i - i % 32];
    for (unsigned l = 0; l < 32; l++)
      if ((t->wmask >> l & 1) && base[l].state != T_WARP) {
        kernel_fail(NULL, "deadlock: thread (%u,%u,%u) waits in %s with mask 0x%08x, but lane %u of its warp %s",
                    t->tid.x, t->tid.y, t->tid.z, t->wwhat, t->wmask, l, state_name(&base[l]));
        return;
      }
  }
  kernel_fail(NULL, "deadlock: no thread can run");
}

static void poison_shared(void) {
  char *lo = __start_dt_emu_shared, *hi = __stop_dt_emu_shared;
  if (lo && hi > lo) memset(lo, 0xff, (size_t)(hi - lo));
}

static int run_block(void) {
  for (thr_t &t : g_thr) {
    t.f = NULL;
    t.state = T_NEW;
  }
  for (warp_t &w : g_warp) w.arrived = 0;
  poison_shared();
  unsigned nw = (g_n + 31) / 32;
  for (;;) {
    for (unsigned wi = 0; wi < nw; wi++) {
      unsigned w = g_order ? nw - 1 - wi : wi, b = w * 32, nl = g_n - b < 32 ? g_n - b : 32;
      for (int again = 1; again;) {
        again = 0;
        for (unsigned li = 0; li < nl; li++) {
          thr_t *t = lane_at(b, nl, li);
          if (t->state != T_NEW && t->state != T_READY) continue;
          li = run_at(b, nl, li);
          if (g_failed) return -1;
          again = 1;
        }
      }
    }
    unsigned done = 0, bar = 0;
    for (const thr_t &t : g_thr) {
      done += t.state == T_DONE;
      bar += t.state == T_BAR;
    }
    if (done == g_n) return 0;
    if (done + bar == g_n) release_barrier();
    else deadlock();
    if (g_failed) return -1;
  }
}

static void drop_fibers(void) {
  for (thr_t &t : g_thr)
    if (t.f) {
      fiber_release(t.f);
      t.f = NULL;
    }
}

/* Pointer arguments must be device memory of this device, pinned host memory or NULL. */
static int check_args(const dt_emu_launch_t *l, int dev) {
  for (int i = 0; i < l->nptr; i++) {
    const void *p = l->ptr[i];
    if (!p) continue;
    const alloc_t *x = heap_contains(p) ? heap_find(p) : NULL;
    char d[256];
    if (x && x->live && x->device == dev) continue;
    if (!heap_contains(p) && host_pinned(p, 1)) continue;
    if (heap_contains(p)) heap_describe(p, d, sizeof d);
    else snprintf(d, sizeof d, "host memory not from cudaMallocHost, which a GPU cannot access");
    fail_sticky(dev, cudaErrorIllegalAddress, "kernel %s: argument %d (%p) is %s%s", l->name, l->ptr_pos[i], p, d,
                x && x->live ? " (another device's memory)" : "");
    return -1;
  }
  return 0;
}

void exec_kernel(const dt_emu_launch_t *l, int dev) {
  if (g_order < 0) {
    const char *e = env_str("DTRAIN_EMU_SCHEDULE");
    g_order = e && !strcmp(e, "reverse");
    g_no_barrier = planted("emu_no_barrier");
  }
  if (check_args(l, dev)) return;
  g_l = l;
  g_dev = dev;
  g_failed = 0;
  dt_emu_ids.gdim = l->grid;
  dt_emu_ids.bdim = l->block;
  g_n = l->block.x * l->block.y * l->block.z;
  g_thr.resize(g_n);
  g_warp.resize((g_n + 31) / 32);
  const dim3 &bd = l->block;
  for (unsigned i = 0; i < g_n; i++) g_thr[i].tid = uint3{i % bd.x, i / bd.x % bd.y, i / (bd.x * bd.y)};
  if (sigsetjmp(g_jmp, 1)) { /* a fault inside the kernel (heap.cpp's handler) */
    g_active = 0;
    g_cur = NULL;
    drop_fibers();
    return;
  }
  g_active = 1;
  for (unsigned z = 0; z < l->grid.z && !g_failed; z++)
    for (unsigned y = 0; y < l->grid.y && !g_failed; y++)
      for (unsigned x = 0; x < l->grid.x; x++) {
        dt_emu_ids.bid = uint3{x, y, z};
        if (run_block() < 0) break;
      }
  g_active = 0;
  if (g_failed) {
    drop_fibers();
    return;
  }
  char why[320];
  if (heap_check_canaries(why, sizeof why) == 0)
    fail_sticky(dev, cudaErrorIllegalAddress, "kernel %s wrote outside its buffers: %s", l->name, why);
}

}  // namespace dt_emu
