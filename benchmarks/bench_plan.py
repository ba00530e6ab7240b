"""Plan time for one endpoint, the prod stack and fleets of 100 endpoints (medians on this machine; not a test).

    .venv/bin/python benchmarks/bench_plan.py [--repeats 7]

Each figure is the median over repeats of wall time and of the process's CPU time (the CPU figure moves
less when other work shares the machine; state the load, `uptime`, next to either). The planner's caches
are emptied before every timed run, so a run pays for what it computes itself. Two fleets of 100:
  * `fleet`: the prod stack's endpoints cycled, traffic scaled so each decision differs (the endpoints of
    one model share their placement search, as copies of an endpoint per region or tenant would);
  * `distinct`: the same with every endpoint's TTFT SLO nudged, so no two share a placement search.
Each case twice: the serverless arithmetic in numpy (what `python -m topology plan` runs: numba is not loaded)
and by the compiled kernel (`serverless.USE_COMPILED = True`; what a process that has numba loaded runs — its
import and the cached kernel's load, 0.43–0.53 s CPU once per process, are paid before the timed runs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topology import CostInputs, load_inputs, plan  # noqa: E402
from topology.plan import placement, serverless  # noqa: E402


def fleet(inputs: CostInputs, n: int, distinct: bool = False) -> CostInputs:
    """n endpoints cycling through the stack's endpoints, traffic scaled so each decision differs."""
    eps = []
    for i in range(n):
        base = inputs.endpoints[i % len(inputs.endpoints)]
        k = 0.25 + (i % 10) * 0.25
        traffic = base.traffic.model_copy(update={"hourly_mean_requests_per_s": [x * k for x in base.traffic.hourly_mean_requests_per_s]})
        update = {"name": f"{base.name[:30]}-{i}", "traffic": traffic, "max_dedicated_replicas": 200,
                  "serverless": base.serverless.model_copy(update={"max_containers_cap": 200}),
                  # a rollout needs dedicated replicas, which a scaled copy may not get: the fleet times planning
                  "rollout": None}
        if distinct:
            update["slo"] = base.slo.model_copy(update={"ttft_p99_ms": base.slo.ttft_p99_ms * (1 + 0.001 * i)})
        eps.append(base.model_copy(update=update))
    return inputs.model_copy(update={"endpoints": eps})


def clear_caches() -> None:
    serverless.clear_memos()
    clear = getattr(placement.slo_utilisation, "cache_clear", None)
    if clear is not None:
        clear()


def medians(fn, repeats: int) -> tuple[float, float]:
    """(median wall s, median CPU s) of `repeats` runs, caches emptied before each."""
    wall, cpu = [], []
    for _ in range(repeats):
        clear_caches()
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    prod = load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml")
    one = prod.model_copy(update={"endpoints": [prod.endpoints[0]]})
    hundred, hundred_distinct = fleet(prod, 100), fleet(prod, 100, distinct=True)
    plan(one)  # warm imports
    modes = [("numpy", False)]
    if hasattr(serverless, "USE_COMPILED"):
        serverless.USE_COMPILED = True
        plan(one)  # numba's import and the kernel's load (or first compile)
        modes.append(("compiled", True))
    r = args.repeats
    for label, inputs, repeats in [("1 endpoint", one, 3 * r), ("prod stack (3)", prod, 2 * r),
                                   ("100 endpoints, fleet", hundred, r), ("100 endpoints, distinct", hundred_distinct, r)]:
        for mode, flag in modes:  # interleaved: the machine's load falls on both alike
            if hasattr(serverless, "USE_COMPILED"):
                serverless.USE_COMPILED = flag
            wall, cpu = medians(lambda: plan(inputs), repeats)
            print(f"plan, {label:24s} {mode:8s} wall {wall * 1000:8.1f} ms  CPU {cpu * 1000:8.1f} ms  "
                  f"(median of {repeats})")


if __name__ == "__main__":
    main()
