# The body of the example consumer, built twice from one source: arenalib_consumer.pyx through the
# function table (cimport arenalib), arenalib_consumer_fast.pyx with the inline fast paths
# (cimport arenalib.fast).  Each of those two files is only its cimport and this include.

cdef enum:
    CONTENT_MISMATCH = -1


cdef int _check(const unsigned char* p, size_t size, unsigned char value) noexcept nogil:
    cdef size_t i
    for i in range(size):
        if p[i] != value:
            return CONTENT_MISMATCH
    return ARENA_OK


def fill_free_loop(arena, Py_ssize_t iterations, size_t size, bint zero=False,
                   unsigned char pattern=3):
    """Without the GIL, ``iterations`` times: allocate ``size`` bytes, check zeroing when asked,
    fill with ``pattern``, check it, free.  Returns the bytes checked."""
    cdef ArenaCore* core = arena_core(arena)
    cdef void* ptr = NULL
    cdef int err = ARENA_OK
    cdef Py_ssize_t _i
    cdef uint64_t checked = 0
    with nogil:
        for _i in range(iterations):
            err = arena_allocate(core, size, 0, zero, &ptr)
            if err != ARENA_OK:
                break
            if zero:
                err = _check(<unsigned char*>ptr, size, 0)
                if err != ARENA_OK:
                    break
            memset(ptr, pattern, size)
            err = _check(<unsigned char*>ptr, size, pattern)
            if err != ARENA_OK:
                break
            checked += size
            err = arena_free(core, ptr, size)
            if err != ARENA_OK:
                break
    if err == CONTENT_MISMATCH:
        raise AssertionError("memory did not hold what was written")
    arena_raise(err)
    return checked


def batch_loop(arena, Py_ssize_t rounds, Py_ssize_t batch, size_t size, unsigned char pattern):
    """Without the GIL: allocate ``batch`` blocks, fill each with ``pattern``, then check all
    (another thread's block overlapping ours would show), free them; ``rounds`` times."""
    if batch > 1024:
        raise ValueError("batch must be <= 1024")
    cdef ArenaCore* core = arena_core(arena)
    cdef void* blocks[1024]
    cdef int err = ARENA_OK
    cdef Py_ssize_t _r, i, n = 0
    with nogil:
        for _r in range(rounds):
            n = 0
            while n < batch:
                err = arena_allocate(core, size, 0, False, &blocks[n])
                if err != ARENA_OK:
                    break
                memset(blocks[n], pattern, size)
                n += 1
            for i in range(n):
                if err == ARENA_OK:
                    err = _check(<unsigned char*>blocks[i], size, pattern)
            for i in range(n):
                arena_free(core, blocks[i], size)
            if err != ARENA_OK:
                break
    if err == CONTENT_MISMATCH:
        raise AssertionError("a block was overwritten: two live blocks overlap")
    arena_raise(err)
    return rounds * batch


def keep_allocations(arena, Py_ssize_t count, size_t size):
    """Allocate ``count`` blocks without freeing them (the arena frees them at close or reset)."""
    cdef ArenaCore* core = arena_core(arena)
    cdef void* ptr
    cdef int err = ARENA_OK
    cdef Py_ssize_t _i
    with nogil:
        for _i in range(count):
            err = arena_allocate(core, size, 0, True, &ptr)
            if err != ARENA_OK:
                break
    arena_raise(err)


def carve_blocks(arena, Py_ssize_t count, size_t size, unsigned char pattern):
    """Without the GIL: carve ``count`` blocks of ``size`` bytes (a SlicingArena's, typically),
    each filled with ``pattern``; a carve refused as busy is retried.  Returns the addresses and
    the number of refusals."""
    cdef ArenaCore* core = arena_core(arena)
    cdef size_t* addresses = <size_t*>malloc(max(count, 1) * sizeof(size_t))
    cdef void* ptr
    cdef int err = ARENA_OK
    cdef Py_ssize_t i = 0, refused = 0
    if addresses == NULL:
        raise MemoryError()
    with nogil:
        while i < count:
            err = arena_allocate(core, size, 0, False, &ptr)
            if err == ARENA_EBUSY:
                refused += 1
                continue
            if err != ARENA_OK:
                break
            memset(ptr, pattern, size)
            addresses[i] = <size_t>ptr
            i += 1
    try:
        arena_raise(err)
        return [addresses[j] for j in range(i)], refused
    finally:
        free(addresses)


def scoped_loop(Py_ssize_t iterations, size_t size):
    """A confined arena with no Python object: open, allocate, fill, close, ``iterations`` times."""
    cdef ArenaCore core
    cdef void* ptr
    cdef int err = ARENA_OK
    cdef Py_ssize_t _i
    arena_core_init(&core)
    for _i in range(iterations):
        arena_open(&core, ARENA_KIND_CONFINED, -1, 0)
        err = arena_allocate(&core, size, 0, False, &ptr)
        if err == ARENA_OK:
            memset(ptr, 3, size)
        arena_close(&core)
        arena_raise(err)
    return iterations


def frame_loop(arena, Py_ssize_t iterations, size_t size, unsigned char pattern):
    """Without the GIL, ``iterations`` times on a SlicingArena: mark, carve ``size`` bytes, fill
    and check them, rewind.  Returns the distinct addresses carved (one: the rewind reuses it)."""
    cdef ArenaCore* core = arena_core(arena)
    cdef ArenaMark mark
    cdef void* ptr = NULL
    cdef void* first = NULL
    cdef Py_ssize_t _i, distinct = 0
    cdef int err = ARENA_OK
    with nogil:
        for _i in range(iterations):
            err = arena_mark(core, &mark)
            if err != ARENA_OK:
                break
            err = arena_allocate(core, size, 0, False, &ptr)
            if err != ARENA_OK:
                break
            memset(ptr, pattern, size)
            err = _check(<unsigned char*>ptr, size, pattern)
            if err != ARENA_OK:
                break
            if ptr != first:
                first = ptr
                distinct += 1
            err = arena_rewind(core, &mark)
            if err != ARENA_OK:
                break
    if err == CONTENT_MISMATCH:
        raise AssertionError("memory did not hold what was written")
    arena_raise(err)
    return distinct


def mark(arena):
    """arena_mark() of a SlicingArena: the mark as bytes (for rewind()), or the error code (int)."""
    cdef ArenaMark out
    cdef int err
    cdef ArenaCore* core = arena_core(arena)
    with nogil:
        err = arena_mark(core, &out)
    if err != ARENA_OK:
        return err
    return (<char*>&out)[:sizeof(ArenaMark)]


def rewind(arena, bytes mark):
    """arena_rewind() to a mark from mark(): the error code (ARENA_OK, ARENA_ESTALEMARK ...)."""
    if len(mark) != sizeof(ArenaMark):
        raise ValueError("not a mark")
    cdef ArenaMark m
    memcpy(&m, <const char*>mark, sizeof(ArenaMark))
    cdef int err
    cdef ArenaCore* core = arena_core(arena)
    with nogil:
        err = arena_rewind(core, &m)
    return err
