# The loops over the names both cimport surfaces share (arena_core, arena_allocate, arena_free,
# arena_raise), compiled twice: with the inline fast paths (arenalib_bench_kernels, cimport
# arenalib.fast) and through the function table (arenalib_bench_table, cimport arenalib).

def arena_fill_free(arena, Py_ssize_t n, size_t size, bint zero):
    """arena_allocate + memset(3) + arena_free on an Arena or ConfinedArena, ns per op."""
    cdef ArenaCore* core = arena_core(arena)
    cdef Py_ssize_t _i
    cdef void* p
    cdef int err = ARENA_OK
    cdef long long t0
    with nogil:
        t0 = now_ns()
        for _i in range(n):
            err = arena_allocate(core, size, 0, zero, &p)
            if err != ARENA_OK:
                break
            memset(p, 3, size)
            escape(p)
            arena_free(core, p, size)
        t0 = now_ns() - t0
    arena_raise(err)
    return t0 / <double>n


def arena_alloc_free_pairs(arena, Py_ssize_t n, size_t size):
    """The LWJGL loop: arena_allocate + arena_free with nothing between (GIL released).

    Returns (ns per op, start, end) with start and end on CLOCK_MONOTONIC, so that runs on several
    threads give the interval in which they really overlapped."""
    cdef ArenaCore* core = arena_core(arena)
    cdef Py_ssize_t _i
    cdef void* p
    cdef int err = ARENA_OK
    cdef long long t0, t1
    with nogil:
        start_line()
        t0 = now_ns()
        for _i in range(n):
            err = arena_allocate(core, size, 0, False, &p)
            if err != ARENA_OK:
                break
            escape(p)
            arena_free(core, p, size)
        t1 = now_ns()
    arena_raise(err)
    return (t1 - t0) / <double>n, t0, t1


def mark_carve_rewind(arena, Py_ssize_t n, size_t size):
    """arena_mark + arena_allocate + arena_rewind on a SlicingArena (a frame per op), ns per op."""
    cdef ArenaCore* core = arena_core(arena)
    cdef ArenaMark mark
    cdef Py_ssize_t _i
    cdef void* p
    cdef int err = ARENA_OK
    cdef long long t0
    with nogil:
        t0 = now_ns()
        for _i in range(n):
            err = arena_mark(core, &mark)
            if err != ARENA_OK:
                break
            err = arena_allocate(core, size, 0, False, &p)
            if err != ARENA_OK:
                break
            escape(p)
            err = arena_rewind(core, &mark)
            if err != ARENA_OK:
                break
        t0 = now_ns() - t0
    arena_raise(err)
    return t0 / <double>n
