# cython: language_level=3, boundscheck=False, wraparound=False
"""nogil timing loops: arenalib's C-level API against glibc's malloc, calloc and free.

Every loop times itself with CLOCK_MONOTONIC and returns ns per operation, so the Python call
overhead is outside the measurement.  escape() stops the compiler from proving a block unused and
deleting the malloc/free pair."""

from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset

from arenalib.fast cimport (
    ARENA_KIND_CONFINED, ARENA_OK, ArenaCore, ArenaMark, arena_allocate, arena_close, arena_core,
    arena_core_init, arena_free, arena_mark, arena_open, arena_raise, arena_reset, arena_rewind,
)

include "_timing.pxi"
include "_arena_loops.pxi"


def malloc_fill_free(Py_ssize_t n, size_t size):
    """glibc malloc + memset(3) + free, ns per op."""
    cdef Py_ssize_t _i
    cdef void* p
    cdef long long t0
    with nogil:
        t0 = now_ns()
        for _i in range(n):
            p = malloc(size)
            memset(p, 3, size)
            escape(p)
            free(p)
        t0 = now_ns() - t0
    return t0 / <double>n


def malloc_free(Py_ssize_t n, size_t size):
    """glibc malloc + free with nothing between, ns per op (one thread)."""
    set_start_line(1)
    return malloc_free_pairs(n, size)[0]


def calloc_fill_free(Py_ssize_t n, size_t size):
    """glibc calloc + memset(3) + free, ns per op."""
    cdef Py_ssize_t _i
    cdef void* p
    cdef long long t0
    with nogil:
        t0 = now_ns()
        for _i in range(n):
            p = calloc(1, size)
            memset(p, 3, size)
            escape(p)
            free(p)
        t0 = now_ns() - t0
    return t0 / <double>n


def slicing_fill(arena, Py_ssize_t n, size_t size, Py_ssize_t batch):
    """arena_allocate + memset(3) on a SlicingArena, arena_reset every ``batch`` ops, ns per op."""
    cdef ArenaCore* core = arena_core(arena)
    cdef Py_ssize_t _i, left = batch  # a countdown: a modulo (idiv) per op would be timed too
    cdef void* p
    cdef int err = ARENA_OK
    cdef long long t0
    with nogil:
        t0 = now_ns()
        for _i in range(n):
            err = arena_allocate(core, size, 0, False, &p)
            if err != ARENA_OK:
                break
            memset(p, 3, size)
            escape(p)
            left -= 1
            if left == 0:
                left = batch
                err = arena_reset(core)
                if err != ARENA_OK:
                    break
        t0 = now_ns() - t0
    arena_raise(err)
    return t0 / <double>n


def scope_open_allocate_close(Py_ssize_t n, size_t size, bint fill=True):
    """Per-scope pattern: arena_open (confined, stack struct) + allocate + memset(3) (when
    ``fill``) + arena_close, ns per op.

    Open and close take the GIL-protected slot pool, so this loop holds the GIL (no Python code
    runs inside it)."""
    cdef ArenaCore core
    cdef Py_ssize_t _i
    cdef void* p
    cdef int err = ARENA_OK
    cdef long long t0
    arena_core_init(&core)
    t0 = now_ns()
    for _i in range(n):
        arena_open(&core, ARENA_KIND_CONFINED, -1, 0)
        err = arena_allocate(&core, size, 0, False, &p)
        if err == ARENA_OK:
            if fill:
                memset(p, 3, size)
            escape(p)
        arena_close(&core)
        if err != ARENA_OK:
            break
    t0 = now_ns() - t0
    arena_raise(err)
    return t0 / <double>n


def malloc_free_pairs(Py_ssize_t n, size_t size):
    """The LWJGL loop on glibc: malloc + free (GIL released); returns as arena_alloc_free_pairs."""
    cdef Py_ssize_t _i
    cdef void* p
    cdef long long t0, t1
    with nogil:
        start_line()
        t0 = now_ns()
        for _i in range(n):
            p = malloc(size)
            escape(p)
            free(p)
        t1 = now_ns()
    return (t1 - t0) / <double>n, t0, t1


def fill_only(Py_ssize_t n, size_t size):
    """memset(3) of ``size`` bytes into one buffer, ns per op: the floor under every candidate
    that fills its block (no allocation at all)."""
    cdef Py_ssize_t _i
    cdef void* p = malloc(size if size else 1)
    cdef long long t0
    if p == NULL:
        raise MemoryError()
    with nogil:
        t0 = now_ns()
        for _i in range(n):
            memset(p, 3, size)
            escape(p)
        t0 = now_ns() - t0
    free(p)
    return t0 / <double>n
