"""What touching memory costs on this machine: memory reused at once against memory left idle.

``.venv/bin/python bench/fresh_memory.py [--mib 512] [--idle 5] [--repeats 5] [--write]``
allocates ``--mib`` MiB of anonymous memory and writes one byte per 4 KiB page, then frees it
and does the same again, either at once ("reused") or after ``--idle`` seconds ("idle"). It
does the same with a file's page cache: writes a new ``--mib`` MiB file in the temp directory
and deletes it, the next at once or after the idle time. Reports the medians (ms per GiB,
microseconds per page) and their ratio, with the machine.

Why: on this VM a page that stayed free for about two seconds costs ~20x more to touch again
than one freed a moment before; most likely the host has taken it back (the guest kernel
reports free pages to the host: ``/sys/module/page_reporting``) and the touch waits for the
host to back it again. A first run of stoker builds row-major records (0.75 GiB for 2 M W1
rows) and saves them, and every page of both is such a page; the pyarrow baseline reuses one
row group's arrays. Read first-run figures in bench/RESULTS.md with this cost beside them.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import write_section  # noqa: E402

PAGE = 4096
REPORTING = Path("/sys/module/page_reporting/parameters")


def touch_anonymous(nbytes: int) -> float:
    """Seconds to write one byte in each page of ``nbytes`` of freshly allocated memory."""
    buf = np.empty(nbytes, dtype=np.uint8)
    t0 = time.perf_counter()
    buf[::PAGE] = 1
    seconds = time.perf_counter() - t0
    del buf
    return seconds


def write_file(nbytes: int, directory: str) -> float:
    """Seconds to write a new ``nbytes`` file (page cache, no fsync); the file is deleted."""
    chunk = np.ones(min(nbytes, 64 << 20), dtype=np.uint8)
    fd, path = tempfile.mkstemp(dir=directory, prefix="stoker-fresh-memory-")
    try:
        t0 = time.perf_counter()
        with os.fdopen(fd, "wb") as f:
            for _ in range(nbytes // chunk.nbytes):
                f.write(chunk)
        return time.perf_counter() - t0
    finally:
        os.unlink(path)


def measure(nbytes: int, idle: float, repeats: int, directory: str) -> dict[str, list[float]]:
    """Each case ``repeats`` times, reused and idle in turn (machine drift hits both)."""
    cases = {"anonymous": lambda: touch_anonymous(nbytes),
             "page cache": lambda: write_file(nbytes, directory)}
    out: dict[str, list[float]] = {}
    for name, run in cases.items():
        run()  # the first touch of the process: neither case's
        for _ in range(repeats):
            run()
            out.setdefault(f"{name}, reused", []).append(run())
            time.sleep(idle)
            out.setdefault(f"{name}, idle", []).append(run())
    return out


def reporting() -> str:
    """The kernel's free-page reporting settings, or why there are none."""
    if not REPORTING.is_dir():
        return "no free-page reporting module on this kernel"
    keys = ("page_reporting_order", "min_free_ms")
    got = {k: (REPORTING / k).read_text().strip() for k in keys if (REPORTING / k).exists()}
    return "free-page reporting on: " + ", ".join(f"{k}={v}" for k, v in got.items())


def table(runs: dict[str, list[float]], nbytes: int) -> str:
    gib = nbytes / 2**30
    lines = ["| memory | touched | ms per GiB | us per 4 KiB page | idle / reused |",
             "|---|---|---:|---:|---:|"]
    for kind in ("anonymous", "page cache"):
        reused = statistics.median(runs[f"{kind}, reused"])
        for when in ("reused", "idle"):
            s = statistics.median(runs[f"{kind}, {when}"])
            lines.append(f"| {kind} | {when} | {1e3 * s / gib:,.0f} | "
                         f"{1e6 * s / (nbytes / PAGE):.2f} | {s / reused:.1f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=512, help="MiB touched per run")
    p.add_argument("--idle", type=float, default=5.0, help="seconds before an idle run")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the files go")
    p.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = p.parse_args(argv)
    if args.mib < 64 or args.mib % 64:
        p.error(f"--mib must be a multiple of 64 and >= 64, got {args.mib}")
    nbytes = args.mib << 20
    runs = measure(nbytes, args.idle, args.repeats, args.dir)
    load = os.getloadavg()[0]
    text = (f"`.venv/bin/python bench/fresh_memory.py --mib {args.mib} --idle {args.idle:g} "
            f"--repeats {args.repeats}` — {platform.machine()}, {os.cpu_count()} cores, "
            f"kernel {platform.release()}, load average {load:.1f}; {reporting()}. Medians of "
            f"{args.repeats}: {args.mib} MiB written one byte per page, right after the same "
            f"amount was freed (reused) or {args.idle:g} s after (idle).\n\n"
            + table(runs, nbytes))
    print(text)
    if args.write:
        write_section("Fresh memory (the machine)", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
