"""The child processes of tests/test_safety.py (issue 11): segments killed while arenalib is in the
middle of using them.

Each command runs in a fresh interpreter, so that a crash (the write through a dead segment landing
in an allocator's free list) fails one test instead of killing pytest, and prints JSON lines that
the parent asserts on:

    matrix KIND [START]      the re-entrancy matrix of one kind, from cell number START on: one
                             {"begin": cell} line before each cell, one {"cell": ...} line after it
    race-arena-threads S     a writer thread against a killer thread on a shared Arena (S seconds)
    race-pool-threads S      the same on a BufferPool (acquire/release)
    race-slicing-signal S    a SIGALRM handler doing reset() + allocate() on a SlicingArena
    race-finalizer S         GC finalizers (gc.set_threshold(1)) killing segments of every kind
    tracemalloc              a finalizer resetting or closing an arena inside allocate()
    capi-reopen MODULE       an arena object's core closed and re-opened through the C API
                             (MODULE: the path of tests/cython/safety_consumer.pyx, built)

A race stops at its time bound, or at the first corruption it sees (reporting the time it took).
Victims hold a pattern that nothing else writes; any change to one, or any read that returns one,
is a corruption.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import itertools
import json
import os
import signal
import sys
import threading
import time

import arenalib
from arenalib import ArenaClosedError

SIZE = 64
SEG_FILL = 0x11            # a doomed segment's bytes before anything happens
WRITE = 0x41               # what the call under test writes
VICTIM = 0xA5              # a victim's bytes (matrix); the races use a pattern per victim
PAYLOAD = bytes([WRITE]) * 8
DEFAULT_THRESHOLD = gc.get_threshold()
# For measuring only: a race goes on after a corruption (and counts them all) instead of stopping.
KEEP_GOING = os.environ.get("ARENALIB_SAFETY_KEEP_GOING") == "1"


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


# -- the triggers: Python code that runs inside a call ---------------------------------------------

def _tick() -> None:
    """A Python call: on 3.12+ the garbage collector runs at such a point (between bytecodes)."""


class Index:
    """An integer whose __index__ runs ``fire`` first."""

    def __init__(self, value: int, fire) -> None:
        self.value = value
        self.fire = fire

    def __index__(self) -> int:
        self.fire()
        return self.value


class _Junk:
    """A GC object that no free list recycles (lists, tuples and dicts may come from one, which
    does not count towards the next collection)."""


class AllocIndex:
    """An integer whose __index__ allocates a GC object: with collectable garbage pending, a
    collection (and its finalizers) runs inside the call that converts it."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        junk = _Junk()
        _tick()
        del junk
        return self.value


class ClassProperty(bytearray):
    """Bytes whose __class__ property runs ``fire``: isinstance() against an ABC (numbers.Integral)
    reads it."""

    @property
    def __class__(self):
        self.fire()
        return bytearray


class BufferValue:
    """Bytes exported through __buffer__ (Python 3.12+), which runs ``fire`` first."""

    def __init__(self, data: bytes, fire) -> None:
        self.data = data
        self.fire = fire

    def __buffer__(self, flags):
        self.fire()
        return memoryview(self.data)


class _Doomed:
    """Cyclic garbage whose finalizer runs ``fire``."""

    def __init__(self, fire) -> None:
        self.fire = fire
        self.me = self

    def __del__(self) -> None:
        fire, self.fire = self.fire, None
        if fire is not None:
            fire()


_held: list = []


def arm_finalizer(fire, full: bool = True) -> None:
    """Make the very next allocation of a GC object collect a cycle whose finalizer runs ``fire``
    (on 3.10/3.11 inside that allocation; from 3.12 at the next bytecode boundary)."""
    _held.clear()
    gc.collect(2 if full else 0)      # generation 0's count from 0: nothing freed below brings it
    gc.disable()                      # back under the threshold
    _Doomed(fire)                     # garbage at once: a cycle, found by the next collection
    for _ in range(4):
        _held.append(_Junk())         # generation 0 well past the threshold of 1
    gc.set_threshold(1)
    gc.enable()


def disarm_finalizer() -> None:
    gc.set_threshold(*DEFAULT_THRESHOLD)
    gc.collect()                      # the finalizer runs now if nothing collected it before
    _held.clear()


# -- the re-entrancy matrix ------------------------------------------------------------------------

# exit: the end of `with seg:` (a free, deferred while an export is alive).
KILLS = {
    "Arena": ("free", "exit", "reset", "close"),
    "ConfinedArena": ("free", "exit", "reset", "close"),
    "SlicingArena": ("reset", "close"),
    "BufferPool": ("free", "exit", "release", "reset", "close"),
    "AutoArena": ("free", "exit"),  # arenalib.allocate(): never reset or closed
}
KIND_NAMES = tuple(KILLS)  # the three arena classes, BufferPool and the automatic arena, by name

# (entry point, trigger): how the call is made and what runs inside it.  index_*: an __index__
# of that argument kills; class_property / buffer: the value's __class__ property or __buffer__
# kills; finalizer: a garbage cycle's __del__ kills from the first collection that runs.
ENTRIES = [
    ("fill", "index_value"), ("fill", "finalizer"),
    ("getitem", "index_key"), ("getitem", "finalizer"),
    ("setitem", "index_key"), ("setitem", "index_value"), ("setitem", "finalizer"),
    ("getslice", "index_start"), ("getslice", "index_stop"), ("getslice", "finalizer"),
    ("getslice_step", "index_start"), ("getslice_step", "index_step"),
    ("getslice_step", "finalizer"),
    ("setslice", "index_start"), ("setslice", "index_stop"), ("setslice", "class_property"),
    ("setslice", "buffer"), ("setslice", "finalizer"),
    ("setslice_step", "index_start"), ("setslice_step", "index_step"),
    ("setslice_step", "class_property"), ("setslice_step", "buffer"),
    ("setslice_step", "finalizer"),
    ("slice", "index_offset"), ("slice", "index_size"), ("slice", "finalizer"),
    # The helpers of issue 27: arenalib.copy into and out of the segment (an offset's __index__,
    # the other buffer's __buffer__), the comparisons, hex(), and allocate_from(seg) of a helper
    # arena (its align's __index__).
    ("copy_into", "index_offset"), ("copy_into", "buffer"), ("copy_into", "finalizer"),
    ("copy_from", "index_offset"), ("copy_from", "buffer"), ("copy_from", "finalizer"),
    ("mismatch", "buffer"), ("mismatch", "finalizer"),
    ("equals", "buffer"), ("equals", "finalizer"),
    ("hex", "index_bytes_per_sep"), ("hex", "finalizer"),
    ("allocate_from", "index_align"), ("allocate_from", "finalizer"),
    # resize(): its size's __index__; the bytes of the segment it returns are what it read.
    ("resize", "index_size"), ("resize", "finalizer"),
    # readonly(): a read through the view it makes; with: a read inside `with seg:`, whose exit
    # frees it (not for a SlicingArena's segments, which `with` refuses).
    ("readonly", "finalizer"), ("with", "finalizer"),
]
POOL_ENTRIES = [("pool_index", "finalizer"), ("pool_release", "finalizer")]
READS = {"getitem", "getslice", "getslice_step", "copy_from", "mismatch", "equals", "hex", "allocate_from",
         "resize", "readonly", "with"}
FIXED_SIZE = {"resize"}  # not for a BufferPool's buffers
FREED_ONE_BY_ONE = {"with"}  # not for a SlicingArena's segments
WRITES = {"fill", "setitem", "setslice", "setslice_step", "copy_into"}
_helper_arena = None


def helper_arena():
    """The arena allocate_from() cells copy the segment into (a BufferPool has no allocate_from)."""
    global _helper_arena
    if _helper_arena is None:
        _helper_arena = arenalib.Arena()
    return _helper_arena


def cells(kind: str) -> list[tuple[str, str, str, str]]:
    """Every cell of ``kind``'s matrix, in the order the child runs them."""
    entries = ENTRIES + (POOL_ENTRIES if kind == "BufferPool" else [])
    if kind == "BufferPool":
        entries = [e for e in entries if e[0] not in FIXED_SIZE]
    if kind == "SlicingArena":
        entries = [e for e in entries if e[0] not in FREED_ONE_BY_ONE]
    if sys.version_info < (3, 12):  # no __buffer__ before 3.12
        entries = [e for e in entries if e[1] != "buffer"]
    return [(kind, kill, entry, trigger) for kill in KILLS[kind] for entry, trigger in entries]


def cell_name(cell) -> str:
    return "-".join(cell)


class Env:
    """The arena (or pool) of one cell, every arena it made, and the way it kills a segment."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.made: list = []
        self.arena = self.new_arena()

    def new_arena(self):
        if self.kind == "AutoArena":
            return arenalib.auto_arena()  # the process's: not closed by close()
        if self.kind == "BufferPool":
            arena = arenalib.BufferPool(SIZE, 4)
        else:
            arena = getattr(arenalib, self.kind)()
        self.made.append(arena)
        return arena

    def get(self):
        if self.kind == "BufferPool":
            return self.arena.try_acquire()
        if self.kind == "AutoArena":
            return arenalib.allocate(SIZE, zero=False)
        return self.arena.allocate(SIZE, zero=False)

    def kill(self, seg, how: str) -> None:
        if how == "free":
            seg.free()
        elif how == "exit":
            seg.__exit__(None, None, None)
        elif how == "release":
            self.arena.release(seg)
        elif how == "reset":
            self.arena.reset()
        else:
            self.arena.close()
            if self.kind != "BufferPool":
                arenalib.trim()  # the closed arena's blocks go back to jemalloc, for the next one
            self.arena = self.new_arena()

    def victims(self, address: int, fill: int = VICTIM, limit: int = 64) -> list:
        """Segments allocated until one lies over ``address`` (at most ``limit``), all filled."""
        made = []
        for _ in range(limit):
            victim = self.get()
            if victim is None:
                break
            victim.fill(fill)
            made.append(victim)
            if overlaps((victim.address, len(victim)), (address, SIZE)):
                break
        return made

    def close(self) -> None:
        for arena in self.made:
            arena.close()


def build_call(entry: str, trigger: str, seg, pool, fire):
    """The call of a cell, as a function of no arguments; every argument is made beforehand."""
    fin = trigger == "finalizer"

    def idx(value, name):
        if trigger == name:
            return Index(value, fire)
        if fin:
            return AllocIndex(value)
        return value

    if entry == "fill":
        value = idx(WRITE, "index_value")
        return lambda: seg.fill(value)
    if entry == "getitem":
        key = idx(0, "index_key")
        return lambda: seg[key]
    if entry == "setitem":
        key = idx(0, "index_key")
        value = Index(WRITE, fire) if trigger == "index_value" else WRITE

        def setitem():
            seg[key] = value  # the statement itself: seg.__setitem__ would allocate a method
        return setitem
    if entry in ("getslice", "setslice", "getslice_step", "setslice_step"):
        step = entry.endswith("_step")
        start = Index(0, fire) if trigger == "index_start" else 0
        stop = Index(16 if step else 8, fire) if trigger == "index_stop" else (16 if step else 8)
        key = slice(start, stop, Index(2, fire) if trigger == "index_step" else 2) if step else \
            slice(start, stop)
        if entry.startswith("get"):
            return lambda: seg[key]
        if trigger == "class_property":
            value = ClassProperty(PAYLOAD)
            value.fire = fire
        elif trigger == "buffer":
            value = BufferValue(PAYLOAD, fire)
        else:
            value = PAYLOAD

        def setslice():
            seg[key] = value
        return setslice
    if entry == "slice":
        if trigger == "index_offset":
            offset, size = Index(0, fire), 8
        elif trigger == "index_size":
            offset, size = 0, Index(8, fire)
        else:
            offset, size = AllocIndex(0), 8
        return lambda: seg.slice(offset, size)
    if entry == "copy_into":
        at = Index(0, fire) if trigger == "index_offset" else AllocIndex(0) if fin else 0
        source = BufferValue(PAYLOAD, fire) if trigger == "buffer" else PAYLOAD
        return lambda: arenalib.copy(source, 0, seg, at, len(PAYLOAD))
    if entry == "copy_from":
        at = Index(0, fire) if trigger == "index_offset" else AllocIndex(0) if fin else 0
        out = bytearray(len(PAYLOAD))
        target = BufferValue(out, fire) if trigger == "buffer" else out

        def copy_from():
            arenalib.copy(seg, at, target, 0, len(out))
            return bytes(out)  # what was read
        return copy_from
    if entry in ("mismatch", "equals"):
        # Bytes of VICTIM: were the victim's bytes read, they would compare equal.
        other = bytes([VICTIM]) * SIZE
        if trigger == "buffer":
            other = BufferValue(other, fire)
        if entry == "mismatch":
            return lambda: bytes([VICTIM]) if seg.mismatch(other) == -1 else b""
        return lambda: bytes([VICTIM]) if seg == other else b""
    if entry == "hex":
        per = Index(1, fire) if trigger == "index_bytes_per_sep" else 1
        if fin:
            return lambda: bytes.fromhex(seg.hex())
        return lambda: bytes.fromhex(seg.hex(":", per).replace(":", ""))
    if entry == "allocate_from":
        align = Index(8, fire) if trigger == "index_align" else AllocIndex(8) if fin else 8
        return lambda: helper_arena().allocate_from(seg, align=align).tobytes()
    if entry == "resize":
        size = idx(2 * SIZE, "index_size")
        return lambda: seg.resize(size, zero=False).tobytes()[:SIZE]
    if entry == "readonly":
        return lambda: seg.readonly().tobytes()
    if entry == "with":
        def with_block():
            with seg:
                return seg.tobytes()
        return with_block
    if entry == "pool_index":
        return lambda: pool.index(seg)
    if entry == "pool_release":
        return lambda: pool.release(seg)
    raise ValueError(entry)


def expect_dead(what: str, seg, problems: list) -> None:
    """Every use of ``seg`` must raise ArenaClosedError."""
    if seg.alive:
        problems.append(f"{what} is alive after it was killed")
    for name, use in (("fill", lambda: seg.fill(WRITE)), ("slice assignment",
                      lambda: seg.__setitem__(slice(0, 8), PAYLOAD)),
                      ("item assignment", lambda: seg.__setitem__(0, WRITE)),
                      ("tobytes", seg.tobytes), ("item", lambda: seg[0])):
        try:
            use()
        except ArenaClosedError:
            continue
        except Exception as exc:
            problems.append(f"{what}.{name} raised {type(exc).__name__}: {exc}")
            continue
        problems.append(f"{what}.{name} worked on a dead segment")


def check_victims(victims: list, problems: list, when: str, seen: set | None = None) -> None:
    """Each victim still holds VICTIM; one found changed is reported once (``seen``: the addresses
    of those reported already)."""
    seen = set() if seen is None else seen
    for victim in victims:
        data = victim.tobytes()
        if data != bytes([VICTIM]) * len(victim) and victim.address not in seen:
            seen.add(victim.address)
            problems.append(f"victim at {victim.address:#x} overwritten {when}: {data[:16].hex()}")


def check_no_overlap(segments: list, problems: list) -> None:
    alive = sorted((s.address, len(s)) for s in segments if s is not None and s.alive)
    for a, b in itertools.pairwise(alive):
        if overlaps(a, b):
            problems.append(f"two alive segments overlap: {a[0]:#x}+{a[1]} and {b[0]:#x}+{b[1]}")


def run_cell(cell) -> dict:
    kind, kill, entry, trigger = cell
    arenalib.trim()  # the same allocator state for every cell: the victim lands where seg was
    env = Env(kind)
    seg = env.get()
    seg.fill(SEG_FILL)
    address = seg.address
    state = {"killed": False, "in_call": False, "killed_in_call": False, "refused": None,
             "kill_error": None, "victims": [], "deferred": False}

    def fire():
        if state["killed"] or state["refused"] or state["kill_error"]:
            return
        try:
            env.kill(seg, kill)
        except BufferError as exc:  # an export of seg is alive: nothing was freed
            state["refused"] = str(exc)
            return
        except ArenaClosedError as exc:
            if seg.alive:
                state["kill_error"] = f"ArenaClosedError: {exc}"
                return
            # dead already (released by the call under test): its memory is the victim's all the same
        except Exception as exc:
            state["kill_error"] = f"{type(exc).__name__}: {exc}"
            return
        state["killed"] = True
        state["killed_in_call"] = state["in_call"]
        if seg.alive:
            # `with` exit while the call holds an export (a memoryview of it): the free waits for
            # the export's release, the memory stays the segment's until then.
            state["deferred"] = True
            return
        state["victims"] = env.victims(address)

    pool = env.arena
    call = build_call(entry, trigger, seg, pool, fire)
    if trigger == "finalizer":
        arm_finalizer(fire)
    state["in_call"] = True
    result = None
    try:
        result = call()
        outcome = "returned"
    except ArenaClosedError:
        outcome = "ArenaClosedError"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    finally:
        state["in_call"] = False
        if trigger == "finalizer":
            disarm_finalizer()
    if not (state["killed"] or state["refused"] or state["kill_error"]):
        fire()  # a trigger the call never ran: kill now, and check that the segment is dead
    if state["deferred"]:
        state["victims"] = env.victims(address)  # freed once the call let go of its export

    problems = []
    if state["kill_error"]:
        problems.append(f"killing the segment raised {state['kill_error']}")
    if outcome not in ("returned", "ArenaClosedError"):
        problems.append(f"the call raised {outcome}")
    victims = state["victims"]
    seen: set = set()
    check_victims(victims, problems, "by the call", seen)
    aliased = any(overlaps((v.address, len(v)), (address, SIZE)) for v in victims)
    if outcome == "returned" and entry in READS:
        data = bytes([result]) if isinstance(result, int) else result
        if bytes([VICTIM]) in data:
            problems.append(f"the call read the victim's bytes: {data.hex()}")
    if (outcome == "returned" and state["killed_in_call"] and trigger.startswith("index")
            and not state["deferred"] and (entry in READS or entry in WRITES)):
        # The segment died while the call converted its arguments: any access after that is to
        # memory that is no longer the segment's.
        problems.append(f"the call {'read' if entry in READS else 'wrote'} memory after the "
                        "segment was killed during the call, instead of raising ArenaClosedError")
    child = result if entry == "slice" and outcome == "returned" else None
    if state["killed"]:
        expect_dead("the segment", seg, problems)
        if child is not None:
            expect_dead("the slice made from it", child, problems)
        check_victims(victims, problems, "by a later use of the dead segment", seen)
    if kind == "BufferPool" and not env.arena.closed:
        # Every buffer acquirable now, with what is alive: no two alive segments share memory.
        more = []
        while (extra := env.arena.try_acquire()) is not None:
            more.append(extra)
        check_no_overlap([seg, child, *victims, *more], problems)
    else:
        check_no_overlap([seg, child, *victims], problems)
    env.close()
    return {"cell": cell_name(cell), "outcome": outcome, "killed": state["killed"],
            "killed_in_call": state["killed_in_call"], "refused": state["refused"],
            "aliased": aliased, "problems": problems}


def matrix(kind: str, start: int = 0) -> None:
    for cell in cells(kind)[start:]:
        emit(begin=cell_name(cell))
        emit(**run_cell(cell))
    emit(done=kind)


# -- races with plain arguments --------------------------------------------------------------------

def patterns():
    """Victim patterns: never SEG_FILL, WRITE or 0."""
    return itertools.cycle([p for p in range(1, 256) if p not in (SEG_FILL, WRITE)])


class Race:
    """Counters and the stop condition shared by a race's parties."""

    def __init__(self, name: str, seconds: float) -> None:
        self.name = name
        self.seconds = seconds
        self.start = time.monotonic()
        self.stop = False
        self.kills = 0           # segments killed (freed, reset, released) with a victim after
        self.aliased = 0         # ... whose victim got the dead segment's address
        self.writes = 0          # writes (and reads) attempted through handles
        self.dead = 0            # ... that raised ArenaClosedError
        self.checked = 0         # victims verified
        self.corruptions = 0
        self.corruption = None     # the first one
        self.detected_at = None
        self.other_errors = []

    def over(self) -> bool:
        return self.stop or time.monotonic() - self.start > self.seconds

    def corrupted(self, what: str) -> None:
        self.corruptions += 1
        if self.corruption is None:
            self.corruption = what
            self.detected_at = time.monotonic() - self.start
        if not KEEP_GOING:
            self.stop = True

    def verify(self, victim, pattern: int) -> None:
        data = victim.tobytes()
        self.checked += 1
        if data != bytes([pattern]) * len(data):
            self.corrupted(f"victim at {victim.address:#x} (pattern {pattern:#04x}) overwritten: "
                           f"{data[:16].hex()}")

    def report(self, **extra) -> None:
        emit(race=self.name, corruptions=self.corruptions,
             corruption=self.corruption, time_to_detect=self.detected_at,
             elapsed=time.monotonic() - self.start, kills=self.kills, aliased=self.aliased,
             writes=self.writes, dead_writes=self.dead, victims_checked=self.checked,
             errors=self.other_errors[:5], **extra)


NO_HANDOFF = contextlib.nullcontext()  # a writer alone with the code that replaces its target


def writer_loop(race: Race, target: list, handoff=NO_HANDOFF) -> None:
    """Write plain bytes (and ints) through whatever segment ``target[0]`` is, dead or alive.

    ``handoff``: what the writer holds while it takes the handle from ``target``, where another
    thread replaces it.  A bare read of a list item another thread replaces is CPython's own
    speculative read (list_get_item_ref), which ThreadSanitizer reports against the next object
    allocated where the replaced one was, a Segment here; the race under test is the use of the
    handle, which runs outside the lock."""
    ops = 0
    try:
        while not race.over():
            with handoff:
                seg = target[0]
            ops += 1
            try:
                if ops % 8 == 0:
                    seg.fill(WRITE)
                elif ops % 8 == 4:
                    seg[3] = WRITE
                else:
                    seg[0:SIZE] = WRITE_BLOCK
            except ArenaClosedError:
                race.dead += 1
            race.writes += 1
    except BaseException as exc:
        race.other_errors.append(f"writer: {type(exc).__name__}: {exc}")
        race.stop = True


WRITE_BLOCK = bytes([WRITE]) * SIZE


def threaded_race(name: str, seconds: float, take, give) -> None:
    """A writer thread writes through the current target while this thread kills targets
    (``give``) and takes the same memory back as a victim (``take``) that it then verifies."""
    sys.setswitchinterval(1e-6)
    race = Race(name, seconds)
    first = take()
    first.fill(SEG_FILL)
    target = [first]
    handoff = threading.Lock()
    writer = threading.Thread(target=writer_loop, args=(race, target, handoff))
    writer.start()
    victims = []
    pattern = patterns()
    try:
        while not race.over():
            seg = take()
            seg.fill(SEG_FILL)
            with handoff:
                target[0] = seg
            address = seg.address
            while len(victims) > 8:  # the writer writes through the live target meanwhile
                old, p_old = victims.pop(0)
                race.verify(old, p_old)
                give(old)
            give(seg)
            victim = take()
            p = next(pattern)
            victim.fill(p)
            race.kills += 1
            race.aliased += victim.address == address
            victims.append((victim, p))
    except BaseException as exc:
        race.other_errors.append(f"killer: {type(exc).__name__}: {exc}")
    race.stop = True
    writer.join()
    for victim, p in victims:
        race.verify(victim, p)
    race.report()


def race_arena_threads(seconds: float) -> None:
    arena = arenalib.Arena()
    threaded_race("arena-threads", seconds, lambda: arena.allocate(SIZE, zero=False),
                  lambda seg: seg.free())
    # no close: a corrupted arena may crash at close; the process exits now


def race_pool_threads(seconds: float) -> None:
    pool = arenalib.BufferPool(SIZE, 32)
    threaded_race("pool-threads", seconds, pool.acquire, pool.release)


def race_slicing_signal(seconds: float) -> None:
    """The main thread writes through the current target; a SIGALRM handler alternately resets the
    arena and takes the target's memory as a victim, and verifies that victim and makes a new target
    (so a write that lands in the victim came through a dead handle)."""
    race = Race("slicing-signal", seconds)
    arena = arenalib.SlicingArena()
    first = arena.allocate(SIZE, zero=False)
    first.fill(SEG_FILL)
    target = [first]
    state = {"victim": None, "busy": False, "runs": 0}
    pattern = patterns()

    def handler(signum, frame):
        if state["busy"] or race.stop:
            return
        state["busy"] = True
        state["runs"] += 1
        try:
            if state["victim"] is not None:
                race.verify(*state["victim"])
                state["victim"] = None
                arena.reset()
                seg = arena.allocate(SIZE, zero=False)
                seg.fill(SEG_FILL)
                target[0] = seg
            else:
                address = target[0].address
                arena.reset()
                victim = arena.allocate(SIZE, zero=False)
                p = next(pattern)
                victim.fill(p)
                race.kills += 1
                race.aliased += victim.address == address
                state["victim"] = (victim, p)
        except BaseException as exc:
            race.other_errors.append(f"handler: {type(exc).__name__}: {exc}")
            race.stop = True
        finally:
            state["busy"] = False

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 1e-4, 1e-4)
    try:
        writer_loop(race, target)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    if state["victim"] is not None:
        race.verify(*state["victim"])
    race.report(handler_runs=state["runs"])


def race_finalizer(seconds: float) -> None:
    """One thread; with gc.set_threshold(1), a garbage cycle's finalizer kills the current target
    (free, reset or release by kind, in turn) and takes its memory as a victim, while plain calls
    write (and read) through the target, dead or alive.  The garbage is made with the collector
    off and the call comes right after it is turned on, so the collection runs at the first
    allocation of a GC object inside the call (on 3.12+: at the first bytecode boundary after
    it); one round in three allocates first, so the call gets a segment already dead."""
    race = Race("finalizer", seconds)
    envs = {kind: Env(kind) for kind in KIND_NAMES}
    kills = dict.fromkeys(KIND_NAMES, 0)
    refused = dict.fromkeys(KIND_NAMES, 0)
    corrupted = dict.fromkeys(KIND_NAMES, 0)
    how = {"Arena": "free", "ConfinedArena": "free", "SlicingArena": "reset",
           "BufferPool": "release", "AutoArena": "free"}
    pattern = patterns()
    whole = slice(0, SIZE)
    step_key = slice(0, SIZE, 2)
    step_block = bytes([WRITE]) * (SIZE // 2)
    clean = bytes([SEG_FILL]) * SIZE
    try:
        for n in itertools.count():
            if race.over():
                break
            kind = KIND_NAMES[n % len(KIND_NAMES)]
            env = envs[kind]
            if kind == "SlicingArena":
                env.arena.reset()  # the target is the first carve, where the victim will be
            seg = env.get()
            seg.fill(SEG_FILL)
            address = seg.address
            state = {"victim": None}

            def fire(env=env, seg=seg, kind=kind, address=address, state=state):
                try:
                    env.kill(seg, how[kind])
                except BufferError:  # the call's own export of seg is alive: nothing freed
                    refused[kind] += 1
                    return
                victim = env.get()
                p = next(pattern)
                victim.fill(p)
                race.kills += 1
                kills[kind] += 1
                race.aliased += victim.address == address
                state["victim"] = (victim, p)

            op = n // len(KIND_NAMES) % 6
            seen = race.corruptions
            arm_finalizer(fire, full=False)
            if n % 3 == 0:
                _held.append(_Junk())  # collected here, before the call
            try:
                if op == 0:
                    data = seg[whole]
                    if data != clean:
                        race.corrupted(f"a read through a dead handle returned {data[:16].hex()}")
                elif op == 1:
                    seg[step_key] = step_block
                elif op == 2:
                    seg[3] = WRITE
                elif op == 3:
                    seg.fill(WRITE)
                else:
                    seg[whole] = WRITE_BLOCK
            except ArenaClosedError:
                race.dead += 1
            race.writes += 1
            gc.set_threshold(*DEFAULT_THRESHOLD)
            if state["victim"] is None:
                gc.collect(0)  # the garbage is still in generation 0 if nothing collected it
            _held.clear()
            if state["victim"] is not None:
                victim, p = state["victim"]
                race.verify(victim, p)
                if kind in ("Arena", "ConfinedArena", "AutoArena"):
                    victim.free()
                elif kind == "BufferPool":
                    env.arena.release(victim)
            corrupted[kind] += race.corruptions > seen
    except BaseException as exc:
        race.other_errors.append(f"{type(exc).__name__}: {exc}")
    gc.set_threshold(*DEFAULT_THRESHOLD)
    gc.enable()
    race.report(kills_by_kind=kills, refused_by_kind=refused, corrupted_by_kind=corrupted)


# -- allocate() under tracemalloc, with a finalizer in it -----------------------------------------

def tracemalloc_case(rounds: int = 10) -> None:
    import tracemalloc

    tracemalloc.start()
    for kind in ("Arena", "ConfinedArena", "SlicingArena"):
        for action in ("reset", "close"):
            stats = {"fired_in_call": 0, "closed_errors": 0, "returned": 0}
            problems = []
            for _ in range(rounds):
                arenalib.trim()
                env = Env(kind)   # a fresh arena: nothing traced yet
                arena = env.arena
                got: list = []   # allocate()'s result lands here before any bytecode runs
                state = {"fired_in_call": None}

                def fire(env=env, arena=arena, action=action, state=state, got=got):
                    state["fired_in_call"] = not got
                    if action == "reset":
                        arena.reset()
                    else:
                        env.kill(None, "close")

                # allocate() called from C, its result stored by C: on 3.12+ the collection runs
                # at the next bytecode boundary, once got holds the segment; on 3.10/3.11 inside
                # allocate() itself.  Made beforehand: the call allocates no GC object before it.
                calls = map(arena.allocate, [SIZE])
                arm_finalizer(fire)
                seg = None
                try:
                    got.extend(calls)
                    seg = got[0]
                except ArenaClosedError:
                    stats["closed_errors"] += 1
                finally:
                    disarm_finalizer()
                stats["fired_in_call"] += bool(state["fired_in_call"])
                # Every segment alive now, the one allocate() returned included, is its own.
                alive = seg is not None and seg.alive
                others = env.victims(seg.address if alive else 0, limit=8)
                if seg is not None:
                    stats["returned"] += 1
                    if state["fired_in_call"] and not seg.alive:
                        problems.append("allocate() returned a dead segment")
                    if seg.alive and seg.arena.closed:
                        problems.append("allocate() returned an alive segment of a closed arena")
                    if seg.alive:
                        seg.fill(WRITE)
                    check_no_overlap([seg, *others], problems)
                check_victims(others, problems, "by the segment allocate() returned")
                env.close()
            emit(kind=kind, action=action, rounds=rounds, problems=sorted(set(problems)), **stats)
    tracemalloc.stop()


# -- C API: an arena object's core closed and re-opened ------------------------------------------

def load_module(path: str):
    name = path.rsplit("/", 1)[-1].split(".", 1)[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def capi_reopen(path: str) -> None:
    consumer = load_module(path)
    for kind in ("Arena", "ConfinedArena", "SlicingArena"):
        arenalib.trim()
        arena = getattr(arenalib, kind)()
        problems = []
        old = []
        for n in range(4):
            batch = [arena.allocate(SIZE, zero=False).fill(SEG_FILL) for _ in range(3)]
            old += batch
            if n == 2:
                arena.reset()   # generations move on both ways
                continue
            consumer.close_and_reopen(arena, consumer.KINDS[kind])
            new = [arena.allocate(SIZE, zero=False).fill(VICTIM) for _ in range(6)]
            check_no_overlap(old + new, problems)
            for seg in old:
                expect_dead("a segment from before the C-level close", seg, problems)
            check_victims(new, problems, "through a segment from before the C-level close")
            old += new
        arena.close()
        emit(kind=kind, problems=sorted(set(problems)))


def main(argv: list[str]) -> None:
    command, args = argv[0], argv[1:]
    if command == "matrix":
        matrix(args[0], int(args[1]) if len(args) > 1 else 0)
    elif command == "race-arena-threads":
        race_arena_threads(float(args[0]))
    elif command == "race-pool-threads":
        race_pool_threads(float(args[0]))
    elif command == "race-slicing-signal":
        race_slicing_signal(float(args[0]))
    elif command == "race-finalizer":
        race_finalizer(float(args[0]))
    elif command == "tracemalloc":
        tracemalloc_case()
    elif command == "capi-reopen":
        capi_reopen(args[0])
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
