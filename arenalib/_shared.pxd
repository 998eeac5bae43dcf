# cython: language_level=3
# Arena (shared)'s inline rule: the books of a block on the allocating thread's share.  The
# rest of the kind (its thread caches, limits, peak, close) is arenalib/_shared.pxi.

from arenalib._abi cimport ThreadCache, books_add, store_ssize


cdef inline void shared_count_allocation(ThreadCache* tc, size_t size) noexcept nogil:
    """A shared Arena's books for a new block, on the allocating thread's share (the arena's
    peak is shared_update_peak()'s)."""
    books_add(&tc.books, size)
    if tc.books.live_bytes > tc.high_water:
        store_ssize(&tc.high_water, tc.books.live_bytes)
