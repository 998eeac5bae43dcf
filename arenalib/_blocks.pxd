# cython: language_level=3
# The free-block cache's inline half: its size classes and the pop and push of a block, compiled
# into every module of the inline fast paths.  Its other half (refilling a class from jemalloc in
# one call, draining, the calls that put jemalloc behind it) is arenalib/_blocks.pxi.

from arenalib._abi cimport (
    CACHE_BINS, CACHE_MAX_BYTES, CACHE_MAX_PER_BIN, CACHE_MAX_SIZE, NO_HOT_BLOCK, FreeBlocks, arenalib_clz,
)


cdef inline int cache_bin(size_t size) noexcept nogil:
    """The free-block cache's size class of ``size`` (1 .. CACHE_MAX_SIZE; 0 shares bin 0)."""
    if size <= 1024:
        return <int>((size + 15) >> 4)
    cdef int k = 63 - arenalib_clz(size - 1)          # size is in (2**k, 2**(k+1)]
    return 65 + (k - 10) * 4 + <int>(((size - 1) >> (k - 2)) & 3)


cdef inline size_t cache_bin_size(int b) noexcept nogil:
    """The block size of size class ``b``: what is allocated, so any block of the class fits."""
    if b <= 64:
        return 16 if b == 0 else <size_t>b * 16
    b -= 65
    return <size_t>(5 + (b & 3)) << (8 + (b >> 2))


cdef inline void* cache_pop(FreeBlocks* cache, size_t size) noexcept nogil:
    """A cached free block for ``size`` bytes (<= CACHE_MAX_SIZE), or NULL."""
    cdef int b = cache_bin(size)
    cdef void* ptr
    if cache.hot_tag == b + 1:
        cache.hot_tag = NO_HOT_BLOCK
        return cache.hot
    ptr = cache.heads[b]
    if ptr != NULL:
        cache.heads[b] = (<void**>ptr)[0]
        cache.counts[b] -= 1
        cache.cached_bytes -= cache_bin_size(b)
    return ptr


cdef inline bint cache_push(FreeBlocks* cache, void* ptr, size_t size) noexcept nogil:
    """Keep a freed block of ``size`` bytes (<= CACHE_MAX_SIZE); False when the cache is full."""
    cdef int b = cache_bin(size)
    cdef int old_bin = cache.hot_tag - 1
    cdef void* old = cache.hot
    cdef size_t block
    if cache.hot_tag != NO_HOT_BLOCK:
        # The hot block moves to its list, if the list has room; else the new block is refused.
        block = cache_bin_size(old_bin)
        if (cache.counts[old_bin] >= CACHE_MAX_PER_BIN
                or cache.cached_bytes + block > CACHE_MAX_BYTES):
            return False
        (<void**>old)[0] = cache.heads[old_bin]
        cache.heads[old_bin] = old
        cache.counts[old_bin] += 1
        cache.cached_bytes += block
    cache.hot = ptr
    cache.hot_tag = b + 1
    return True


cdef inline size_t cache_held_bytes(FreeBlocks* cache) noexcept nogil:
    """Bytes of all the blocks the cache holds."""
    if cache.hot_tag != NO_HOT_BLOCK:
        return cache.cached_bytes + cache_bin_size(cache.hot_tag - 1)
    return cache.cached_bytes


cdef inline bint small_align(size_t align) noexcept nogil:
    """``align`` is 0 or a power of two up to 16, which every block of the fast paths meets."""
    return align <= 16 and (align & (align - 1)) == 0
