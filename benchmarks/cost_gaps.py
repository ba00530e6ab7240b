"""Experiments behind the cost table's remaining gaps (README "Serverless cost"; not a test, not a fix).

    .venv/bin/python benchmarks/cost_gaps.py shuffle  [--trace azure2023_code.csv] [--rate 0.3] [--hours 8]
    .venv/bin/python benchmarks/cost_gaps.py dispersion [--trace azure2023_code.csv] [--rate 3] [--hours 3] [--service S]
    .venv/bin/python benchmarks/cost_gaps.py cluster --cluster 92 [--trace azure2023_code.csv] [--rate 30] [--hours 3]
    .venv/bin/python benchmarks/cost_gaps.py startup [--rate 150]
    .venv/bin/python benchmarks/cost_gaps.py levels [--trace azure2023_code.csv] [--rate 0.3] [--hours 8]
    .venv/bin/python benchmarks/cost_gaps.py levels --trace synthetic --peak-factor 3 --correlation 600 \
        --rate 3 --hours 12
    .venv/bin/python benchmarks/cost_gaps.py spread [--trace azure2023_code.csv] [--rates 3,30] [--seeds 2]
    .venv/bin/python benchmarks/cost_gaps.py hours [--trace azure2023_conv.csv] [--rate 3] [--hours 168] [--start 0]
        [--option serverless_only] [--spike-warm-hours-fraction 0.1] [--seed 0]

All but `hours` from Tuesday 09:00 (hour 33), prod `assist` scaled to the rate, as tests/test_cost_model.py.

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
* levels: the share of time each container level k is alive — the plan's (serverless-only, its measured
  within_hour_correlation_s, 0 and an hour) against the plan's own idealisation run on the replayed arrivals: each
  request in flight for the plan's service time, the k-th container started when in flight reaches its start level
  and stopped once in flight has stayed below k for the scaledown window — as replayed and with each hour's
  minutes shuffled. Where these two agree and the simulator does not, the simulator's routing or service times
  differ; where the idealisation and the plan differ, the plan's traffic model does. `--trace synthetic`: the
  simulator's synthetic week drawn with the given peak factor and correlation time (the plan is told what its
  minute counts measure).
* spread: the week's cost check (as bench_cost_model.py: from Monday 00:00, 24 hours at 150 req/s, the stack's spike
  warm minimum off) on one trace, with the plan's `arrival_cluster_size` B as measured and replaced by
  1 + (B − 1)·κ, κ = E[min(o₁, o₂)] / E[o] over the replay's output tokens: a bunch's requests do not hold their
  places equally long, and in flight's variance over its mean is 1 + (B − 1)·∫(1 − F)² / E[S] for services of
  distribution F (M^X/G/∞), not B; taking S in proportion to the output tokens. Each option's bill, planned
  against simulated, the means over --seeds replays.
* hours: the cost check over [start, start + hours) (from Monday 00:00 by default: the whole week, as
  bench_cost_model.py), with the stack's spike warm minimum (`traffic.spike_warm_hours_fraction`, prod's 0.1 by
  default), one option's serverless bill hour by hour, planned against simulated: the hours the warm minimum
  holds, the hour before each of its rises (the schedule's lead) and the rest, summed apart, and the hours
  where the two part most. `--trace synthetic` draws the week from the stack's traffic inputs (or those given).
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


SYNTHETIC: dict = {}  # --trace synthetic: the traffic inputs the simulator's synthetic week is drawn from


def _endpoint(trace_name: str, rate: float, hours: float):
    """As costcheck.check builds it: the endpoint the simulator replays (a trace's with the measured burstiness
    set, which its random draws depend on; a synthetic week's with the inputs it is drawn from) and the one the
    plan is told (the measured burstiness, the served token means)."""
    base = load_inputs(STACK)
    if trace_name == "synthetic":
        trace = None
        base = base.model_copy(update={"endpoints": [
            e.model_copy(update={"traffic": e.traffic.model_copy(update=SYNTHETIC)}) for e in base.endpoints]})
    else:
        trace = load_trace(ROOT / "traces" / trace_name)
    inputs = costcheck.at_rate(base, "assist", rate, trace)
    mt = costcheck.measured_traffic(inputs, trace, START_H, START_H + hours, 0)
    pf, cluster, in_mean, out_mean = mt.peak_factor, mt.cluster_size, mt.input_tokens_mean, mt.output_tokens_mean
    ep = inputs.endpoints[0]
    measured = ep.model_copy(update={"traffic": ep.traffic.model_copy(update={
        "within_hour_peak_factor": min(20.0, max(1.0, pf)), "arrival_cluster_size": min(1000.0, cluster),
        "within_hour_correlation_s": mt.correlation_s, "idle_minute_share": min(0.99, mt.idle_share)})})
    served = measured.model_copy(update={"shape": ep.shape.model_copy(update={"input_tokens_mean": in_mean,
                                                                               "output_tokens_mean": out_mean})})
    prep = prepare_endpoint(inputs.model_copy(update={"endpoints": [served]}), served, GPU_KINDS)
    return trace, (ep if trace is None else measured), served, prep, pf, cluster


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


def _spread_of_bunches(inputs, trace, start_h: float, end_h: float, seed: int) -> float:
    """κ = E[min(o₁, o₂)] / E[o] of two independent replayed requests' output tokens (the first six hours)."""
    rng = np.random.default_rng([seed, 7])
    ep = inputs.endpoints[0]
    o = np.sort(np.concatenate([c.output_tokens for c in arrivals(ep, trace, start_h * 3600.0,
                                                                  min(end_h, start_h + 6.0) * 3600.0, rng)]))
    n = len(o)
    if n == 0:
        return 1.0
    # E[min] of two draws with replacement: the i-th smallest (0-based) is the minimum in 2(n − i) − 1 of n² pairs
    e_min = float(np.sum(o * (2.0 * (n - np.arange(n)) - 1.0))) / n ** 2
    return e_min / float(o.mean())


def spread(args) -> None:
    original = costcheck.measured_traffic
    base = _stack_with(spike_warm_hours_fraction=0.0)
    seen: dict = {}

    def measured(inputs, trace, start_h, end_h, seed):
        mt = original(inputs, trace, start_h, end_h, seed)
        kappa = _spread_of_bunches(inputs, trace, start_h, end_h, seed)
        seen.setdefault("kappa", []).append(kappa)
        seen.setdefault("B", []).append(mt.cluster_size)
        return dataclasses.replace(mt, cluster_size=1.0 + (mt.cluster_size - 1.0) * kappa)

    for rate in (float(x) for x in args.rates.split(",")):
        hours = 24.0 if rate >= 150 else 168.0
        for label, patched in (("B as measured", False), ("B = 1 + (B − 1)·κ", True)):
            costcheck.measured_traffic = measured if patched else original
            seen.clear()
            by: dict = {}
            for s in range(args.seeds):
                for r in costcheck.check(STACK, "assist", args.trace, rate, 0.0, hours, base=base, seed=s):
                    by.setdefault(r.option, []).append(r)
            extra = (f" (B {np.mean(seen['B']):.1f}, κ {np.mean(seen['kappa']):.2f})" if patched else "")
            for option, rs in sorted(by.items()):
                p = float(np.mean([r.planned_variable_usd for r in rs]))
                q = float(np.mean([r.simulated_variable_usd for r in rs]))
                print(f"{args.trace} {rate:g} req/s {hours:g} h, {label}{extra}: {option}"
                      f"{' (chosen)' if rs[0].chosen else ''}: planned ${p:,.0f} simulated ${q:,.0f} "
                      f"({(q - p) / p:+.1%})", flush=True)
    costcheck.measured_traffic = original


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


def levels(args) -> None:
    from topology.plan import serverless as sv
    from topology.plan.serverless import buffer_containers, expected_containers, gamma_alpha_for_peak

    trace, ep, served, prep, pf, cluster = _endpoint(args.trace, args.rate, args.hours)
    sls = prep.sls
    T, cold, W = sls.planned_inflight, serverless_cold_start_s(ep), ep.serverless.scaledown_window_s
    lam = prep.demand.mean_rps
    from topology.minute_factors import gamma_alpha_for_peak_with_idle

    alpha = gamma_alpha_for_peak(min(20.0, max(1.0, pf)))  # the factor without idle minutes (the model before)
    idle = served.traffic.idle_minute_share
    alpha_idle = gamma_alpha_for_peak_with_idle(min(20.0, max(1.0, pf)), idle)
    buf = buffer_containers(prep.demand.peak_rps, sls.planning_rps, cold, served.serverless.max_containers_cap)
    tau = served.traffic.within_hour_correlation_s
    h0, h1 = int(START_H), int(START_H + args.hours)
    batch = np.full(len(lam), float(T))
    for _ in range(2):  # the plan's service time at the batch its containers see (topology/plan/options.py)
        S = service_time_s(served, sls, batch)
        ch = expected_containers(lam, S, target_inputs=T, buffer_containers=buf, scaledown_window_s=W,
                                 alpha=alpha_idle, start_hour=h0, cluster_size=cluster, factor_correlation_s=tau,
                                 idle_share=idle)
        batch = 1.0 + lam * S / np.maximum(ch.alive, 1.0)
    top = 6
    print(f"{args.trace} {args.rate:g} req/s {args.hours:g} h: target {T}, buffer {buf}, service {S[h0]:.1f} s, "
          f"W {W:g} s, peak factor {pf:.2f}, cluster {cluster:.1f}, correlation {tau:.0f} s, idle minutes {idle:.3f}")
    for t, p_idle in ((0.0, 0.0), (tau, 0.0), (3600.0, 0.0), (0.0, idle), (tau, idle)):
        prev, row = 0.0, []
        for K in range(1, top + 1):
            a = float(expected_containers(lam, S, target_inputs=T, buffer_containers=buf, scaledown_window_s=W,
                                          alpha=alpha_idle if p_idle > 0 else alpha, start_hour=h0, max_containers=K,
                                          cluster_size=cluster, factor_correlation_s=t,
                                          idle_share=p_idle).alive[h0:h1].mean())
            row.append(a - prev)
            prev = a
        print(f"  plan, correlation {t:4.0f} s, idle share {p_idle:.3f}: P(k-th alive) k = 1…{top}: "
              + " ".join(f"{x:.3f}" for x in row))
    t_arr, _ = _replayed(ep, trace, args.hours)
    # the plan with the replay's own minute rates for the factor (each minute's count over its hour's mean, in 32
    # equal-probability bins; Poisson noise left in) instead of the Gamma the peak factor sets
    counts = np.bincount((t_arr // 60).astype(int), minlength=int(args.hours * 60))[: int(args.hours * 60)]
    by_hour = counts.reshape(-1, 60).astype(float)
    g_emp = np.sort((by_hour / np.maximum(by_hour.mean(axis=1, keepdims=True), 1e-9)).ravel())
    nodes = np.array([b.mean() for b in np.array_split(g_emp, 32)])
    nodes, weights = nodes / nodes.mean(), np.full(32, 1 / 32)
    print(f"  the replay's minutes: {np.mean(counts == 0):.0%} with no request; the Gamma puts "
          f"{float(np.mean(sv.gamma_quadrature(alpha)[0] < 0.05)):.0%} of its nodes below 0.05 of the mean")
    original = sv.factor_quadrature  # (memoised: the replay's nodes replace it, not gamma_quadrature under it)
    sv.factor_quadrature = lambda a, p=0.0, n=32: (nodes, weights)
    sv.clear_memos()
    try:
        for t in (0.0, tau):
            prev, row = 0.0, []
            for K in range(1, top + 1):
                a = float(expected_containers(lam, S, target_inputs=T, buffer_containers=buf, scaledown_window_s=W,
                                              alpha=alpha, start_hour=h0, max_containers=K, cluster_size=cluster,
                                              factor_correlation_s=t).alive[h0:h1].mean())
                row.append(a - prev)
                prev = a
            print(f"  plan, the replay's minute rates, correlation {t:4.0f} s: P(k-th alive) k = 1…{top}: "
                  + " ".join(f"{x:.3f}" for x in row))
    finally:
        sv.factor_quadrature = original
        sv.clear_memos()
    for label in ("as replayed", "minutes shuffled"):
        if label == "minutes shuffled":
            minute = (t_arr // 60).astype(int)
            order = np.arange(int(args.hours * 60))
            prng = np.random.default_rng(12345)
            for h in range(0, len(order), 60):
                block = order[h:h + 60].copy()
                prng.shuffle(block)
                order[h:h + 60] = block
            t_arr = np.sort(order[minute] * 60 + (t_arr - minute * 60))
        svc = S[h0 + (t_arr // 3600).astype(int)]
        ev_t = np.concatenate([t_arr, t_arr + svc])
        ev_d = np.concatenate([np.ones(len(t_arr)), -np.ones(len(t_arr))])
        o = np.lexsort((ev_d, ev_t))  # a completion before an arrival at the same instant
        ev_t, n = ev_t[o], np.cumsum(ev_d[o])
        end = args.hours * 3600.0
        row = []
        for k in range(1, top + 1):
            start = k if k <= buf else max(T * (k - 1 - buf) + 1, k)
            on, last, t_on, alive = False, -math.inf, 0.0, 0.0
            for i in range(len(ev_t)):
                t = ev_t[i]
                if t > end:
                    break
                if on and t - last > W:  # in flight below k for the whole window: stopped at last + W
                    alive += last + W - t_on
                    on = False
                if n[i] >= k or (i > 0 and n[i - 1] >= k):
                    last = t
                if not on and n[i] >= start:
                    on, t_on = True, t
            if on:
                alive += min(end, last + W) - t_on
            row.append(alive / end)
        print(f"  replayed arrivals, {label}: P(k-th alive) k = 1…{top}: " + " ".join(f"{x:.3f}" for x in row))


def _stack_with(**traffic):
    """The prod stack with these traffic inputs on every endpoint."""
    base = load_inputs(STACK)
    return base.model_copy(update={"endpoints": [
        e.model_copy(update={"traffic": e.traffic.model_copy(update=traffic)}) for e in base.endpoints]})


def hourly(args) -> None:
    upd = {"spike_warm_hours_fraction": args.spike_warm_hours_fraction}
    if args.trace == "synthetic":
        upd.update(within_hour_peak_factor=args.peak_factor, within_hour_correlation_s=args.correlation)
    base = _stack_with(**upd)
    trace = None if args.trace == "synthetic" else args.trace
    start = args.start if args.start is not None else 0.0
    rows = costcheck.check(STACK, "assist", trace, args.rate, start, start + args.hours, base=base, seed=args.seed)
    r = next((x for x in rows if x.option == args.option), None)
    if r is None or not r.planned_serverless_usd_by_hour:
        print(f"{args.option}: no serverless bill in this check")
        return
    plan, sim = np.array(r.planned_serverless_usd_by_hour), np.array(r.simulated_serverless_usd_by_hour)
    warm = np.array(r.warm_min_by_hour) if r.warm_min_by_hour else np.zeros(len(plan), int)
    base_min = int(warm.min())
    held = warm > base_min
    lead = np.zeros(len(plan), bool)
    lead[:-1] = warm[1:] > warm[:-1]
    lead &= ~held
    rest = ~held & ~lead
    print(f"{args.trace} {args.rate:g} req/s [{start:g}, {start + args.hours:g}) {args.option}, spike warm "
          f"{args.spike_warm_hours_fraction:g}: serverless planned ${plan.sum():,.0f} simulated ${sim.sum():,.0f} "
          f"({r.serverless_error:+.1%})")
    for label, sel in (("warm minimum above its base", held), ("hour before a rise (its lead), not itself held", lead),
                       ("the other hours", rest)):
        p, q = plan[sel].sum(), sim[sel].sum()
        print(f"  {label}: {int(sel.sum())} h, planned ${p:,.1f} simulated ${q:,.1f} (gap ${q - p:+,.1f})")
    gap = sim - plan
    print("  hour: warm, planned, simulated (the 12 that part most; $ per hour)")
    for h in np.argsort(-np.abs(gap), kind="stable")[:12]:
        print(f"    {int(start) + int(h):3d}: {int(warm[h]):2d}  ${plan[h]:8,.1f}  ${sim[h]:8,.1f}  {gap[h]:+8,.1f}")


def main() -> int:
    warnings.simplefilter("ignore")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", choices=["shuffle", "dispersion", "cluster", "startup", "levels", "hours", "spread"])
    ap.add_argument("--trace", default="azure2023_code.csv")
    ap.add_argument("--rate", type=float, default=None)
    ap.add_argument("--hours", type=float, default=None)
    ap.add_argument("--cluster", type=float, default=None)
    ap.add_argument("--service", type=float, default=None, help="dispersion: seconds a request holds its place")
    ap.add_argument("--peak-factor", type=float, default=1.5, help="--trace synthetic: within_hour_peak_factor")
    ap.add_argument("--correlation", type=float, default=0.0, help="--trace synthetic: within_hour_correlation_s")
    ap.add_argument("--start", type=float, default=None, help="hours: the first hour (0 = Monday 00:00)")
    ap.add_argument("--option", default="serverless_only", help="hours: which option's bill")
    ap.add_argument("--seed", type=int, default=0, help="hours: the replay (costcheck.check's seed)")
    ap.add_argument("--seeds", type=int, default=2, help="spread: replays per cell (seeds 0 … K − 1)")
    ap.add_argument("--rates", default="3,30", help="spread: mean rates")
    ap.add_argument("--spike-warm-hours-fraction", type=float, default=0.1,
                    help="hours: the endpoint's traffic.spike_warm_hours_fraction (the stack's 0.1)")
    args = ap.parse_args()
    if args.experiment == "hours" and args.trace == "azure2023_code.csv" and "--trace" not in sys.argv:
        args.trace = "azure2023_conv.csv"
    SYNTHETIC.update(within_hour_peak_factor=args.peak_factor, within_hour_correlation_s=args.correlation,
                     spike_warm_hours_fraction=0.0)
    defaults = {"shuffle": (0.3, 8.0), "dispersion": (3.0, 3.0), "cluster": (30.0, 3.0), "startup": (150.0, 2.0),
                "levels": (0.3, 8.0), "hours": (3.0, 168.0), "spread": (30.0, 168.0)}
    rate, hours = defaults[args.experiment]
    args.rate = rate if args.rate is None else args.rate
    args.hours = hours if args.hours is None else args.hours
    if args.seeds < 1:
        ap.error(f"--seeds must be at least 1, got {args.seeds}")
    if args.experiment == "cluster" and args.cluster is None:
        ap.error("cluster: --cluster FIGURE is required")
    {"shuffle": shuffle, "dispersion": dispersion, "cluster": cluster, "startup": startup,
     "levels": levels, "hours": hourly, "spread": spread}[args.experiment](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
