# cython: language_level=3
# The C-level API of arenalib, for Cython extensions:
#
#     from arenalib cimport ArenaCore, arena_core, arena_allocate, arena_free, arena_raise
#
#     core = arena_core(arena)              # with the GIL; keep a reference to `arena`
#     with nogil:
#         err = arena_allocate(core, 512, 0, False, &ptr)
#         ...
#         err = arena_free(core, ptr, 512)
#     arena_raise(err)                      # the matching Python exception, if any
#
# The nogil functions never raise: they return ARENA_OK or an error code.  A ConfinedArena's core
# fails with ARENA_EWRONGTHREAD on any thread but its owner; a SlicingArena's with ARENA_EBUSY when
# another thread is carving from it at that moment; an Arena's is free for all threads (each gets
# its own thread cache).  arena_free() takes the size given to arena_allocate().  Close and reset
# must not race with allocations on other threads, nor with any use of the arena's segments from
# Python on another thread (a segment access counts itself in the arena's exports, but without a
# memory barrier that a nogil thread could rely on).  For a scope without any Python object, put an
# ArenaCore on the stack, prepare it once with arena_core_init(), then use arena_open() /
# arena_close() (both need the GIL).
#
# The common cases are inline functions, compiled into your module: a ConfinedArena's allocate
# and free from its free list, a SlicingArena's carve (no atomic instruction while one thread
# keeps carving), a confined scope's open and close.  They read arenalib's structs, so a module
# must be rebuilt against the arenalib it runs with: one whose C ABI fingerprint differs (a digest
# of the struct layouts, constants and size-class rule it was compiled with, and of whether the
# interpreter is free-threaded) gets ImportError from arena_core() or arena_open(), never a wrong
# layout.
# Consumers need no jemalloc header and link nothing: the inline functions and structs are in
# arenalib/_capi.pxd (the C ABI), and reach arenalib's own functions through the function table of
# the capsule arenalib._arena._C_API.  See arenalib/_examples/cython/ for a complete consumer.

from arenalib._arena cimport Arena, ArenaBase, ConfinedArena, Segment, SlicingArena
from arenalib._capi cimport (
    ARENA_EBUSY,
    ARENA_ECLOSED,
    ARENA_EEXPORTED,
    ARENA_EINVAL,
    ARENA_ELIMIT,
    ARENA_ENOMEM,
    ARENA_EUNSUPPORTED,
    ARENA_EWRONGTHREAD,
    ARENA_KIND_CONFINED,
    ARENA_KIND_SHARED,
    ARENA_KIND_SLICING,
    ARENA_OK,
    ArenaCore,
    arena_allocate,
    arena_close,
    arena_core,
    arena_core_init,
    arena_free,
    arena_open,
    arena_raise,
    arena_reset,
)
