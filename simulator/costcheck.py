"""Planned vs simulated cost of every option of one endpoint, on a trace, at a mean rate, over a span of hours.

For the cost-model test table (tests/test_cost_model.py) and its full-week benchmark
(benchmarks/bench_cost_model.py). Each option (serverless only, floor + burst, dedicated only) is built into
a spec as if it had won, its traffic replayed through the simulator, and the serverless bill and the
option's variable bill compared with the plan's for exactly those hours.

The planner is told the within-hour burstiness and the token means the way a user would measure them: from the
replayed arrivals' per-minute counts (`within_hour_from_minute_counts`: the peak factor and idle-minute share
together; `correlation_s_from_minute_counts`) and
the tokens they carry, not from the simulator's settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from topology import costs
from topology.catalog import GPU_KINDS
from topology.inputs import CostInputs
from topology.plan import build_endpoint_spec, decide, plan, prepare_endpoint, with_platform_share
from topology.plan.options import serverless_usd_by_hour
from topology.plan.schedule import prices_for
from topology.plan.serverless import (
    CLUSTER_WINDOW_S,
    cluster_size_from_counts,
    correlation_s_from_minute_counts,
    within_hour_from_minute_counts,
)
from topology.timebase import HOURS_PER_WEEK, MINUTES_PER_HOUR, SECONDS_PER_HOUR

from .simulate import simulate_endpoint
from .traffic import RateTrace, Trace, arrivals, load_trace

ROOT = Path(__file__).resolve().parent.parent
TRACES = ("azure2023_code.csv", "azure2023_conv.csv", "servegen_m-small_14d_rate.csv", "mooncake_synthetic.jsonl")
OPTIONS = ("serverless_only", "floor_plus_burst", "dedicated_only")
TOLERANCE = 0.10


@dataclass(frozen=True)
class OptionCheck:
    trace: str
    mean_rps: float
    option: str
    chosen: bool
    planned_serverless_usd: float
    simulated_serverless_usd: float
    planned_variable_usd: float  # reserved + on-demand + serverless over the hours
    simulated_variable_usd: float
    start_h: float
    end_h: float
    fixed_usd: float = 0.0  # the option's fixed shares (platform, serverless) over the hours
    before_serverless_usd: float = 0.0  # the replaced PEAKS_PER_HOUR formula on the same option (comparison)
    # the serverless bill hour by hour over [start_h, end_h), planned and simulated (container-seconds billed in
    # each hour × the container's price): where in the span a gap arises
    planned_serverless_usd_by_hour: tuple[float, ...] = ()
    simulated_serverless_usd_by_hour: tuple[float, ...] = ()
    warm_min_by_hour: tuple[int, ...] = ()  # the option's warm minimum over the same hours (spike's included)

    @property
    def simulated_total_usd(self) -> float:
        return self.simulated_variable_usd + self.fixed_usd

    @property
    def before_serverless_error(self) -> float | None:
        p = self.before_serverless_usd
        return None if p <= 0 else (self.simulated_serverless_usd - p) / p

    @property
    def serverless_error(self) -> float | None:
        p = self.planned_serverless_usd
        return None if p <= 0 and self.simulated_serverless_usd <= 0 else (
            (self.simulated_serverless_usd - p) / p if p > 0 else math.inf)

    @property
    def variable_error(self) -> float:
        return (self.simulated_variable_usd - self.planned_variable_usd) / self.planned_variable_usd


def at_rate(inputs: CostInputs, name: str, mean_rps: float, trace: Trace | None) -> CostInputs:
    """The stack with only endpoint `name`, its hour-of-week profile scaled to `mean_rps` (a rate trace's own
    hourly means when the trace is a rate trace, as `traffic.rate_trace` would give)."""
    ep = next(e for e in inputs.endpoints if e.name == name)
    prof = np.asarray(ep.traffic.hourly_mean_requests_per_s, dtype=float)
    if isinstance(trace, RateTrace):
        per = int(trace.window_s // 60)
        base = np.repeat(trace.rates, per)[: HOURS_PER_WEEK * MINUTES_PER_HOUR]
        prof = base.reshape(HOURS_PER_WEEK, MINUTES_PER_HOUR).mean(axis=1)
    prof = prof * (mean_rps / prof.mean())
    traffic = ep.traffic.model_copy(update={"hourly_mean_requests_per_s": [float(x) for x in prof]})
    # caps are the stack's business, not the cost model's: lift them so every option can carry the rate
    serverless = ep.serverless.model_copy(update={"max_containers_cap": 10_000})
    # and a rollout needs dedicated replicas, which the serverless-only option has not: the check is about cost
    ep = ep.model_copy(update={"traffic": traffic, "serverless": serverless, "max_dedicated_replicas": 10_000,
                               "rollout": None})
    return inputs.model_copy(update={"endpoints": [ep]})


def measured_burstiness(inputs: CostInputs, trace: Trace | None, start_h: float, end_h: float,
                        seed: int) -> tuple[float, float]:
    """What the gateway's request log would show: (within_hour_peak_factor, arrival_cluster_size) from the
    replayed arrivals' per-minute and per-10-second counts."""
    m = measured_traffic(inputs, trace, start_h, end_h, seed)
    return m.peak_factor, m.cluster_size


@dataclass(frozen=True)
class MeasuredTraffic:
    """What the gateway's request log shows of the replayed arrivals (the traffic inputs a user would set)."""

    peak_factor: float  # traffic.within_hour_peak_factor
    cluster_size: float  # traffic.arrival_cluster_size
    correlation_s: float  # traffic.within_hour_correlation_s
    input_tokens_mean: float
    output_tokens_mean: float
    idle_share: float = 0.0  # traffic.idle_minute_share


def measured_traffic(inputs: CostInputs, trace: Trace | None, start_h: float, end_h: float,
                     seed: int) -> MeasuredTraffic:
    """What the gateway's request log would show: the burstiness inputs from per-minute and per-10-second counts,
    and the mean prompt and output tokens of the replayed arrivals. The token means are those served: a trace
    scaled to the endpoint's shape is then clipped to the product's limits (max_tokens), which lowers the mean of
    a heavy-tailed trace (Azure code: 400 planned, 343 served)."""
    ep = inputs.endpoints[0]
    rng = np.random.default_rng([seed, 7])
    start_s, end_s = start_h * SECONDS_PER_HOUR, end_h * SECONDS_PER_HOUR
    per = 60 // CLUSTER_WINDOW_S
    n_win = int(round((end_s - start_s) / CLUSTER_WINDOW_S))
    counts = np.zeros(n_win)
    n_req, in_sum, out_sum = 0, 0.0, 0.0
    for ch in arrivals(ep, trace, start_s, end_s, rng):
        j = ((ch.arrival_s - start_s) // CLUSTER_WINDOW_S).astype(int)
        counts += np.bincount(j[(j >= 0) & (j < n_win)], minlength=n_win)
        n_req += len(ch.arrival_s)
        in_sum += float(np.sum(ch.input_tokens))
        out_sum += float(np.sum(ch.output_tokens))
    b = cluster_size_from_counts(counts[: n_win // per * per].reshape(-1, per))
    minutes = counts[: n_win // per * per].reshape(-1, per).sum(axis=1)
    hours = len(minutes) // MINUTES_PER_HOUR
    by_hour = minutes[: hours * MINUTES_PER_HOUR].reshape(hours, MINUTES_PER_HOUR)
    pf, idle = within_hour_from_minute_counts(by_hour, b)
    tau = correlation_s_from_minute_counts(by_hour, b)
    if n_req == 0:
        return MeasuredTraffic(pf, b, tau, ep.shape.input_tokens_mean, ep.shape.output_tokens_mean, idle)
    return MeasuredTraffic(pf, b, tau, in_sum / n_req, out_sum / n_req, idle)


def check(
    stack: str | Path, name: str, trace_name: str | None, mean_rps: float, start_h: float, end_h: float, *,
    seed: int = 0, base: CostInputs | None = None,
) -> list[OptionCheck]:
    """Every dedicated/serverless option of endpoint `name` at `mean_rps` on the trace, hours [start_h, end_h)
    (whole hours: the plan bills by the hour). trace_name None: the simulator's synthetic week from the
    endpoint's traffic inputs (its burstiness then measured from those arrivals like a trace's)."""
    if start_h != int(start_h) or end_h != int(end_h):
        raise ValueError(f"whole hours only, got [{start_h}, {end_h})")
    from topology import load_inputs

    trace = None if trace_name is None else load_trace(ROOT / "traces" / trace_name)
    inputs = at_rate(base or load_inputs(stack), name, mean_rps, trace)
    mt = measured_traffic(inputs, trace, start_h, end_h, seed)
    in_mean, out_mean = mt.input_tokens_mean, mt.output_tokens_mean
    ep = inputs.endpoints[0]
    ep = ep.model_copy(update={"traffic": ep.traffic.model_copy(update={
        "within_hour_peak_factor": min(20.0, max(1.0, mt.peak_factor)),
        "arrival_cluster_size": min(1000.0, mt.cluster_size), "within_hour_correlation_s": mt.correlation_s,
        "idle_minute_share": min(0.99, mt.idle_share)})})
    # the simulator replays the trace scaled to the stack's shape (then clipped to the product's limits); the
    # planner is told the token means as served (below the shape's p99s, which stay the stack's). A synthetic
    # week is drawn from the traffic inputs as given (those the measurement above saw), not from what was measured
    replay_inputs = inputs if trace is None else inputs.model_copy(update={"endpoints": [ep]})
    shape = ep.shape.model_copy(update={"input_tokens_mean": min(in_mean, ep.shape.input_tokens_p99),
                                        "output_tokens_mean": min(out_mean, ep.shape.output_tokens_p99)})
    ep = ep.model_copy(update={"shape": shape})
    inputs = inputs.model_copy(update={"endpoints": [ep]})
    prep = prepare_endpoint(inputs, ep, GPU_KINDS)
    share = inputs.prices.platform_fixed_usd_per_month / costs.WEEKS_PER_MONTH
    options = with_platform_share(prep.options, share)
    win, _, _ = decide(ep, options)
    hours = np.arange(math.floor(start_h), math.ceil(end_h)) % HOURS_PER_WEEK
    full_week = end_h - start_h >= HOURS_PER_WEEK
    skeleton = plan(inputs)  # the fleet-level fields; each option's endpoint replaces the planned one
    out = []
    for o in options:
        if o.tier not in OPTIONS or not o.feasible:
            continue
        runner = None
        plan_ep = build_endpoint_spec(inputs, ep, prep.demand, prep.ok, prep.sls, prep.herd, options, o, runner,
                                      "forced for the cost check", GPU_KINDS)
        spec = skeleton.model_copy(update={"endpoints": (plan_ep.spec,)})
        res = simulate_endpoint(replay_inputs, spec, ep.name, seed=seed, trace=trace, start_h=start_h, end_h=end_h)
        sls_plan = 0.0
        plan_h: tuple[float, ...] = ()
        sim_h: tuple[float, ...] = ()
        if o.uses_burst:
            # the plan's expectation for exactly these hours, starting as the simulation does: no container up
            pr = prices_for(inputs, ep, o.placement, prep.sls)
            by_hour = serverless_usd_by_hour(o.tier, ep, prep.demand, o.placement, prep.sls, pr, o.floor_by_hour,
                                             o.warm_min_by_hour, o.burst_max_containers,
                                             start_hour=None if full_week else int(start_h))
            sls_plan = float(by_hour[hours].sum())
            plan_h = tuple(float(x) for x in by_hour[hours])
            # the simulator's containers by hour (container-seconds / the hour's length) × the hour's length
            sim_h = tuple(float(c) * min(SECONDS_PER_HOUR, (end_h - start_h - i) * SECONDS_PER_HOUR) / SECONDS_PER_HOUR
                          * pr.serverless_container_hour for i, c in enumerate(res.hourly_burst_containers))
        ded_plan = _dedicated_by_hour(o)[hours].sum()
        out.append(OptionCheck(
            trace=trace_name or "synthetic", mean_rps=mean_rps, option=o.tier, chosen=o.tier == win.tier,
            planned_serverless_usd=sls_plan, simulated_serverless_usd=res.cost_usd["serverless"],
            planned_variable_usd=sls_plan + ded_plan,
            simulated_variable_usd=res.cost_usd["serverless"] + res.cost_usd["reserved"] + res.cost_usd["on_demand"],
            start_h=start_h, end_h=end_h,
            fixed_usd=sum(v for k, v in o.breakdown_weekly.items() if k.endswith("_fixed")) * len(hours) / HOURS_PER_WEEK,
            before_serverless_usd=_before(o, ep, prep, inputs, hours) if o.uses_burst else 0.0,
            planned_serverless_usd_by_hour=plan_h, simulated_serverless_usd_by_hour=sim_h,
            warm_min_by_hour=(tuple(int(x) for x in o.warm_min_by_hour[hours]) if o.warm_min_by_hour is not None
                              else ()),
        ))
    return out


def _dedicated_by_hour(o) -> np.ndarray:
    """The option's reserved and on-demand bill spread over the week's hours (reserved evenly, on-demand by
    the nodes its floor runs each hour)."""
    b = o.breakdown_weekly
    out = np.full(HOURS_PER_WEEK, b.get("reserved", 0.0) / HOURS_PER_WEEK)
    if o.floor_by_hour is not None and b.get("on_demand", 0.0) > 0:
        rpn = o.placement.replicas_per_node
        od_nodes = np.maximum(np.ceil(o.floor_by_hour / rpn) - o.reserved_layers // rpn, 0)
        out += b["on_demand"] * od_nodes / max(od_nodes.sum(), 1)
    return out


PEAKS_PER_HOUR_BEFORE = 8  # the replaced constant (topology/plan/schedule.py before the change), for comparison


def _before(o, ep, prep, inputs, hours: np.ndarray) -> float:
    """The replaced formula's serverless bill for these hours: the mean's containers, those above it held
    W × 8 / 3600 of each hour, a cold start per peak container."""
    from topology.plan.timing import serverless_cold_start_s

    pl, sls = o.placement, prep.sls
    pr = prices_for(inputs, ep, pl, sls)
    floor = o.floor_by_hour if o.floor_by_hour is not None else np.zeros(HOURS_PER_WEEK)
    over_mean = np.maximum(prep.demand.mean_rps - floor * pl.planning_rps, 0.0)
    over_peak = np.maximum(prep.demand.peak_rps - floor * pl.planning_rps, 0.0)
    c_mean = over_mean / sls.planning_rps
    c_peak = np.ceil(over_peak / sls.planning_rps - 1e-9)
    W = ep.serverless.scaledown_window_s
    base = np.maximum(c_mean, 1.0 - np.exp(-over_mean * W))
    alive = base + np.maximum(c_peak - base, 0.0) * min(1.0, W * PEAKS_PER_HOUR_BEFORE / 3600.0)
    alive = np.maximum(alive, o.warm_min_by_hour)
    usd = (alive + c_peak * serverless_cold_start_s(ep) / 3600.0) * pr.serverless_container_hour
    return float(usd[hours].sum())
