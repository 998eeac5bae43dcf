# A BufferPool's region: one block of the private jemalloc outside every arena (region_allocate,
# _slots.pxi), held by the pool and by every raw view of it, freed by the last of them; which of its
# pages are in RAM.

from cpython.buffer cimport PyBuffer_FillInfo

from arenalib._arena cimport region_allocate, region_free

cdef extern from "sys/mman.h" nogil:
    int mincore(void* addr, size_t length, unsigned char* vec)

cdef extern from "unistd.h" nogil:
    long sysconf(int name)
    int _SC_PAGESIZE

# A region starts on a page boundary, whatever its buffers' alignment.
cdef size_t REGION_ALIGN = 4096
cdef size_t PAGE_SIZE = <size_t>sysconf(_SC_PAGESIZE)


@cython.final
@cython.no_gc
cdef class _Region:
    """Owns a pool's region; the pool and every raw view hold it, the last one frees it."""

    @staticmethod
    cdef _Region allocate(size_t size, size_t align, bint zero):
        cdef _Region region = _Region()  # before the memory: its owner must exist to free it
        region.ptr = region_allocate(size, max(align, REGION_ALIGN), zero)
        if region.ptr == NULL:
            raise MemoryError(f"cannot allocate a pool region of {size} bytes: out of memory")
        return region

    def __dealloc__(self):
        if self.ptr != NULL:
            region_free(self.ptr)


@cython.final
cdef class _PoolBufferView:
    """The exporter behind raw_views(): one buffer of a pool's region, keeping the region alive."""

    cdef _Region _region
    cdef char* _ptr
    cdef Py_ssize_t _size

    def __init__(self, *args, **kwargs):
        raise TypeError("use BufferPool.raw_views()")

    @staticmethod
    cdef _PoolBufferView _make(_Region region, char* ptr, Py_ssize_t size):
        cdef _PoolBufferView exporter = _PoolBufferView.__new__(_PoolBufferView)
        exporter._region = region
        exporter._ptr = ptr
        exporter._size = size
        return exporter

    def __getbuffer__(self, Py_buffer* view, int flags):
        if self._region is None:
            raise TypeError("use BufferPool.raw_views()")
        PyBuffer_FillInfo(view, self, self._ptr, self._size, 0, flags)


cdef list region_views(_Region region, char* base, size_t stride, Py_ssize_t size, Py_ssize_t count):
    """A memoryview of each of the ``count`` buffers of ``size`` bytes, ``stride`` apart from
    ``base``, each holding ``region``."""
    cdef Py_ssize_t i
    return [memoryview(_PoolBufferView._make(region, base + <size_t>i * stride, size))
            for i in range(count)]


cdef inline size_t _first_page(const char* base) noexcept nogil:
    return <size_t>base & ~(PAGE_SIZE - 1)


cdef size_t region_pages(const char* base, size_t nbytes) noexcept nogil:
    """Pages the ``nbytes`` from ``base`` lie on: the length of region_resident()'s vector."""
    return (<size_t>base + nbytes - _first_page(base) + PAGE_SIZE - 1) // PAGE_SIZE


cdef size_t region_resident(const char* base, size_t nbytes, unsigned char* flags) noexcept nogil:
    """Bytes of the ``nbytes`` from ``base`` on resident pages (mincore; 0 when it fails), ``flags``
    a vector of region_pages(base, nbytes) bytes."""
    cdef size_t start = _first_page(base)
    cdef size_t region_start = <size_t>base
    cdef size_t region_end = region_start + nbytes
    cdef size_t i, first, last, resident = 0
    if mincore(<void*>start, region_end - start, flags) != 0:
        return 0
    for i in range(region_pages(base, nbytes)):
        if flags[i] & 1:  # the part of page i that is the region's
            first = max(start + i * PAGE_SIZE, region_start)
            last = min(start + (i + 1) * PAGE_SIZE, region_end)
            resident += last - first
    return resident
