/* SlicingArena's C (arenalib/_slicing.pxi): membarrier(), the asymmetric fence that lets a biased
 * thread carve without any fence of its own, and the atomics of the carver records.  Private to
 * arenalib._arena. */
#ifndef ARENALIB_SRC_SLICING_H
#define ARENALIB_SRC_SLICING_H

#include <unistd.h>
#include <sys/syscall.h>
#if defined(__linux__) && defined(SYS_membarrier)
#include <linux/membarrier.h>
static int arenalib_membarrier_register(void) {
    return (int)syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0);
}
/* A full memory barrier on every running thread of this process. */
static int arenalib_membarrier(void) {
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0)
        return 0;
    return (int)syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0);
}
#else
static int arenalib_membarrier_register(void) { return -1; }
static int arenalib_membarrier(void) { return -1; }
#endif
#define arenalib_claim_record(p, me) \
    __atomic_compare_exchange_n((p), &(unsigned long){0}, (me), 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)
#define arenalib_release_record(p) __atomic_store_n((p), 0UL, __ATOMIC_RELEASE)

#endif /* ARENALIB_SRC_SLICING_H */
