# SlicingArena: bump-pointer carving of chunks (Panama's slicingAllocator).  Nothing is freed one by
# one; reset() starts over in the first chunk, close() gives the chunks back.  Its fields are
# SlicingState.  Any thread may carve: the thread that carved last keeps the arena (biased
# ownership, the inline fast path in fast.pxd) and carves without any atomic instruction; any other
# thread takes the busy lock and the arena over, or gets ARENA_EBUSY while it is in use.  Its books
# are folded in lazily (slicing_settle): the carve counts live bytes only.

cimport cython
from libc.stdlib cimport free, realloc
from libc.string cimport memmove, memset

from arenalib._abi cimport (
    CARVER_RECORDS, RECENT_MAX, SLICE_DEFAULT_ALIGN, ArenaCore, CarverRecord, SlicingState, books_note_peak,
    arenalib_load_carving, arenalib_load_owner, arenalib_store_owner, arenalib_unlock,
    load_carve_record, store_carve_record, thread_ident,
)
from arenalib._jemalloc cimport je_dallocx
from arenalib._slicing cimport carve_extent, slicing_carve_current, slicing_settle
from arenalib._table cimport ARENA_EBUSY, ARENA_ELIMIT, ARENA_ENOMEM, ARENA_KIND_SLICING, ARENA_OK

cdef extern from "src/fork.h":
    # The busy lock (arenalib_unlock() releases it too: it stores 0), never taken over in a fork's
    # child; a stale one is the parent's (see there).
    bint busy_take "arenalib_generation_try_lock_here"(int* busy) noexcept nogil
    bint busy_stale "arenalib_generation_stale"(int* busy) noexcept nogil

cdef extern from "src/slicing.h":
    void arenalib_release_record(unsigned long* thread) noexcept nogil
    int arenalib_membarrier_register() noexcept nogil
    int arenalib_membarrier() noexcept nogil
    bint arenalib_claim_record(unsigned long* thread, unsigned long me) noexcept nogil

cdef size_t DEFAULT_CHUNK_SIZE = 256 * 1024
# Biased carving needs membarrier(); without it (not Linux, or refused by a sandbox) every carve
# takes the busy lock.  Set by slicing_init().
cdef bint _biased_carving = False


cdef void slicing_init() noexcept nogil:
    global _biased_carving
    _biased_carving = arenalib_membarrier_register() == 0


cdef void slicing_after_fork() noexcept nogil:
    """In a fork's child only this thread is left: no other thread is carving (an arena whose
    busy lock one of them held stays busy: src/fork.h), and their records are free for the
    child's new threads."""
    global _biased_carving
    cdef unsigned long me = thread_ident()
    cdef int i
    for i in range(CARVER_RECORDS):
        _inline_state.carvers[i].carving = NULL
        if _inline_state.carvers[i].thread != me:
            _inline_state.carvers[i].thread = 0
    _biased_carving = _biased_carving and arenalib_membarrier_register() == 0


# -- chunks ----------------------------------------------------------------------------------------

cdef bint _grow(void** array, size_t nbytes) noexcept nogil:
    # libc's, not PyMem_RawRealloc(): under the busy lock, and tracemalloc's hook of the raw
    # allocator takes the GIL, which a Python thread waiting for the lock may hold (a deadlock).
    cdef void* grown = realloc(array[0], nbytes)
    if grown == NULL:
        return False
    array[0] = grown
    return True


cdef inline void _use_chunk(SlicingState* slicing, Py_ssize_t i) noexcept nogil:
    """Carve from chunk ``i`` on, from its start."""
    slicing.current = i
    slicing.cursor = <size_t>slicing.chunks[i]
    slicing.cursor_end = slicing.cursor + slicing.chunk_sizes[i]


cdef inline void _use_no_chunk(SlicingState* slicing) noexcept nogil:
    """Carve from no chunk: the next carve takes or makes one."""
    slicing.current = 0
    slicing.cursor = 0
    slicing.cursor_end = 0


cdef int _next_chunk(ArenaCore* core, size_t size, size_t align) noexcept nogil:
    """Make the current chunk one that can hold ``size`` bytes at ``align`` from its start."""
    cdef SlicingState* slicing = &core.slicing
    cdef Py_ssize_t i = slicing.current + 1 if slicing.nchunks else 0
    while i < slicing.nchunks:  # chunks kept warm by reset()
        if (<size_t>slicing.chunks[i] & (align - 1)) == 0 and slicing.chunk_sizes[i] >= size:
            _use_chunk(slicing, i)
            return ARENA_OK
        i += 1
    cdef size_t chunk_size = slicing.chunk_size
    if size > chunk_size:
        chunk_size = (size + PAGE - 1) & ~(PAGE - 1)
    cdef Py_ssize_t capacity
    if slicing.nchunks == slicing.chunks_capacity:
        capacity = slicing.chunks_capacity * 2 + 4
        if not (_grow(<void**>&slicing.chunks, capacity * sizeof(char*))
                and _grow(<void**>&slicing.chunk_sizes, capacity * sizeof(size_t))):
            return ARENA_ENOMEM
        slicing.chunks_capacity = capacity
    # Not zeroed: a chunk is mostly reused dirty memory, and zeroing all of it would cost more than
    # zeroing the zero=True segments carved from it.
    cdef char* chunk = <char*>jemalloc_allocate(
        slot_flags(core.slot), chunk_size, align if align > PAGE else PAGE, False)
    if chunk == NULL:
        return ARENA_ENOMEM
    # Put in right after the current chunk, not at the end: the chunks after the current one are
    # the unused ones (kept warm by reset()), which the next carves must still reach.  Appended,
    # a chunk of its own for a large request skipped them for good, and every reset() of an arena
    # that carved a large request between small ones kept one more chunk (2,000 resets: 500 MiB).
    cdef Py_ssize_t at = slicing.current + 1 if slicing.nchunks else 0
    memmove(&slicing.chunks[at + 1], &slicing.chunks[at], (slicing.nchunks - at) * sizeof(char*))
    memmove(&slicing.chunk_sizes[at + 1], &slicing.chunk_sizes[at],
            (slicing.nchunks - at) * sizeof(size_t))
    slicing.chunks[at] = chunk
    slicing.chunk_sizes[at] = chunk_size
    slicing.nchunks += 1
    slicing.chunk_bytes += chunk_size
    _use_chunk(slicing, at)
    return ARENA_OK


cdef void _free_own_chunks(ArenaCore* core) noexcept nogil:
    """Give back the chunks made for one request larger than chunk_size (none holds a live
    segment): only chunks of the arena's chunk_size stay warm across resets, so that a one-off
    huge request does not stay resident for the arena's life.  jemalloc keeps their pages dirty
    for a while, so the same request again after a reset still finds them warm."""
    cdef SlicingState* slicing = &core.slicing
    cdef size_t held = slicing.chunk_bytes
    cdef Py_ssize_t i, kept = 0
    for i in range(slicing.nchunks):
        if slicing.chunk_sizes[i] > slicing.chunk_size:
            je_dallocx(slicing.chunks[i], slot_flags(core.slot))
            slicing.chunk_bytes -= slicing.chunk_sizes[i]
        else:
            slicing.chunks[kept] = slicing.chunks[i]
            slicing.chunk_sizes[kept] = slicing.chunk_sizes[i]
            kept += 1
    slicing.nchunks = kept
    # Their pages stay dirty in the slot's arena: the close counts them in its churn (a 200 MiB
    # request, reset, closed: 200 MiB stayed resident until jemalloc's decay, or for good without
    # it, when the close counted only the chunks left).
    slicing.chunk_bytes_peak = max(slicing.chunk_bytes_peak, held)


cdef void slicing_free_chunks(ArenaCore* core, Py_ssize_t keep) noexcept nogil:
    """Give back the chunks from index ``keep`` on (they hold no live segment)."""
    cdef SlicingState* slicing = &core.slicing
    cdef Py_ssize_t i
    for i in range(keep, slicing.nchunks):
        je_dallocx(slicing.chunks[i], slot_flags(core.slot))
        slicing.chunk_bytes -= slicing.chunk_sizes[i]
    if keep < slicing.nchunks:
        slicing.nchunks = keep


# -- the busy lock and the bias ----------------------------------------------------------------------

cdef CarverRecord* _carver_record(unsigned long me) noexcept nogil:
    """The calling thread's CarverRecord, or NULL when its place in the table is another live
    thread's (that thread then carves through the lock: slower, never wrong)."""
    cdef CarverRecord* record = &_inline_state.carvers[_carver_index(me)]
    if record.thread == me:
        return record
    if arenalib_claim_record(&record.thread, me):
        thread_exit_arm()  # the record goes back when the thread ends
        return record
    return NULL


cdef void slicing_thread_exit() noexcept nogil:
    """The calling thread ends (_thread_exit): its carver record is free for another thread.  An
    arena still biased to it finds the record taken by another thread (record.thread is not the
    biased one), and a carve of it takes the slow path, as for any thread without a record."""
    cdef unsigned long me = thread_ident()
    cdef CarverRecord* record = &_inline_state.carvers[_carver_index(me)]
    if record.thread == me:
        arenalib_release_record(&record.thread)


def _carver_records_taken():
    """How many carver records threads hold (for the tests)."""
    return sum(_inline_state.carvers[i].thread != 0 for i in range(CARVER_RECORDS))


cdef inline Py_ssize_t _carver_index(unsigned long me) noexcept nogil:
    return <Py_ssize_t>(((me >> 12) * <unsigned long>0x9E3779B97F4A7C15) >> 56)


cdef int slicing_lock(ArenaCore* core) noexcept nogil:
    """Take a SlicingArena's busy lock and its bias (from whichever thread holds it), for a carve
    that needs the slow path, a reset or a purge.  ARENA_EBUSY: another thread is using it."""
    global _biased_carving
    cdef SlicingState* slicing = &core.slicing
    cdef unsigned long me = thread_ident()
    cdef unsigned long owner
    if not busy_take(&slicing.busy):
        return ARENA_EBUSY
    owner = arenalib_load_owner(&core.carve_owner)
    if owner == me or load_carve_record(&slicing.carve_record) == NULL:
        return ARENA_OK   # no other thread may be carving without the lock
    if owner != 0:
        arenalib_store_owner(&core.carve_owner, 0)
        # After this, the owner either sees carve_owner == 0 before carving, or its record shows
        # the carve it started.
        if arenalib_membarrier() != 0:
            # Cannot take it over safely: the owner keeps it, and no arena is biased from now on.
            _biased_carving = False
            arenalib_store_owner(&core.carve_owner, owner)
            arenalib_unlock(&slicing.busy)
            return ARENA_EBUSY
    if arenalib_load_carving(&load_carve_record(&slicing.carve_record).carving) == <void*>core:
        arenalib_unlock(&slicing.busy)
        return ARENA_EBUSY   # the former owner is in the middle of a carve
    store_carve_record(&slicing.carve_record, NULL)
    return ARENA_OK


cdef bint slicing_busy_for_good(ArenaCore* core) noexcept nogil:
    """Whether the arena's ARENA_EBUSY will not end: its busy lock was held by a thread of the
    parent when this process forked (src/fork.h), so a caller that waits out a busy lock raises."""
    return core.kind == ARENA_KIND_SLICING and busy_stale(&core.slicing.busy)


cdef void slicing_unlock(ArenaCore* core) noexcept nogil:
    """Release the busy lock and leave the arena biased to the calling thread (when it can be)."""
    cdef unsigned long me = thread_ident()
    cdef CarverRecord* record
    if (_biased_carving and core.max_bytes < 0 and core.open
            and arenalib_load_owner(&core.carve_owner) != me):
        record = _carver_record(me)
        if record != NULL:
            store_carve_record(&core.slicing.carve_record, record)
            arenalib_store_owner(&core.carve_owner, me)
    arenalib_unlock(&core.slicing.busy)


cdef void _drop_bias(ArenaCore* core) noexcept nogil:
    """At close: no thread may carve without the lock any more (a carve racing with close is the
    caller's error, as the C API says; this only makes sure later carves see the arena closed)."""
    if arenalib_load_owner(&core.carve_owner) not in (0, thread_ident()):
        arenalib_store_owner(&core.carve_owner, 0)
        arenalib_membarrier()
    arenalib_store_owner(&core.carve_owner, 0)
    store_carve_record(&core.slicing.carve_record, NULL)


# -- the operations ----------------------------------------------------------------------------------

cdef int _carve(ArenaCore* core, size_t size, size_t align, bint zero, void** out) noexcept nogil:
    if over_limit(core, size):
        return ARENA_ELIMIT
    if align < SLICE_DEFAULT_ALIGN:
        align = SLICE_DEFAULT_ALIGN
    cdef void* ptr = slicing_carve_current(core, size, align, zero)
    cdef int err
    if ptr == NULL:
        err = _next_chunk(core, carve_extent(size), align)
        if err:
            return err
        ptr = slicing_carve_current(core, size, align, zero)  # fits the chunk just chosen
    out[0] = ptr
    return ARENA_OK


cdef int slicing_allocate(ArenaCore* core, size_t size, size_t align, bint zero,
                          void** out) noexcept nogil:
    cdef int err = slicing_lock(core)
    if err:
        return err
    err = _carve(core, size, align, zero, out)
    if err:
        arenalib_unlock(&core.slicing.busy)  # not biased to a thread whose carve failed
    else:
        slicing_unlock(core)
    return err


cdef int slicing_resize(ArenaCore* core, void* ptr, size_t old, size_t new, size_t align, bint zero,
                        uint64_t stamp, void** out) noexcept nogil:
    """Resize the carve ``ptr`` of ``old`` bytes (carved at ``align`` under the level of ``stamp``).
    The last carve of the current chunk, at the innermost level of marks, grows or shrinks in place
    (its end is the cursor); any other shrinks in place, and grows into a new carve with its bytes
    copied, the old one left carved until the next reset or rewind.  ARENA_EINVAL: it would move
    into a level of marks opened after its carve, whose rewind would take it."""
    cdef int err = slicing_lock(core)
    if err:
        return err
    cdef SlicingState* slicing = &core.slicing
    cdef size_t start = <size_t>ptr
    cdef uint64_t version
    cdef bint innermost = frame_stamp_now(&core.life, &version) == stamp
    cdef bint last = (innermost and slicing.nchunks and start + carve_extent(old) == slicing.cursor
                      and start >= <size_t>slicing.chunks[slicing.current])
    out[0] = ptr
    if last and carve_extent(new) <= slicing.cursor_end - start:
        if new > old and over_limit(core, new - old):
            err = ARENA_ELIMIT
        else:
            if new < old:
                # The carve counts live bytes only and folds them in at reset, rewind and close:
                # the bytes a shrink gives back fold in now, or peak and total would never see them.
                books_note_peak(&core.books)
                core.books.allocated_total += old - new
            slicing.cursor = start + carve_extent(new)
            core.books.live_bytes += <Py_ssize_t>new - <Py_ssize_t>old
            if zero and new > old:
                memset(<char*>ptr + old, 0, new - old)
    elif new > old and not innermost:
        err = ARENA_EINVAL
    elif new > old:
        err = _carve(core, new, align, False, out)
        if not err:
            memcpy(out[0], ptr, old)
            if zero:
                memset(<char*>out[0] + old, 0, new - old)
            core.books.live_segments -= 1  # the old carve's segment is the one that dies
    if err:
        arenalib_unlock(&slicing.busy)
    else:
        slicing_unlock(core)
    return err


cdef void slicing_open(ArenaCore* core, size_t chunk_size) noexcept nogil:
    """A SlicingArena opens with no chunk: its first carve takes one."""
    memset(&core.slicing, 0, sizeof(SlicingState))
    core.slicing.chunk_size = chunk_size


cdef int slicing_reset(ArenaCore* core) noexcept nogil:
    """Start over in the first chunk (the chunks stay, warm); every segment is dead."""
    cdef int err = slicing_lock(core)
    if err:
        return err
    frames_forget(core)  # (its carve position is overwritten below)
    _free_own_chunks(core)
    if core.slicing.nchunks:
        _use_chunk(&core.slicing, 0)
    else:
        _use_no_chunk(&core.slicing)
    slicing_settle(core)
    core_forget_live(core)
    slicing_unlock(core)
    return ARENA_OK


cdef void slicing_close(ArenaCore* core, size_t* stale, size_t* churn, bint holding) noexcept:
    """What a closing SlicingArena leaves to its slot: ``stale`` bytes still allocated, ``churn``
    bytes allocated in all.  ``holding``: exports are alive, every chunk stays."""
    cdef SlicingState* slicing = &core.slicing
    # Busy for good (a fork's child: src/fork.h): the chunk list may be half moved, and a chunk
    # named twice would be freed twice; the slot's reset frees them all at once, and the lists
    # (maybe being grown at the fork) are left.
    cdef bint torn = busy_stale(&slicing.busy)
    _drop_bias(core)
    frames_close(&core.life, holding)
    slicing_settle(core)
    churn[0] = max(slicing.chunk_bytes, slicing.chunk_bytes_peak)
    if slicing.nchunks <= RECENT_MAX and not holding and not torn:
        # A few chunks go straight back to jemalloc, warm for the next arena's chunks.
        slicing_free_chunks(core, 0)
    # Otherwise the chunks (holding every segment) are the slot's stale garbage now.
    stale[0] = slicing.chunk_bytes
    if not torn:
        free(slicing.chunks)
        free(slicing.chunk_sizes)
    slicing.chunks = NULL
    slicing.chunk_sizes = NULL
    slicing.nchunks = 0
    slicing.chunks_capacity = 0
    slicing.chunk_bytes = 0
    slicing.chunk_bytes_peak = 0
    _use_no_chunk(slicing)


@cython.final
cdef class SlicingArena(ArenaBase):
    """SlicingArena(*, chunk_size=None, max_bytes=None)\n--\n\nBump-pointer allocation inside chunks taken
    from jemalloc (Panama's slicingAllocator).

    SlicingArena(*, chunk_size=None, max_bytes=None).  No per-segment free: reset() invalidates every
    segment and keeps the chunks for reuse; close() gives them back.  Requests larger than a chunk
    get a chunk of their own.  Every carve, even of 0 bytes, has an address of its own (as malloc(0)
    has): at least one byte of the chunk.  Any thread may use it; the thread that used it last carves without
    atomic instructions, and another thread taking it over pays a few microseconds."""

    def __cinit__(self, _positional=_NOT_GIVEN, *, chunk_size=None, max_bytes=None):
        if _positional is not _NOT_GIVEN:
            _no_positional(self, "chunk_size=, max_bytes=")
        cdef Py_ssize_t size = <Py_ssize_t>DEFAULT_CHUNK_SIZE
        if chunk_size is not None:
            size = _parse_size(chunk_size, "chunk_size")
            if <size_t>size < PAGE:
                raise ValueError(f"chunk_size must be at least {PAGE}, not {chunk_size!r}")
        self._open(ARENA_KIND_SLICING, max_bytes, <size_t>size)

    @property
    def chunk_size(self):
        """Size of the chunks carved by allocate()."""
        return self._core.slicing.chunk_size

    cdef int _free_segment(self, Segment seg) except -1:
        return self._check_freeable()

    cdef int _check_freeable(self) except -1:
        raise UnsupportedOperation(
            "SlicingArena segments cannot be freed one by one; use reset() or close()")

    def purge(self):
        """Give back the chunks not in use (those past the current one, all of them when no
        segment is alive) and purge dirty pages."""
        # Chunks and thread caches go: no other thread's Python-level access, reset or close meanwhile.
        exclusive_begin(&self._core.life)
        cdef int err = _usable(&self._core)
        if not err:
            err = slicing_lock(&self._core)
        if not err:
            # Every chunk past the current one holds no live segment; with no live segment at
            # all (after a reset), none does, but open marks still name the current one.
            if self._core.slicing.nchunks and (self._core.books.live_segments
                                               or frames_open(&self._core.life)):
                slicing_free_chunks(&self._core, self._core.slicing.current + 1)
            else:
                slicing_free_chunks(&self._core, 0)
                _use_no_chunk(&self._core.slicing)
            self._core.slicing.chunk_bytes_peak = 0  # (the purge below hands the rest back)
            slicing_unlock(&self._core)
            slot_purge_open(self._core.slot)
        cdef ArenaSlot* slot = self._core.slot
        exclusive_end(&self._core.life)
        if err:
            self._raise(err, "cannot purge")
        with nogil:
            slot_purge_settle(slot)

    def stats(self):
        """As ArenaBase.stats(), plus the chunks held and the marks open (frames included).

        live_bytes counts what was carved and not yet rewound or reset: a resize that moved a
        segment leaves its old carve counted (its bytes come back with the next rewind below it,
        or reset()), while live_segments counts the new segment only."""
        result = ArenaBase.stats(self)
        result["chunks"] = self._core.slicing.nchunks
        result["chunk_bytes"] = self._core.slicing.chunk_bytes
        result["marks"] = frames_depth(&self._core.life)
        return result

    # -- marks and frames (arenalib/_frames.pxi) ---------------------------------------------------

    def mark(self):
        """The carve position, as a Mark for rewind(): what is carved after it dies at the rewind.

        Marks nest, on one stack per arena (whichever thread makes them)."""
        return arena_mark_object(self)

    def rewind(self, mark):
        """Kill every segment carved since ``mark`` (using one raises ArenaClosedError) and carve
        that memory again; segments carved before it stay, the chunks stay warm.  The mark is used
        up, and so is every mark made after it.  Raises ValueError, changing nothing, for a used-up
        mark or one of another arena, or while a frame entered after it is open; BufferError while
        an export of a segment it would kill is alive."""
        arena_rewind_object(self, mark)

    def frame(self):
        """A Frame: ``with arena.frame() as f:`` marks on entry and rewinds on exit."""
        return arena_frame_object(self)
