"""What importing stoker costs a fresh interpreter, side by side with importing torch alone.

One command (``.venv/bin/python bench/import_bench.py [--repeats 7] [--write]``) runs every
case in a fresh ``python -c`` process, interleaved within each repeat, and reports medians:

- ``import torch``: the baseline every torch program pays;
- ``import stoker.loader``: the package (lazy: the DataLoader and torch load on first use);
- ``from stoker.loader import DataLoader``: everything a training script pays, torch included;
- the DataLoader import *beyond* torch, pyarrow and numpy (imported first, untimed): what
  stoker itself adds; with whether Numba was imported and the threads alive after it.

``--write`` replaces the "Import" section of bench/RESULTS.md with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

_TIMED = """
import json, sys, threading, time
t0 = time.perf_counter()
{body}
seconds = time.perf_counter() - t0
print(json.dumps({{"s": seconds, "numba": "numba" in sys.modules,
                  "threads": threading.active_count()}}))
"""

CASES = {
    "import torch": ("", "import torch"),
    "import stoker.loader": ("", "import stoker.loader"),
    "from stoker.loader import DataLoader": ("", "from stoker.loader import DataLoader"),
    "DataLoader beyond torch + pyarrow + numpy": ("import torch, pyarrow, numpy",
                                                  "from stoker.loader import DataLoader"),
}


def run_case(setup: str, body: str) -> dict[str, float]:
    code = setup + "\n" + _TIMED.format(body=body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "0"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(repeats: int) -> dict[str, list[dict[str, float]]]:
    for setup, body in CASES.values():  # warm the OS page cache and __pycache__ once
        run_case(setup, body)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in CASES}
    for _ in range(repeats):
        for name, (setup, body) in CASES.items():
            runs[name].append(run_case(setup, body))
    return runs


def table(runs: dict[str, list[dict[str, float]]]) -> str:
    torch_s = statistics.median(r["s"] for r in runs["import torch"])
    lines = ["| import, fresh interpreter | median s | vs `import torch` | Numba imported | "
             "threads after |", "|---|---:|---:|---|---:|"]
    for name, rs in runs.items():
        s = statistics.median(r["s"] for r in rs)
        lines.append(f"| `{name}` | {s:.3f} | {s / torch_s:.2f}x | "
                     f"{'yes' if any(r['numba'] for r in rs) else 'no'} | "
                     f"{max(int(r['threads']) for r in rs)} |")
    return "\n".join(lines)


def machine() -> str:
    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (f"{platform.machine()}, {os.cpu_count()} cores, load average {load[0]:.1f}, "
            f"Python {platform.python_version()}, torch {torch.__version__}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = p.parse_args(argv)
    runs = measure(args.repeats)
    text = (f"`.venv/bin/python bench/import_bench.py --repeats {args.repeats}` — "
            f"{machine()}; medians of {args.repeats} fresh processes per case, interleaved.\n\n"
            + table(runs) + "\n")
    print(text)
    if args.write:
        results = HERE / "RESULTS.md"
        old = results.read_text(encoding="utf-8")
        section = "## Import\n\n" + text
        if "## Import\n" in old:
            new = re.sub(r"## Import\n.*?(?=\n## |\Z)", section.rstrip("\n") + "\n",
                         old, flags=re.S)
        else:
            new = old.rstrip("\n") + "\n\n" + section
        results.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
