"""arenalib: scoped, fast, optionally unzeroed native memory on jemalloc's explicit arenas.

    with arenalib.ConfinedArena() as arena:
        seg = arena.allocate(4096, zero=False, align=4096)
        os.preadv(fd, [seg], 0)
    # leaving the block frees every segment of the arena at once
"""

from arenalib._arena import (
    TRACEMALLOC_DOMAIN,
    Arena,
    ArenaBase,
    AutoArena,
    ConfinedArena,
    Frame,
    Mark,
    NumpyScope,
    Segment,
    SlicingArena,
    allocate,
    auto_arena,
    copy,
    frame,
    frame_arena,
    get_retention,
    jemalloc_version,
    live_objects,
    numpy_handler,
    pool_stats,
    set_debug,
    set_numpy_handler,
    set_retention,
    slot_stats,
    trim,
)
from arenalib._errors import (
    ArenaClosedError,
    ArenaError,
    PoolExhaustedError,
    UnsupportedOperation,
    WrongThreadError,
)
from arenalib._pool import BufferPool
from arenalib._ring import (
    FEATURES,
    OPCODES,
    SETUP_CLAMP,
    SETUP_COOP_TASKRUN,
    SETUP_IOPOLL,
    SETUP_SQPOLL,
    SETUP_SUBMIT_ALL,
    SETUP_TASKRUN_FLAG,
    Received,
    Ring,
    check,
)

__version__: str  # read on first use by __getattr__ below


def __getattr__(name: str) -> str:
    # The version is written once, in meson.build; read from the installed metadata on first use
    # (not at import: finding the distribution costs milliseconds).
    if name == "__version__":
        from importlib.metadata import version

        return version("arenalib")
    raise AttributeError(f"module 'arenalib' has no attribute {name!r}")


def get_include() -> str:
    """The directory to pass to Cython with -I so that ``cimport arenalib`` finds the .pxd files."""
    import os

    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_c_include() -> str:
    """The directory to pass to the C compiler with -I for a module that cimports arenalib.fast
    (the table-only ``cimport arenalib`` needs no header)."""
    import os

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


__all__ = [
    "FEATURES",
    "OPCODES",
    "SETUP_CLAMP",
    "SETUP_COOP_TASKRUN",
    "SETUP_IOPOLL",
    "SETUP_SQPOLL",
    "SETUP_SUBMIT_ALL",
    "SETUP_TASKRUN_FLAG",
    "TRACEMALLOC_DOMAIN",
    "Arena",
    "ArenaBase",
    "ArenaClosedError",
    "ArenaError",
    "AutoArena",
    "BufferPool",
    "ConfinedArena",
    "Frame",
    "Mark",
    "NumpyScope",
    "PoolExhaustedError",
    "Received",
    "Ring",
    "Segment",
    "SlicingArena",
    "UnsupportedOperation",
    "WrongThreadError",
    "__version__",
    "allocate",
    "auto_arena",
    "check",
    "copy",
    "frame",
    "frame_arena",
    "get_c_include",
    "get_include",
    "get_retention",
    "jemalloc_version",
    "live_objects",
    "numpy_handler",
    "pool_stats",
    "set_debug",
    "set_numpy_handler",
    "set_retention",
    "slot_stats",
    "trim",
]
