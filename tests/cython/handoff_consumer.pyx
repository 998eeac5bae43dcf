# cython: language_level=3, freethreading_compatible=True
"""A test-only consumer of arenalib's C-level API (built by tests/cython/meson.build) that never calls
arena_core(), arena_open() or arena_raise(): it is handed an ArenaCore's address by another module
and allocates through it without the GIL, so its first call past the inline fast path has to fetch
arenalib's function table itself (tests/test_capi.py)."""

from libc.stdint cimport uintptr_t
from libc.string cimport memset

from arenalib.fast cimport ARENA_OK, ArenaCore, ArenaMark, arena_allocate, arena_mark, arena_rewind


def allocate_without_the_gil(uintptr_t address, size_t size, size_t align):
    """arena_allocate(core at ``address``, size, align) without the GIL, the block filled with
    0x5A when it succeeds: the result code and the block's address."""
    cdef ArenaCore* core = <ArenaCore*>address
    cdef void* ptr = NULL
    cdef int err
    with nogil:
        err = arena_allocate(core, size, align, False, &ptr)
        if err == ARENA_OK:
            memset(ptr, 0x5A, size)
    return err, <uintptr_t>ptr


def mark_and_rewind_without_the_gil(uintptr_t address):
    """arena_mark() then, when it succeeded, arena_rewind() to it, on the core at ``address``
    without the GIL: both result codes."""
    cdef ArenaCore* core = <ArenaCore*>address
    cdef ArenaMark mark
    cdef int marked, rewound = -1
    with nogil:
        marked = arena_mark(core, &mark)
        if marked == ARENA_OK:
            rewound = arena_rewind(core, &mark)
    return marked, rewound
