"""Benchmark: one simulated week at a mean of 3 requests/s (~1.8 M requests) — not a test.

    .venv/bin/python benchmarks/bench_simulate.py [--repeat 3] [--trace traces/azure2023_conv.csv]

Uses the prod stack's `assist` endpoint (70B on 2×H100, floor + burst) with its hour-of-week shape scaled
to a 3 req/s mean, planned afresh, then simulated for the whole week. Reports wall time, requests
simulated per second, and peak memory: the process's max RSS (everything, imports included) and the
Python heap peak during the run (tracemalloc, measured in a separate run because tracing slows it).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topology import load_inputs, plan  # noqa: E402
from simulator.traffic import load_trace  # noqa: E402
from simulator.simulate import simulate_endpoint  # noqa: E402

MEAN_RPS = 3.0


def three_rps_stack():
    inputs = load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml")
    ep = next(e for e in inputs.endpoints if e.name == "assist")
    prof = ep.traffic.hourly_mean_requests_per_s
    k = MEAN_RPS / (sum(prof) / len(prof))
    traffic = ep.traffic.model_copy(update={"hourly_mean_requests_per_s": [x * k for x in prof]})
    ep = ep.model_copy(update={"traffic": traffic})
    inputs = inputs.model_copy(update={"endpoints": [ep]})
    return inputs, plan(inputs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--trace", help="replay this trace instead of the synthetic week")
    args = ap.parse_args()
    inputs, spec = three_rps_stack()
    trace = load_trace(args.trace) if args.trace else None
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    times = []
    res = None
    for i in range(args.repeat):
        t0 = time.perf_counter()
        res = simulate_endpoint(inputs, spec, "assist", seed=i, trace=trace)
        times.append(time.perf_counter() - t0)
    assert res is not None
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tracemalloc.start()
    simulate_endpoint(inputs, spec, "assist", seed=0, trace=trace)
    _, heap_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    best = min(times)
    print(f"week at {MEAN_RPS:g} req/s mean ({'trace ' + Path(args.trace).name if trace else 'synthetic'}), "
          f"{spec.endpoints[0].tier}, floor {spec.endpoints[0].floor.base_replicas}–"
          f"{max(spec.endpoints[0].floor.replicas_by_hour)} replicas, burst ≤ "
          f"{spec.endpoints[0].burst.max_containers if spec.endpoints[0].burst else 0} containers")
    print(f"requests simulated: {res.requests:,}")
    print(f"wall time: best {best:.2f} s, runs {', '.join(f'{t:.2f}' for t in times)} s")
    print(f"throughput: {res.requests / best:,.0f} requests simulated per second")
    print(f"memory: max RSS {rss1:.0f} MiB (before the runs {rss0:.0f} MiB); Python heap peak during a run "
          f"{heap_peak / 2**20:.1f} MiB")
    print(f"result: goodput {res.goodput:.2%}, TTFT p99 {res.ttft_p99_s * 1000:.0f} ms, "
          f"ITL p99 {res.itl_p99_s * 1000:.0f} ms, burst share {res.burst_share:.1%}")
    # at 3 req/s the planner picks serverless only; the floor path is timed on the prod stack's assist week
    prod = load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml")
    prod_spec = plan(prod)
    t0 = time.perf_counter()
    r2 = simulate_endpoint(prod, prod_spec, "assist", seed=0, trace=trace)
    dt = time.perf_counter() - t0
    print(f"floor + burst path (prod assist, {prod_spec.endpoint('assist').tier}, 12 req/s mean): "
          f"{r2.requests:,} requests in {dt:.2f} s = {r2.requests / dt:,.0f} requests/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
