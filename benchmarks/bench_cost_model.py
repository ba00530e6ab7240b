"""Benchmark: planned vs simulated cost of every option on every bundled trace at 0.3, 3, 30 and 150 req/s.

    .venv/bin/python benchmarks/bench_cost_model.py [--hours 168] [--hours-150 24] [--start 0] [--rates 0.3,3,30,150]
        [--spike-warm-hours-fraction 0] [--seeds 1]

The prod stack's `assist` endpoint (70B on 2×H100), its hour-of-week profile scaled to each mean rate (the
ServeGen trace brings its own hourly shape), the within-hour burstiness measured from the replayed arrivals
(simulator/costcheck.py). Each option is built into a spec as if it had won and simulated for the hours; the
table shows the serverless bill and the option's variable bill (reserved + on demand + serverless), planned
and simulated, and the decision check: the chosen option's simulated bill against every rejected one's.

"before" is the replaced formula (PEAKS_PER_HOUR = 8: containers above the mean held W × 8 / 3600 of each
hour, plus a cold start per peak container), applied to the same option and demand, for comparison only.
A full week at 150 req/s is ~90 M requests per option (minutes each here): `--hours` bounds it.

As tests/test_cost_model.py, the endpoint's `traffic.spike_warm_hours_fraction` is set to 0 unless given (prod
assist keeps the burst warm for a 3× spike in the busiest 10% of hours: a warm minimum that is priced but is not
the cost model under test, and moves the decision); the README's first table is measured so, its second with
`--spike-warm-hours-fraction 0.1` (the stack's own; where its gap arises: `benchmarks/cost_gaps.py hours`).

`--seeds K` replays each cell K times (seeds 0 … K − 1: each a different phase of the tiled trace, and different
Poisson draws) and reports the means, with the range of the option's error over the seeds. A cell is a bounded
window simulated from no container, and on the bursty traces its serverless bill moves by 20 points from one
replay to the next (at 150 req/s the pool launched in the first minute, while in flight outruns the first
completions, is held for the rest of the window: how many depends on the replay's first 50 seconds); the plan
is an expectation, so it is compared with the mean.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.costcheck import TOLERANCE, TRACES, check  # noqa: E402
from topology import load_inputs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hours", type=float, default=168.0, help="simulated hours from Monday 00:00 (168 = the week)")
    ap.add_argument("--hours-150", type=float, default=24.0, help="hours simulated at 150 req/s")
    ap.add_argument("--start", type=float, default=0.0, help="first simulated hour (0 = Monday 00:00)")
    ap.add_argument("--rates", default="0.3,3,30,150")
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--spike-warm-hours-fraction", type=float, default=0.0,
                    help="the endpoint's traffic.spike_warm_hours_fraction (the stack has 0.1)")
    ap.add_argument("--seeds", type=int, default=1, help="replays per cell (seeds 0 … K − 1); the table shows means")
    args = ap.parse_args()
    if args.seeds < 1:
        ap.error(f"--seeds must be at least 1, got {args.seeds}")
    stack = ROOT / "stacks" / "Pulumi.prod.yaml"
    base = load_inputs(stack)
    base = base.model_copy(update={"endpoints": [
        e.model_copy(update={"traffic": e.traffic.model_copy(update={
            "spike_warm_hours_fraction": args.spike_warm_hours_fraction})})
        for e in base.endpoints]})
    print("| trace | req/s | hours | option | chosen | serverless planned (before) | simulated | error (before) | "
          "option planned | simulated | error |")
    print("|---|---:|---:|---|:-:|---:|---:|---:|---:|---:|---:|")
    flips = []
    t0 = time.perf_counter()
    for rate in (float(x) for x in args.rates.split(",")):
        hours = args.hours_150 if rate >= 150 else args.hours
        for tr in args.traces.split(","):
            start = args.start if hours < 168 else 0.0
            runs = [check(stack, "assist", tr, rate, start, start + hours, base=base, seed=s) for s in range(args.seeds)]
            by_option: dict[str, list] = {}
            for rows in runs:
                for r in rows:
                    by_option.setdefault(r.option, []).append(r)
            fmt = (lambda x: "—" if x is None else f"{x:+.1%}")
            for option in sorted(by_option):
                rs = by_option[option]
                r0 = rs[0]  # the plan is the same for every seed but for the measured burstiness: the means below
                mean = (lambda f: float(np.mean([f(r) for r in rs])))
                p_s, s_s, b_s = mean(lambda r: r.planned_serverless_usd), mean(lambda r: r.simulated_serverless_usd), \
                    mean(lambda r: r.before_serverless_usd)
                p_v, s_v = mean(lambda r: r.planned_variable_usd), mean(lambda r: r.simulated_variable_usd)
                err = lambda sim, plan: None if plan <= 0 else (sim - plan) / plan  # noqa: E731
                spread = ""
                if len(rs) > 1:
                    errs = [r.variable_error for r in rs]
                    spread = f" ({min(errs):+.1%} … {max(errs):+.1%})"
                chosen_n = sum(r.chosen for r in rs)
                mark = "✓" if chosen_n == len(rs) else (f"{chosen_n}/{len(rs)}" if chosen_n else "")
                print(f"| {tr} | {rate:g} | {hours:g} | {r0.option} | {mark} | "
                      f"${p_s:,.0f} (${b_s:,.0f}) | ${s_s:,.0f} | "
                      f"{fmt(err(s_s, p_s))} ({fmt(err(s_s, b_s))}) | ${p_v:,.0f} | ${s_v:,.0f} | "
                      f"{fmt(err(s_v, p_v))}{spread} |", flush=True)
            # the decision check on the means (each replay's own check is the test's)
            totals = {o: float(np.mean([r.simulated_total_usd for r in rs])) for o, rs in by_option.items()}
            chosen = next((o for o, rs in by_option.items() if sum(r.chosen for r in rs) * 2 > len(rs)), None)
            if chosen is not None:
                for o, total in totals.items():
                    if o != chosen and totals[chosen] > total * (1 + TOLERANCE):
                        flips.append(f"{tr} at {rate:g} req/s: chosen {chosen} simulates "
                                     f"${totals[chosen]:,.0f}, rejected {o} ${total:,.0f}")
    print()
    print("decision check (chosen never dearer in simulation than a rejected option by more than "
          f"{TOLERANCE:.0%}): " + ("holds" if not flips else "fails: " + "; ".join(flips)))
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
