# The request table of a Ring (included by _ring.pyx, before the class that holds one).
#
# Every request in flight lives in a slot of the table, under an id of the ring's own that the SQE's
# user_data carries (the caller's user_data object is kept in the slot and handed back as given).  A
# slot owns its references: the caller's user_data and the buffer exports that pin the request's
# memory.  Reaped completions wait in ``done`` until wait() returns them.  At most ``capacity``
# (cq_entries) requests are in flight or reaped-and-not-returned at once, so the completion queue
# cannot overflow with single-shot completions.  A multishot receive keeps its slot until its last
# completion; the completions before that each carry a buffer (or, incremental, a part) of its group
# and are not counted (``done`` grows for them).  The kernel posts those only into free room of the
# CQ, ending the receive when there is none, so what passes the CQ is the completions that end a
# request, at most one per slot, which it keeps (IORING_FEAT_NODROP: DESIGN.md says the price).
# Everything here is C except _request_release (a pin's release may run finalizers) and what builds
# wait()'s list.


ctypedef struct Provision:
    # A group of provided buffers (Ring.provide(), _ring_provide.pxi): a BufferPool's buffers lent to
    # the kernel through a provided-buffer ring it picks them from.
    io_uring_buf_ring* br    # the ring of buffer entries (mmapped, MADV_DONTFORK), read by the kernel
    size_t br_bytes
    int mask                 # entries - 1
    unsigned group           # the buffer group id (the SQE's buf_group)
    unsigned armed           # multishot receives on it in flight
    unsigned long forks      # ring_forks when made: a fork child has no mapping of br
    char* base               # the pool's region, its stride and the length each entry offers
    size_t stride
    unsigned buffer_len
    bint incremental         # IOU_PBUF_RING_INC: the kernel fills a buffer in parts
    PyObject* pool           # the BufferPool (owned), pinned by its _registered count
    PyObject* spare          # an unbound Segment of the pool made ahead of a completion, or NULL
    void* next               # the ring's next Provision


ctypedef struct Request:
    PyObject* user_data      # the caller's, owned while the request is in the table; NULL: free slot
    Py_buffer view           # the buffer of a one-buffer request (nviews == 1, views == NULL)
    Py_buffer* views         # readv/writev: their nviews buffers (PyMem), else NULL
    iovec* iov               # readv/writev: the iovecs the kernel reads (PyMem), else NULL
    Py_ssize_t nviews        # buffers held: 0 (nop), 1 or the vector's length
    bint fixed               # a read_fixed/write_fixed: the registration must outlive it
    bint cancelling          # close() has sent a cancel for it (the per-request fallback)
    Provision* prov          # recv_multishot: the group its buffers come from (stays until its last CQE)
    # The object the fd came from (a file, a socket), owned so that its collection cannot close the
    # fd and let it be reused under the request; NULL for an int.
    PyObject* file


ctypedef struct Completion:
    PyObject* user_data      # owned
    int result
    PyObject* segment        # a multishot receive's Segment over the bytes received (owned), or NULL
    bint received            # a recv_multishot completion: wait() gives it as a Received
    bint more                # ... and the receive stays armed (IORING_CQE_F_MORE)


ctypedef struct RequestTable:
    unsigned capacity        # requests in flight + completions without a buffer not returned, at most
    Request* requests        # capacity slots, indexed by the id in the CQE's user_data
    unsigned* free_ids       # a stack of free slots
    unsigned nfree
    unsigned fixed_in_flight
    Completion* done         # reaped, not yet returned by wait()
    unsigned ndone
    unsigned done_capacity   # grows past capacity with the completions that carry a buffer
    unsigned ndone_buffers   # completions in done carrying a Segment (bounded by the buffers lent)


cdef bint _table_alloc(RequestTable* t, unsigned capacity) noexcept:
    """Allocate and fill the table; False (nothing held) when the memory is not there."""
    t.capacity = capacity
    t.requests = <Request*>PyMem_Malloc(capacity * sizeof(Request))
    t.free_ids = <unsigned*>PyMem_Malloc(capacity * sizeof(unsigned))
    t.done = <Completion*>PyMem_Malloc(capacity * sizeof(Completion))
    t.done_capacity = capacity
    t.ndone = 0
    t.ndone_buffers = 0
    if t.requests == NULL or t.free_ids == NULL or t.done == NULL:
        _table_free(t)
        return False
    cdef unsigned i
    for i in range(capacity):
        _request_init(&t.requests[i])
        t.free_ids[i] = capacity - 1 - i  # id 0 is taken first
    t.nfree = capacity
    return True


cdef void _table_free(RequestTable* t) noexcept:
    PyMem_Free(t.requests)
    PyMem_Free(t.free_ids)
    PyMem_Free(t.done)
    t.requests = NULL
    t.free_ids = NULL
    t.done = NULL


cdef inline unsigned _table_in_flight(RequestTable* t) noexcept:
    return t.capacity - t.nfree


cdef inline void _request_init(Request* req) noexcept:
    memset(req, 0, sizeof(Request))


cdef inline void _hold_file(Request* req, object fd) noexcept:
    """Keep the object ``fd`` came from (anything but an int) until the request is let go."""
    if type(fd) is not int:
        Py_INCREF(fd)
        req.file = <PyObject*>fd


cdef void _request_release(Request* req) noexcept:
    """Let go of the request's pins and file (may run Python code: finalizers of what the buffers
    held, a file closed by its collection)."""
    cdef Py_ssize_t i
    cdef Py_buffer* views = req.views
    cdef Py_ssize_t n = req.nviews
    cdef iovec* iov = req.iov
    cdef PyObject* file = req.file
    req.views = NULL
    req.iov = NULL
    req.nviews = 0
    req.file = NULL
    PyMem_Free(iov)
    if views == NULL:
        if n == 1:
            PyBuffer_Release(&req.view)
    else:
        for i in range(n):
            PyBuffer_Release(&views[i])
        PyMem_Free(views)
    Py_XDECREF(file)


cdef unsigned _table_file(RequestTable* t, Request* req, object user_data) noexcept:
    """File the request under a free id and return it (C only: nothing can fail; the caller has
    checked that a slot is free)."""
    t.nfree -= 1
    cdef unsigned rid = t.free_ids[t.nfree]
    Py_INCREF(user_data)
    req.user_data = <PyObject*>user_data
    t.requests[rid] = req[0]  # the exports move with the struct: the table owns them now
    if req.fixed:
        t.fixed_in_flight += 1
    return rid


cdef bint _table_done_room(RequestTable* t) noexcept:
    """Room in ``done`` for one more completion (grown when full); False when memory is short."""
    if t.ndone < t.done_capacity:
        return True
    cdef unsigned grown = t.done_capacity * 2
    cdef Completion* done = <Completion*>PyMem_Realloc(t.done, grown * sizeof(Completion))
    if done == NULL:
        return False
    t.done = done
    t.done_capacity = grown
    return True


cdef void _table_complete(RequestTable* t, uint64_t rid, int res, object segment=None,
                          bint more=False, bint keep=True) noexcept:
    """A completion of request ``rid``: the table first (the slot freed, unless a multishot receive
    goes on, ``more``; the completion filed, unless ``keep`` is False: close() drops it), then the
    pins, whose release may run Python code (the caller has set the ring's _busy).  ``segment``: a
    multishot receive's.  The caller has made room in ``done`` (_table_done_room) when ``keep``."""
    if rid >= t.capacity or t.requests[rid].user_data == NULL:
        return  # not a request of this ring's (cannot happen: the ids are its own)
    cdef Request req
    cdef Request* slot = &t.requests[rid]
    cdef PyObject* user_data = slot.user_data
    cdef bint received = slot.prov != NULL
    _request_init(&req)
    if more:
        Py_INCREF(<object>user_data)  # the slot keeps its own: the receive goes on
    else:
        req = slot[0]
        _request_init(slot)
        t.free_ids[t.nfree] = <unsigned>rid
        t.nfree += 1
        if req.fixed:
            t.fixed_in_flight -= 1
        if req.prov != NULL:
            req.prov.armed -= 1
    if keep:
        t.done[t.ndone].user_data = user_data
        t.done[t.ndone].result = res
        t.done[t.ndone].segment = NULL
        t.done[t.ndone].received = received
        t.done[t.ndone].more = more
        if segment is not None:
            Py_INCREF(segment)
            t.done[t.ndone].segment = <PyObject*>segment
            t.ndone_buffers += 1
        t.ndone += 1
    else:
        Py_DECREF(<object>user_data)
    _request_release(&req)


cdef list _table_take_done(RequestTable* t):
    """The completions reaped, as wait() returns them, and forgotten by the table."""
    cdef unsigned i, n = t.ndone
    cdef Completion* c
    # Sized at once (no append's reallocation), and full from the start: making a tuple may run the
    # collector, whose finalizers can reach this list through gc.get_objects().
    cdef list result = [None] * n
    for i in range(n):  # a MemoryError here keeps them all for the next wait()
        c = &t.done[i]
        if c.received:
            result[i] = (<object>c.user_data, _make_received(c.segment, c.result, c.more))
        else:
            result[i] = (<object>c.user_data, c.result)
    _table_drop_done(t)
    return result


cdef void _table_drop_done(RequestTable* t) noexcept:
    cdef unsigned i, n = t.ndone
    cdef PyObject* segment
    t.ndone = 0
    t.ndone_buffers = 0
    for i in range(n):
        segment = t.done[i].segment
        Py_DECREF(<object>t.done[i].user_data)
        if segment != NULL:
            Py_DECREF(<object>segment)


cdef void _table_leak(RequestTable* t) noexcept:
    """Forget the requests without releasing them: their pins stay for good (close() when the kernel
    will not say that they ended: a leak, never a write into memory someone else owns)."""
    t.requests = NULL
    t.nfree = t.capacity
    t.fixed_in_flight = 0


cdef void _table_clear(RequestTable* t) noexcept:
    """Release every request left and every completion not returned, and free the table (close(),
    once the kernel is done with the requests or, in a fork child, has none of them)."""
    cdef unsigned i
    cdef Request req
    for i in range(t.capacity if t.requests != NULL else 0):
        if t.requests[i].user_data != NULL:
            req = t.requests[i]
            _request_init(&t.requests[i])
            Py_DECREF(<object>req.user_data)
            _request_release(&req)
    t.nfree = t.capacity
    t.fixed_in_flight = 0
    _table_drop_done(t)
    _table_free(t)


cdef int _table_traverse(RequestTable* t, visitproc visit, void* arg) noexcept:
    """The collector's visit of the table's objects: each request's user_data and the exporters its
    buffer exports hold, and the user_data of completions not yet returned.  No Python code, no
    reference count touched: the table is read as it is (every entry filed owns its references)."""
    cdef unsigned i
    cdef Py_ssize_t j
    cdef Request* req
    cdef PyObject* obj
    cdef int ret
    if t.requests != NULL and t.nfree != t.capacity:
        for i in range(t.capacity):
            req = &t.requests[i]
            if req.user_data == NULL:
                continue
            ret = visit(req.user_data, arg)
            if ret:
                return ret
            if req.file != NULL:
                ret = visit(req.file, arg)
                if ret:
                    return ret
            for j in range(req.nviews):
                obj = buffer_obj(&req.views[j] if req.views != NULL else &req.view)
                if obj != NULL:
                    ret = visit(obj, arg)
                    if ret:
                        return ret
    if t.done != NULL:
        for i in range(t.ndone):
            ret = visit(t.done[i].user_data, arg)
            if ret:
                return ret
            if t.done[i].segment != NULL:
                ret = visit(t.done[i].segment, arg)
                if ret:
                    return ret
    return 0
