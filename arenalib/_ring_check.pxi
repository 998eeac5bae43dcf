# The checks a Ring's calls make (included by _ring.pyx, after the class): owner thread, fork, open,
# not re-entered.  Each runs after the call's conversions and buffer acquisitions, the last thing
# before the queues are touched (convert, then check, then touch).

cdef str FORK_CHILD = ("this Ring was made by the parent of this forked process: a fork child cannot "
                       "use it (close() it and make a new one)")
cdef str BUSY = "the Ring is in the middle of wait() or close(): a finalizer or signal handler may not {} it"


cdef int _check_thread(Ring ring) except -1:
    if ring._owner != thread_ident():
        raise WrongThreadError(f"this Ring belongs to thread {ring._owner}; thread {thread_ident()} "
                               "may not use it")
    return 0


cdef int _check_usable(Ring ring) except -1:
    _check_not_forked(ring)  # first: in a fork child made by another thread, the owner is not there
    _check_thread(ring)
    if not ring._open:
        raise ArenaClosedError("the Ring is closed: make a new one")
    if ring._busy:
        raise RuntimeError(BUSY.format("use"))
    return 0


cdef inline bint _forked(Ring ring) noexcept:
    """True in a fork child of the ring's maker, where its queues are not mapped."""
    return ring._forks != ring_forks


cdef inline bint _owner_left_behind(Ring ring) noexcept:
    """In a fork child made by a thread other than the ring's owner: the owner, and any call of the
    ring it was in, did not come along (the child has only the thread that forked)."""
    return _forked(ring) and ring._owner != thread_ident()


cdef inline int _check_not_forked(Ring ring) except -1:
    """Where Python code has run since the last check (a release's finalizer, a signal handler:
    either may have forked), before the queues are touched again."""
    if ring._forks != ring_forks:
        raise RuntimeError(FORK_CHILD)
    return 0
