/* What this machine can back at once (arenalib/_blocks.pxi, the BufferPool's limits).

   jemalloc maps memory with MAP_NORESERVE where the kernel overcommits (its pages.c,
   os_overcommits), so a block larger than the machine's RAM and swap together is handed out, and the
   process is killed by the OOM killer as its pages get written.  glibc's malloc maps without it, so
   the kernel refuses such a mapping and bytearray, NumPy and the rest get MemoryError.  arenalib
   refuses those blocks itself. */

#ifndef ARENALIB_SRC_MACHINE_H
#define ARENALIB_SRC_MACHINE_H

#include <stddef.h>
#include <sys/sysinfo.h>

/* RAM plus swap (0 when unknown).  Read each time (one system call): swap can be added while the
   program runs. */
static inline size_t arenalib_backable_bytes(void) {
    struct sysinfo info;
    if (sysinfo(&info) != 0)
        return 0;
    size_t unit = info.mem_unit ? info.mem_unit : 1;
    return ((size_t)info.totalram + (size_t)info.totalswap) * unit;
}

/* Whether one block of ``size`` bytes is more than the machine could ever back.  Asked only from
   1 GiB on, where the system call is nothing next to the block's page faults. */
static inline int arenalib_beyond_machine(size_t size) {
    if (size <= ((size_t)1 << 30))
        return 0;
    size_t backable = arenalib_backable_bytes();
    return backable != 0 && size > backable;
}

#endif
