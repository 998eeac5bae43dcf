# cython: language_level=3, freethreading_compatible=True
"""A test-only consumer of arenalib's C-level API (tests/test_capi.py, issue 11; built by
tests/cython/meson.build): an ArenaCore on the stack, full of garbage, made ready for arena_open()
by arena_core_init()."""

from libc.string cimport memset

from arenalib.fast cimport (
    ARENA_KIND_CONFINED, ARENA_KIND_SHARED, ARENA_KIND_SLICING, ARENA_OK, ArenaCore, arena_allocate,
    arena_close, arena_core_init, arena_open, arena_raise,
)

KINDS = {"Arena": ARENA_KIND_SHARED, "ConfinedArena": ARENA_KIND_CONFINED,
         "SlicingArena": ARENA_KIND_SLICING}


def garbage_stack_core(int kind, Py_ssize_t max_bytes, size_t size, Py_ssize_t rounds):
    """``rounds`` times: an ArenaCore on the stack filled with 0xFF bytes, arena_core_init(),
    arena_open(kind, max_bytes), allocate ``size`` bytes and fill them, arena_close().  Returns
    the number of bytes written."""
    cdef ArenaCore core
    cdef void* ptr = NULL
    cdef int err = ARENA_OK
    cdef Py_ssize_t _i, written = 0
    for _i in range(rounds):
        memset(&core, 0xFF, sizeof(core))
        arena_core_init(&core)
        arena_open(&core, kind, max_bytes, 0)
        err = arena_allocate(&core, size, 0, False, &ptr)
        if err == ARENA_OK:
            memset(ptr, 0x5A, size)
            written += <Py_ssize_t>size
        arena_close(&core)
        arena_raise(err)
    return written
