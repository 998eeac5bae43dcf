"""A program with type errors arenalib's stubs must catch: tests/test_typing.py expects mypy to
report exactly the lines marked ``# error``."""

from __future__ import annotations

import arenalib


def main() -> None:
    with arenalib.Arena() as arena:
        seg = arena.allocate(64)
        seg.fill("x")  # error
        arena.allocate_from("not bytes")  # error
        arena.allocate_string(b"not str")  # error
        arenalib.copy(seg, 0, seg, 0, "8")  # error
        name: str = seg.mismatch(b"")  # error
        print(name)
    arenalib.allocate("64")  # error
    with arenalib.allocate(8) as auto:
        size: str = len(auto)  # error
        print(size)
