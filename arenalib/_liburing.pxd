# cython: language_level=3
"""The part of liburing 2.3 (subprojects/liburing.wrap) that arenalib's Ring and the benchmarks' C
loops use: private to this project, declared once, and not installed (as _jemalloc.pxd is not:
nothing of liburing leaves the build; bench/native reaches it in the source tree of the editable
install).  Whatever cimports it must link liburing (the wrap's liburing_dep), as arenalib._ring and
bench/native's uring kernels do."""

from libc.stdint cimport uint64_t


cdef extern from "<sys/uio.h>" nogil:
    struct iovec:
        void* iov_base
        size_t iov_len


cdef extern from "liburing.h" nogil:
    struct io_uring_sqe:
        uint64_t user_data
        unsigned char flags          # IOSQE_*
        unsigned short buf_group     # with IOSQE_BUFFER_SELECT: the provided-buffer group
    struct io_uring_cqe:
        uint64_t user_data
        int res
        unsigned flags               # IORING_CQE_F_*; with F_BUFFER, the buffer id in the upper 16 bits
    # A provided-buffer ring (IORING_REGISTER_PBUF_RING, Linux 5.19): entries the application fills
    # and publishes by its tail, from which the kernel picks a buffer per receive.
    struct io_uring_buf:
        uint64_t addr
        unsigned len
        unsigned short bid
    struct io_uring_buf_ring:
        unsigned short tail
    struct io_uring_buf_reg:
        uint64_t ring_addr
        unsigned ring_entries
        unsigned short bgid
        unsigned short pad           # the kernel's ``flags`` from 6.12 (IOU_PBUF_RING_INC)
    struct io_uring_sq:
        unsigned sqe_head            # the next SQE to submit
        unsigned sqe_tail            # the next SQE to hand out
        unsigned ring_mask
        io_uring_sqe* sqes
    struct io_uring:
        io_uring_sq sq
        int ring_fd
    struct io_uring_params:
        unsigned sq_entries
        unsigned cq_entries
        unsigned flags
        unsigned features
    struct io_uring_probe:
        unsigned char last_op
        unsigned char ops_len

    int io_uring_queue_init(unsigned entries, io_uring* ring, unsigned flags)
    int io_uring_queue_init_params(unsigned entries, io_uring* ring, io_uring_params* p)
    void io_uring_queue_exit(io_uring* ring)
    int io_uring_ring_dontfork(io_uring* ring)
    io_uring_sqe* io_uring_get_sqe(io_uring* ring)
    int io_uring_submit(io_uring* ring)
    int io_uring_submit_and_wait(io_uring* ring, unsigned wait_nr)
    int io_uring_sqring_wait(io_uring* ring)
    unsigned io_uring_peek_batch_cqe(io_uring* ring, io_uring_cqe** cqes, unsigned count)
    void io_uring_cq_advance(io_uring* ring, unsigned nr)
    void io_uring_sqe_set_data64(io_uring_sqe* sqe, uint64_t data)
    void io_uring_prep_nop(io_uring_sqe* sqe)
    void io_uring_prep_read(io_uring_sqe* sqe, int fd, void* buf, unsigned nbytes, uint64_t offset)
    void io_uring_prep_write(io_uring_sqe* sqe, int fd, const void* buf, unsigned nbytes, uint64_t offset)
    void io_uring_prep_readv(io_uring_sqe* sqe, int fd, const iovec* iovecs, unsigned nr_vecs,
                             uint64_t offset)
    void io_uring_prep_writev(io_uring_sqe* sqe, int fd, const iovec* iovecs, unsigned nr_vecs,
                              uint64_t offset)
    void io_uring_prep_read_fixed(io_uring_sqe* sqe, int fd, void* buf, unsigned nbytes, uint64_t offset,
                                  int buf_index)
    void io_uring_prep_write_fixed(io_uring_sqe* sqe, int fd, const void* buf, unsigned nbytes,
                                   uint64_t offset, int buf_index)
    void io_uring_prep_recv(io_uring_sqe* sqe, int sockfd, void* buf, size_t len, int flags)
    void io_uring_prep_recv_multishot(io_uring_sqe* sqe, int sockfd, void* buf, size_t len, int flags)
    void io_uring_prep_send(io_uring_sqe* sqe, int sockfd, const void* buf, size_t len, int flags)
    void io_uring_prep_cancel64(io_uring_sqe* sqe, uint64_t user_data, int flags)
    int io_uring_register_buffers(io_uring* ring, const iovec* iovecs, unsigned nr_iovecs)
    int io_uring_unregister_buffers(io_uring* ring)
    int io_uring_register_buf_ring(io_uring* ring, io_uring_buf_reg* reg, unsigned flags)
    int io_uring_unregister_buf_ring(io_uring* ring, int bgid)
    int io_uring_buf_ring_mask(unsigned ring_entries)
    void io_uring_buf_ring_init(io_uring_buf_ring* br)
    void io_uring_buf_ring_add(io_uring_buf_ring* br, void* addr, unsigned len, unsigned short bid,
                               int mask, int buf_offset)
    void io_uring_buf_ring_advance(io_uring_buf_ring* br, int count)
    void io_uring_sqe_set_flags(io_uring_sqe* sqe, unsigned flags)
    io_uring_probe* io_uring_get_probe_ring(io_uring* ring)
    void io_uring_free_probe(io_uring_probe* probe)
    bint io_uring_opcode_supported(const io_uring_probe* p, int op)

    unsigned IORING_SETUP_IOPOLL, IORING_SETUP_SQPOLL, IORING_SETUP_CQSIZE, IORING_SETUP_CLAMP
    unsigned IORING_SETUP_SUBMIT_ALL, IORING_SETUP_COOP_TASKRUN, IORING_SETUP_TASKRUN_FLAG
    int IORING_ASYNC_CANCEL_ALL, IORING_ASYNC_CANCEL_ANY
    unsigned IOSQE_BUFFER_SELECT
    unsigned IORING_CQE_F_BUFFER, IORING_CQE_F_MORE, IORING_CQE_BUFFER_SHIFT
