# Arena (shared): any thread may allocate, free and close.  Each thread gets its own explicit
# tcache, free-block cache and Books (a ThreadCache, kept warm with the slot), found through a small
# thread-local table, so two threads never share a lock or a cache line on the common path.  Its
# fields: the ThreadCaches of the slot plus SharedState (the bytes reserved against max_bytes, the
# one counter all threads touch, and only when there is a limit).  The arena's figures are the sum
# over its threads; peak_bytes is brought up to date by the Python path (allocate()).  On a
# free-threaded build a thread's segments hold its anchor of the arena, not the arena (below).

cimport cython
from libc.stdlib cimport calloc
from cpython.object cimport PyObject
from cpython.pystate cimport PyThreadState_GetDict
from cpython.ref cimport Py_INCREF, Py_XDECREF
from posix.unistd cimport getpid
from cpython.pythread cimport (
    PyThread_acquire_lock, PyThread_release_lock, PyThread_type_lock, WAIT_LOCK,
)
from libc.stdint cimport uint64_t

from arenalib._abi cimport (
    ArenaCore, ArenaSlot, Books, ThreadCache, books_clear, books_remove, books_resize, load_first_cache,
    load_size, load_ssize, store_first_cache, store_size, store_ssize,
)
from arenalib._blocks cimport cache_held_bytes
from arenalib._shared cimport shared_count_allocation
from arenalib._table cimport ARENA_ELIMIT, ARENA_ENOMEM, ARENA_KIND_SHARED, ARENA_OK
from arenalib._jemalloc cimport MALLOCX_ARENA, MALLOCX_TCACHE_NONE, je_dallocx, je_mallocx

cdef extern from "src/shared.h":
    unsigned long load_thread "arenalib_load_thread"(unsigned long* thread) noexcept nogil
    void store_thread "arenalib_store_thread"(unsigned long* thread, unsigned long value) noexcept nogil
    void* arenalib_tls_get(uint64_t serial) noexcept nogil
    void arenalib_tls_set(uint64_t serial, void* cache) noexcept nogil
    int arenalib_thread_ready
    Py_ssize_t arenalib_atomic_add(Py_ssize_t* counter, Py_ssize_t value) noexcept nogil
    void arenalib_publish(ThreadCache** head, ThreadCache* node) noexcept nogil
    ThreadCache* arenalib_follow(ThreadCache** link) noexcept nogil
    void arenalib_raise_peak(Py_ssize_t* peak, Py_ssize_t value) noexcept nogil
    bint arenalib_reserve(Py_ssize_t* counter, size_t size, Py_ssize_t limit) noexcept nogil
    void* arenalib_tls_anchor(uint64_t serial) noexcept nogil
    bint arenalib_tls_set_anchor(uint64_t serial, void* anchor) noexcept nogil
    void arenalib_tls_forget_anchor(void* anchor) noexcept nogil
    bint owned_here "arenalib_owned_here"(object o) noexcept nogil
    bint arenalib_thread_state_ending() noexcept nogil
    bint interpreter_finalizing "arenalib_interpreter_finalizing"() noexcept
    Py_ssize_t refcount "Py_REFCNT"(PyObject* o) noexcept nogil

cdef int MAX_THREAD_CACHES = 8         # per slot, kept warm across shared arenas


cdef ThreadCache* _thread_cache(ArenaCore* core) noexcept nogil:
    """The calling thread's ThreadCache of a shared arena, made on its first use; NULL: no memory."""
    cdef ThreadCache* tc = <ThreadCache*>arenalib_tls_get(core.serial)
    if tc != NULL:
        return tc
    global arenalib_thread_ready
    cdef void* first
    if not arenalib_thread_ready:
        # A thread whose first jemalloc call is a free gets jemalloc's minimal per-thread state,
        # which must not use a tcache (jemalloc --enable-debug asserts it: a thread that only frees
        # an Arena's segments met it); one allocation gives the thread its full state first.
        first = je_mallocx(1, MALLOCX_TCACHE_NONE)
        if first != NULL:
            je_dallocx(first, MALLOCX_TCACHE_NONE)
            arenalib_thread_ready = 1
    cdef unsigned long me = thread_ident()
    cdef ArenaSlot* slot = core.slot
    cdef ThreadCache* unowned = NULL
    thread_exit_arm()  # its caches go back when it ends
    PyThread_acquire_lock(<PyThread_type_lock>slot.threads_lock, WAIT_LOCK)
    tc = slot.threads
    while tc != NULL and tc.thread != me:
        if tc.thread == 0 and unowned == NULL:
            unowned = tc
        tc = tc.next
    if tc == NULL and unowned != NULL:
        tc = unowned  # left by a thread that ended: warm, its books still count
        store_thread(&tc.thread, me)
    if tc == NULL:
        tc = <ThreadCache*>calloc(1, sizeof(ThreadCache))  # (libc's: see _slots.pxi)
        if tc != NULL:
            tcache_take(&tc.tcache_index)  # NO_TCACHE when none can be had: slower, still right
            tc.thread = me
            tc.next = slot.threads
            arenalib_publish(&slot.threads, tc)
            slot.thread_count += 1
    PyThread_release_lock(<PyThread_type_lock>slot.threads_lock)
    if tc != NULL:
        arenalib_tls_set(core.serial, tc)
    return tc


cdef void shared_thread_exit() noexcept nogil:
    """The calling thread ends (_thread_exit): the free blocks its caches keep go back to jemalloc
    (decay or a purge then hands their pages to the OS), and its ThreadCaches are left unowned,
    for the next thread to take over with their books.  A slot is never freed, and _all_slots_lock
    keeps the list from moving meanwhile.  Its caches are its own: only reset, purge and close
    touch another thread's, under the slot's threads_lock, held here too."""
    cdef unsigned long me = thread_ident()
    cdef Py_ssize_t i
    cdef ArenaSlot* slot
    cdef ThreadCache* tc
    PyThread_acquire_lock(_all_slots_lock, WAIT_LOCK)
    for i in range(_all_slots_count):
        slot = _all_slots[i]
        PyThread_acquire_lock(<PyThread_type_lock>slot.threads_lock, WAIT_LOCK)
        tc = slot.threads
        while tc != NULL:
            if tc.thread == me:
                cache_drain(&tc.cache)
                _flush_tcache(tc.tcache_index)
                store_thread(&tc.thread, 0)
            tc = tc.next
        PyThread_release_lock(<PyThread_type_lock>slot.threads_lock)
    PyThread_release_lock(_all_slots_lock)


cdef inline int _thread_flags(ArenaCore* core, ThreadCache* tc) noexcept nogil:
    return MALLOCX_ARENA(core.slot.arena_index) | tcache_flag(tc.tcache_index)


cdef inline int shared_allocate(ArenaCore* core, size_t size, size_t align, bint zero,
                                void** out) noexcept nogil:
    cdef ThreadCache* tc = _thread_cache(core)
    if tc == NULL:
        return ARENA_ENOMEM
    # Only a limited arena pays for a counter shared by all threads; compare-and-swap, so that
    # neither a huge size nor threads reserving at once can take it past the limit.
    if core.max_bytes >= 0 and not arenalib_reserve(&core.shared.reserved_bytes, size,
                                                    core.max_bytes):
        return ARENA_ELIMIT
    cdef void* ptr = cached_allocate(&tc.cache, _thread_flags(core, tc), size, align, zero)
    if ptr == NULL:
        if core.max_bytes >= 0:
            arenalib_atomic_add(&core.shared.reserved_bytes, -<Py_ssize_t>size)
        return ARENA_ENOMEM
    shared_count_allocation(tc, size)
    if core.max_bytes < 0 and load_first_cache(&core.shared.first_cache) == NULL:
        store_first_cache(&core.shared.first_cache, tc)  # this thread's fast path from now on
    out[0] = ptr
    return ARENA_OK


cdef inline int shared_free(ArenaCore* core, void* ptr, size_t size) noexcept nogil:
    cdef ThreadCache* tc = _thread_cache(core)
    if tc == NULL:
        # No memory for this thread's cache: free without one, and count it on a thread that
        # allocated (there is one: ptr came from this arena), so the totals stay right.
        je_dallocx(ptr, MALLOCX_TCACHE_NONE)
        tc = core.slot.threads
    else:
        cached_free(&tc.cache, _thread_flags(core, tc), ptr, size)
    if tc != NULL:
        books_remove(&tc.books, size)
    if core.max_bytes >= 0:
        arenalib_atomic_add(&core.shared.reserved_bytes, -<Py_ssize_t>size)
    return ARENA_OK


cdef inline int shared_resize(ArenaCore* core, void* ptr, size_t old, size_t new, size_t align,
                              bint zero, void** out) noexcept nogil:
    cdef ThreadCache* tc = _thread_cache(core)
    if tc == NULL:
        return ARENA_ENOMEM
    cdef Py_ssize_t grow = <Py_ssize_t>new - <Py_ssize_t>old
    if core.max_bytes >= 0 and grow > 0 and not arenalib_reserve(&core.shared.reserved_bytes,
                                                                 <size_t>grow, core.max_bytes):
        return ARENA_ELIMIT
    cdef int done = cached_resize(&tc.cache, _thread_flags(core, tc), ptr, old, new, align, zero, out)
    if done == RESIZE_FAILED:
        if core.max_bytes >= 0 and grow > 0:
            arenalib_atomic_add(&core.shared.reserved_bytes, -grow)
        return ARENA_ENOMEM
    if core.max_bytes >= 0 and grow < 0:
        arenalib_atomic_add(&core.shared.reserved_bytes, grow)
    books_resize(&tc.books, old, new, done == RESIZE_MOVED)  # this thread's share, as a free's
    if tc.books.live_bytes > tc.high_water:
        store_ssize(&tc.high_water, tc.books.live_bytes)
    return ARENA_OK


cdef void shared_totals(ArenaCore* core, Books* totals, size_t* cached=NULL) noexcept nogil:
    """The sum of the arena's per-thread books (and of the bytes their caches hold)."""
    cdef ThreadCache* tc
    totals.live_bytes = 0
    totals.live_segments = 0
    totals.allocated_total = load_size(&core.shared.reused_bytes)  # (the NumPy handler's: see there)
    totals.peak_bytes = load_ssize(&core.books.peak_bytes)
    PyThread_acquire_lock(<PyThread_type_lock>core.slot.threads_lock, WAIT_LOCK)
    tc = core.slot.threads
    while tc != NULL:  # each thread's books change as they are read: a figure of the moment
        totals.live_bytes += load_ssize(&tc.books.live_bytes)
        totals.live_segments += load_ssize(&tc.books.live_segments)
        totals.allocated_total += load_size(&tc.books.allocated_total)
        if cached != NULL:
            cached[0] += cache_held_bytes(&tc.cache)
        tc = tc.next
    PyThread_release_lock(<PyThread_type_lock>core.slot.threads_lock)


cdef void shared_update_peak(ArenaCore* core) noexcept nogil:
    """Bring peak_bytes up to the live bytes of all threads (after each Python allocate()).

    The sum cannot pass peak_bytes while this thread's live bytes plus the other threads' high
    water marks do not: then nothing else is read.  Only otherwise are the other threads' live
    bytes read, each a cache line its thread writes on every call (a cache miss per allocate
    when they were read every time: a shared Arena on 2 threads scaled 1.40x in bench/threads.py).

    Walked without the lock (a lock every thread takes on every allocate would undo the per-thread
    caches): nodes are only freed by close(), which waits for this Python-level allocate to end
    (or needs the GIL it holds), and a node another thread is adding right now is missed at worst.
    The other threads' live bytes are read while they change: a figure, not an invariant."""
    cdef ThreadCache* mine = load_first_cache(&core.shared.first_cache)
    # The sums below count the blocks the NumPy handler keeps; the peak is of what was held.
    cdef Py_ssize_t idle = load_ssize(&core.shared.idle_bytes)
    cdef Py_ssize_t peak = load_ssize(&core.books.peak_bytes) + idle
    if mine != NULL and load_thread(&mine.thread) == thread_ident():
        if mine.next == NULL and arenalib_follow(&core.slot.threads) == mine:
            # The one thread of the arena (the common case): its live bytes are the sum.
            if mine.books.live_bytes > peak:
                arenalib_raise_peak(&core.books.peak_bytes, mine.books.live_bytes - idle)
            return
    else:
        mine = <ThreadCache*>arenalib_tls_get(core.serial)
    cdef Py_ssize_t bound = mine.books.live_bytes if mine != NULL else 0
    cdef ThreadCache* tc = arenalib_follow(&core.slot.threads)
    while tc != NULL and bound <= peak:
        if tc != mine:
            bound += load_ssize(&tc.high_water)
        tc = arenalib_follow(&tc.next)
    if bound <= peak and mine != NULL:
        return
    cdef Py_ssize_t live = 0
    tc = arenalib_follow(&core.slot.threads)
    while tc != NULL:
        live += load_ssize(&tc.books.live_bytes)
        tc = arenalib_follow(&tc.next)
    arenalib_raise_peak(&core.books.peak_bytes, live - idle)


cdef void shared_open(ArenaCore* core) noexcept nogil:
    """A shared arena opens on a slot: the threads' caches stay warm, their books start at 0.  Its
    permit (first_cache) waits for its first allocation."""
    cdef ArenaSlot* slot = core.slot
    cdef ThreadCache* tc
    core.shared.reserved_bytes = 0
    store_ssize(&core.shared.idle_bytes, 0)
    store_size(&core.shared.reused_bytes, 0)
    PyThread_acquire_lock(<PyThread_type_lock>slot.threads_lock, WAIT_LOCK)
    tc = slot.threads
    while tc != NULL:
        books_clear(&tc.books)
        tc.high_water = 0
        tc = tc.next
    PyThread_release_lock(<PyThread_type_lock>slot.threads_lock)


cdef void shared_reset(ArenaCore* core) noexcept nogil:
    """Every allocation goes at once: the slot's whole jemalloc arena is reset (its threads' books
    of live bytes with it), and so do the reservations against max_bytes."""
    slot_reset(core.slot)
    core.shared.reserved_bytes = 0
    store_ssize(&core.shared.idle_bytes, 0)  # (the kept blocks went with the rest)
    core_forget_live(core)


cdef void shared_close(ArenaCore* core, size_t* stale, size_t* churn) noexcept:
    """What a closing Arena leaves to its slot: ``stale`` bytes still allocated, ``churn`` bytes
    allocated in all."""
    cdef Books totals
    # Before the caches may go (below): no fast path may reach a ThreadCache of a closed arena.
    store_first_cache(&core.shared.first_cache, NULL)
    shared_totals(core, &totals)
    core.books.allocated_total = totals.allocated_total  # the threads' books go to the next user
    stale[0] = <size_t>totals.live_bytes
    churn[0] = totals.allocated_total
    if core.slot.thread_count > MAX_THREAD_CACHES:
        # Threads come and go: do not let a slot collect caches of threads long gone.
        stale[0] += slot_flush_threads(core.slot, FLUSH_AND_GIVE_BACK)


# -- anchors: what a thread's segments hold in the arena's place (free-threaded builds) ----------
# Every segment keeps its arena alive.  Holding the arena itself, a segment made on a thread that
# does not own the arena object takes and drops a reference with an atomic add on the arena's
# header, a line every such thread writes on every allocate and free: it held a shared Arena at
# 0.73x of bytearray's 2-thread scaling.  Such a thread's segments hold its anchor instead, an
# object the thread made, whose reference count the thread changes without atomics; the anchor
# holds the arena.  The thread's anchor holder (in its thread-state dict) keeps the thread's
# anchors, in C where no Python code can reach them; the thread's cache table (src/shared.h)
# names them.  An anchor goes when its thread ends or closes its arena, or when the thread makes a
# new one and finds its arena closed or held by nothing but the anchor; so an Arena dropped
# unclosed after another thread allocated from it is closed, with its ResourceWarning, when that
# thread ends or next anchors another arena (a thread owning the arena object holds no anchor).

cdef str _ANCHOR_HOLDER_KEY = "arenalib._anchors"

cdef enum:
    # The most anchors a thread keeps: past them (a thread allocating from that many open shared
    # Arenas it did not make), its segments hold the arena, as without anchors.
    MAX_ANCHORS = 64


@cython.final
@cython.no_gc  # an arena holds no anchor: no cycle
cdef class _Anchor:
    """One thread's stand-in for an Arena in that thread's segments."""
    cdef ArenaBase arena

    def __dealloc__(self):
        if self.arena is not _auto:  # (the AutoArena's live as long as their thread: not counted)
            shard_add(LIVE_ANCHORS, -1)


@cython.final
@cython.no_gc
cdef class _AnchorHolder:
    """The anchors of one thread (the value of its thread-state dict's _ANCHOR_HOLDER_KEY)."""
    cdef PyObject* anchors[MAX_ANCHORS]  # owned references
    cdef Py_ssize_t count
    cdef unsigned long thread
    cdef long pid

    def __dealloc__(self):
        # The thread's cache table names only anchors this holder keeps.  A thread state is
        # cleared on its own thread, or in a fork child (whose other threads, and their tables,
        # are gone; the thread that forked is there, with its table); cleared from anywhere else
        # (Python code reaching into another thread's state), the anchors stay: a leak rather
        # than a table naming freed objects.
        cdef bint mine = self.thread == thread_ident()
        if not mine and self.pid == getpid():
            return
        cdef Py_ssize_t i
        for i in range(self.count):
            if mine:
                arenalib_tls_forget_anchor(self.anchors[i])
            Py_XDECREF(self.anchors[i])
        self.count = 0

    cdef _Anchor find(self, ArenaBase arena):
        cdef Py_ssize_t i
        for i in range(self.count):
            if (<_Anchor>self.anchors[i]).arena is arena:
                return <_Anchor>self.anchors[i]
        return None

    cdef void drop(self, PyObject* anchor) noexcept:
        """Let go of ``anchor`` (one of this thread's, or nothing happens)."""
        cdef Py_ssize_t i
        for i in range(self.count):
            if self.anchors[i] == anchor:
                arenalib_tls_forget_anchor(anchor)
                self.count -= 1
                self.anchors[i] = self.anchors[self.count]
                Py_XDECREF(anchor)  # the holder is whole again first: its arena's dealloc runs code
                return

    cdef void prune(self) noexcept:
        """Let go of the anchors of closed arenas and of arenas nothing but their anchor holds
        (nothing else can reach such an arena: dropping it is its collection)."""
        cdef PyObject* gone[MAX_ANCHORS]
        cdef Py_ssize_t i, kept = 0, dropped = 0
        cdef bint held_elsewhere
        cdef _Anchor anchor
        for i in range(self.count):
            anchor = <_Anchor>self.anchors[i]
            held_elsewhere = refcount(<PyObject*>anchor.arena) > 1 or refcount(self.anchors[i]) > 1
            if not held_elsewhere or not open_now(anchor.arena):
                arenalib_tls_forget_anchor(self.anchors[i])
                gone[dropped] = self.anchors[i]
                dropped += 1
            else:
                self.anchors[kept] = self.anchors[i]
                kept += 1
        anchor = None
        self.count = kept
        # Only now, the holder whole: a dropped arena's dealloc runs Python code (its warning).
        for i in range(dropped):
            Py_XDECREF(gone[i])


cdef _AnchorHolder _thread_holder(bint make):
    """The calling thread's anchor holder (None: none, and make is False or it cannot have one)."""
    if arenalib_thread_state_ending():
        return None  # its dict is cleared or going: a holder made now would never go
    cdef PyObject* state_dict = PyThreadState_GetDict()
    if state_dict == NULL:
        return None  # no thread state to keep anchors in: its segments hold the arena
    cdef dict state = <dict>state_dict
    cdef _AnchorHolder holder = state.get(_ANCHOR_HOLDER_KEY)
    if holder is None and make:
        holder = _AnchorHolder.__new__(_AnchorHolder)
        holder.thread = thread_ident()
        holder.pid = getpid()
        state[_ANCHOR_HOLDER_KEY] = holder
    return holder


cdef int shared_drop_anchor(ArenaBase arena) except -1:
    """The calling thread closed ``arena``: its own anchor of it goes now (another thread's goes
    when that thread ends or makes its next anchor)."""
    cdef void* anchor = arenalib_tls_anchor(arena._core.serial)
    if anchor == NULL:
        return 0
    cdef _AnchorHolder holder = _thread_holder(False)
    if holder is not None:
        holder.drop(<PyObject*>anchor)
    return 0


cdef int shared_make_anchor(ArenaBase arena) except -1:
    """Give the calling thread an anchor of ``arena`` (a shared Arena it allocated from without
    one) for its next segments, or name its anchor again where its cache table forgot it."""
    cdef _AnchorHolder holder = _thread_holder(True)
    if holder is None:
        return 0
    cdef _Anchor anchor = holder.find(arena)
    if anchor is None:
        holder.prune()
        anchor = holder.find(arena)  # (the prune's deallocs may have run this function)
    if anchor is None:
        if holder.count == MAX_ANCHORS:
            return 0
        anchor = _Anchor.__new__(_Anchor)  # not tracked by the GC: no collection starts here
        anchor.arena = arena
        if arena is not _auto:
            shard_add(LIVE_ANCHORS, 1)
        Py_INCREF(anchor)
        holder.anchors[holder.count] = <PyObject*>anchor
        holder.count += 1
    if open_now(arena):  # (a close from now on leaves the entry harmless: the holder keeps it)
        arenalib_tls_set_anchor(arena._core.serial, <void*>anchor)
    return 0


@cython.final
cdef class Arena(ArenaBase):
    """Arena(*, max_bytes=None)\n--\n\nAn arena any thread may allocate from, free into and close.

    Arena(*, max_bytes=None).  Every segment's memory is freed at once by close() (or the end of a
    with-block); seg.free() gives one segment back early.  Each thread allocates through its own
    jemalloc thread cache, so threads do not contend on a lock."""

    def __cinit__(self, _positional=_NOT_GIVEN, *, max_bytes=None):
        if _positional is not _NOT_GIVEN:
            _no_positional(self, "max_bytes=")
        self._open(ARENA_KIND_SHARED, max_bytes)
