"""Experiments behind the cost table's remaining gaps (README "Serverless cost"; not a test, not a fix).

    .venv/bin/python benchmarks/cost_gaps.py shuffle  [--trace azure2023_code.csv] [--rate 0.3] [--hours 8]
    .venv/bin/python benchmarks/cost_gaps.py dispersion [--trace azure2023_code.csv] [--rate 3] [--hours 3] [--service S]
    .venv/bin/python benchmarks/cost_gaps.py cluster --cluster 92 [--trace azure2023_code.csv] [--rate 30] [--hours 3]
    .venv/bin/python benchmarks/cost_gaps.py startup [--rate 150]

All from Tuesday 09:00 (hour 33), prod `assist` scaled to the rate, as tests/test_cost_model.py.

* shuffle: the cost check (simulator/costcheck.py) with the replayed arrivals' minutes put in a random order
  within each hour — the same minute counts and the same within-minute bunching, no correlation from one minute
  to the next (the plan draws each minute's factor independently). The replay is reordered by wrapping the
  simulator's `arrivals` for this process only.
* dispersion: the in-flight count of an infinite-server queue fed by the replayed arrivals, each request
  holding its place for the plan's mean service × its output tokens over their mean (and for the mean alone):
  its variance over its mean, against the cluster size the plan is given (10-second window counts) and the
  counts' dispersion over windows of the service time.
* cluster: the cost check with `arrival_cluster_size` replaced by the given figure (the plan's only change).
* startup: the start-up burst with the service times' spread, N = λ·max_u [c·(1 − F(u)) + ∫₀ᵘ (1 − F)]
  (requests arriving before the first container is ready start at c, later ones on arrival, each holding its
  place its own service time at the full batch), against the plan's bound λ·(c + S₁), in containers.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import simulator.costcheck as costcheck  # noqa: E402
import simulator.simulate as simulate  # noqa: E402
from simulator.traffic import Chunk, arrivals, load_trace  # noqa: E402
from topology import load_inputs  # noqa: E402
from topology.catalog import GPU_KINDS  # noqa: E402
from topology.plan import prepare_endpoint  # noqa: E402
from topology.plan.serverless import service_time_s  # noqa: E402
from topology.plan.timing import serverless_cold_start_s  # noqa: E402

STACK = ROOT / "stacks" / "Pulumi.prod.yaml"
START_H = 33.0


def _rows(trace: str, rate: float, hours: float, label: str) -> None:
    for r in costcheck.check(STACK, "assist", trace, rate, START_H, START_H + hours):
        e = r.serverless_error
        print(f"{label}: {trace} {rate:g} req/s {hours:g} h {r.option}{' (chosen)' if r.chosen else ''}: serverless "
              f"planned ${r.planned_serverless_usd:,.1f} simulated ${r.simulated_serverless_usd:,.1f} "
              f"({'—' if e is None else f'{e:+.1%}'}); option {r.variable_error:+.1%}", flush=True)


def _shuffled_minutes(original):
    def replay(ep, trace, start_s, end_s, rng, **kw):
        chunks = list(original(ep, trace, start_s, end_s, rng, **kw))
        t = np.concatenate([c.arrival_s for c in chunks])
        ins = np.concatenate([c.input_tokens for c in chunks])
        outs = np.concatenate([c.output_tokens for c in chunks])
        n_min = int(math.ceil((end_s - start_s) / 60))
        minute = ((t - start_s) // 60).astype(int)
        order = np.arange(n_min)
        prng = np.random.default_rng(12345)
        for h in range(0, n_min, 60):
            block = order[h:h + 60].copy()
            prng.shuffle(block)
            order[h:h + 60] = block
        t = start_s + order[minute] * 60 + (t - start_s - minute * 60)
        o = np.argsort(t, kind="stable")
        t, ins, outs = t[o], ins[o], outs[o]
        for a in range(0, n_min, 10):
            sel = (t >= start_s + a * 60) & (t < start_s + (a + 10) * 60)
            yield Chunk(t[sel], ins[sel], outs[sel])
    return replay


def shuffle(args) -> None:
    _rows(args.trace, args.rate, args.hours, "as replayed")
    replay = _shuffled_minutes(costcheck.arrivals)
    costcheck.arrivals = simulate.arrivals = replay
    _rows(args.trace, args.rate, args.hours, "minutes shuffled")


def _endpoint(trace_name: str, rate: float, hours: float):
    """As costcheck.check builds it: the endpoint the simulator replays (the measured burstiness set, which its
    random draws depend on) and the one the plan is told (the served token means)."""
    trace = load_trace(ROOT / "traces" / trace_name)
    inputs = costcheck.at_rate(load_inputs(STACK), "assist", rate, trace)
    mt = costcheck.measured_traffic(inputs, trace, START_H, START_H + hours, 0)
    pf, cluster, in_mean, out_mean = mt.peak_factor, mt.cluster_size, mt.input_tokens_mean, mt.output_tokens_mean
    ep = inputs.endpoints[0]
    ep = ep.model_copy(update={"traffic": ep.traffic.model_copy(update={
        "within_hour_peak_factor": min(20.0, max(1.0, pf)), "arrival_cluster_size": min(1000.0, cluster),
        "within_hour_correlation_s": mt.correlation_s})})
    served = ep.model_copy(update={"shape": ep.shape.model_copy(update={"input_tokens_mean": in_mean,
                                                                         "output_tokens_mean": out_mean})})
    prep = prepare_endpoint(inputs.model_copy(update={"endpoints": [served]}), served, GPU_KINDS)
    return trace, ep, served, prep, pf, cluster


def _replayed(ep, trace, hours: float):
    """The arrivals the simulator replays in costcheck.check from Tuesday 09:00 for `hours` (its random stream:
    seed 0 and the endpoint's name)."""
    s0 = START_H * 3600.0
    rng = np.random.default_rng([0, simulate._stable_hash(ep.name)])
    chunks = list(arrivals(ep, trace, s0, s0 + hours * 3600, rng))
    return (np.concatenate([c.arrival_s for c in chunks]) - s0,
            np.concatenate([c.output_tokens for c in chunks]).astype(float))


def dispersion(args) -> None:
    trace, ep, served, prep, pf, cluster = _endpoint(args.trace, args.rate, args.hours)
    t, out = _replayed(ep, trace, args.hours)
    T = max(1, math.floor(prep.sls.usable_concurrency * prep.sls.planning_utilisation))
    # the plan's service time: given (the serverless-only plan's at 3 req/s is 7.3 s, at the batch its
    # containers see), else a full container's
    S = args.service if args.service is not None else float(service_time_s(served, prep.sls, T))
    grid = np.arange(600.0, args.hours * 3600 - 10, 0.5)
    hour = (grid // 3600).astype(int)
    for label, svc in (("equal services", np.full(len(t), S)), ("own services", S * out / out.mean())):
        ends = np.sort(t + svc)
        x = (np.searchsorted(t, grid, side="right") - np.searchsorted(ends, grid, side="right")).astype(float)
        ratio = np.mean([x[hour == h].var() / x[hour == h].mean() for h in np.unique(hour)])
        print(f"{args.trace} {args.rate:g} req/s, service {S:.1f} s, {label}: in flight mean {x.mean():.1f}, "
              f"variance / mean {ratio:.1f}")
    for w in (10.0, S):
        n = int(args.hours * 3600 // w)
        c = np.bincount((t // w).astype(int), minlength=n)[:n].astype(float)
        print(f"  counts over {w:.1f} s windows: variance / mean {c.var() / c.mean():.1f}")
    print(f"  the plan's arrival_cluster_size (10-second windows within minutes) {cluster:.1f}, "
          f"within_hour_peak_factor {pf:.2f}")


def cluster(args) -> None:
    original = costcheck.measured_traffic

    def measured(*a, **k):
        mt = original(*a, **k)
        print(f"  arrival_cluster_size measured {mt.cluster_size:.1f}, planned with {args.cluster:g}")
        return dataclasses.replace(mt, cluster_size=args.cluster)

    costcheck.measured_traffic = measured
    _rows(args.trace, args.rate, args.hours, f"cluster {args.cluster:g}")


def startup(args) -> None:
    for name in costcheck.TRACES:
        if name.startswith("servegen"):
            continue  # a rate trace: its tokens are the shape's lognormal, no replayed spread
        trace, ep, served, prep, _, _ = _endpoint(name, args.rate, args.hours)
        sls = prep.sls
        c = serverless_cold_start_s(ep)
        T = max(1, math.floor(sls.usable_concurrency * sls.planning_utilisation))
        s1 = float(service_time_s(served, sls, 1))
        t, outs = _replayed(ep, trace, args.hours)
        outs = outs[t < 600]
        lam = float(np.sum(t < 600)) / 600.0
        lam40 = float(np.sum(t < 40)) / 40.0
        x = np.sort(float(service_time_s(served, sls, T)) * outs / outs.mean())
        u = np.linspace(0.0, float(x[-1]), 20001)
        surv = 1.0 - np.searchsorted(x, u, side="right") / len(x)
        integral = np.concatenate([[0.0], np.cumsum((surv[1:] + surv[:-1]) / 2 * np.diff(u))])
        held = c * surv + integral
        i = int(np.argmax(held))
        print(f"{name} {args.rate:g} req/s (first 10 min {lam:.1f} req/s, first 40 s {lam40:.1f}): plan's bound "
              f"λ(c + S₁) = {lam * (c + s1) / T:.1f} containers; with the replayed spread {lam * held[i] / T:.1f} "
              f"(in flight peaks {c + u[i]:.0f} s after the start); at the first 40 s' rate {lam40 * held[i] / T:.1f}")


def main() -> int:
    warnings.simplefilter("ignore")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", choices=["shuffle", "dispersion", "cluster", "startup"])
    ap.add_argument("--trace", default="azure2023_code.csv")
    ap.add_argument("--rate", type=float, default=None)
    ap.add_argument("--hours", type=float, default=None)
    ap.add_argument("--cluster", type=float, default=None)
    ap.add_argument("--service", type=float, default=None, help="dispersion: seconds a request holds its place")
    args = ap.parse_args()
    defaults = {"shuffle": (0.3, 8.0), "dispersion": (3.0, 3.0), "cluster": (30.0, 3.0), "startup": (150.0, 2.0)}
    rate, hours = defaults[args.experiment]
    args.rate = rate if args.rate is None else args.rate
    args.hours = hours if args.hours is None else args.hours
    if args.experiment == "cluster" and args.cluster is None:
        ap.error("cluster: --cluster FIGURE is required")
    {"shuffle": shuffle, "dispersion": dispersion, "cluster": cluster, "startup": startup}[args.experiment](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
