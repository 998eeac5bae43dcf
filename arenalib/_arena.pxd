# cython: language_level=3
# The classes of arenalib._arena, and the functions arenalib's other modules (_pool) cimport.
# The C ABI the inline fast paths read is arenalib/_abi.pxd; the public cimport surfaces are
# arenalib/__init__.pxd (the function table) and arenalib/fast.pxd (the inline fast paths).

from libc.stdint cimport uint64_t

from arenalib._abi cimport ArenaCore, Books, Lifetime
from arenalib._table cimport ArenaMark

cdef extern from *:
    """
    /* Segment._freed of a root segment: a free under way is FREEING until it is done or undone. */
    #define ARENALIB_SEG_ALIVE 0
    #define ARENALIB_SEG_FREED 1
    #define ARENALIB_SEG_FREEING 2
    /* Counters several threads may change at once (exports, live objects): atomic where no GIL
       serialises them. */
    #if ARENALIB_FREE_THREADED
    #define arenalib_count(p, v) ((void)__atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST))
    /* Sequentially consistent, as the flag's store before it: a deferred free sets the flag, then
       reads the count; the last release counts down, then claims the flag; each must see the
       other's write (an acquire load may pass the earlier store on ARM's RCpc loads; on x86 both
       are the same plain load). */
    #define arenalib_read(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
    #define arenalib_flag_set(p) __atomic_store_n((p), 1, __ATOMIC_SEQ_CST)
    #define arenalib_flag_claim(p) __atomic_exchange_n((p), 0, __ATOMIC_SEQ_CST)
    #else
    #define arenalib_count(p, v) ((void)(*(p) += (v)))
    #define arenalib_read(p) (*(p))
    #define arenalib_flag_set(p) ((void)(*(p) = 1))
    static inline int arenalib_flag_claim(int *p) { int was = *p; *p = 0; return was; }
    #endif
    """
    int SEG_ALIVE "ARENALIB_SEG_ALIVE"
    int SEG_FREED "ARENALIB_SEG_FREED"
    int SEG_FREEING "ARENALIB_SEG_FREEING"
    void count_add "arenalib_count"(Py_ssize_t* counter, Py_ssize_t delta) noexcept nogil
    Py_ssize_t count_read "arenalib_read"(Py_ssize_t* counter) noexcept nogil
    int state_read "arenalib_read"(int* state) noexcept nogil
    void flag_set "arenalib_flag_set"(int* flag) noexcept nogil
    bint flag_claim "arenalib_flag_claim"(int* flag) noexcept nogil  # clears it: was it set?

cdef enum:
    # tracemalloc domain of the memory handed out through the Python API ("ARNA").
    TRACE_DOMAIN = 0x41524E41

cdef extern from "Python.h":
    # Both return -2 at once when tracemalloc is not tracing: the cost when it is off.
    int PyTraceMalloc_Track(unsigned int domain, size_t ptr, size_t size) noexcept
    int PyTraceMalloc_Untrack(unsigned int domain, size_t ptr) noexcept


cdef enum:
    # The NumPy handler's cache of small blocks (GIL builds, arenalib/_numpy.pxi): blocks of up to
    # NP_CACHE_MAX data bytes, a bucket per 16 bytes, NP_CACHE_DEPTH blocks a bucket.
    NP_CACHE_MAX = 1024
    NP_CACHE_BUCKETS = 65
    NP_CACHE_DEPTH = 4

cdef struct NumpyCache:
    # Arena blocks of arrays dropped lately, which the handler hands out again before it asks the
    # arena, as NumPy's own handler keeps its small blocks; the GIL guards it.
    uint64_t generation       # the arena's generation when they were kept: in another, they are gone
    unsigned char count[NP_CACHE_BUCKETS]
    void* kept[NP_CACHE_BUCKETS * NP_CACHE_DEPTH]

cdef struct NumpyBooks:
    # An Arena's NumPy data buffers (arenalib/_numpy.pxi), each also counted in Lifetime.exports.
    Py_ssize_t arrays         # alive now
    Py_ssize_t nbytes         # their bytes, as NumPy asked for them
    Py_ssize_t fallbacks      # allocations NumPy's default handler served instead (arena closed)
    NumpyCache* cache         # made with the arena's first handler on a GIL build; NULL otherwise
    void* large               # its big blocks alive (src/numpy_large.h), made with its first handler


cdef class SegmentOwner:
    cdef:
        Lifetime* _life         # what this owner's segments check (in its core, or its own)
        object __weakref__

    cdef bint _is_open(self) noexcept
    cdef int _free_segment(self, Segment seg) except -1
    cdef int _check_freeable(self) except -1
    cdef void _exports_released(self) noexcept
    cdef Segment _resize_segment(self, Segment seg, Py_ssize_t size, bint zero)


cdef class Segment:
    cdef:
        char* _ptr
        Py_ssize_t _size
        SegmentOwner _arena     # owns the memory (an arena or a BufferPool); borrowed: see _keeper
        object _keeper          # keeps _arena alive: _arena, a thread's anchor of it, or None (a slice)
        Lifetime* _life         # _arena's Lifetime, kept here: one load less per check
        Segment _root           # the segment that owns the memory; None when this one does
        uint64_t _generation    # the owner's generation when allocated: stale after a reset/close
        Py_ssize_t _exports     # live buffer exports and pins; counted on the root only
        void* _accessor         # whose access record names it: see _access.pxi (root only)
        uint64_t _frame_stamp   # carved under a mark of a SlicingArena: its level's stamp (0: none)
        # The small fields last, in pairs, so that no padding grows the object past 128 bytes
        # (136 cost ~12 ns a round trip: measured, not counted in instructions).
        int _freed              # SEG_ALIVE, SEG_FREED, or SEG_FREEING while a free is under way
        int _free_pending       # free once the last export is released (root only)
        bint _readonly          # made by readonly() (or sliced from one): no writes, no writable exports
        bint _resized           # resize() moved its memory to another Segment (root only)
        unsigned char _lg_align  # log2 of the align it was allocated at (0: none asked): resize keeps it

    cdef int _check(self) except -1
    cdef int _status(self) noexcept
    cdef bint _dead_root(self) noexcept
    cdef bint _current(self) noexcept
    cdef int _raise_status(self, int status) except -1
    cdef int _pin(self, void** token) except -1
    cdef void _unpin(self, void* token) noexcept
    cdef Segment _owner_segment(self)
    cdef int _free_when_unexported(self) except -1
    cdef int _free_pending_now(self) except -1


cdef class ArenaBase(SegmentOwner):
    cdef:
        ArenaCore _core
        object _created_at      # creation stack in debug mode, else None
        dict _traced            # addresses of the blocks reported to tracemalloc (-> 0) ...
        dict _traced_framed     # ... and those carved under a mark (-> their frame stamp)
        Py_ssize_t _traced_rewinds  # the arena's rewinds when _traced_framed was last swept
        dict _debug_blocks      # set_debug(True): address -> [size, where allocated, exports, frame stamp]
        NumpyBooks _numpy       # its numpy() scopes' arrays (_numpy.pxi)

    cdef int _open(self, int kind, object max_bytes, size_t chunk_size=*) except -1
    cdef Segment _allocate(self, Py_ssize_t size, bint zero, size_t align,
                           const ArenaMark* frame, const char* contents, Py_ssize_t copied)
    cdef int _raise(self, int code, str context) except -1
    cdef int _close(self, bint deferred=*) except -1
    cdef int _reset(self) except -1
    cdef int _check_usable(self) except -1
    cdef void _untrack_all(self) noexcept
    cdef void _start_tracing(self) noexcept
    cdef int _trace(self, size_t address, size_t size, bint track, uint64_t stamp=*,
                    uint64_t generation=*) except -1
    cdef int _sync_traced(self) except -1
    cdef int _sync_traced_locked(self) except -1


cdef class Arena(ArenaBase):
    pass


cdef class ConfinedArena(ArenaBase):
    pass


cdef class SlicingArena(ArenaBase):
    pass


# -- for arenalib's other modules ----------------------------------------------------------------

cdef Segment make_segment(SegmentOwner arena, Py_ssize_t size, bint keep=*)
cdef Py_ssize_t parse_size(object size, str name) except -1
cdef size_t parse_align(object align) except 0
cdef bint parse_flag(object value, str name) except -1
cdef void* region_allocate(size_t size, size_t align, bint zero) noexcept nogil
cdef void region_free(void* ptr) noexcept nogil
cdef void count_open_pools(int delta) noexcept
# Accessing-now records (_access.pxi): what keeps memory from going while another thread touches it.
cdef void* access_enter(Lifetime* life) noexcept nogil
cdef void access_exit(void* token) noexcept nogil
cdef void exclusive_begin(Lifetime* life) noexcept nogil
cdef void exclusive_end(Lifetime* life) noexcept nogil
cdef bint free_begin(Lifetime* life, Segment root, void* my_token) noexcept
cdef void free_end(Segment root, bint freed) noexcept
