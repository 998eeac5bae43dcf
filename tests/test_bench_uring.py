"""bench/uring.py at a small scale, in a child process: every candidate reads the whole file in every
mode (a failed or short read raises there), its C loops build and link liburing, PyPI's liburing is
measured or skipped with the probe's reason, and run.py reports its tables and targets."""

from __future__ import annotations

import json
from pathlib import Path

from support import assert_ok, run_python, tooling_only

pytestmark = tooling_only

BENCH = Path(__file__).resolve().parent.parent / "bench"

SMALL_RUN = f"""
    import glob, json, sys
    sys.path.insert(0, {str(BENCH)!r})
    import _report
    import run as runner
    import uring
    from _common import Config, QuietProgress

    # 8 MiB and a partial last block: O_DIRECT reads it as a short read at the end of the file.
    uring.SETTINGS["quick"] = {{"file_bytes": (8 << 20) + 12345, "rounds": {{"cache": 3, "direct": 2}},
                               "nop_ms": 5.0}}
    before = set(glob.glob(uring.FILE_DIR + "/arenalib-uring-*"))
    res = uring.run(Config.quick(), QuietProgress())
    left = sorted(set(glob.glob(uring.FILE_DIR + "/arenalib-uring-*")) - before)
    checks = uring.targets(res)
    print(json.dumps({{"res": res, "checks": checks, "left": left, "tables": uring.tables(res),
                      "targets_text": _report.targets_text(runner.targets({{"uring": res}}))}}))
"""


def test_uring_experiment_reads_every_way_and_reports():
    out = json.loads(assert_ok(run_python(SMALL_RUN)).splitlines()[-1])
    res = out["res"]
    assert out["left"] == []  # the temporary file is gone
    modes = ["cache"] + ([] if "direct" in res["skipped"] else ["direct"])
    assert list(res["cells"]) == modes
    liburing_skipped = [key for key in res["skipped"] if key.startswith("liburing_")]
    assert liburing_skipped in ([], ["liburing_qd1", "liburing_qd8", "liburing_qd32"])
    for mode in modes:
        for block in ("65536", "1048576"):
            cells = res["cells"][mode][block]
            expected = {"preadv_pool", *(f"{kind}_qd{d}" for kind in ("ring", "c") for d in (1, 8, 32))}
            if mode == "cache":
                expected.add("preadv_bytearray")
            if not liburing_skipped:
                expected |= {f"liburing_qd{d}" for d in (1, 8, 32)}
            assert set(cells) == expected
            for cell in cells.values():
                assert len(cell["per_round_ns"]) == {"cache": 3, "direct": 2}[mode]
                assert cell["gb_per_s"]["median"] > 0
    nop = res["nop"]
    # (No order between the two asserted: at this size, other tests running alongside decide it.)
    assert nop["c_ns_per_request"]["median"] > 0 and nop["python_ns_per_request"]["median"] > 0
    checks = out["checks"]
    assert len(checks) == 2 + 6 + 1  # O_DIRECT at QD32 per block size, page cache per cell, overhead
    for c in checks:
        measured = "direct" in modes or "O_DIRECT" not in c["target"]
        assert c["status"] in (("MET", "MISSED") if measured else ("n/a",)), c
    assert "arenalib Ring read_fixed, QD32" in out["tables"] and "C over liburing" in out["tables"]
    assert "uring: Python overhead per request" in out["targets_text"]
    assert " ns per request (limit 1000 ns)" in out["targets_text"]
