/* What a thread pays to announce an access of shared memory, with 1 and 2 threads at once: the
 * measurement behind arenalib/_access.pxi's choice (DESIGN.md, "Free-threading").
 *
 *   gcc -O2 -pthread bench/native/access_protocol.c -o /tmp/access_protocol && /tmp/access_protocol
 *
 * Each operation is an announce, a 512-byte memset (the access), and the end of the announce:
 *   record:  arenalib's accessing-now record (a store to the thread's own cache line, a full
 *            fence, a load of the owner's busy flag; then a release store)
 *   mutex:   one pthread mutex per arena, taken around the access
 *   counter: a reader count per arena (one atomic increment and decrement, as a reader-writer
 *            lock's readers do)
 *   none:    the access alone
 * Reported: ns per operation per thread, and the 2-thread throughput over the 1-thread one. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define OPS 20000000L

typedef struct { void *life; char pad[56]; } __attribute__((aligned(64))) record_t;
static record_t records[2];
static int busy __attribute__((aligned(64)));
static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static long readers __attribute__((aligned(64)));
static char memory[2][4096] __attribute__((aligned(64)));
static int mode;
static pthread_barrier_t start;

static void *run(void *arg) {
    long i, id = (long)arg;
    record_t *r = &records[id];
    char *block = memory[id];
    pthread_barrier_wait(&start);
    for (i = 0; i < OPS; i++) {
        switch (mode) {
        case 0:
            __atomic_store_n(&r->life, (void *)&busy, __ATOMIC_RELAXED);
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            if (__atomic_load_n(&busy, __ATOMIC_ACQUIRE))
                return NULL;
            memset(block, (int)i, 512);
            __atomic_store_n(&r->life, NULL, __ATOMIC_RELEASE);
            break;
        case 1:
            pthread_mutex_lock(&mutex);
            memset(block, (int)i, 512);
            pthread_mutex_unlock(&mutex);
            break;
        case 2:
            __atomic_add_fetch(&readers, 1, __ATOMIC_SEQ_CST);
            memset(block, (int)i, 512);
            __atomic_sub_fetch(&readers, 1, __ATOMIC_RELEASE);
            break;
        default:
            memset(block, (int)i, 512);
            __asm__ volatile("" ::: "memory");
        }
    }
    return NULL;
}

static double run_threads(int n) {
    pthread_t t[2];
    struct timespec a, b;
    long i;
    pthread_barrier_init(&start, NULL, (unsigned)n + 1);
    for (i = 0; i < n; i++)
        pthread_create(&t[i], NULL, run, (void *)i);
    clock_gettime(CLOCK_MONOTONIC, &a);
    pthread_barrier_wait(&start);
    for (i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_barrier_destroy(&start);
    return (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
}

int main(void) {
    static const char *names[] = {"record", "mutex", "counter", "none"};
    printf("%-8s %12s %12s %8s\n", "announce", "1 thread ns", "2 threads ns", "scaling");
    for (mode = 0; mode < 4; mode++) {
        double one = run_threads(1) / OPS, two = run_threads(2) / OPS;
        printf("%-8s %12.1f %12.1f %7.2fx\n", names[mode], one, two, 2.0 * one / two);
    }
    return 0;
}
