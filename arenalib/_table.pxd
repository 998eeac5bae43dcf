# cython: language_level=3
# The table-only C API: what a module that cimports arenalib (arenalib/__init__.pxd) compiles in.
# The result codes, the arena kinds, an ArenaCore as opaque storage, and ArenaTable: the function
# pointers of arenalib's entry points, found through the capsule arenalib._arena._C_TABLE (as
# numpy.random's bit generators are).  No struct layout, no inline rule: a module built against
# this table keeps working across arenalib versions until this file changes, which its
# fingerprint (TABLE_FINGERPRINT, tools/abi_fingerprint.py) tells.

from libc.stdint cimport uint64_t


# Result codes of the nogil functions; arena_raise() turns one into the matching Python exception
# (the table is _ERROR_TABLE in arenalib/_error_table.pxi, shared by the Python and the C entry points).
cdef enum:
    ARENA_OK = 0
    ARENA_ENOMEM = 1          # MemoryError: jemalloc could not get the memory
    ARENA_ELIMIT = 2          # MemoryError: max_bytes would be exceeded
    ARENA_ECLOSED = 3         # ArenaClosedError
    ARENA_EWRONGTHREAD = 4    # WrongThreadError: a confined arena used from another thread
    ARENA_EINVAL = 5          # ValueError: alignment not a power of two up to 1 GiB
    ARENA_EEXPORTED = 6       # BufferError: buffer exports of segments are alive
    ARENA_EBUSY = 7           # ArenaError: a SlicingArena used by two threads at once
    ARENA_EUNSUPPORTED = 8    # UnsupportedOperation: per-segment free of a SlicingArena
    ARENA_ESTALEMARK = 9      # ValueError: a mark of another arena, or invalidated since
    ARENA_EORDER = 10         # ValueError: a frame entered after this mark or frame is still open
    ARENA_ERROR_CODES = 11

cdef enum:
    ARENA_KIND_SHARED = 0     # Arena
    ARENA_KIND_CONFINED = 1   # ConfinedArena
    ARENA_KIND_SLICING = 2    # SlicingArena

cdef enum:
    # Room for arenalib's ArenaCore (arenalib._abi; 304 bytes today): a core of your own on the
    # stack or in a struct.  The table says how much arenalib needs, and a module whose room is
    # too small is refused.
    OPAQUE_CORE_WORDS = 64


cdef struct ArenaMark:
    # A SlicingArena's carve position, from arena_mark() for arena_rewind(): storage the caller
    # keeps, never read by it.
    uint64_t arena            # the open arena's serial number
    uint64_t generation       # the arena's generation: a reset or close makes the mark stale
    uint64_t serial           # the stamp its level had when it was made (renewed by a rewind)
    Py_ssize_t depth          # its place in the arena's stack of marks


cdef struct OpaqueCore:
    # An arena's C handle as the table-only API sees it: storage only, never read by the caller.
    uint64_t words[OPAQUE_CORE_WORDS]


ctypedef int (*table_open_fn)(OpaqueCore* core, int kind, Py_ssize_t max_bytes,
                              size_t chunk_size) except -1
ctypedef int (*table_close_fn)(OpaqueCore* core) except -1
ctypedef int (*table_allocate_fn)(OpaqueCore* core, size_t size, size_t align, bint zero,
                                  void** out) noexcept nogil
ctypedef int (*table_free_fn)(OpaqueCore* core, void* ptr, size_t size) noexcept nogil
ctypedef int (*table_reset_fn)(OpaqueCore* core) noexcept nogil
ctypedef int (*table_mark_fn)(OpaqueCore* core, ArenaMark* out) noexcept nogil
ctypedef int (*table_rewind_fn)(OpaqueCore* core, const ArenaMark* mark) noexcept nogil
ctypedef int (*table_raise_fn)(int code) except -1
ctypedef OpaqueCore* (*table_core_of_fn)(object arena) except NULL
ctypedef void (*table_core_init_fn)(OpaqueCore* core) noexcept nogil


cdef struct ArenaTable:
    # The fingerprint first, then the room arenalib's core needs: a module checks both before it
    # calls anything.  Every function holds the whole rule of its operation (fast paths included).
    uint64_t fingerprint
    size_t core_size
    table_open_fn open
    table_close_fn close
    table_allocate_fn allocate
    table_free_fn free
    table_reset_fn reset
    table_raise_fn raise_error
    table_core_of_fn core_of
    table_core_init_fn core_init
    table_mark_fn mark
    table_rewind_fn rewind
