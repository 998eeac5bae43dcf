# Accessing-now records: what keeps a segment's memory from going away while another thread is
# touching it, on a free-threaded CPython (on a GIL build every function here compiles to nothing,
# and the GIL does that job: nothing between a liveness check and the memory access releases it).
#
# Who needs them: the owners any thread may use (Arena, SlicingArena, BufferPool).  A ConfinedArena
# is used by its owner thread only, so its frees, resets and closes never run beside an access.
#
# The protocol (a Dekker handshake, each side a full fence):
# - A reader (fill, a slice copy, a buffer export, an allocate, a free) writes the Lifetime and the
#   root segment it is about to use into its thread's record, fences, and then checks: if a writer
#   is at work on that Lifetime (``busy``) or a free of that segment is under way (FREEING), it
#   clears its record, waits for the writer and tries again.  Otherwise it checks liveness as
#   always and touches the memory, then clears its record.
# - A writer (reset, close) sets ``busy``, fences, then waits until no record names its Lifetime;
#   a free of one segment sets the segment FREEING, fences, and waits until no record names that
#   segment.  Either way, every access that saw the old state has finished, and every later one
#   sees the new state (and raises) before it touches anything.
# Each thread writes only its own record, on a cache line of its own: readers of one Arena on two
# threads share no written cache line (what lets them scale), and a writer's cost is a scan of the
# records in use.  A free does not even scan: a root segment remembers which record accessed it
# (``_accessor``: none, one, or ACCESSOR_MANY once a second thread has), written by a reader before
# its fence, so a free waits on that one record, and a segment only ever used by the thread that
# frees it costs the free no read of another thread's cache line (each such read was a cache miss
# per free, with the other thread writing its record on every access: a BufferPool per thread
# scaled 1.77x on 2 threads with the scan and 1.98x with the note, DESIGN.md's probe).  Threads
# beyond ACCESS_RECORDS take one process-wide mutex instead: slower, never wrong.  Records go back
# at thread exit (a pthread key destructor) and in a fork's child.
#
# Why not a lock per arena: two threads using one Arena would then write the same cache line on
# every call (a reader-writer lock's reader count, or a PyMutex per object), the cost this
# library's per-thread caches exist to avoid.  DESIGN.md has the measurements.

# The protocol's C (records, atomics, fences): src/access.h.
cdef extern from "src/access.h":
    int arenalib_records_init() noexcept nogil
    void* arenalib_access_enter(void* life, int* busy, void* seg, int* seg_state,
                                void** accessor) noexcept nogil
    void arenalib_access_exit(void* token) noexcept nogil
    void arenalib_exclusive_begin(void* life, int* busy) noexcept nogil
    void arenalib_exclusive_end(int* busy) noexcept nogil
    bint arenalib_free_begin(int* seg_state, void* seg, void** accessor, void* my_token) noexcept nogil
    void arenalib_free_end(int* seg_state, bint freed) noexcept nogil
    void arenalib_records_after_fork() noexcept nogil
    void arenalib_yield "sched_yield"() noexcept nogil


from arenalib._abi cimport FREE_THREADED, Lifetime, load_life_owner


cdef inline bint _any_thread(Lifetime* life) noexcept nogil:
    """The owner's segments may be used by several threads at once (all but a ConfinedArena's)."""
    return FREE_THREADED and load_life_owner(&life.owner) == 0


cdef void* access_enter(Lifetime* life) noexcept nogil:
    """Announce an access of ``life``'s memory; a token for access_exit().  Nothing on a GIL build
    or for a ConfinedArena."""
    if not _any_thread(life):
        return NULL
    return arenalib_access_enter(life, &life.busy, NULL, NULL, NULL)


cdef void* access_enter_root(Lifetime* life, Segment root) noexcept:
    """access_enter() for the memory of root segment ``root`` in particular (what its free waits
    for)."""
    if not _any_thread(life):
        return NULL
    return arenalib_access_enter(life, &life.busy, <void*>root, &root._freed, &root._accessor)


cdef void access_exit(void* token) noexcept nogil:
    arenalib_access_exit(token)


cdef void exclusive_begin(Lifetime* life) noexcept nogil:
    """Wait until no thread accesses ``life``'s memory, and keep new accesses waiting until
    exclusive_end() (for reset and close)."""
    if _any_thread(life):
        arenalib_exclusive_begin(life, &life.busy)


cdef void exclusive_end(Lifetime* life) noexcept nogil:
    if _any_thread(life):
        arenalib_exclusive_end(&life.busy)


cdef bint free_begin(Lifetime* life, Segment root, void* my_token) noexcept:
    """Mark ``root`` as being freed and wait for its accesses to finish; False when it is freed
    already.  free_end() says whether it stayed freed."""
    if not _any_thread(life):
        if root._freed == SEG_FREED:
            return False
        root._freed = SEG_FREEING
        return True
    return arenalib_free_begin(&root._freed, <void*>root, &root._accessor, my_token)


cdef void free_end(Segment root, bint freed) noexcept:
    arenalib_free_end(&root._freed, freed)
