# cython: language_level=3, boundscheck=False, wraparound=False
"""The arena loops of arenalib_bench_kernels compiled against the table-only C API (cimport arenalib):
every allocate and free is a call through arenalib's function table."""

from libc.string cimport memset

from arenalib cimport (
    ARENA_OK, ArenaCore, ArenaMark, arena_allocate, arena_core, arena_free, arena_mark, arena_raise,
    arena_rewind,
)

include "_timing.pxi"
include "_arena_loops.pxi"
