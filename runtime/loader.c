/* runtime/loader.c: em_loader, batches of in-memory tensors assembled on worker threads ahead of
 * the training step (torch.utils.data.DataLoader with num_workers and prefetch_factor).
 *
 * Batch k of an epoch takes rows order[k*B .. k*B+b) of every source tensor, with the order
 * em_batch_iter uses (rt_batch_order), so the two give the same batches. Batch k is assembled in
 * slot k % n_slots. A worker claims the next batch when its slot is free and it is fewer than
 * `prefetch` batches ahead of the consumer, copies the rows in (memcpy, no lock held), and marks
 * the slot ready; em_loader_next waits for its batch's slot.
 *
 * Workers touch no em_tensor, scope or error state (those are thread-local or unsynchronised):
 * they fill plain buffers and report failure by a flag. The consumer makes the tensors.
 *   - EM_CPU: each batch gets fresh buffers (rt_alloc), which the returned tensors adopt
 *     (rt_new_external, freed with their storage), so the slot is free again at once and a batch
 *     held by the caller never blocks the workers.
 *   - EM_CUDA: each slot owns pinned host buffers. The consumer allocates the device tensors on
 *     its current stream, and queues the host-to-device copies on the loader's side stream after
 *     an event from the current stream (the caching allocator may hand out a block the current
 *     stream's queued work still reads), then makes the current stream wait for the copy's
 *     event. With workers, the next batch's copy is queued as soon as this one is handed out (when
 *     its rows are ready), so it overlaps the step's work on the device. A slot is reused only
 *     after its copy's event completes (checked when the batch after it is taken).
 * Epochs change on the consumer thread, under the lock, when no worker is filling a slot. */
#include "cuda.h"
#include "rt.h"

#include <pthread.h>
#include <sched.h>
#include <string.h>

#define MAX_WORKERS 64
#define MAX_PREFETCH 1024

/* A slot's life: FREE -> FILLING (a worker copies rows in) -> READY -> (EM_CUDA: QUEUED, its copy
 * to the device queued ahead of its turn ->) handed out -> FREE (EM_CUDA: COPYING until its
 * copy is known to be done). */
enum slot_state { FREE, FILLING, READY, QUEUED, COPYING };

typedef struct slot {
  enum slot_state state;
  int64_t batch; /* the batch it holds (FILLING, READY, COPYING) */
  bool failed;   /* a worker could not allocate its buffers */
  char **buf;    /* [n_src]: EM_CPU, this batch's buffers (adopted by its tensors); EM_CUDA, pinned */
  em_tensor **dev; /* [n_src] EM_CUDA, QUEUED: the device tensors being copied into (owned) */
  cu_event copied; /* EM_CUDA: recorded on the side stream after the slot's copies */
} slot;

struct em_loader {
  int n_src;
  em_tensor **src;    /* [n_src] contiguous CPU tensors, owned references */
  size_t *row_bytes;  /* [n_src] */
  int64_t n, batch, len, epoch;
  uint64_t seed;
  bool shuffle, drop_last;
  em_device device;
  int workers, prefetch, n_slots;
  int64_t *order;     /* [n] this epoch's permutation */
  slot *slots;
  em_tensor **out;    /* [n_src] what em_loader_next returns */
  /* under lock: */
  pthread_mutex_t lock;
  pthread_cond_t work, ready; /* work: a batch may be claimable, or stop; ready: a slot is filled */
  int64_t claimed, taken;     /* batches claimed by workers / handed to the consumer this epoch */
  int filling, peak_ahead;
  bool stop;
  pthread_t *threads;
  int started;
  cu_stream side;
  cu_event before;    /* EM_CUDA: recorded on the consumer's stream before each batch's copies */
};

/* Rows of batch k into s's buffers (allocated first on the CPU). Runs on any thread; no lock. */
static void fill(em_loader *l, slot *s, int64_t k) {
  int64_t start = k * l->batch, b = l->n - start < l->batch ? l->n - start : l->batch;
  s->failed = false;
  for (int i = 0; i < l->n_src; i++) {
    size_t rb = l->row_bytes[i];
    if (l->device == EM_CPU) {
      s->buf[i] = rt_alloc(rb * (size_t)b + 64, 64); /* a 64-byte header keeps the byte count */
      if (!s->buf[i]) {
        for (int j = 0; j < i; j++) rt_free(s->buf[j]), s->buf[j] = NULL;
        s->failed = true;
        return;
      }
      *(size_t *)s->buf[i] = rb * (size_t)b;
    }
    char *dst = l->device == EM_CPU ? s->buf[i] + 64 : s->buf[i];
    const char *src = rt_data(l->src[i]);
    for (int64_t r = 0; r < b; r++) memcpy(dst + (size_t)r * rb, src + (size_t)l->order[start + r] * rb, rb);
  }
}

static void *worker(void *arg) {
  em_loader *l = arg;
#ifdef SCHED_BATCH
  /* A worker woken by the consumer must not preempt it where no core is idle (two cores, both
   * computing): SCHED_BATCH threads get no wakeup preemption. Best effort. */
  pthread_setschedparam(pthread_self(), SCHED_BATCH, &(struct sched_param){0});
#endif
  pthread_mutex_lock(&l->lock);
  for (;;) {
    slot *s = NULL;
    while (!l->stop) {
      int64_t k = l->claimed;
      if (k < l->len && k < l->taken + l->prefetch && l->slots[k % l->n_slots].state == FREE) {
        s = &l->slots[k % l->n_slots];
        break;
      }
      pthread_cond_wait(&l->work, &l->lock);
    }
    if (l->stop) break;
    int64_t k = l->claimed++;
    s->state = FILLING, s->batch = k, l->filling++;
    int ahead = (int)(l->claimed - l->taken);
    if (ahead > l->peak_ahead) l->peak_ahead = ahead;
    pthread_mutex_unlock(&l->lock);
    fill(l, s, k);
    pthread_mutex_lock(&l->lock);
    s->state = READY, l->filling--;
    pthread_cond_broadcast(&l->ready);
  }
  pthread_mutex_unlock(&l->lock);
  return NULL;
}

/* Frees what a READY or QUEUED slot holds (CPU buffers, device tensors) and waits for a QUEUED or
 * COPYING slot's copies; under lock. */
static void drain(em_loader *l, slot *s) {
  if (s->state == READY && l->device == EM_CPU && !s->failed)
    for (int i = 0; i < l->n_src; i++) rt_free(s->buf[i]), s->buf[i] = NULL;
  if (s->state == COPYING || s->state == QUEUED) cu_drv()->event_sync(s->copied);
  for (int i = 0; s->state == QUEUED && i < l->n_src; i++) em_release(s->dev[i]), s->dev[i] = NULL;
  s->state = FREE;
}

/* The next epoch: waits out the workers' fills, drops what they made, reshuffles. */
static void next_epoch(em_loader *l) {
  pthread_mutex_lock(&l->lock);
  l->claimed = l->len; /* no more claims in this epoch */
  while (l->filling) pthread_cond_wait(&l->ready, &l->lock);
  for (int i = 0; i < l->n_slots; i++) drain(l, &l->slots[i]);
  l->epoch++;
  rt_batch_order(l->order, l->n, l->shuffle, l->seed, (uint64_t)l->epoch);
  l->claimed = l->taken = 0;
  pthread_cond_broadcast(&l->work);
  pthread_mutex_unlock(&l->lock);
}

void em_loader_free(em_loader *l) {
  if (!l) return;
  pthread_mutex_lock(&l->lock);
  l->stop = true;
  pthread_cond_broadcast(&l->work);
  pthread_mutex_unlock(&l->lock);
  for (int i = 0; i < l->started; i++) pthread_join(l->threads[i], NULL);
  const cu_driver *d = l->device == EM_CUDA ? cu_drv() : NULL;
  if (d) cu_enter();
  for (int i = 0; l->slots && i < l->n_slots; i++) {
    slot *s = &l->slots[i];
    if (s->buf) drain(l, s);
    for (int j = 0; d && s->buf && j < l->n_src; j++)
      if (s->buf[j]) d->host_free(s->buf[j]);
    if (d && s->copied) d->event_destroy(s->copied);
    rt_free(s->buf), rt_free(s->dev);
  }
  if (d && l->before) d->event_destroy(l->before);
  if (d && l->side) d->stream_destroy(l->side);
  for (int i = 0; l->src && i < l->n_src; i++) em_release(l->src[i]);
  pthread_cond_destroy(&l->work);
  pthread_cond_destroy(&l->ready);
  pthread_mutex_destroy(&l->lock);
  rt_free(l->src), rt_free(l->row_bytes), rt_free(l->order), rt_free(l->slots), rt_free(l->out), rt_free(l->threads);
  rt_free(l);
}

static void *alloc_zero(size_t bytes) {
  void *p = rt_alloc(bytes ? bytes : 1, 16);
  if (p) memset(p, 0, bytes ? bytes : 1);
  return p;
}

/* Pinned buffers, events and the side stream for EM_CUDA; false with an error recorded. */
static bool cuda_setup(em_loader *l, const char *name, em_site site) {
  const cu_driver *d = cu_drv();
  if (!d) return rt_error(site, name, "device EM_CUDA: no CUDA device (see em_cuda_is_available)"), false;
  cu_enter();
  size_t rows = (size_t)(l->batch < l->n ? l->batch : l->n); /* the most a batch holds: no overflow */
  int r = d->stream_create(&l->side, 1 /* CU_STREAM_NON_BLOCKING */);
  if (!r) r = d->event_create(&l->before, 2 /* CU_EVENT_DISABLE_TIMING */);
  for (int i = 0; !r && i < l->n_slots; i++) {
    slot *s = &l->slots[i];
    r = d->event_create(&s->copied, 2);
    for (int j = 0; !r && j < l->n_src; j++) {
      void *p = NULL;
      r = d->host_alloc(&p, l->row_bytes[j] * rows + 1, 0);
      s->buf[j] = p;
    }
  }
  if (r) return rt_error(site, name, "setting up pinned buffers and the copy stream: %s", d->error_string(r)), false;
  return true;
}

em_loader *em_loader_new_at(int n, em_tensor *const *tensors, const em_loader_opts *opts, em_site site) {
  static const char name[] = "em_loader_new";
  if (!tensors || !opts) return rt_error(site, name, "%s is NULL", tensors ? "opts" : "the tensors array");
  if (n < 1) return rt_error(site, name, "needs at least one tensor, got n = %d", n);
  for (int i = 0; i < n; i++) {
    em_tensor *t = tensors[i];
    if (!t) return rt_error(site, name, "tensors[%d] is NULL", i);
    if (t->ndim < 1) return rt_error(site, name, "tensors[%d] is 0-dim: needs a dim 0 of examples", i);
    if (t->storage->device != EM_CPU)
      return rt_error(site, name, "tensors[%d] is on CUDA: the loader reads rows on host threads (keep the data set "
                      "on the CPU and set opts.device)", i);
    if (t->sizes[0] != tensors[0]->sizes[0])
      return rt_error(site, name, "tensors[%d] has %lld rows, tensors[0] has %lld", i, (long long)t->sizes[0],
                      (long long)tensors[0]->sizes[0]);
  }
  if (opts->batch_size < 1) return rt_error(site, name, "batch_size must be >= 1, got %lld", (long long)opts->batch_size);
  if (opts->workers < 0 || opts->workers > MAX_WORKERS)
    return rt_error(site, name, "workers must be in [0, %d], got %d", MAX_WORKERS, opts->workers);
  if (opts->prefetch < 0 || opts->prefetch > MAX_PREFETCH)
    return rt_error(site, name, "prefetch must be in [0, %d], got %d", MAX_PREFETCH, opts->prefetch);
  if (opts->device != EM_CPU && opts->device != EM_CUDA)
    return rt_error(site, name, "device must be EM_CPU or EM_CUDA, got %d", (int)opts->device);
  int64_t rows = tensors[0]->sizes[0];
  if ((uint64_t)rows > (uint64_t)PTRDIFF_MAX / sizeof(int64_t))
    return rt_error(site, name, "%lld rows: their order would not fit in memory", (long long)rows);

  em_loader *l = alloc_zero(sizeof *l);
  if (!l) return rt_error(site, name, "out of memory");
  pthread_mutex_init(&l->lock, NULL);
  pthread_cond_init(&l->work, NULL);
  pthread_cond_init(&l->ready, NULL);
  l->n_src = n, l->n = rows, l->batch = opts->batch_size, l->seed = opts->seed;
  l->shuffle = opts->shuffle, l->drop_last = opts->drop_last, l->device = opts->device;
  l->len = l->drop_last ? rows / l->batch : rows / l->batch + (rows % l->batch != 0);
  l->workers = opts->workers;
  l->prefetch = l->workers == 0 ? 1 : opts->prefetch ? opts->prefetch : 2 * l->workers;
  l->n_slots = l->prefetch + (l->device == EM_CUDA); /* EM_CUDA: the slot being copied from */
  l->src = alloc_zero(sizeof *l->src * (size_t)n);
  l->row_bytes = alloc_zero(sizeof *l->row_bytes * (size_t)n);
  l->out = alloc_zero(sizeof *l->out * (size_t)n);
  l->order = alloc_zero(sizeof *l->order * (size_t)rows);
  l->slots = alloc_zero(sizeof *l->slots * (size_t)l->n_slots);
  l->threads = alloc_zero(sizeof *l->threads * (size_t)l->workers);
  bool ok = l->src && l->row_bytes && l->out && l->order && l->slots && l->threads;
  for (int i = 0; ok && i < l->n_slots; i++) {
    l->slots[i].buf = alloc_zero(sizeof(char *) * (size_t)n);
    l->slots[i].dev = alloc_zero(sizeof(em_tensor *) * (size_t)n);
    ok = l->slots[i].buf && l->slots[i].dev;
  }
  if (!ok) {
    em_loader_free(l);
    return rt_error(site, name, "out of memory");
  }
  for (int i = 0; i < n; i++) {
    em_tensor *c = em_is_contiguous(tensors[i]) ? tensors[i] : em_contiguous_at(tensors[i], site);
    if (!c) return em_loader_free(l), NULL;
    l->src[i] = em_retain(c);
    size_t rb = (size_t)ir_dtype(c->dtype)->size; /* fits: c's storage holds rows * rb bytes, or rows is 0 */
    for (int d = 1; d < c->ndim; d++) rb *= (size_t)c->sizes[d];
    l->row_bytes[i] = rb;
  }
  if (l->device == EM_CUDA && !cuda_setup(l, name, site)) return em_loader_free(l), NULL;
  rt_batch_order(l->order, l->n, l->shuffle, l->seed, 0);
  for (int i = 0; i < l->workers; i++) {
    if (pthread_create(&l->threads[i], NULL, worker, l)) {
      em_loader_free(l);
      return rt_error(site, name, "cannot start worker thread %d of %d", i + 1, opts->workers);
    }
    l->started++;
  }
  return l;
}

static void adopt_release(void *buf) {
  rt_count_storage(-(int64_t) * (size_t *)buf);
  rt_free(buf);
}

/* The CPU tensors over s's buffers, into l->out; false with an error recorded. The buffers go
 * with the tensors (or are freed). */
static bool adopt(em_loader *l, slot *s, int64_t b, const char *name, em_site site) {
  bool ok = true;
  for (int i = 0; i < l->n_src; i++) {
    em_tensor *src = l->src[i];
    int64_t sizes[EM_MAX_DIMS];
    memcpy(sizes, src->sizes, sizeof sizes);
    sizes[0] = b;
    size_t bytes = *(size_t *)s->buf[i];
    em_tensor *t = ok ? rt_new_external(src->dtype, src->ndim, sizes, NULL, 0, EM_CPU, s->buf[i] + 64, bytes,
                                        adopt_release, s->buf[i], name, site)
                      : NULL;
    if (!t) {
      rt_free(s->buf[i]);
      ok = false;
    } else {
      rt_count_storage((int64_t)bytes);
      ok = (l->out[i] = rt_scope_add(t, name, site)) != NULL;
    }
    s->buf[i] = NULL;
  }
  return ok;
}

/* Queues the copies of s's pinned rows into new device tensors (s->dev, owned) on the side
 * stream, after the work queued so far on the caller's stream; false with an error recorded. */
static bool queue_copy(em_loader *l, slot *s, int64_t b, const char *name, em_site site) {
  const cu_driver *d = cu_drv();
  int r = d->event_record(l->before, cu_current_stream());
  if (!r) r = d->stream_wait_event(l->side, l->before, 0);
  if (r) return rt_error(site, name, "ordering the copy stream: %s", d->error_string(r)), false;
  bool ok = true;
  for (int i = 0; ok && i < l->n_src; i++) {
    em_tensor *src = l->src[i];
    int64_t sizes[EM_MAX_DIMS];
    memcpy(sizes, src->sizes, sizeof sizes);
    sizes[0] = b;
    ok = (s->dev[i] = rt_new_device(src->dtype, src->ndim, sizes, EM_CUDA, name, site)) != NULL;
    if (ok && (r = d->memcpy_htod((uint64_t)(uintptr_t)rt_data(s->dev[i]), s->buf[i], l->row_bytes[i] * (size_t)b,
                                  l->side)))
      ok = rt_error(site, name, "copying a batch to the device: %s", d->error_string(r)) != NULL;
  }
  if (ok && (r = d->event_record(s->copied, l->side)))
    ok = rt_error(site, name, "recording the copy's event: %s", d->error_string(r)) != NULL;
  if (!ok) {
    d->stream_sync(l->side); /* what was queued reads the pinned rows */
    for (int i = 0; i < l->n_src; i++) em_release(s->dev[i]), s->dev[i] = NULL;
  }
  return ok;
}

/* Hands s's device tensors to the current scope, the caller's stream waiting for their copy. */
static bool hand_out(em_loader *l, slot *s, const char *name, em_site site) {
  int r = cu_drv()->stream_wait_event(cu_current_stream(), s->copied, 0);
  if (r) rt_error(site, name, "waiting for the copy: %s", cu_drv()->error_string(r));
  bool ok = !r;
  for (int i = 0; i < l->n_src; i++) {
    if (ok) ok = (l->out[i] = rt_scope_add(s->dev[i], name, site)) != NULL;
    else em_release(s->dev[i]);
    s->dev[i] = NULL;
  }
  return ok;
}

/* Rows in batch k. */
static int64_t batch_rows(const em_loader *l, int64_t k) {
  return l->n - k * l->batch < l->batch ? l->n - k * l->batch : l->batch;
}

/* EM_CUDA: queues the next batch's copy now, when its rows are ready, so it overlaps this step's
 * work on the device. A failure here is left for that batch's turn to report. */
static void copy_ahead(em_loader *l, const char *name, em_site site) {
  int64_t k = l->taken;
  slot *s = &l->slots[k % l->n_slots];
  pthread_mutex_lock(&l->lock);
  bool ready = k < l->len && s->state == READY && s->batch == k && !s->failed;
  pthread_mutex_unlock(&l->lock);
  if (!ready) return; /* a READY slot changes only here and in em_loader_next: no race */
  bool clean = em_last_error() == NULL;
  bool queued = queue_copy(l, s, batch_rows(l, k), name, site);
  if (!queued && clean) em_clear_error();
  pthread_mutex_lock(&l->lock);
  if (queued) s->state = QUEUED;
  pthread_mutex_unlock(&l->lock);
}

em_tensor **em_loader_next_at(em_loader *l, em_site site) {
  static const char name[] = "em_loader_next";
  if (!l) return NULL;
  if (l->taken >= l->len) {
    next_epoch(l);
    return NULL;
  }
  int64_t k = l->taken, b = batch_rows(l, k);
  slot *s = &l->slots[k % l->n_slots];
  if (l->device == EM_CUDA) cu_enter();
  pthread_mutex_lock(&l->lock);
  if (l->device == EM_CUDA) /* the slot before ours: its copy was queued ahead of this step's work */
    for (int i = 0; i < l->n_slots; i++)
      if (l->slots[i].state == COPYING) cu_drv()->event_sync(l->slots[i].copied), l->slots[i].state = FREE;
  if (l->workers == 0) {
    pthread_mutex_unlock(&l->lock);
    s->batch = k;
    fill(l, s, k);
    pthread_mutex_lock(&l->lock);
  } else {
    while (!((s->state == READY || s->state == QUEUED) && s->batch == k)) pthread_cond_wait(&l->ready, &l->lock);
  }
  pthread_mutex_unlock(&l->lock);
  bool ok;
  if (s->failed) {
    rt_error(site, name, "out of memory for batch %lld (%lld rows)", (long long)k, (long long)b);
    ok = false;
  } else {
    ok = l->device == EM_CPU ? adopt(l, s, b, name, site)
                             : (s->state == QUEUED || queue_copy(l, s, b, name, site)) && hand_out(l, s, name, site);
  }
  pthread_mutex_lock(&l->lock);
  s->state = l->device == EM_CUDA && !s->failed ? COPYING : FREE;
  l->taken++;
  pthread_cond_broadcast(&l->work);
  pthread_mutex_unlock(&l->lock);
  if (ok && l->device == EM_CUDA && l->workers) copy_ahead(l, name, site);
  return ok ? l->out : NULL;
}

void em_loader_reset(em_loader *l) {
  if (l) next_epoch(l);
}

int64_t em_loader_len(const em_loader *l) { return l ? l->len : 0; }

int em_loader_ahead(const em_loader *l, int *peak) {
  if (!l) return 0;
  em_loader *m = (em_loader *)l; /* the lock is the only thing written */
  pthread_mutex_lock(&m->lock);
  int ahead = (int)(m->claimed - m->taken);
  if (peak) *peak = m->peak_ahead;
  pthread_mutex_unlock(&m->lock);
  return ahead;
}
