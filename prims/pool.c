/* prims/pool.c: Ember's thread pool, which runs every parallel loop of the reference kernels,
 * of the inductor's compiled kernels and of the GEMM tiles (issue 23).
 *
 * Why not OpenMP. libgomp's idle threads spin at the end of a region, 300,000 rounds by default,
 * before they sleep, and a region's end waits for its slowest thread. On a machine other
 * processes keep busy the thread a region waits for sits behind them for whole scheduler slices
 * while its partner spins: the compiled MLP training step went from 3.4 ms to 53-168 ms beside
 * two busy processes on 2 cores (OMP_WAIT_POLICY=passive: 6.4-9.6 ms). The wait policy is read
 * from the environment when libgomp loads, so a library cannot choose it without changing its
 * user's environment. This pool makes the same trade as a passive policy only after a short
 * spin: a waiting thread spins for at most SPIN_NS (back-to-back kernels of a step reuse hot
 * threads) and then sleeps on a condition variable.
 *
 * Tasks, not threads. prim_parallel(n, fn, ctx) runs fn(ctx, i) for every i in [0, n). Which
 * thread runs an index never matters to a result: callers split work by shapes only (or into
 * pieces whose results do not depend on the split), so a computation gives the same bits with 1
 * thread or 16. It matters to speed, twice over:
 *  - Affinity. The P threads of a loop (the caller, rank 0, and workers 1..P-1) each own a home
 *    range, the p-th contiguous P-th of [0, n), and claim its indices in order first: the same
 *    thread touches the same part of a tensor in every loop over it, as under OpenMP's static
 *    schedule. One claim counter for all (this pool's first design) gave each index to whichever
 *    thread came first, and the race could settle so that a kernel read what the one before
 *    it had written from the other core's cache. In some processes and periods on this
 *    project's 2-vCPU Zen 5 VM that cost as much as memory: eager layer_norm over 16 MiB
 *    followed by a sum of its output took 1.06 ms a call, 0.35 with home ranges (same minute).
 *  - Graceful degradation. Indices are claimed, not assigned: a thread done with its home range
 *    takes the rest of the others' (stealing), so a worker the scheduler has not run yet, its
 *    core busy with another process, delays nothing; the caller takes its share.
 * At the end the caller takes back the job from every worker that has not picked it up (the
 * job lives in the caller's frame), and waits only for workers that did pick it up, which are
 * running. prim_parallel_ordered claims from one counter in index order instead, for tasks that
 * wait on the one before (prim_turn_wait).
 *
 * Serial fallbacks. A loop started inside a task, or while another thread's job holds the pool
 * (two user threads running ops at once), runs on its calling thread: the pool never queues,
 * never nests, and never changes a result by it.
 *
 * Failure. Nothing is allocated per job (slots are static, the job is on the caller's stack);
 * workers are started when first needed, and a pthread_create that fails leaves the pool with
 * the workers it has (the loops then use fewer threads), where libgomp would exit(1). After
 * fork() the child starts with no workers and makes its own when it needs them. */
#include "prims.h"

#include <limits.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* How long a waiting thread spins before it sleeps: about the gap between two kernels of a
 * compiled step, so a step keeps its workers awake on a quiet machine, and short enough that a
 * worker gives its core back quickly when other processes want it. (bench/contention measures
 * both; see issue 23's figures in README.md.) */
#ifndef POOL_SPIN_NS /* a build option only for measuring other values */
#define POOL_SPIN_NS 50000
#endif
#define SPIN_NS POOL_SPIN_NS

enum { MAX_WORKERS = 255 };
enum { IDLE, POSTED, TAKEN }; /* a worker's slot: nothing for it, a job handed to it, a job it is running */

typedef struct job {
  prim_task fn;
  void *ctx;
  int64_t n;
  int parts;            /* threads taking part: the caller and its workers; 0 in a serial run */
  bool ordered;         /* claim from next in index order (prim_parallel_ordered) */
  _Atomic int64_t next; /* ordered: the next index to claim */
} job;

/* Home ranges of the job in flight (only one is, under busy): range p is [next, end), on its own
 * cache line, claimed first by the thread of rank p. */
static struct {
  _Alignas(64) _Atomic int64_t next;
  int64_t end;
} homes[MAX_WORKERS + 1];

typedef struct {
  _Alignas(64) _Atomic uint32_t state; /* IDLE, POSTED or TAKEN; each thread spins on its own line */
  _Atomic uint32_t sleepers;           /* threads asleep (or about to be) on cond waiting for state to change */
  job *job;                            /* written before state becomes POSTED */
  pthread_mutex_t lock;
  pthread_cond_t cond;
} slot;

static slot slots[MAX_WORKERS];
static int started;                     /* workers running, under start_lock */
static _Atomic int configured;          /* em_set_num_threads's count; 0 until first needed */
static atomic_flag busy = ATOMIC_FLAG_INIT; /* a job is in flight */
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* Thread-local: set while this thread runs a task (the caller's share included), so a loop
 * inside one stays serial. */
static _Thread_local bool in_task;
static _Thread_local int task_rank; /* the running task's thread: 0 the caller, k + 1 worker k */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Returns once s->state differs from v: spinning for up to SPIN_NS, then asleep. The waker
 * stores the state, then reads sleepers; the sleeper counts itself, then reads the state (all
 * sequentially consistent), so one of them sees the other and no wake-up is lost. */
static void wait_while(slot *s, uint32_t v) {
  uint64_t t0 = 0;
  for (unsigned i = 1; atomic_load_explicit(&s->state, memory_order_acquire) == v; i++) {
    cpu_relax();
    if (i % 256) continue;
    uint64_t t = now_ns();
    if (!t0) {
      t0 = t;
    } else if (t - t0 > SPIN_NS) {
      pthread_mutex_lock(&s->lock);
      atomic_fetch_add(&s->sleepers, 1);
      while (atomic_load(&s->state) == v) pthread_cond_wait(&s->cond, &s->lock);
      atomic_fetch_sub(&s->sleepers, 1);
      pthread_mutex_unlock(&s->lock);
      return;
    }
  }
}

static void set_state(slot *s, uint32_t v) {
  atomic_store(&s->state, v);
  if (atomic_load(&s->sleepers)) {
    pthread_mutex_lock(&s->lock);
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
  }
}

/* Runs job j's indices as the thread of rank r: its home range, then what is left of the others'
 * (serial and ordered jobs: every index, in order, from the one counter). */
static void run(job *j, int r) {
  bool outer = in_task;
  int outer_rank = task_rank;
  in_task = true;
  task_rank = r;
  if (!j->parts || j->ordered) {
    for (int64_t i; (i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n;) j->fn(j->ctx, i);
  } else {
    for (int k = 0; k < j->parts; k++) {
      int h = (r + k) % j->parts;
      for (int64_t i; (i = atomic_fetch_add_explicit(&homes[h].next, 1, memory_order_relaxed)) < homes[h].end;)
        j->fn(j->ctx, i);
    }
  }
  in_task = outer;
  task_rank = outer_rank;
}

static void *worker(void *arg) {
  slot *s = arg;
  int rank = (int)(s - slots) + 1;
  for (;;) {
    wait_while(s, IDLE);
    uint32_t posted = POSTED;
    if (!atomic_compare_exchange_strong(&s->state, &posted, TAKEN)) continue; /* taken back */
    run(s->job, rank);
    set_state(s, IDLE);
  }
  return NULL;
}

static void reset(void) {
  for (int i = 0; i < MAX_WORKERS; i++) {
    atomic_init(&slots[i].state, IDLE);
    atomic_init(&slots[i].sleepers, 0);
    pthread_mutex_init(&slots[i].lock, NULL);
    pthread_cond_init(&slots[i].cond, NULL);
  }
  started = 0;
  atomic_flag_clear(&busy);
  pthread_mutex_init(&start_lock, NULL);
}

/* The child of a fork has only the forking thread: the workers are gone, and a lock or slot
 * another thread held is left as it was. It starts over. */
static void init(void) {
  reset();
  pthread_atfork(NULL, NULL, reset);
}

/* Starts workers up to want (at most MAX_WORKERS); returns how many there are. */
static int start_workers(int want) {
  pthread_mutex_lock(&start_lock);
  if (started < want) {
    /* Workers take no signals: a handler the user installs runs on the user's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    bool attr_ok = pthread_attr_init(&attr) == 0;
    if (attr_ok) pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while (started < want) {
      pthread_t t;
      if (pthread_create(&t, attr_ok ? &attr : NULL, worker, &slots[started])) break;
      if (!attr_ok) pthread_detach(t);
      started++;
    }
    if (attr_ok) pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
  }
  int have = started < want ? started : want;
  pthread_mutex_unlock(&start_lock);
  return have;
}

/* The default: OMP_NUM_THREADS when set, else the CPUs this process may run on, as libgomp
 * reads them (omp_get_max_threads starts no threads). */
static int default_threads(void) {
  int n = omp_get_max_threads();
  return n < 1 ? 1 : n > MAX_WORKERS + 1 ? MAX_WORKERS + 1 : n;
}

void prim_set_threads(int n) {
  atomic_store(&configured, n > 0 ? (n > MAX_WORKERS + 1 ? MAX_WORKERS + 1 : n) : default_threads());
}

int prim_max_threads(void) {
  int n = atomic_load(&configured);
  if (!n) {
    int d = default_threads(), zero = 0;
    atomic_compare_exchange_strong(&configured, &zero, d);
    n = atomic_load(&configured);
  }
  return n;
}

/* Thread-local: this thread's loops run on it alone (prim_serial_thread). */
static _Thread_local bool serial_thread;

void prim_serial_thread(void) { serial_thread = true; }

int prim_threads(void) { return in_task || serial_thread ? 1 : prim_max_threads(); }

static void parallel(int64_t n, int threads, prim_task fn, void *ctx, bool ordered) {
  if (n <= 0) return;
  int nt = prim_threads();
  if (nt > threads) nt = threads;
  int want = (int64_t)(nt - 1) < n - 1 ? nt - 1 : (int)(n - 1);
  pthread_once(&once, init);
  int w = want > 0 && !atomic_flag_test_and_set_explicit(&busy, memory_order_acquire) ? start_workers(want) : -1;
  job j = {.fn = fn, .ctx = ctx, .n = n, .ordered = ordered};
  atomic_init(&j.next, 0);
  if (w < 0) { /* serial: a one-thread pool, a nested loop (which keeps its task's rank) or the pool in use */
    run(&j, task_rank);
    return;
  }
  j.parts = w + 1;
  for (int p = 0; p < j.parts; p++) {
    atomic_store_explicit(&homes[p].next, n * p / j.parts, memory_order_relaxed);
    homes[p].end = n * (p + 1) / j.parts;
  }
  for (int k = 0; k < w; k++) {
    slots[k].job = &j;
    set_state(&slots[k], POSTED); /* sequentially consistent: publishes the home ranges too */
  }
  run(&j, 0);
  for (int k = 0; k < w; k++) {
    uint32_t posted = POSTED;
    if (!atomic_compare_exchange_strong(&slots[k].state, &posted, IDLE)) wait_while(&slots[k], TAKEN);
  }
  atomic_flag_clear_explicit(&busy, memory_order_release);
}

void prim_parallel(int64_t n, prim_task fn, void *ctx) { parallel(n, INT_MAX, fn, ctx, false); }

void prim_parallel_upto(int64_t n, int threads, prim_task fn, void *ctx) { parallel(n, threads, fn, ctx, false); }

void prim_parallel_ordered(int64_t n, prim_task fn, void *ctx) { parallel(n, INT_MAX, fn, ctx, true); }

int prim_rank(void) { return task_rank; }

typedef struct {
  prim_range_task fn;
  void *ctx;
  int64_t n, parts;
} range_job;

static void range_part(void *ctx, int64_t p) {
  const range_job *r = ctx;
  int64_t b = r->n * p / r->parts, e = r->n * (p + 1) / r->parts;
  if (b < e) r->fn(r->ctx, b, e);
}

void prim_parallel_for(bool par, int64_t n, prim_range_task fn, void *ctx) {
  int nt = par ? prim_threads() : 1;
  if (nt < 2 || n < 2) {
    if (n > 0) fn(ctx, 0, n);
    return;
  }
  range_job r = {fn, ctx, n, n < nt ? n : nt};
  prim_parallel(r.parts, range_part, &r);
}

void prim_turn_wait(_Atomic int64_t *turn, int64_t c) {
  /* The task ahead is running, but may be off its core: spin briefly, then yield to it. */
  for (unsigned i = 0; atomic_load_explicit(turn, memory_order_acquire) != c; i++) {
    if (i < 4096) cpu_relax();
    else sched_yield();
  }
}

void prim_turn_pass(_Atomic int64_t *turn, int64_t c) { atomic_store_explicit(turn, c + 1, memory_order_release); }
