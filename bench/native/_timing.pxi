# Timing for the nogil loops of both kernel modules: a monotonic clock, an escape the compiler
# cannot see through, and a start line for timed threads.

cdef extern from *:
    """
    #include <time.h>
    static inline void arenalib_bench_escape(void *p) { __asm__ volatile("" : : "g"(p) : "memory"); }
    static inline long long arenalib_bench_now(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }
    /* A start line for timed threads: each arrives, then spins until all have, so that none is
       timed while another is still being woken up (a sleeping vCPU takes up to milliseconds). */
    static int arenalib_bench_arrived, arenalib_bench_expected = 1;
    static inline void arenalib_bench_start_line(void) {
        __atomic_add_fetch(&arenalib_bench_arrived, 1, __ATOMIC_ACQ_REL);
        while (__atomic_load_n(&arenalib_bench_arrived, __ATOMIC_ACQUIRE) < arenalib_bench_expected)
            __builtin_ia32_pause();
    }
    """
    void escape "arenalib_bench_escape"(void* p) noexcept nogil
    long long now_ns "arenalib_bench_now"() noexcept nogil
    int arrived "arenalib_bench_arrived"
    int expected "arenalib_bench_expected"
    void start_line "arenalib_bench_start_line"() noexcept nogil


def set_start_line(int threads):
    """The pair loops below start timing once ``threads`` of them have reached the start line."""
    global arrived, expected
    arrived = 0
    expected = threads
