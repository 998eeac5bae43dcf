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
# The nogil functions never raise: they return ARENA_OK or an error code.  arena_free() takes the
# size given to arena_allocate().
#
# Threads.  The same contract holds with the GIL and on a free-threaded CPython (3.13t), where nogil
# code and Python threads truly run at once:
# - an Arena's core: arena_allocate() and arena_free() from any threads at once (each thread has
#   its own thread cache);
# - a ConfinedArena's core: its owner thread only; any other gets ARENA_EWRONGTHREAD;
# - a SlicingArena's core: any thread, one carving at a time; the others get ARENA_EBUSY;
# - arena_close() and arena_reset(), and the Python close(), reset() and purge(), must come after
#   every nogil arena_allocate()/arena_free() of that core on other threads has returned (join
#   your workers first): arenalib does not track C-level callers.  Python-level users need no such
#   care: close, reset, purge, free and release wait for Python-level accesses of the memory under
#   way on other threads, and those that come later raise (arenalib/_access.pxi);
# - arena_core() and arena_open()/arena_close() need the GIL (an attached thread state);
# - a segment's memory you write from nogil code is yours while the segment is alive: arenalib
#   does not stop another Python thread from freeing it under you.
# The inline paths honour this: they read and write only the calling thread's state (a confined
# core's free lists, a SlicingArena's carve by its biased thread), and on a free-threaded build the
# inline open and close of a confined scope leave the shared parked slot to arenalib's functions,
# which lock the slot pool.  For a scope without any Python object, put an
# ArenaCore on the stack, prepare it once with arena_core_init(), then use arena_open() /
# arena_close() (both need the GIL).  An ArenaCore must not be copied or moved while open: every
# call treats a copy (a core not at the address it was opened at) as closed (ARENA_ECLOSED), so it
# can never reach memory the original gave back.
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
