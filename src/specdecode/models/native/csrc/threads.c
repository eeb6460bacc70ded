/* The library's thread pool: parallel_for, and kernels_pool_workers to observe it.
 *
 * parallel_for(n, threads, fn, ctx): fn(ctx, i) for i in 0..n-1 on `threads` threads, split into
 * contiguous shares (OpenMP's schedule(static)), on one pool of threads - 1 workers per process,
 * started on first use and kept, whichever thread calls. Not OpenMP: libgomp keeps a team per
 * calling thread, and with a second caller (a server's decode thread beside the main thread) it
 * counts more threads than cores and stops spinning, so every call on a worker thread waited on a
 * futex (benchmarks/results/thread_placement.md); Apple's clang has no OpenMP at all. Each index's
 * work is the same whichever thread runs it, so results do not depend on the thread count. */
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>

static void run_share(int part, int parts, int n, index_fn fn, void *ctx) {
    int base = n / parts, extra = n % parts, begin = part * base + (part < extra ? part : extra);
    for (int i = begin, end = begin + base + (part < extra); i < end; i++) fn(ctx, i);
}

/* Workers wait for a call spinning for a while (a decode step makes ~150 calls in quick succession,
 * each too short to wait for a sleeping thread to wake), then sleep on a condition variable. */
enum { SPINS = 20000 };

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static struct {
    pthread_mutex_t call, lock; /* call: one parallel_for at a time; lock: sleeping and waking */
    pthread_cond_t wake;
    int workers, sleepers;      /* under lock */
    int parts, n;               /* this call's, written before `round` moves */
    index_fn fn;
    void *ctx;
    atomic_ulong round;         /* one per call: each worker runs each round once */
    atomic_int remaining;       /* workers still on this round */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

typedef struct {
    int part;
    unsigned long seen;
} worker_t;

static void *pool_worker(void *arg) {
    worker_t self = *(worker_t *)arg;
    free(arg);
    for (;;) {
        unsigned long round;
        int spins = 0;
        while ((round = atomic_load(&pool.round)) == self.seen && spins < SPINS) relax(), spins++;
        if (round == self.seen) {
            pthread_mutex_lock(&pool.lock);
            pool.sleepers++;
            while ((round = atomic_load(&pool.round)) == self.seen) pthread_cond_wait(&pool.wake, &pool.lock);
            pool.sleepers--;
            pthread_mutex_unlock(&pool.lock);
        }
        self.seen = round;
        if (self.part < pool.parts) run_share(self.part, pool.parts, pool.n, pool.fn, pool.ctx);
        atomic_fetch_sub(&pool.remaining, 1);
    }
    return NULL;
}

/* the pool's worker threads started so far */
int kernels_pool_workers(void) {
    pthread_mutex_lock(&pool.lock);
    int workers = pool.workers;
    pthread_mutex_unlock(&pool.lock);
    return workers;
}

/* A forked child has none of the parent's threads: it starts its own pool. */
static void pool_after_fork(void) {
    pool.workers = pool.sleepers = 0;
    pthread_mutex_init(&pool.call, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
}
static void pool_register(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

INTERNAL void parallel_for(int n, int threads, index_fn fn, void *ctx) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    if (threads < 2 || n < 2) {
        run_share(0, 1, n, fn, ctx);
        return;
    }
    pthread_once(&once, pool_register);
    pthread_mutex_lock(&pool.call);
    pthread_mutex_lock(&pool.lock);
    while (pool.workers < threads - 1) { /* a worker that cannot start leaves its share to the others */
        worker_t *w = malloc(sizeof *w);
        pthread_t thread;
        if (!w) break;
        *w = (worker_t){pool.workers + 1, atomic_load(&pool.round)};
        if (pthread_create(&thread, NULL, pool_worker, w)) {
            free(w);
            break;
        }
        pthread_detach(thread);
        pool.workers++;
    }
    const int parts = pool.workers + 1 < threads ? pool.workers + 1 : threads;
    pthread_mutex_unlock(&pool.lock);
    pool.parts = parts, pool.n = n, pool.fn = fn, pool.ctx = ctx;
    atomic_store(&pool.remaining, pool.workers);
    atomic_fetch_add(&pool.round, 1); /* publishes the fields above (sequentially consistent) */
    pthread_mutex_lock(&pool.lock);   /* a worker that checked `round` before it moved is asleep or about to be */
    if (pool.sleepers) pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    run_share(0, parts, n, fn, ctx);
    while (atomic_load(&pool.remaining) > 0) relax();
    pthread_mutex_unlock(&pool.call);
}
