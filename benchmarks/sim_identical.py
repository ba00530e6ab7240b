"""Check that a change to the simulator's speed leaves its results as they were (not a test: it needs the old tree).

    PYTHONPATH=OLD_TREE .venv/bin/python benchmarks/sim_identical.py --save /tmp/sim_before.json
    PYTHONPATH=$PWD .venv/bin/python benchmarks/sim_identical.py --compare /tmp/sim_before.json

OLD_TREE: a checkout of the commit before the change (e.g. /work/main, or `git worktree add /tmp/old <commit>`);
`simulator` and `topology` are imported from PYTHONPATH, the stacks and traces are read from this repository.
The cases (seed 0, the compiled engine unless SIMULATOR_PURE_PYTHON=1): the prod week, every endpoint
(49.3 M requests); bench_simulate.py's week at 3 req/s; every drill on every prod endpoint with the CLI's
defaults; a day of each bundled trace (Azure conv and code, Mooncake with its raw token counts, the ServeGen
rate trace) through prod; the dev stack's week. Every field of every result is compared exactly (floats by
their repr, so a last-bit difference shows).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _plain(x):
    """JSON-ready, floats as their repr (NaN and infinities included)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, float) or type(x).__name__.startswith("float"):
        return repr(float(x))
    if type(x).__name__.startswith(("int", "uint")) and not isinstance(x, bool):
        return int(x)
    return x


def _three_rps():
    spec = importlib.util.spec_from_file_location("bench_simulate_week", ROOT / "benchmarks" / "bench_simulate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.three_rps_stack()


def record(only: set[str] | None) -> dict:
    from simulator.drills import DRILLS, run_drill  # noqa: F401  (run_drill: the CLI's path)
    from simulator import drills as drill_mod
    from simulator.simulate import simulate_endpoint, simulate_week
    from simulator.traffic import load_trace
    from topology import load_inputs, plan

    out: dict = {}

    def case(name: str, fn) -> None:
        if only and name.split("/")[0] not in only:
            return
        t0, c0 = time.perf_counter(), time.process_time()
        out[name] = _plain(fn())
        print(f"{name}: {time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU", file=sys.stderr,
              flush=True)

    prod = load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml")
    prod_spec = plan(prod)
    case("prod_week", lambda: simulate_week(prod, prod_spec, seed=0))
    inputs3, spec3 = _three_rps()
    case("rps3_week", lambda: simulate_endpoint(inputs3, spec3, "assist", seed=0))
    dev = load_inputs(ROOT / "stacks" / "Pulumi.dev.yaml")
    dev_spec = plan(dev)
    case("dev_week", lambda: simulate_week(dev, dev_spec, seed=0))
    drills = {
        "morning-cold-start": lambda n: drill_mod.morning_cold_start(prod, prod_spec, n, seed=0),
        "spike": lambda n: drill_mod.spike(prod, prod_spec, n, 3.0, 10.0, seed=0),
        "long-prompt": lambda n: drill_mod.long_prompt(prod, prod_spec, n, seed=0),
        "disconnect": lambda n: drill_mod.disconnect(prod, prod_spec, n, 0.2, seed=0),
        "rollback": lambda n: drill_mod.rollback(prod, prod_spec, n, 10.0, seed=0),
    }
    for d, fn in drills.items():
        for e in prod_spec.endpoints:
            case(f"drill/{d}/{e.name}", lambda fn=fn, n=e.name: fn(n))
    traces = ROOT / "traces"
    for fname, raw in (("azure2023_conv.csv", False), ("azure2023_code.csv", False),
                       ("mooncake_synthetic.jsonl", True), ("servegen_m-small_14d_rate.csv", False)):
        tr = load_trace(traces / fname)
        case(f"trace/{fname}", lambda tr=tr, raw=raw: simulate_week(prod, prod_spec, seed=0, trace=tr, start_h=30.0,
                                                                     end_h=54.0, raw_tokens=raw))
    tr = load_trace(traces / "azure2023_conv.csv")
    case("drill/long-prompt-trace", lambda: [drill_mod.long_prompt(prod, prod_spec, e.name, seed=0, trace=tr)
                                             for e in prod_spec.endpoints])
    return out


def compare(before: dict, after: dict) -> bool:
    ok = True
    for name, b in before.items():
        a = after.get(name)
        if a is None:
            print(f"{name}: not run after")
            continue
        diffs = list(_diff(b, a, name))
        if diffs:
            ok = False
            print(f"{name}: {len(diffs)} differences")
            for d in diffs[:20]:
                print("   ", d)
        else:
            print(f"{name}: identical")
    return ok


def _diff(b, a, where: str):
    if isinstance(b, dict) and isinstance(a, dict):
        for k in sorted(set(b) | set(a)):
            if k not in a or k not in b:
                yield f"{where}.{k}: only {'before' if k in b else 'after'}"
            else:
                yield from _diff(b[k], a[k], f"{where}.{k}")
    elif isinstance(b, list) and isinstance(a, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(b, a)):
            yield from _diff(x, y, f"{where}[{i}]")
    elif a != b:
        yield f"{where}: {b!r} → {a!r}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--save", help="write the results here")
    ap.add_argument("--compare", help="compare with results saved by --save")
    ap.add_argument("--only", help="comma-separated case names (their first part: prod_week, drill, trace, …)")
    args = ap.parse_args()
    if not (args.save or args.compare):
        ap.error("--save or --compare")
    res = record(set(args.only.split(",")) if args.only else None)
    if args.save:
        Path(args.save).write_text(json.dumps(res, indent=0, sort_keys=True))
    if args.compare:
        before = json.loads(Path(args.compare).read_text())
        return 0 if compare(before, res) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
