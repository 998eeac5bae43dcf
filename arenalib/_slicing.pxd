# cython: language_level=3
# SlicingArena's inline rule: the carve of a block from the current chunk, and the books it
# settles at reset and close.  The rest of the kind (chunks, the busy lock and the bias, reset,
# close) is arenalib/_slicing.pxi.

from libc.string cimport memset

from arenalib._abi cimport ArenaCore, Books, SlicingState


cdef inline void* slicing_carve_current(ArenaCore* core, size_t size, size_t align,
                                        bint zero) noexcept nogil:
    """``size`` bytes carved from the current chunk at ``align`` (>= 16), or NULL when they do
    not fit or there is no chunk.  The caller holds the busy lock or the arena's bias."""
    cdef SlicingState* slicing = &core.slicing
    cdef size_t start = (slicing.cursor + align - 1) & ~(align - 1)
    if start > slicing.cursor_end or size > slicing.cursor_end - start or start == 0:
        return NULL
    slicing.cursor = start + size
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
