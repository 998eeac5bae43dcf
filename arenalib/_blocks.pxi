# Allocating from jemalloc, and the free-block cache's half that calls it (confined arenas and each
# thread of a shared one): refilling a size class in one call, keeping and draining blocks.  The
# cache's inline half (size classes, pop, push) is arenalib/_blocks.pxd.

from arenalib._abi cimport (
    CACHE_BINS, CACHE_MAX_BYTES, CACHE_MAX_PER_BIN, CACHE_MAX_SIZE, NO_HOT_BLOCK, FreeBlocks,
    arenalib_compiler_fence,
)
from arenalib._blocks cimport cache_bin, cache_bin_size, cache_pop, cache_push
from arenalib._jemalloc cimport (
    MALLOCX_LG_ALIGN, MALLOCX_ZERO, je_dallocx, je_mallocx, je_rallocx, je_sallocx, je_xallocx,
)

cdef extern from "src/machine.h" nogil:
    bint beyond_machine "arenalib_beyond_machine"(size_t size)


# zero=True blocks up to this size are zeroed by memset, not by jemalloc (see DESIGN.md).
cdef size_t EAGER_ZERO_LIMIT = 4 << 20


cdef inline void* jemalloc_allocate(int flags, size_t size, size_t align, bint zero) noexcept nogil:
    """``size`` bytes from jemalloc with ``flags`` (arena, tcache) at ``align``; NULL: no memory,
    or more than this machine has (jemalloc would hand it out: src/machine.h)."""
    if beyond_machine(size):
        return NULL
    cdef bint memset_here = zero and CACHE_MAX_SIZE < size <= EAGER_ZERO_LIMIT
    if zero and not memset_here:
        flags |= MALLOCX_ZERO
    if align > 1:
        flags |= MALLOCX_LG_ALIGN(arenalib_ctz(align))
    cdef void* ptr = je_mallocx(size, flags)
    if memset_here and ptr != NULL:
        # jemalloc would zero a reused large extent by purging it, which moves the cost to a page
        # fault per page at first touch: a memset is far cheaper up to EAGER_ZERO_LIMIT.
        memset(ptr, 0, size)
    return ptr


# -- the free-block cache (confined arenas and each thread of a shared one) -----------------------

cdef enum:
    # A cache miss for a block up to REFILL_MAX_SIZE takes REFILL_BLOCKS blocks of its class in one
    # call into jemalloc, the rest kept in the cache for the next allocations: a scope of many
    # small blocks pays jemalloc's entry (~130 instructions a mallocx) once per REFILL_BLOCKS.
    # Larger blocks are few enough per scope that the prefetch would only hold memory.
    REFILL_MAX_SIZE = 4096
    REFILL_BLOCKS = 16


cdef struct BatchRequest:
    # jemalloc's batch_alloc_packet_t (src/ctl.c), written to experimental.batch_alloc.
    void** ptrs
    size_t num
    size_t size
    int flags


cdef void* _cache_refill(FreeBlocks* cache, int flags, int b) noexcept nogil:
    """A new block of size class ``b``, with up to REFILL_BLOCKS - 1 more of the class put in the
    cache's list (as many as the cache has room for), all from one call into jemalloc; NULL when
    jemalloc gave none."""
    cdef size_t block = cache_bin_size(b)
    cdef size_t room = min(<size_t>(CACHE_MAX_PER_BIN - cache.counts[b]),
                           (CACHE_MAX_BYTES - cache.cached_bytes) // block)
    cdef void* blocks[REFILL_BLOCKS]
    cdef BatchRequest request
    request.ptrs = blocks
    request.num = min(<size_t>REFILL_BLOCKS, room + 1)
    request.size = block
    request.flags = flags
    cdef size_t filled = 0
    cdef size_t filled_len = sizeof(size_t)
    if je_mallctlbymib(_mib_batch_alloc, _mib_batch_alloc_len, &filled, &filled_len,
                       &request, sizeof(request)) or filled == 0:
        return NULL
    cdef size_t i
    for i in range(1, filled):
        (<void**>blocks[i])[0] = cache.heads[b]
        cache.heads[b] = blocks[i]
    cache.counts[b] += <unsigned char>(filled - 1)
    cache.cached_bytes += (filled - 1) * block
    return blocks[0]


cdef inline void* cached_allocate(FreeBlocks* cache, int flags, size_t size, size_t align,
                                  bint zero) noexcept nogil:
    """A block from ``cache`` when one of the size class is there (and no special alignment is
    asked), else a new one from jemalloc; NULL when memory cannot be had."""
    cdef void* ptr
    if size > CACHE_MAX_SIZE:
        return jemalloc_allocate(flags, size, align, zero)
    if align <= 16:
        ptr = cache_pop(cache, size)
        if ptr == NULL and size <= REFILL_MAX_SIZE:
            ptr = _cache_refill(cache, flags, cache_bin(size))
        if ptr != NULL:
            if zero:
                memset(ptr, 0, size)
            return ptr
    # A whole size class, so the block can go to its bin when freed.
    return jemalloc_allocate(flags, cache_bin_size(cache_bin(size)), align, zero)


cdef inline void cached_free(FreeBlocks* cache, int flags, void* ptr, size_t size) noexcept nogil:
    """Keep a freed block for reuse, or give it to jemalloc when the cache is full."""
    if size > CACHE_MAX_SIZE or not cache_push(cache, ptr, size):
        je_dallocx(ptr, flags)


cdef enum:  # what cached_resize() did
    RESIZE_FAILED = 0       # no memory: the block is as it was
    RESIZE_IN_PLACE = 1
    RESIZE_MOVED = 2        # to a new block, the bytes copied, the old block freed


cdef int cached_resize(FreeBlocks* cache, int flags, void* ptr, size_t old, size_t new,
                       size_t align, bint zero, void** out) noexcept nogil:
    """Resize the block ``ptr`` of ``old`` bytes, from cached_allocate() at ``align``, to ``new``
    bytes (``zero``: the bytes past ``old`` zeroed); out[0] is where the bytes are now."""
    cdef void* moved = ptr
    cdef size_t zero_from = old    # where the bytes to zero here begin
    cdef size_t zero_to = new
    cdef bint both_large = old > CACHE_MAX_SIZE and new > CACHE_MAX_SIZE
    if beyond_machine(new):  # (as jemalloc_allocate)
        return RESIZE_FAILED
    if both_large:
        # jemalloc's own extents: in place (xallocx) when the pages after it are free or the size
        # shrinks, else jemalloc moves it (rallocx), where a large extent's pages may be remapped.
        if align > 1:
            flags |= MALLOCX_LG_ALIGN(arenalib_ctz(align))
        if zero and new - old > EAGER_ZERO_LIMIT:
            # As jemalloc_allocate(): zero pages from jemalloc rather than a memset of them all.
            # It zeroes from the extent's usable size on; the slack before it is memset here.
            zero_to = min(je_sallocx(ptr, 0), new)
            flags |= MALLOCX_ZERO
        if je_xallocx(ptr, new, 0, flags) < new:
            moved = je_rallocx(ptr, new, flags)
            if moved == NULL:
                return RESIZE_FAILED
    elif old > CACHE_MAX_SIZE or new > CACHE_MAX_SIZE or cache_bin(old) != cache_bin(new):
        # Another size class of the cache (whose blocks hold their whole class), or across the
        # cache's bound: a block of the new size, as an allocation would take it.
        moved = cached_allocate(cache, flags, new, align, False)
        if moved == NULL:
            return RESIZE_FAILED
        memcpy(moved, ptr, min(old, new))
        cached_free(cache, flags, ptr, old)
    # Else the same size class: the block already holds ``new`` bytes.
    if zero and zero_to > zero_from:
        memset(<char*>moved + zero_from, 0, zero_to - zero_from)
    out[0] = moved
    return RESIZE_IN_PLACE if moved == ptr else RESIZE_MOVED


cdef void* region_allocate(size_t size, size_t align, bint zero) noexcept nogil:
    """A BufferPool's region: one block outside every slot's arena, so that no bulk reset can take
    it while raw views handed to the kernel may still point into it; NULL: no memory."""
    return jemalloc_allocate(MALLOCX_TCACHE_NONE, size if size else 1, align, zero)


cdef void region_free(void* ptr) noexcept nogil:
    """Give back a block from region_allocate()."""
    je_dallocx(ptr, MALLOCX_TCACHE_NONE)


cdef void _cache_forget(FreeBlocks* cache) noexcept nogil:
    """Forget the cached free blocks (the caller resets the arena, which frees them in bulk)."""
    memset(cache, 0, sizeof(FreeBlocks))


cdef void cache_drain(FreeBlocks* cache) noexcept nogil:
    """Give every cached free block back to jemalloc (before a purge, which can then hand their
    pages to the OS, or when the thread that kept them ends), and empty the cache.

    The cache is emptied first and its blocks freed from a copy: a fork made by another thread
    meanwhile gives the child either the whole cache, none of it freed (jemalloc's fork handlers
    wait for a free under way), or an empty one, never lists of blocks jemalloc has taken back
    (a child thread taking the cache over was handed blocks twice)."""
    cdef FreeBlocks blocks = cache[0]
    cdef int b
    cdef void* ptr
    cdef void* next_ptr
    _cache_forget(cache)
    arenalib_compiler_fence()
    if blocks.hot_tag != NO_HOT_BLOCK:
        je_dallocx(blocks.hot, MALLOCX_TCACHE_NONE)
    for b in range(CACHE_BINS):
        ptr = blocks.heads[b]
        while ptr != NULL:
            next_ptr = (<void**>ptr)[0]
            je_dallocx(ptr, MALLOCX_TCACHE_NONE)
            ptr = next_ptr
