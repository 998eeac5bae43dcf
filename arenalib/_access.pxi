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
# scaled 1.63x on 2 threads in bench/threads.py).  Threads beyond ACCESS_RECORDS take one
# process-wide mutex instead: slower, never wrong.  Records go back at thread exit (a pthread key
# destructor) and in a fork's child.
#
# Why not a lock per arena: two threads using one Arena would then write the same cache line on
# every call (a reader-writer lock's reader count, or a PyMutex per object), the cost this
# library's per-thread caches exist to avoid.  DESIGN.md has the measurements.

cdef extern from *:
    """
    #include <pthread.h>
    #include <sched.h>
    #define ARENALIB_ACCESS_RECORDS 1024
    /* Segment._accessor once records of two threads (or a thread without one) have named it. */
    #define ARENALIB_ACCESSOR_MANY ((void *)1)

    #if ARENALIB_FREE_THREADED
    typedef struct {
        void *life;           /* the Lifetime this thread is accessing now, or NULL */
        void *seg;            /* the root segment it is accessing now, or NULL */
        int taken;            /* the record belongs to a live thread */
        char padding[64 - 2 * sizeof(void *) - sizeof(int)];
    } __attribute__((aligned(64))) arenalib_access_record;

    static arenalib_access_record arenalib_records[ARENALIB_ACCESS_RECORDS];
    static int arenalib_records_used;      /* records ever taken: [0, used) is scanned */
    static pthread_mutex_t arenalib_overflow_lock = PTHREAD_MUTEX_INITIALIZER;
    static char arenalib_overflow_token;   /* the token of a thread without a record */
    static int arenalib_overflow_users;    /* threads inside the overflow lock: writers lock it only then */
    static pthread_key_t arenalib_record_key;
    static __thread arenalib_access_record *arenalib_my_record;
    static __thread int arenalib_no_record;  /* the table was full when this thread looked */

    static void arenalib_record_release(void *record) {
        arenalib_access_record *r = (arenalib_access_record *)record;
        __atomic_store_n(&r->seg, NULL, __ATOMIC_RELAXED);
        __atomic_store_n(&r->life, NULL, __ATOMIC_RELAXED);
        __atomic_store_n(&r->taken, 0, __ATOMIC_RELEASE);
    }

    static int arenalib_records_init(void) {
        return pthread_key_create(&arenalib_record_key, arenalib_record_release);
    }

    static arenalib_access_record *arenalib_record_claim(void) {
        int i, expected, used;
        for (i = 0; i < ARENALIB_ACCESS_RECORDS; i++) {
            expected = 0;
            if (__atomic_load_n(&arenalib_records[i].taken, __ATOMIC_RELAXED) == 0
                    && __atomic_compare_exchange_n(&arenalib_records[i].taken, &expected, 1, 0,
                                                   __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
                used = __atomic_load_n(&arenalib_records_used, __ATOMIC_RELAXED);
                while (used < i + 1 && !__atomic_compare_exchange_n(
                        &arenalib_records_used, &used, i + 1, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
                    ;
                if (pthread_setspecific(arenalib_record_key, &arenalib_records[i]) != 0) {
                    arenalib_record_release(&arenalib_records[i]);
                    break;
                }
                arenalib_my_record = &arenalib_records[i];
                return arenalib_my_record;
            }
        }
        arenalib_no_record = 1;
        return NULL;
    }

    static inline int arenalib_access_blocked(int *busy, int *seg_state) {
        return __atomic_load_n(busy, __ATOMIC_ACQUIRE)
            || (seg_state && __atomic_load_n(seg_state, __ATOMIC_ACQUIRE) == ARENALIB_SEG_FREEING);
    }

    static inline void arenalib_access_exit(void *token) {
        arenalib_access_record *r = (arenalib_access_record *)token;
        if (token == (void *)&arenalib_overflow_token) {
            __atomic_sub_fetch(&arenalib_overflow_users, 1, __ATOMIC_RELEASE);
            pthread_mutex_unlock(&arenalib_overflow_lock);
        } else if (r != NULL) {
            __atomic_store_n(&r->seg, NULL, __ATOMIC_RELEASE);
            __atomic_store_n(&r->life, NULL, __ATOMIC_RELEASE);
        }
    }

    /* Note in a root segment's ``accessor`` that ``r`` (NULL: a thread without a record) accesses
       it; written only on a thread's first access, so the segment's line stays unshared. */
    static inline void arenalib_note_accessor(void **accessor, arenalib_access_record *r) {
        void *seen = __atomic_load_n(accessor, __ATOMIC_RELAXED);
        void *expected = NULL;
        if (seen == (void *)r && r != NULL)
            return;
        if (seen == ARENALIB_ACCESSOR_MANY)
            return;
        if (seen == NULL && r != NULL
                && __atomic_compare_exchange_n(accessor, &expected, (void *)r, 0, __ATOMIC_RELAXED,
                                               __ATOMIC_RELAXED))
            return;
        __atomic_store_n(accessor, ARENALIB_ACCESSOR_MANY, __ATOMIC_RELAXED);
    }

    /* Announce an access of ``life`` (and of root segment ``seg`` with state ``seg_state`` and
       accessor note ``accessor``, or NULLs), once no writer is at work on either; the token goes
       to arenalib_access_exit(). */
    static inline void *arenalib_access_enter(void *life, int *busy, void *seg, int *seg_state,
                                              void **accessor) {
        arenalib_access_record *r = arenalib_my_record;
        void *token;
        if (r == NULL && !arenalib_no_record)
            r = arenalib_record_claim();
        if (accessor != NULL)
            arenalib_note_accessor(accessor, r);  /* before the fence, as the record is */
        for (;;) {
            if (r != NULL) {
                __atomic_store_n(&r->seg, seg, __ATOMIC_RELAXED);
                __atomic_store_n(&r->life, life, __ATOMIC_RELAXED);
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
                token = r;
            } else {
                pthread_mutex_lock(&arenalib_overflow_lock);
                __atomic_add_fetch(&arenalib_overflow_users, 1, __ATOMIC_SEQ_CST);
                /* As after a record's stores: the accessor note and the count come before the
                   checks in C11's order too, not only on the hardware's. */
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
                token = &arenalib_overflow_token;
            }
            if (!arenalib_access_blocked(busy, seg_state))
                return token;
            arenalib_access_exit(token);
            while (arenalib_access_blocked(busy, seg_state))
                sched_yield();
        }
    }

    /* Threads without a record access under the overflow lock: wait for the one inside, unless
       it is this thread (``my_token``: a caller holding an access of its own while it waits;
       arenalib's frees and releases take theirs only after free_begin(), and pass NULL). */
    static void arenalib_wait_overflow(void *my_token) {
        if (my_token != (void *)&arenalib_overflow_token
                && __atomic_load_n(&arenalib_overflow_users, __ATOMIC_SEQ_CST)) {
            pthread_mutex_lock(&arenalib_overflow_lock);
            pthread_mutex_unlock(&arenalib_overflow_lock);
        }
    }

    /* Wait until no other thread's record names ``life`` (or, when life is NULL, ``seg``). */
    static void arenalib_wait_readers(void *life, void *seg, void *my_token) {
        int i, used = __atomic_load_n(&arenalib_records_used, __ATOMIC_ACQUIRE);
        arenalib_access_record *r;
        for (i = 0; i < used; i++) {
            r = &arenalib_records[i];
            if ((void *)r == my_token)
                continue;
            if (life != NULL)
                while (__atomic_load_n(&r->life, __ATOMIC_ACQUIRE) == life)
                    sched_yield();
            else
                while (__atomic_load_n(&r->seg, __ATOMIC_ACQUIRE) == seg)
                    sched_yield();
        }
        arenalib_wait_overflow(my_token);
    }

    /* Exclusive use of ``life`` (a reset or a close) against every reader. */
    static void arenalib_exclusive_begin(void *life, int *busy) {
        int expected;
        for (;;) {
            expected = 0;
            if (__atomic_compare_exchange_n(busy, &expected, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
                break;
            sched_yield();  /* another reset or close of the same owner is at work */
        }
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        arenalib_wait_readers(life, NULL, NULL);
    }

    static inline void arenalib_exclusive_end(int *busy) {
        __atomic_store_n(busy, 0, __ATOMIC_RELEASE);
    }

    /* Start freeing a root segment: 0 when it is freed already (by this call's rival, say). */
    static int arenalib_free_begin(int *seg_state, void *seg, void **accessor, void *my_token) {
        arenalib_access_record *r;
        int expected;
        for (;;) {
            expected = ARENALIB_SEG_ALIVE;
            if (__atomic_compare_exchange_n(seg_state, &expected, ARENALIB_SEG_FREEING, 0,
                                            __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
                break;
            if (expected == ARENALIB_SEG_FREED)
                return 0;
            sched_yield();  /* another thread is freeing it: see whether it stays freed */
        }
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        /* Every reader that missed FREEING noted itself before its fence: read after ours. */
        r = (arenalib_access_record *)__atomic_load_n(accessor, __ATOMIC_RELAXED);
        if (r == ARENALIB_ACCESSOR_MANY) {
            arenalib_wait_readers(NULL, seg, my_token);
        } else if (r != NULL && (void *)r != my_token) {
            while (__atomic_load_n(&r->seg, __ATOMIC_ACQUIRE) == seg)
                sched_yield();
        }
        return 1;
    }

    static inline void arenalib_free_end(int *seg_state, int freed) {
        __atomic_store_n(seg_state, freed ? ARENALIB_SEG_FREED : ARENALIB_SEG_ALIVE, __ATOMIC_RELEASE);
    }

    /* In a fork's child only the calling thread is left: the others' records are free. */
    static void arenalib_records_after_fork(void) {
        int i;
        for (i = 0; i < ARENALIB_ACCESS_RECORDS; i++) {
            if (&arenalib_records[i] != arenalib_my_record)
                arenalib_record_release(&arenalib_records[i]);
        }
        pthread_mutex_init(&arenalib_overflow_lock, NULL);
        arenalib_overflow_users = 0;
    }
    #else  /* the GIL orders every access before every free: nothing to do */
    static inline int arenalib_records_init(void) { return 0; }
    static inline void *arenalib_access_enter(void *l, int *b, void *s, int *st, void **a) {
        return NULL;
    }
    static inline void arenalib_access_exit(void *token) { }
    static inline void arenalib_exclusive_begin(void *life, int *busy) { }
    static inline void arenalib_exclusive_end(int *busy) { }
    static inline int arenalib_free_begin(int *st, void *seg, void **a, void *token) {
        if (*st == ARENALIB_SEG_FREED) return 0;
        *st = ARENALIB_SEG_FREEING;
        return 1;
    }
    static inline void arenalib_free_end(int *st, int freed) {
        *st = freed ? ARENALIB_SEG_FREED : ARENALIB_SEG_ALIVE;
    }
    static inline void arenalib_records_after_fork(void) { }
    #endif
    """
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


from arenalib._abi cimport FREE_THREADED, Lifetime


cdef inline bint _any_thread(Lifetime* life) noexcept nogil:
    """The owner's segments may be used by several threads at once (all but a ConfinedArena's)."""
    return FREE_THREADED and life.owner == 0


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
