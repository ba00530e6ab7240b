"""Benchmark: how long `__main__.py` takes under Pulumi's mocks, and how that grows with endpoints.

    .venv/bin/python benchmarks/bench_program.py [--repeats 5] [--template guard]

Reports medians of wall time for
  * the prod stack, cold: a fresh interpreter (imports of pulumi, pulumi_aws submodules, the planner);
  * the prod stack, warm: the program re-run in one process (what a test session pays per stack);
  * synthetic stacks of 1, 10 and 50 endpoints, each a copy of the prod stack's `--template` endpoint
    under a new name (planning included, since `pulumi up` plans too).
Target: prod under 5 s; time per endpoint roughly constant (linear growth). Not a test.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from offline.mockrun import read_stack_config, run_program  # noqa: E402

PROD = ROOT / "stacks" / "Pulumi.prod.yaml"
INPUTS_KEY = "llm-serving:inputs"


def synthetic_config(config: dict, template: str, n: int) -> dict:
    """The stack config with `n` copies of endpoint `template`, named ep-001, ep-002, ..."""
    inputs = copy.deepcopy(config[INPUTS_KEY])
    src = next((e for e in inputs["endpoints"] if e["name"] == template), None)
    if src is None:
        raise SystemExit(f"--template {template!r}: no such endpoint; have {[e['name'] for e in inputs['endpoints']]}")
    inputs["endpoints"] = [{**copy.deepcopy(src), "name": f"ep-{i:03d}"} for i in range(1, n + 1)]
    return {**config, INPUTS_KEY: inputs}


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def cold_run_s() -> float:
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "from offline.mockrun import run_stack_file\n"
        "run_stack_file(%r)\n" % (str(ROOT), str(PROD))
    )
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--template", default="assist", help="prod endpoint copied for the growth runs (assist plans a floor at every size)")
    ap.add_argument("--sizes", default="1,10,50")
    args = ap.parse_args()
    import warnings

    warnings.simplefilter("ignore")
    stack, config = read_stack_config(PROD)

    cold = [cold_run_s() for _ in range(max(1, args.repeats // 2))]
    run_program(stack, config)  # imports done once before the warm timings
    warm = timed(lambda: run_program(stack, config), args.repeats)
    n_resources = len(run_program(stack, config).resources)
    print(f"prod stack ({n_resources} resources): cold {statistics.median(cold):.2f} s (fresh interpreter), "
          f"warm {statistics.median(warm):.2f} s (median of {args.repeats})")

    print(f"\ngrowth, copies of endpoint {args.template!r} (median of {args.repeats}):")
    print(f"{'endpoints':>9} {'resources':>9} {'median s':>9} {'ms/endpoint':>12}")
    for n in (int(x) for x in args.sizes.split(",")):
        cfg = synthetic_config(config, args.template, n)
        times = timed(lambda: run_program(stack, cfg), args.repeats)
        resources = len(run_program(stack, cfg).resources)
        med = statistics.median(times)
        print(f"{n:>9} {resources:>9} {med:>9.2f} {1000 * med / n:>12.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
