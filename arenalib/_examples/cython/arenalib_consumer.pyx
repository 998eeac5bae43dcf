# cython: language_level=3, boundscheck=False, wraparound=False, freethreading_compatible=True
"""An example consumer of arenalib's C-level API: nogil allocation loops with content checks,
through the function table (``cimport arenalib``: nothing of arenalib compiled in)."""

from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from arenalib cimport (
    ARENA_EBUSY, ARENA_KIND_CONFINED, ARENA_OK, ArenaCore, ArenaMark, arena_allocate, arena_close,
    arena_core, arena_core_init, arena_free, arena_mark, arena_open, arena_raise, arena_rewind,
)

include "consumer_body.pxi"
