"""Check that a change to the planner's speed leaves every plan as it was (not a test: it needs the old tree).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/plans_unchanged.py --save /tmp/plans_before.json --tree OLD_TREE
    PYTHONPATH=$PWD .venv/bin/python benchmarks/plans_unchanged.py --compare /tmp/plans_before.json

OLD_TREE: a checkout of the commit before the change (e.g. `git worktree add /tmp/old <commit>` or
`git archive <commit> | tar -x -C /tmp/old`); `topology` is imported from it, and its stack files are read.
The cases: every bundled stack (stacks/*.yaml) and the 100-endpoint fleets of benchmarks/bench_plan.py. For each,
the spec JSON (compared byte for byte) and every option's weekly cost and per-hour serverless bill unrounded
(compared to the largest relative difference, which the spec's rounding could hide).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load_bench_plan():
    spec = importlib.util.spec_from_file_location("bench_plan_fleet", ROOT / "benchmarks" / "bench_plan.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cases(tree: Path) -> dict[str, object]:
    from topology import load_inputs

    out = {}
    for path in sorted((tree / "stacks").glob("*.yaml")):
        out[path.name] = load_inputs(path)
    fleet = _load_bench_plan().fleet
    prod = out["Pulumi.prod.yaml"]
    out["fleet100"] = fleet(prod, 100)
    out["fleet100_distinct"] = fleet(prod, 100, distinct=True)
    return out


def record(inputs) -> dict:
    """The spec JSON and every option's unrounded costs."""
    from topology.catalog import GPU_KINDS
    from topology.plan import plan
    from topology.plan.options import prepare_endpoints

    spec_json = plan(inputs).to_json()
    costs = {}
    for ep, prep in zip(inputs.endpoints, prepare_endpoints(inputs, GPU_KINDS)):
        for o in prep.options:
            costs[f"{ep.name}/{o.tier}"] = {
                "feasible": o.feasible,
                "weekly_usd": o.weekly_usd if o.feasible else None,
                "breakdown": o.breakdown_weekly,
                "serverless_by_hour": None if o.serverless_usd_by_hour is None else list(map(float, o.serverless_usd_by_hour)),
                "floor": None if o.floor_by_hour is None else list(map(int, o.floor_by_hour)),
                "burst_max": o.burst_max_containers,
            }
    return {"spec": spec_json, "costs": costs}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def compare(before: dict, after: dict) -> bool:
    ok = True
    for name in before:
        b, a = before[name], after.get(name)
        if a is None:
            print(f"{name}: missing after")
            ok = False
            continue
        same_spec = a["spec"] == b["spec"]
        worst, where, decisions = 0.0, "", []
        for key, cb in b["costs"].items():
            ca = a["costs"].get(key)
            if ca is None or ca["feasible"] != cb["feasible"] or ca["floor"] != cb["floor"] or ca["burst_max"] != cb["burst_max"]:
                decisions.append(key)
                continue
            pairs = [(cb["weekly_usd"], ca["weekly_usd"])] if cb["feasible"] else []
            pairs += [(cb["breakdown"][k], ca["breakdown"].get(k, float("nan"))) for k in cb["breakdown"]]
            pairs += list(zip(cb["serverless_by_hour"] or [], ca["serverless_by_hour"] or []))
            for x, y in pairs:
                r = _rel(x, y)
                if r > worst:
                    worst, where = r, key
        print(f"{name}: spec JSON {'byte-identical' if same_spec else 'DIFFERS'}; "
              f"largest relative cost difference {worst:.2e}{f' ({where})' if where else ''}; "
              f"options with a changed floor, burst cap or feasibility: {len(decisions)} {decisions[:5]}")
        ok &= same_spec and not decisions and worst < 1e-4
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose planner and stacks are read")
    ap.add_argument("--save", type=Path, help="write the record here")
    ap.add_argument("--compare", type=Path, help="compare this tree's record with the one saved here")
    ap.add_argument("--compiled", choices=["auto", "yes", "no"], default="auto",
                    help="the serverless arithmetic by the numba kernel (yes), numpy (no) or as plan() decides "
                         "(a tree without the kernel ignores it)")
    args = ap.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))
    warnings.simplefilter("ignore")
    import topology

    print(f"planner from {Path(topology.__file__).parent}")
    from topology.plan import serverless
    if args.compiled != "auto" and hasattr(serverless, "USE_COMPILED"):
        serverless.USE_COMPILED = args.compiled == "yes"
        print(f"serverless arithmetic: {'compiled' if args.compiled == 'yes' else 'numpy'}")
    rec = {name: record(inputs) for name, inputs in cases(args.tree).items()}
    if args.save:
        args.save.write_text(json.dumps(rec))
        print(f"saved {len(rec)} cases to {args.save}")
    if args.compare:
        same = compare(json.loads(args.compare.read_text()), rec)
        print("plans unchanged" if same else "PLANS CHANGED")
        sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
