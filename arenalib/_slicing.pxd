# cython: language_level=3
# SlicingArena's inline rule: the carve of a block from the current chunk, the books it settles
# at reset and close, and the bias test (a thread the arena is biased to carves, marks and rewinds
# without an atomic instruction).  The rest of the kind (chunks, the busy lock and the taking over
# of the bias, reset, close) is arenalib/_slicing.pxi.

from libc.string cimport memset

from arenalib._abi cimport (
    ArenaCore, Books, CarverRecord, SlicingState, arenalib_clear_carving, arenalib_compiler_fence,
    arenalib_load_owner, arenalib_set_carving, load_carve_record,
)


cdef inline size_t carve_extent(size_t size) noexcept nogil:
    """The bytes of the chunk a carve of ``size`` takes: one at least, so that every live carve
    has an address of its own (as every malloc(0) has), which tracemalloc and set_debug() key on."""
    return size if size else 1


cdef inline void* slicing_carve_current(ArenaCore* core, size_t size, size_t align,
                                        bint zero) noexcept nogil:
    """``size`` bytes carved from the current chunk at ``align`` (>= 16), or NULL when they do
    not fit or there is no chunk.  The caller holds the busy lock or the arena's bias."""
    cdef SlicingState* slicing = &core.slicing
    cdef size_t start = (slicing.cursor + align - 1) & ~(align - 1)
    cdef size_t extent = carve_extent(size)
    if start > slicing.cursor_end or extent > slicing.cursor_end - start or start == 0:
        return NULL
    slicing.cursor = start + extent
    # Nothing is freed between resets, so peak_bytes and allocated_total are brought up to date
    # from live_bytes at reset and close (slicing_settle) instead of on every carve: the one
    # kind whose books are not kept by books_add(), for the carve's sake.
    core.books.live_bytes += size
    core.books.live_segments += 1
    if zero:
        memset(<void*>start, 0, size)
    return <void*>start


cdef inline void slicing_settle(ArenaCore* core) noexcept nogil:
    """Fold a SlicingArena's live bytes into peak_bytes and allocated_total, before they go."""
    if core.books.live_bytes > core.books.peak_bytes:
        core.books.peak_bytes = core.books.live_bytes
    core.books.allocated_total += <size_t>core.books.live_bytes


cdef inline void slicing_books(ArenaCore* core, Books* books) noexcept nogil:
    """The books as they will be once settled (stats() of an open SlicingArena)."""
    books[0] = core.books
    if books.live_bytes > books.peak_bytes:
        books.peak_bytes = books.live_bytes
    books.allocated_total += <size_t>books.live_bytes


cdef inline CarverRecord* biased_record(ArenaCore* core, unsigned long me) noexcept nogil:
    """The calling thread's carver record when the SlicingArena ``core`` is biased to it, else NULL.
    The thread then works on the arena without the busy lock: it announces the work in the record
    (arenalib_set_carving), re-reads carve_owner, works, and clears the record; a thread taking the
    bias over clears carve_owner, runs membarrier(), then reads the record, so one of the two sees
    the other (slicing_lock).  Only a thread's own record is ever announced in."""
    cdef CarverRecord* record
    if core.self != core or arenalib_load_owner(&core.carve_owner) != me:
        return NULL
    record = load_carve_record(&core.slicing.carve_record)
    return record if record != NULL and record.thread == me else NULL


cdef inline CarverRecord* biased_begin(ArenaCore* core, unsigned long me) noexcept nogil:
    """biased_record(), with the work announced: the record, or NULL (the caller takes the locked
    path); biased_end() ends the work.  The caller has checked that ``core`` is at its own address
    (core.self: a copy must not reach the original's chunks and marks)."""
    # The record, not carve_owner, is tested before the announcement: a record of this thread's
    # that the arena names makes the announcement harmless even while the arena is being taken
    # over (the taker, reading it, answers ARENA_EBUSY and tries again), and carve_owner, tested
    # after it, decides.
    cdef CarverRecord* record = load_carve_record(&core.slicing.carve_record)
    if record == NULL or record.thread != me:
        return NULL
    arenalib_set_carving(&record.carving, core)
    arenalib_compiler_fence()
    if arenalib_load_owner(&core.carve_owner) == me:
        return record
    arenalib_clear_carving(&record.carving)  # not biased to this thread (any more)
    return NULL


cdef inline void biased_end(CarverRecord* record) noexcept nogil:
    arenalib_clear_carving(&record.carving)
