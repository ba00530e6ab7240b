"""Benchmark: a simulated prod week and a week at 3 requests/s, whole processes — not a test.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_simulate.py [--repeats 3] [--cold] [--reference] [--workers N]
                                                                   [--weeks rps3,prod] [--ref REV_OR_DIR]

Each run is a fresh interpreter (`--child`) that loads and plans the stack and simulates the week; the parent
reports medians over the runs of the whole process (wall and CPU: interpreter start, imports, planning, JIT or
its cache, the simulation, the exit) and of the simulation alone as the child times it (`simulate_week` /
`simulate_endpoint` and nothing around them: numba's first dispatch and its cache loads are inside), and
the child's CPU before the simulation in three parts: start-up (the interpreter and this script's imports),
the imports of `topology` and `simulator` (pydantic, numpy, numba), loading and planning the stack. Weeks:

- prod: `python -m topology simulate stacks/Pulumi.prod.yaml`'s week, every endpoint, seed 0 (49.3 M requests),
  its endpoints in threads as `simulate_week` runs them by default (`--workers 1`: one after the other);
- 3 req/s: the prod `assist` endpoint's hour-of-week shape scaled to a 3 req/s mean (1.8 M requests),
  planned afresh (the report names the tier the plan picks: dedicated_only on 2026-12-03, the floor's path;
  serverless only, the burst tier's path, when this benchmark was written).

`--ref` also runs another tree's simulator and planner (a git revision, extracted with `git archive`, or a
folder holding a checkout), its processes alternating with this tree's so both see the same load; the child
script, the stacks and the traces stay this tree's, only `topology` and `simulator` are imported from the other
tree. The children run with PYTHONDONTWRITEBYTECODE removed (this machine's shell sets it), so they read the
bytecode caches the untimed first run wrote, as any machine does after its first run: with it set, every
process would compile the project's modules from source (≈ 0.35 s of CPU here).

Warm runs share a numba cache directory (one per tree) filled by one untimed run; `--cold` adds runs that each start from an
empty cache (JIT compile included); `--reference` adds the pure-Python engine (SIMULATOR_PURE_PYTHON=1, one
run each: the prod week takes minutes). The numba cache goes to a temporary directory (NUMBA_CACHE_DIR), never
the repository's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEAN_RPS = 3.0


def three_rps_stack():
    from topology import load_inputs, plan

    inputs = load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml")
    ep = next(e for e in inputs.endpoints if e.name == "assist")
    prof = ep.traffic.hourly_mean_requests_per_s
    k = MEAN_RPS / (sum(prof) / len(prof))
    traffic = ep.traffic.model_copy(update={"hourly_mean_requests_per_s": [x * k for x in prof]})
    # no rollout section: a rollout needs dedicated replicas, and at 3 req/s the plan may be serverless only
    ep = ep.model_copy(update={"traffic": traffic, "rollout": None})
    inputs = inputs.model_copy(update={"endpoints": [ep]})
    return inputs, plan(inputs)


def child(week: str, workers: int | None) -> None:
    """One run in this process: plan, then time the simulation alone; prints one JSON line."""
    c_start = time.process_time()  # the interpreter's start-up and this script's own imports
    from topology import load_inputs, plan
    from simulator.simulate import simulate_endpoint, simulate_week
    from topology.cli import skip_exit_collection

    skip_exit_collection()  # as the simulate command does (simulator/cli.py): a one-shot process
    c_imports = time.process_time()
    if week == "prod":
        inputs = load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml")
        spec = plan(inputs)
        w0, c0 = time.perf_counter(), time.process_time()
        res = simulate_week(inputs, spec, seed=0, workers=workers)
        w1, c1 = time.perf_counter(), time.process_time()
        requests = res.wall_requests
        goodput = {e.endpoint: e.goodput for e in res.endpoints}
    else:
        inputs, spec = three_rps_stack()
        w0, c0 = time.perf_counter(), time.process_time()
        r = simulate_endpoint(inputs, spec, "assist", seed=0)
        w1, c1 = time.perf_counter(), time.process_time()
        requests = r.requests
        goodput = {"assist": r.goodput}
    tiers = {e.name: e.tier for e in spec.endpoints}
    print(json.dumps({"sim_wall_s": w1 - w0, "sim_cpu_s": c1 - c0, "before_sim_cpu_s": c0, "start_cpu_s": c_start,
                      "imports_cpu_s": c_imports - c_start, "plan_cpu_s": c0 - c_imports, "requests": requests,
                      "goodput": goodput, "tiers": tiers}))


def run_child(week: str, env: dict[str, str], workers: int | None) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    extra = ["--workers", str(workers)] if workers is not None else []
    # -P: `topology` and `simulator` from PYTHONPATH (this tree or --ref's), not from the script's folder
    proc = subprocess.run([sys.executable, "-P", __file__, "--child", week, *extra], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"--child {week} failed:\n{proc.stderr}")
    out = proc.stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rec = json.loads(out.strip().splitlines()[-1])
    rec.update(proc_wall_s=wall, proc_cpu_s=cpu)
    return rec


def report(label: str, runs: list[dict]) -> None:
    def med(k: str) -> float:
        return statistics.median(r[k] for r in runs)

    r0 = runs[0]
    if any(r["goodput"] != r0["goodput"] or r["requests"] != r0["requests"] for r in runs):
        raise SystemExit(f"{label}: runs disagree (the simulation should be deterministic for a seed)")
    gp = ", ".join(f"{k} ({r0['tiers'][k]}) {v:.2%}" for k, v in r0["goodput"].items())
    print(f"{label}: {r0['requests']:,} requests, {len(runs)} runs, medians: "
          f"whole process {med('proc_wall_s'):.2f} s wall / {med('proc_cpu_s'):.2f} s CPU; "
          f"simulation {med('sim_wall_s'):.2f} s wall / {med('sim_cpu_s'):.2f} s CPU "
          f"({r0['requests'] / med('sim_wall_s') / 1e6:.2f} M requests/s), CPU before it {med('before_sim_cpu_s'):.2f} s "
          f"(start-up {med('start_cpu_s'):.2f}, imports {med('imports_cpu_s'):.2f}, loading and planning "
          f"{med('plan_cpu_s'):.2f} s) "
          f"(process CPU ranges {min(r['proc_cpu_s'] for r in runs):.2f}–{max(r['proc_cpu_s'] for r in runs):.2f} s); "
          f"goodput {gp}", flush=True)


def code_tree(ref: str, tmp: Path) -> Path:
    """--ref's code: a folder as it is, else the git revision extracted into `tmp`."""
    if Path(ref).is_dir():
        return Path(ref).resolve()
    tmp.mkdir()
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    return tmp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="also runs from an empty numba cache (JIT compile included)")
    ap.add_argument("--reference", action="store_true", help="also the pure-Python engine, once per week")
    ap.add_argument("--weeks", default="rps3,prod", help="comma-separated: rps3, prod")
    ap.add_argument("--workers", type=int, default=None,
                    help="the prod week's endpoints at once (default: simulate_week's, one thread per CPU)")
    ap.add_argument("--ref", help="also run this git revision's (or this folder's) simulator and planner, alternating")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.workers)
        return 0
    base = {k: v for k, v in os.environ.items() if k not in ("SIMULATOR_PURE_PYTHON", "PYTHONDONTWRITEBYTECODE")}
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs, "
          f"workers {args.workers or 'default'}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-numba-") as tmp:
        trees = {"this tree": ROOT}
        if args.ref:
            trees[f"ref {args.ref}"] = code_tree(args.ref, Path(tmp) / "ref-code")
        envs = {}
        for k, (name, code) in enumerate(trees.items()):
            envs[name] = dict(base, PYTHONPATH=str(code), NUMBA_CACHE_DIR=str(Path(tmp) / f"numba-{k}"))
        for week in args.weeks.split(","):
            label = "prod week" if week == "prod" else f"week at {MEAN_RPS:g} req/s"
            for name in trees:
                run_child(week, envs[name], args.workers)  # fills the numba cache and the bytecode caches
            warm: dict[str, list[dict]] = {name: [] for name in trees}
            for _ in range(args.repeats):  # the trees alternate, so both see the same load
                for name in trees:
                    warm[name].append(run_child(week, envs[name], args.workers))
            for name in trees:
                report(f"{label}, {name}, compiled, warm cache", warm[name])
            if len({json.dumps([r["requests"], r["goodput"]]) for rs in warm.values() for r in rs}) > 1:
                print(f"{label}: the trees' requests or goodput differ (sim_identical.py compares every field)")
            if args.cold:
                cold: dict[str, list[dict]] = {name: [] for name in trees}
                for _ in range(args.repeats):
                    for name in trees:
                        with tempfile.TemporaryDirectory(prefix="bench-numba-cold-") as fresh:
                            cold[name].append(run_child(week, dict(envs[name], NUMBA_CACHE_DIR=fresh), args.workers))
                for name in trees:
                    report(f"{label}, {name}, compiled, cold cache (JIT compile included)", cold[name])
            if args.reference:
                for name in trees:
                    report(f"{label}, {name}, pure-Python reference",
                           [run_child(week, dict(envs[name], SIMULATOR_PURE_PYTHON="1"), args.workers)])
    print(f"load average after: {os.getloadavg()[0]:.2f} (1 min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
