"""Benchmark: how long `__main__.py` takes under Pulumi's mocks, and how that grows with endpoints.

    .venv/bin/python benchmarks/bench_program.py [--repeats 5] [--template guard]

Reports medians of wall time and of CPU time (this process's, or the child's for the cold run) for
  * the prod stack, cold: a fresh interpreter (imports of pulumi, pulumi_aws submodules, the planner);
  * the prod stack, warm: the program re-run in one process (what a test session pays per stack);
  * synthetic stacks of 1, 10 and 50 endpoints, each a copy of the prod stack's `--template` endpoint
    under a new name (planning included, since `pulumi up` plans too), and two parts of that time:
      plan     reading the inputs and planning them alone (`inputs_from_document` + `plan`, as the program does);
      floor    Pulumi's runtime and the mock monitor alone: the same resources (types, names, parents, recorded
               inputs) declared as bare CustomResource / ComponentResource objects by a program that does nothing
               else, under the same runner. What no change to our components can take away. The runner's trims
               of the runtime's work (offline/mockrun.py: no per-call reference cycle in contains_unknowns, the
               discarded monitor-less URN computed directly, each type unwrapped once) apply to it too.
Target: prod under 5 s; time per endpoint roughly constant (linear growth), under 80 ms CPU (issue #17).
Not a test. State the machine's load (`uptime`) next to the figures: the wall ones move with it.
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import datetime as dt  # noqa: E402
import json  # noqa: E402

import pulumi  # noqa: E402

from offline.mockrun import Recording, read_stack_config, run_function, run_program  # noqa: E402
from topology.loading import inputs_from_document  # noqa: E402
from topology.plan import plan  # noqa: E402

PROD = ROOT / "stacks" / "Pulumi.prod.yaml"
INPUTS_KEY = "llm-serving:inputs"
GATEWAY_KEY = "llm-serving:gateway"


def synthetic_config(config: dict, template: str, n: int) -> dict:
    """The stack config with `n` copies of endpoint `template`, named ep-001, ep-002, ..."""
    inputs = copy.deepcopy(config[INPUTS_KEY])
    src = next((e for e in inputs["endpoints"] if e["name"] == template), None)
    if src is None:
        raise SystemExit(f"--template {template!r}: no such endpoint; have {[e['name'] for e in inputs['endpoints']]}")
    # each copy serves its own model name: one stack's endpoints may not share one (their vLLM metrics would mix)
    inputs["endpoints"] = [{**copy.deepcopy(src), "name": f"ep-{i:03d}",
                            "model": {**src["model"], "name": f"{src['model']['name']}-{i:03d}"}}
                           for i in range(1, n + 1)]
    # each copy its own gateway port (llm-serving:gateway.ports names every gated endpoint of the stack)
    gateway = {**config.get(GATEWAY_KEY, {}), "ports": {f"ep-{i:03d}": 8079 + i for i in range(1, n + 1)}}
    return {**config, INPUTS_KEY: inputs, GATEWAY_KEY: gateway}


def plan_only(config: dict) -> None:
    """What the program does before declaring anything: read the inputs and plan them."""
    date = config.get("llm-serving:planningDate")
    inputs = inputs_from_document(json.loads(json.dumps(config[INPUTS_KEY])), "bench", ROOT, today=dt.date.today())
    plan(inputs, planning_date=dt.date.fromisoformat(date) if date else dt.date.today())


def bare_program(rec: Recording):
    """A program declaring the recorded resources as bare CustomResource / ComponentResource objects (same types,
    names, parents, inputs; no component code, no typed SDK classes, no planning)."""
    urns = {r.urn for r in rec.resources}

    def program() -> None:
        made: dict[str, pulumi.Resource] = {}
        pending = list(rec.resources)
        while pending:  # parents first
            later = []
            for r in pending:
                if r.parent in urns and r.parent not in made:
                    later.append(r)
                    continue
                opts = pulumi.ResourceOptions(parent=made.get(r.parent))
                made[r.urn] = (pulumi.CustomResource(r.type, r.name, dict(r.inputs), opts) if r.custom
                               else pulumi.ComponentResource(r.type, r.name, None, opts))
            pending = later

    return program


def clear_caches() -> None:
    """Empty the planner's memos (as bench_plan.py does): each run pays for the planning it does, not the
    previous run's."""
    from topology.plan import placement, serverless

    serverless.clear_memos()
    clear = getattr(placement.slo_utilisation, "cache_clear", None)
    if clear is not None:
        clear()


def timed(fn, repeats: int) -> tuple[float, float]:
    """(median wall s, median CPU s) of `repeats` calls, the planner's memos emptied before each."""
    wall, cpu = [], []
    for _ in range(repeats):
        clear_caches()
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def cold_run_s() -> tuple[float, float]:
    """(wall s, CPU s) of the prod stack in a fresh interpreter."""
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "from offline.mockrun import run_stack_file\n"
        "run_stack_file(%r)\n" % (str(ROOT), str(PROD))
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--template", default="assist", help="prod endpoint copied for the growth runs (assist plans a floor at every size)")
    ap.add_argument("--sizes", default="1,10,50")
    args = ap.parse_args()
    import warnings

    warnings.simplefilter("ignore")
    stack, config = read_stack_config(PROD)

    print(f"1-minute load average at start: {os.getloadavg()[0]:.1f}")
    cold = [cold_run_s() for _ in range(max(1, args.repeats // 2))]
    run_program(stack, config)  # imports done once before the warm timings
    warm_wall, warm_cpu = timed(lambda: run_program(stack, config), args.repeats)
    n_resources = len(run_program(stack, config).resources)
    print(f"prod stack ({n_resources} resources): cold {statistics.median(w for w, _ in cold):.2f} s wall, "
          f"{statistics.median(c for _, c in cold):.2f} s CPU (fresh interpreter, median of {len(cold)}); "
          f"warm {warm_wall:.2f} s wall, {warm_cpu:.2f} s CPU (median of {args.repeats})")

    print(f"\ngrowth, copies of endpoint {args.template!r} (median of {args.repeats}):")
    print(f"{'endpoints':>9} {'resources':>9} {'wall s':>8} {'CPU s':>8} {'CPU ms/endpoint':>16} "
          f"{'of it: plan':>12} {'floor':>6} {'rest':>5}")
    by_size: list[tuple[int, float]] = []
    for n in (int(x) for x in args.sizes.split(",")):
        cfg = synthetic_config(config, args.template, n)
        wall, cpu = timed(lambda: run_program(stack, cfg), args.repeats)
        rec = run_program(stack, cfg)
        _, plan_cpu = timed(lambda: plan_only(cfg), args.repeats)
        bare = bare_program(rec)
        _, floor_cpu = timed(lambda: run_function(bare, stack=stack), args.repeats)
        per = [1000 * x / n for x in (cpu, plan_cpu, floor_cpu, cpu - plan_cpu - floor_cpu)]
        print(f"{n:>9} {len(rec.resources):>9} {wall:>8.2f} {cpu:>8.2f} {per[0]:>16.0f} {per[1]:>12.0f} {per[2]:>6.0f} "
              f"{per[3]:>5.0f}")
        by_size.append((n, cpu))
    print("(ms per endpoint, CPU: plan = inputs and planning alone; floor = the same resources declared bare under "
          "the same runner, Pulumi's runtime and the mock monitor; rest = our components, typed SDK classes, exports)")
    # the average above carries the stack's fixed part (cluster, gateway, monitoring) divided by n; what one more
    # endpoint costs is the slope between sizes
    for (n0, c0), (n1, c1) in zip(by_size, by_size[1:]):
        print(f"one more endpoint, {n0} -> {n1}: {1000 * (c1 - c0) / (n1 - n0):.0f} ms CPU")
    print(f"1-minute load average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
