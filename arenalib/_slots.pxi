# The pool of jemalloc arenas and explicit thread caches ("slots") behind arenalib's arena objects:
# taking and giving back a slot, the spare tcaches of shared arenas' threads, and what a fork or a
# thread's end does to them.  What an idle slot keeps warm is _retention.pxi's; the allocations
# themselves (jemalloc_allocate, the free-block cache) are _blocks.pxi's.
#
# Why a pool: creating a jemalloc arena is slow and destroying one leaks metadata, and only ~4000 can
# exist at once (DESIGN.md has the figures).  So jemalloc arenas are never destroyed: a closed arena
# object hands its slot back here.
#
# Why deferred resets: a jemalloc arena reset costs far more than a small scope's whole budget.  A
# closed arena's allocations are garbage nobody can reach (its segments check the arena object, never
# jemalloc), so a slot goes back warm with that garbage counted as stale_bytes, and is reset in bulk
# once the garbage passes STALE_LIMIT.
#
# The slot pool is used with the GIL held on a GIL build; on a free-threaded build it is under
# pool_lock() (taken by slot_acquire, slot_release, trim and slot_stats, never while anything can
# run Python code).  The spare tcaches of shared arenas are taken from nogil code too, so they have
# a lock of their own.

# libc's allocator for the slots' own books, not PyMem_Raw*(): a thread without the GIL calls it
# holding a slot's threads_lock (a C library's first allocation on a thread), and tracemalloc's
# hook of the raw allocator takes the GIL, which a thread waiting for that lock may hold.
from libc.stdlib cimport calloc, free, realloc
from cpython.pythread cimport (
    PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock, PyThread_release_lock,
    PyThread_type_lock, WAIT_LOCK,
)
from libc.string cimport memcpy, memset

import os

from arenalib._abi cimport ArenaSlot, InlineState, ThreadCache, store_ssize
from arenalib._blocks cimport cache_held_bytes
from arenalib._jemalloc cimport (
    MALLOCX_ARENA, MALLOCX_TCACHE, MALLOCX_TCACHE_NONE, je_mallctl, je_mallctlbymib, je_mallctlnametomib,
)

cdef extern from "src/fork.h":
    void fork_generation_next "arenalib_generation_next"() noexcept nogil

cdef extern from "src/slots.h":
    int arenalib_ctz(unsigned long long x) noexcept nogil
    void arenalib_sleep_us(long us) noexcept nogil
    void pool_lock "arenalib_pool_lock"() noexcept nogil
    void pool_unlock "arenalib_pool_unlock"() noexcept nogil
    void pool_lock_reinit "arenalib_pool_lock_reinit"() noexcept nogil
    void* arenalib_cache_aligned(size_t size) noexcept nogil
    int arenalib_thread_exit_init(void (*on_exit)(void*) noexcept nogil) noexcept nogil
    void thread_exit_arm "arenalib_thread_exit_arm"() noexcept nogil
    bint headless "arenalib_headless"
    void headless_begin "arenalib_headless_begin"() noexcept nogil
    bint headless_last "arenalib_headless_last"() noexcept nogil

cdef extern from "pythread.h":
    # (Cython declares it with the GIL; it takes none: PyMem_RawMalloc and the lock's own init)
    PyThread_type_lock allocate_lock_nogil "PyThread_allocate_lock"() noexcept nogil

cdef extern from "<pthread.h>" nogil:
    int pthread_atfork(void (*prepare)() noexcept nogil, void (*parent)() noexcept nogil,
                       void (*child)() noexcept nogil)

cdef extern from *:
    """
    #include <sys/syscall.h>
    #include <unistd.h>
    /* Whether the calling thread is the process's initial one (whose end, returning from main,
       exits the process; any other thread's end leaves the process to the threads left). */
    static int arenalib_on_initial_thread(void) { return syscall(SYS_gettid) == getpid(); }
    """
    bint on_initial_thread "arenalib_on_initial_thread"() noexcept nogil

cdef unsigned NO_TCACHE = <unsigned>-1

# jemalloc 5.3.0 allows ~4094 arenas, but arenas.create reads out of bounds near that limit (seen
# under AddressSanitizer: a crash in ctl_arena_init): arenalib stops short of it.
cdef Py_ssize_t MAX_SLOTS = 4000
cdef size_t STALE_LIMIT = 1 << 20
cdef Py_ssize_t WARM_SLOTS = 4

cdef ArenaSlot** _free_slots = NULL
cdef Py_ssize_t _free_count = 0
cdef Py_ssize_t _free_capacity = 0
cdef Py_ssize_t _slots_created = 0
cdef Py_ssize_t _resets = 0
cdef Py_ssize_t _purges = 0

# module can take it without a call; the SlicingArena carver records and the C API's function table
# live here too (see InlineState in _abi.pxd).  Allocated by slots_init().
cdef InlineState* _inline_state = NULL

cdef unsigned* _spare_tcaches = NULL
cdef Py_ssize_t _spare_tcache_count = 0
cdef Py_ssize_t _spare_tcache_capacity = 0
cdef PyThread_type_lock _spare_tcache_lock = NULL

# Management interfaces translated to MIBs once; a copy gets the arena index patched in per call.
cdef size_t _mib_reset[3]
cdef size_t _mib_purge[3]
cdef size_t _mib_tcache_flush[2]
cdef size_t _mib_reset_len = 3
cdef size_t _mib_purge_len = 3
cdef size_t _mib_tcache_flush_len = 2
cdef size_t _mib_batch_alloc[2]
cdef size_t _mib_batch_alloc_len = 2
cdef size_t _mib_pdirty[4]
cdef size_t _mib_pdirty_len = 4


cdef int slots_init() except -1:
    """The slot pool's start-up: the shared state, the lock of the spare tcaches, the MIBs, and
    the fork handler."""
    global _inline_state, _spare_tcache_lock, _all_slots_lock, _pid, _idle_decay_wanted
    _inline_state = <InlineState*>arenalib_cache_aligned(sizeof(InlineState))
    _spare_tcache_lock = PyThread_allocate_lock()
    _all_slots_lock = PyThread_allocate_lock()
    if arenalib_records_init() != 0 or arenalib_thread_exit_init(_thread_exit) != 0:
        raise MemoryError("cannot create the thread key of arenalib's access records")
    if _inline_state == NULL or _spare_tcache_lock == NULL or _all_slots_lock == NULL:
        raise ImportError("arenalib: cannot allocate its shared state")
    _inline_state.parked_headroom = _retain_limit
    if (je_mallctlnametomib(b"arena.0.reset", _mib_reset, &_mib_reset_len)
            or je_mallctlnametomib(b"arena.0.purge", _mib_purge, &_mib_purge_len)
            or je_mallctlnametomib(b"tcache.flush", _mib_tcache_flush, &_mib_tcache_flush_len)
            or je_mallctlnametomib(b"experimental.batch_alloc", _mib_batch_alloc,
                                   &_mib_batch_alloc_len)
            or je_mallctlnametomib(b"stats.arenas.0.pdirty", _mib_pdirty, &_mib_pdirty_len)):
        raise ImportError("arenalib: the private jemalloc did not answer mallctlnametomib")
    _pid = os.getpid()
    # In C, right after fork(): before CPython's own after-fork work, which clears the states of
    # the threads the child has lost and may close arenas on the way (a lost thread's frame
    # arena), under locks those threads held.  Registered after jemalloc's own handlers (made at
    # its first call, above), so it runs after them.
    if pthread_atfork(_before_fork, NULL, _after_fork_child) != 0:
        raise ImportError("arenalib: pthread_atfork failed")
    os.register_at_fork(after_in_child=_after_fork_in_child)
    # The option itself, not max_background_threads (a cap, which chooses nothing).
    _idle_decay_wanted = not any(option.strip().startswith("background_thread:")
                                 for option in os.environ.get("ARENALIB_JE_MALLOC_CONF", "").split(","))
    return 0


cdef int _mallctl_read_unsigned(const char* name, unsigned* out) noexcept nogil:
    cdef size_t size = sizeof(unsigned)
    return je_mallctl(name, out, &size, NULL, 0)


cdef void _arena_ctl(size_t* mib_template, size_t mib_len, unsigned arena_index) noexcept nogil:
    cdef size_t mib[3]
    memcpy(mib, mib_template, mib_len * sizeof(size_t))
    mib[1] = arena_index
    je_mallctlbymib(mib, mib_len, NULL, NULL, NULL, 0)


cdef void _flush_tcache(unsigned tcache_index) noexcept nogil:
    if tcache_index == NO_TCACHE:
        return
    je_mallctlbymib(_mib_tcache_flush, _mib_tcache_flush_len, NULL, NULL,
                    &tcache_index, sizeof(unsigned))


cdef uint64_t _next_serial = 1


cdef ArenaSlot* slot_acquire(uint64_t* serial) except NULL:
    """A warm pooled slot, or a new jemalloc arena with its tcache; ``serial`` gets the arena's
    serial number (unique for the process's life)."""
    global _next_serial
    cdef int err = 0
    pool_lock()
    cdef ArenaSlot* slot = _slot_take(&err)
    serial[0] = _next_serial
    _next_serial += 1
    _start_idle_decay()
    pool_unlock()
    if slot != NULL:
        return slot
    if err == -1:
        raise MemoryError(
            f"{_slots_created} arenas are open, the most arenalib opens at once; "
            "close arenas that are no longer needed")
    if err == -2:
        raise MemoryError("cannot allocate an arena slot")
    # jemalloc's EAGAIN: its metadata (or the arena's first extent) could not be had; with few
    # arenas in use, that is the process out of memory, not too many arenas.
    raise MemoryError(
        f"jemalloc cannot create another arena (error {err}, {os.strerror(err)}): no memory for "
        f"its metadata, with {_slots_created} arena(s) in use; close arenas that are no longer "
        "needed, or free memory")


cdef ArenaSlot* _slot_take(int* err) noexcept:
    """slot_acquire() under the pool lock: NULL with ``err`` -1 at MAX_SLOTS, -2 without memory,
    else jemalloc's error."""
    global _free_count, _slots_created
    if _inline_state.parked_idle:
        _inline_state.parked_idle = False
        return _inline_state.parked
    if _free_count:
        _free_count -= 1
        return _free_slots[_free_count]
    cdef unsigned arena_index, tcache_index
    if _slots_created >= MAX_SLOTS:
        err[0] = -1
        return NULL
    err[0] = _mallctl_read_unsigned(b"arenas.create", &arena_index)
    if err[0]:
        return NULL
    if tcache_take(&tcache_index) != 0:
        tcache_index = NO_TCACHE
    cdef ArenaSlot* slot = <ArenaSlot*>calloc(1, sizeof(ArenaSlot))
    if slot != NULL:
        slot.threads_lock = PyThread_allocate_lock()
    # Remembered last: the fork handler walks every remembered slot and its lock.
    if slot == NULL or slot.threads_lock == NULL or not _remember_slot(slot):
        # The new arena stays unused: destroying it would leak metadata and free an index that a
        # stale reference could alias.
        if slot != NULL and slot.threads_lock != NULL:
            PyThread_free_lock(<PyThread_type_lock>slot.threads_lock)
        free(slot)
        err[0] = -2
        return NULL
    slot.arena_index = arena_index
    slot.tcache_index = tcache_index
    store_ssize(&_slots_created, _slots_created + 1)  # slot_purge_settle reads it unlocked
    return slot


cdef inline int tcache_flag(unsigned tcache_index) noexcept nogil:
    return MALLOCX_TCACHE_NONE if tcache_index == NO_TCACHE else MALLOCX_TCACHE(tcache_index)


cdef inline int slot_flags(ArenaSlot* slot) noexcept nogil:
    return MALLOCX_ARENA(slot.arena_index) | tcache_flag(slot.tcache_index)


cdef ArenaSlot** _all_slots = NULL   # every slot ever made, idle or in use (for fork)
cdef Py_ssize_t _all_slots_count = 0
# Guards _all_slots against its growth: a thread that ends walks it without the GIL or the pool
# lock (see shared_thread_exit), and the pool lock is no lock at all on a GIL build.
cdef PyThread_type_lock _all_slots_lock = NULL


cdef bint _remember_slot(ArenaSlot* slot) noexcept nogil:
    global _all_slots, _all_slots_count
    PyThread_acquire_lock(_all_slots_lock, WAIT_LOCK)
    cdef ArenaSlot** grown = <ArenaSlot**>realloc(
        _all_slots, <size_t>(_all_slots_count + 1) * sizeof(ArenaSlot*))
    if grown != NULL:
        _all_slots = grown
        _all_slots[_all_slots_count] = slot
        _all_slots_count += 1
    PyThread_release_lock(_all_slots_lock)
    return grown != NULL


cdef unsigned _fresh_tcache() noexcept nogil:
    cdef unsigned tcache_index
    if _mallctl_read_unsigned(b"tcache.create", &tcache_index) != 0:
        return NO_TCACHE
    return tcache_index


cdef object _pid = None  # the process slots_init() ran in (set by it)


# Whether the thread that forks ends the process when it ends (it returns from main: the process's
# initial thread), as the parent saw it: read in the child.  A child forked by any other thread has
# no such thread, nor has any process it forks in turn (its one thread's id is its pid, but that
# thread ends in pthread_exit): it is ``headless`` (src/slots.h), and the last of its armed threads
# stops the background thread as it ends (_thread_exit), or it would keep the process alive.
cdef bint _forked_on_initial_thread = True


cdef void _before_fork() noexcept nogil:
    global _forked_on_initial_thread
    _forked_on_initial_thread = on_initial_thread() and not headless


cdef void _after_fork_child() noexcept nogil:
    """jemalloc's child forgets the explicit tcaches made before the fork (flushing one would
    corrupt it): give every slot and thread cache a new one, never touch the old ones again, and
    replace locks another thread of the parent may have held.  C only (pthread_atfork's child
    handler): no Python state is usable yet."""
    global _spare_tcache_count, _spare_tcache_lock, _all_slots_lock
    cdef Py_ssize_t i
    cdef ArenaSlot* slot
    cdef ThreadCache* tc
    fork_generation_next()  # first: the per-arena locks another thread held (src/fork.h)
    _spare_tcache_count = 0
    _spare_tcache_lock = allocate_lock_nogil()
    _all_slots_lock = allocate_lock_nogil()
    pool_lock_reinit()
    arenalib_records_after_fork()
    slicing_after_fork()
    for i in range(_all_slots_count):
        slot = _all_slots[i]
        slot.tcache_index = _fresh_tcache()
        slot.threads_lock = allocate_lock_nogil()
        tc = slot.threads
        while tc != NULL:
            tc.tcache_index = _fresh_tcache()
            if tc.thread != thread_ident():
                tc.thread = 0  # its thread is not in the child: the child's threads take it over
            tc = tc.next


def _after_fork_in_child():
    """What a fork's child needs of Python once CPython's after-fork work is done: jemalloc's
    background thread again (it stopped in the child).  A no-op in a process that did not fork
    since the last call (the function is reachable from Python)."""
    global _pid, _idle_decay_started
    if os.getpid() == _pid:
        return
    _pid = os.getpid()
    if not _forked_on_initial_thread:
        headless_begin()
    if _idle_decay_started:
        _idle_decay_started = False
        _start_idle_decay()


cdef void _thread_exit(void* unused) noexcept nogil:
    """A thread that holds per-thread state of arenalib (armed by thread_exit_arm()) ends: its
    shared Arenas' caches and its SlicingArena carver record go back.  Without this, threads that
    come and go would each keep up to CACHE_MAX_BYTES of free blocks (plus jemalloc's tcache) until
    the arena closed, and their records would stay taken.  Runs after the thread's Python state is
    gone: no Python code, only C and locks."""
    shared_thread_exit()
    slicing_thread_exit()
    if headless_last() and _idle_decay_started:
        # The last armed thread of a fork's child that no thread of can exit (see _before_fork):
        # the background thread stopped (and joined), so that it does not keep the process alive.
        # A thread that never armed may still run: it starts the background thread again (and is
        # armed for it) if it opens an arena.
        _stop_idle_decay()


# What slot_flush_threads() does besides flushing each thread's jemalloc tcache.
cdef enum FlushMode:
    FLUSH_AND_DRAIN      # before a purge: the cached blocks go back to jemalloc
    FLUSH_AND_FORGET     # before a reset: their books and cached blocks go too
    FLUSH_AND_GIVE_BACK  # threads long gone: their tcaches go back to the spares, the caches go


cdef size_t slot_flush_threads(ArenaSlot* slot, FlushMode mode) noexcept nogil:
    """Flush the jemalloc tcache of every thread that used the slot through a shared arena, and
    more as ``mode`` says.  Returns the bytes the caches given back held (garbage from now on)."""
    cdef ThreadCache* tc
    cdef ThreadCache* next_tc
    cdef size_t dropped = 0
    PyThread_acquire_lock(<PyThread_type_lock>slot.threads_lock, WAIT_LOCK)
    tc = slot.threads
    while tc != NULL:
        next_tc = tc.next
        if mode == FLUSH_AND_DRAIN:
            cache_drain(&tc.cache)
        _flush_tcache(tc.tcache_index)
        if mode == FLUSH_AND_FORGET:
            tc.books.live_bytes = 0   # what it allocated in all still counts
            tc.books.live_segments = 0
            _cache_forget(&tc.cache)
        if mode == FLUSH_AND_GIVE_BACK:
            dropped += cache_held_bytes(&tc.cache)
            tcache_give_back(tc.tcache_index)
            free(tc)
        tc = next_tc
    if mode == FLUSH_AND_GIVE_BACK:
        slot.threads = NULL
        slot.thread_count = 0
    PyThread_release_lock(<PyThread_type_lock>slot.threads_lock)
    return dropped


cdef int tcache_take(unsigned* out) noexcept nogil:
    """A spare explicit tcache (for a shared arena's thread), or a new one; 0 on success."""
    global _spare_tcache_count
    PyThread_acquire_lock(_spare_tcache_lock, WAIT_LOCK)
    if _spare_tcache_count:
        _spare_tcache_count -= 1
        out[0] = _spare_tcaches[_spare_tcache_count]
        PyThread_release_lock(_spare_tcache_lock)
        return 0
    PyThread_release_lock(_spare_tcache_lock)
    out[0] = _fresh_tcache()
    return 0 if out[0] != NO_TCACHE else -1


cdef void tcache_give_back(unsigned tcache_index) noexcept nogil:
    """Keep a flushed tcache for the next shared arena's thread (tcaches are never destroyed)."""
    global _spare_tcaches, _spare_tcache_count, _spare_tcache_capacity
    cdef unsigned* grown
    if tcache_index == NO_TCACHE:
        return
    PyThread_acquire_lock(_spare_tcache_lock, WAIT_LOCK)
    if _spare_tcache_count == _spare_tcache_capacity:
        grown = <unsigned*>realloc(
            _spare_tcaches, <size_t>(_spare_tcache_capacity * 2 + 16) * sizeof(unsigned))
        if grown == NULL:
            PyThread_release_lock(_spare_tcache_lock)
            return
        _spare_tcaches = grown
        _spare_tcache_capacity = _spare_tcache_capacity * 2 + 16
    _spare_tcaches[_spare_tcache_count] = tcache_index
    _spare_tcache_count += 1
    PyThread_release_lock(_spare_tcache_lock)
