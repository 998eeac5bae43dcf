# A BufferPool's buffers: how far apart they lie and what a pool of them costs (pool_stride), and
# their books (PoolBooks, _pool.pxd): which are free, and whether a free one is known to hold zeros.
# books_take, books_give_back, books_reset and books_available are C only, for the pool's critical
# section: nothing in them raises or runs Python code.
#
# The free buffers are the released ones (the free stack, LIFO) and every index from ``next_fresh``
# up (handed out in order once the stack is empty).  ``state`` is written only below ``touched``, the
# buffers ever handed out (above it, a buffer holds what the region's pages hold: ``fresh_state``).
# So making a pool writes no bookkeeping, and a reset writes what was used, not every buffer.
#
# Buffers lent to a Ring's provided-buffer ring (Ring.provide) are out of the free list: LENT while
# the kernel may pick them (never reachable from Python), DELIVERED once a completion handed one out
# as a Segment.  Giving a DELIVERED buffer back puts it into the ring again while the lending lasts
# (books_give_back), else on the free list; ending the lending (books_unlend) frees the LENT ones.
# A ring that lends incrementally (IOU_PBUF_RING_INC) has the kernel fill a buffer in parts: each
# part is a segment of its own (``parts``: how much is filled, how many segments are alive), and the
# buffer goes back only once the kernel is done with it and every segment over it is released.

from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc
from cpython.pyport cimport PY_SSIZE_T_MAX

cdef extern from "src/machine.h" nogil:
    size_t backable_bytes "arenalib_backable_bytes"()

# Buffer states.  A buffer free since the region was zeroed needs no memset for a zero=True pool.
cdef enum:
    FREE_ZERO = 0
    IN_USE = 1
    FREE_DIRTY = 2
    LENT = 3         # in a ring's provided-buffer ring: the kernel may write it at any time
    DELIVERED = 4    # picked by the kernel and handed out by the ring as a Segment

# The bookkeeping per buffer: its index on the free stack and its state byte.
cdef size_t BOOKKEEPING_PER_BUFFER = sizeof(Py_ssize_t) + 1


cdef size_t pool_stride(Py_ssize_t size, Py_ssize_t n, size_t align) except 0:
    """The distance between buffers of ``size`` bytes aligned to ``align``; MemoryError for ``n`` of
    them that no address space, or not this machine, could hold."""
    if <size_t>size > <size_t>PY_SSIZE_T_MAX - align:
        raise MemoryError(f"cannot allocate buffers of {size} bytes: larger than any address space")
    cdef size_t stride = (<size_t>size + align - 1) & ~(align - 1)
    if <size_t>n > <size_t>PY_SSIZE_T_MAX / stride:
        raise MemoryError(f"cannot allocate {n} buffers of {stride} bytes: larger than any address "
                          "space")
    cdef size_t total = stride * <size_t>n
    # Every buffer may be in use at once, each with its bookkeeping: refuse what this machine
    # could never back (the region is reserved at once but its pages only as they are written,
    # so an impossible pool would otherwise fail later, with the OOM killer).
    cdef size_t bookkeeping = <size_t>n * BOOKKEEPING_PER_BUFFER
    cdef size_t backable = backable_bytes()
    if backable and (total > backable or bookkeeping > backable - total):
        raise MemoryError(
            f"cannot make a BufferPool of {n} buffers of {stride} bytes: its region ({total} "
            f"bytes) and bookkeeping ({bookkeeping} bytes) are more than this machine's memory "
            f"({backable} bytes of RAM and swap); ask for fewer or smaller buffers")
    return stride


cdef int books_init(PoolBooks* books, Py_ssize_t count, bint zero) noexcept:
    """Books of ``count`` free buffers never handed out; -1: no memory (``books_free`` still owed).

    The arrays are allocated whole but written only as buffers are handed out and released: a
    pool costs what is used of it."""
    books.free_stack = <Py_ssize_t*>PyMem_Malloc(<size_t>count * sizeof(Py_ssize_t))
    books.state = <unsigned char*>PyMem_Malloc(<size_t>count)
    books.fresh_state = FREE_ZERO if zero else FREE_DIRTY  # what the region's pages hold now
    return -1 if books.free_stack == NULL or books.state == NULL else 0


cdef void books_free(PoolBooks* books) noexcept:
    PyMem_Free(books.free_stack)
    PyMem_Free(books.state)
    PyMem_Free(books.parts)
    books.free_stack = NULL
    books.state = NULL
    books.parts = NULL


cdef inline Py_ssize_t books_available(const PoolBooks* books, Py_ssize_t count) noexcept nogil:
    return books.nstack + (count - books.next_fresh)


cdef Py_ssize_t books_take(PoolBooks* books, Py_ssize_t count, bint* dirty) noexcept nogil:
    """Mark a free buffer in use and return its index: the last one released, else the lowest never
    handed out since the region was made or reset; ``dirty``: it may not hold zeros.  -1 when every
    buffer is in use (counted as exhausted)."""
    cdef Py_ssize_t i
    if books.nstack:
        books.nstack -= 1
        i = books.free_stack[books.nstack]
    elif books.next_fresh < count:
        i = books.next_fresh
        books.next_fresh += 1
        if i == books.touched:  # its first time: its state is what the region's pages hold
            books.state[i] = books.fresh_state
            books.touched += 1
    else:
        books.exhausted += 1
        return -1
    dirty[0] = books.state[i] != FREE_ZERO
    books.state[i] = IN_USE
    books.in_use += 1
    books.acquisitions += 1
    if books.in_use > books.high_water:
        books.high_water = books.in_use
    return i


cdef bint books_give_back(PoolBooks* books, Py_ssize_t i, void* lender,
                          lender_take_fn take) noexcept nogil:
    """Put buffer ``i`` back on the free stack, or, when a ring delivered it and ``lender`` takes it,
    into that ring; False, changing nothing, when it is not in use."""
    if i >= books.touched:
        return False
    cdef unsigned char state = books.state[i]
    cdef PartUse* part
    if state == DELIVERED:
        if books.parts != NULL:
            part = &books.parts[i]
            part.segments -= 1
            if part.segments > 0 or (lender != NULL and not part.done):
                return True  # out still: other parts alive, or the kernel has the rest of it
            part.consumed = 0
            part.done = False
        if lender != NULL and take(lender, i):
            books.state[i] = LENT
            return True
        books.lent -= 1
    elif state != IN_USE:
        return False
    books.state[i] = FREE_DIRTY
    books.free_stack[books.nstack] = i
    books.nstack += 1
    books.in_use -= 1
    return True


cdef void books_reset(PoolBooks* books) noexcept nogil:
    """Every buffer free, handed out from index 0 up again; the ones in use become dirty."""
    cdef Py_ssize_t i
    for i in range(books.touched):
        if books.state[i] == IN_USE or books.state[i] == DELIVERED:  # (never LENT: reset refuses)
            books.state[i] = FREE_DIRTY
        if books.parts != NULL:
            memset(&books.parts[i], 0, sizeof(PartUse))
    books.nstack = 0
    books.next_fresh = 0
    books.in_use = 0
    books.lent = 0


cdef void books_install_parts(PoolBooks* books, PartUse* parts) noexcept nogil:
    """Start the part books (``parts`` zeroed, one per buffer) at a pool's first incremental
    lending: a buffer delivered whole before is one part alive, the kernel done with it."""
    cdef Py_ssize_t i
    for i in range(books.touched):
        if books.state[i] == DELIVERED:
            parts[i].segments = 1
            parts[i].done = True
    books.parts = parts


cdef Py_ssize_t books_lend(PoolBooks* books, Py_ssize_t count, void* lender,
                           lender_take_fn take) noexcept nogil:
    """Lend every free buffer to ``lender`` (each marked LENT and handed to ``take``); how many."""
    cdef Py_ssize_t i, n = 0
    cdef bint dirty
    while books_available(books, count):
        i = books_take(books, count, &dirty)
        books.acquisitions -= 1  # lent, not acquired
        books.state[i] = LENT
        books.lent += 1
        take(lender, i)
        n += 1
    return n


cdef Py_ssize_t books_unlend(PoolBooks* books) noexcept nogil:
    """End a lending: the LENT buffers back on the free stack (the DELIVERED ones come back when
    their segments are released); how many."""
    cdef Py_ssize_t i, n = 0
    for i in range(books.touched):
        if books.state[i] == DELIVERED and books.parts != NULL:
            # A part-filled buffer: the kernel will fill no more of it.  Free now if no segment
            # holds it, else once its last one is released.
            books.parts[i].done = True
            if books.parts[i].segments == 0:
                memset(&books.parts[i], 0, sizeof(PartUse))
                books.state[i] = LENT
        if books.state[i] == LENT:
            books.state[i] = FREE_DIRTY
            books.free_stack[books.nstack] = i
            books.nstack += 1
            n += 1
    books.in_use -= n
    books.lent -= n
    return n


cdef Py_ssize_t books_deliver(PoolBooks* books, Py_ssize_t i, Py_ssize_t nbytes, bint more,
                              Py_ssize_t size) noexcept nogil:
    """Buffer ``i``, picked by the kernel, is handed out: ``nbytes`` from the offset returned, the
    buffer's start unless it is lent incrementally (then after its parts handed out before; ``more``:
    the kernel fills more of it).  -1 when it was not lent (or the part does not fit)."""
    if i < 0 or i >= books.touched:
        return -1
    cdef unsigned char state = books.state[i]
    cdef PartUse* part
    cdef Py_ssize_t offset = 0
    if books.parts == NULL:
        if state != LENT:
            return -1
    else:
        part = &books.parts[i]
        if not (state == LENT or (state == DELIVERED and not part.done)) or part.consumed + nbytes > size:
            return -1
        offset = part.consumed
        part.consumed += nbytes
        part.segments += 1
        part.done = not more
    books.state[i] = DELIVERED
    return offset
