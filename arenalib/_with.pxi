# `with arena:` binds __enter__ and __exit__ without a garbage-collected object.
#
# The with statement looks both methods up on the type and binds each to the arena (CPython's
# _PyObject_LookupSpecial).  For a method of a C type, CPython 3.10 to 3.13 make a builtin method
# object each time: tracked by the GC, dropped after its one call.  For a scope per request, the
# two cost ~480 of the ~3,050 instructions of `with ConfinedArena() as a: a.allocate(512,
# zero=False).fill(3)` (DESIGN.md, callgrind).  Here both are replaced in ArenaBase's dict by a
# descriptor that binds to a small untracked object (kept on a free list with the GIL) and calls the
# method's C function straight.  Reached through the class, the descriptor gives the original
# method, and a bound one answers every attribute as the builtin method would: help(), inspect and
# stubtest see what they always saw.

# The two types, their slots and the free list: src/with.h.
cdef extern from "src/with.h":
    int arenalib_fast_method_install(type t, const char* name) except -1


cdef int fast_with_init(type arena_base) except -1:
    """Give ``arena_base``'s __enter__ and __exit__ their cheap binding (see above)."""
    arenalib_fast_method_install(arena_base, b"__enter__")
    arenalib_fast_method_install(arena_base, b"__exit__")
    return 0
