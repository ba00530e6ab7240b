"""Benchmark: `python -m topology render STACK --out DIR` as a whole process (interpreter start, imports, plan,
the program under mocks, files, validation) — not a test.

    .venv/bin/python benchmarks/bench_render.py [--repeats 7] [--stack stacks/Pulumi.prod.yaml]

Reports the median wall time and the median CPU time (user + system of the child process) over `repeats`
fresh processes, and the load average before and after: other work on the machine moves the wall figure
more than the CPU one. Target (issue #17): prod under 2.5 s wall.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_render(stack: Path, out: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one render process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "topology", "render", str(stack), "--out", str(out)], cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--stack", default=str(ROOT / "stacks" / "Pulumi.prod.yaml"))
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_render(Path(args.stack), Path(tmp) / "out") for _ in range(args.repeats)]
    load_after = os.getloadavg()[0]
    wall = statistics.median(w for w, _ in runs)
    cpu = statistics.median(c for _, c in runs)
    print(f"render {Path(args.stack).name}, whole process: wall {wall:.2f} s, CPU {cpu:.2f} s "
          f"(medians of {args.repeats}; 1-minute load {load_before:.1f} before, {load_after:.1f} after)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
