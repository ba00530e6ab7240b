"""Replay a week of traffic (synthetic or a real trace) through a TopologySpec and run the failure drills.

The planner's SLO and cost claims come from formulas; this checks them by serving requests. Ground truth
(engine rates, cold starts, prices, shape, traffic, SLO) comes from the inputs; the spec supplies the
decisions under test (floor by hour, autoscaling, gateway overflow, burst sizing). The model is described
in simulator/engine.py; traffic sources in simulator/traffic.py; drills in simulator/drills.py.

    python -m topology simulate stacks/Pulumi.prod.yaml [--trace traces/azure2023_conv.csv]
        [--drill morning-cold-start|spike|long-prompt|disconnect|rollback] [--plot out/week.png] [--markdown]

For the plan report: `plan_check(inputs, spec)` → one `PlanComparison` per endpoint (simulated goodput and
monthly cost next to the planner's, `ok` false beyond COST_TOLERANCE_FRACTION or below GOODPUT_TARGET);
`format_plan_check(...)` renders it.

Pure: no clock reads, no network; randomness from an explicit seed; matplotlib and tqdm load lazily.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from topology.costs import WEEKS_PER_MONTH
from topology.inputs import CostInputs
from topology.spec import EndpointSpec, TopologySpec
from topology.timebase import HOURS_PER_WEEK, SECONDS_PER_HOUR

from . import compiled as compiled_engine
from .engine import EndpointSim, Overrides, hist_quantile
from .format import WEEKDAYS, fmt_seconds, hour_of_week_label, table
from .traffic import Spike, Trace, arrivals

GOODPUT_TARGET = 0.99  # share of requests meeting both the TTFT and inter-token SLOs (the SLOs are p99s)
PEAK_HOURS_FRACTION = 0.10  # "SLO met at peak": the busiest 10% of simulated hours must meet the target too
COST_TOLERANCE_FRACTION = 0.15  # simulated vs planned monthly cost: beyond ±15% the plan report warns
CHUNK_S = 600.0
T_ = TypeVar("T_")
TRACE_SOURCES = {  # cite where results use them (traces/README.md)
    "azure2023_conv.csv": "Azure/AzurePublicDataset AzureLLMInferenceTrace_conv (Splitwise, ISCA'24), CC-BY-4.0",
    "azure2023_code.csv": "Azure/AzurePublicDataset AzureLLMInferenceTrace_code (Splitwise, ISCA'24), CC-BY-4.0",
    "mooncake_synthetic.jsonl": "kvcache-ai/Mooncake FAST25-release/traces/synthetic_trace.jsonl, Apache-2.0",
    "servegen_m-small_14d_rate.csv": "derived from alibaba/ServeGen data/language/m-small (arXiv 2505.09999), Apache-2.0",
}


@dataclass(frozen=True)
class EndpointResult:
    """What one endpoint did over the simulated window."""

    endpoint: str
    tier: str
    has_floor: bool  # the spec's EndpointSpec.has_floor
    start_h: float
    end_h: float
    requests: int
    goodput: float  # share meeting both SLOs
    peak_hours_goodput: float
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    ttft_slo_s: float
    itl_slo_s: float
    cost_usd: dict[str, float]  # reserved, on_demand, serverless, api — over the window
    gpu_hours: dict[str, float]  # dedicated (billed nodes), serverless (containers)
    burst_share: float
    rejected: int
    pod_cold_starts: int
    node_cold_starts: int
    container_cold_starts: int
    requests_waiting_on_cold_container: int
    floor_queue_peak: int
    burst_queue_peak: int
    hourly_requests: tuple[float, ...]
    hourly_goodput: tuple[float, ...]
    hourly_floor_replicas: tuple[float, ...]
    hourly_burst_containers: tuple[float, ...]
    hourly_burst_requests: tuple[float, ...]
    worst_hours: tuple[tuple[int, float], ...]  # (hour of week, goodput) below target, worst first
    planning_requests_per_s: float
    serverless_requests_per_s: float
    floor_wait_mean_s: float  # mean wait for a sequence slot on the floor
    itl_safe_inflight: int | None  # largest floor batch whose token gap meets the inter-token SLO
    focus_start_s: float = 0.0  # drills: the span tallied by minute
    focus_minute_requests: tuple[float, ...] = ()
    focus_minute_met: tuple[float, ...] = ()
    focus_ttft_max_s: float = 0.0
    diagnostics: tuple[str, ...] = ()  # why the SLO slipped, where the model can tell
    burst_backlog_threshold: float | None = None  # the floor's burst-backlog trigger (None: no such trigger)
    burst_backlog_polls: int = 0  # autoscaler polls where that trigger asked for more than every other one
    burst_backlog_replicas_added: int = 0  # floor replicas added beyond what the queue and cron triggers asked
    burst_inflight_peak: int = 0  # most requests in flight to burst at an autoscaler poll
    too_long_413: int = 0  # prompts over the product limit whose body passed the gateway's cap (raw tokens)
    too_long_400: int = 0  # prompts at or over the product limit the engine refused (prompt ≥ max_model_len)
    preemptions: int = 0  # vLLM recompute preemptions (KV cache full)
    recomputed_tokens: float = 0.0
    recompute_gpu_s: float = 0.0
    kv_admission_waits: int = 0  # requests that waited for KV blocks with a sequence slot free
    shed: int = 0  # admission control: 429 after the bounded wait
    timed_out: int = 0  # no first token within the gateway's first-byte timeout (counted failed, TTFT infinite)
    focus_minute_shed: tuple[float, ...] = ()
    non_streamed_burst: int = 0  # non-streamed requests served by burst
    non_streamed_capped: int = 0  # … whose max_tokens the burst rule capped
    non_streamed_refused: int = 0  # … refused (400) because burst requires streaming
    non_streamed_redirected: int = 0  # … that ran past Modal's web-request cap (303, a failure)
    # the plan's lower bound of the per-token gap p99 at the planned batch (derivation token_gap_p99_ms): what
    # vLLM's ITL histogram reads, where the ITL above is each request's mean gap; None without a floor
    token_gap_p99_s: float | None = None

    @property
    def admitted_goodput(self) -> float:
        """Goodput of the requests admitted (not shed with 429, not refused as over the product limit)."""
        admitted = self.requests - self.shed - self.too_long_413 - self.too_long_400
        return self.goodput * self.requests / admitted if admitted > 0 else 1.0

    @property
    def full_week(self) -> bool:
        return self.end_h - self.start_h >= HOURS_PER_WEEK - 1e-9

    @property
    def meets_slo(self) -> bool:
        if self.requests == 0:  # a window with no traffic (a weekend of an office profile): nothing to judge
            return True
        return self.goodput >= GOODPUT_TARGET and self.peak_hours_goodput >= GOODPUT_TARGET

    @property
    def cost_total_usd(self) -> float:
        return float(sum(self.cost_usd.values()))

    def monthly_usd(self) -> float | None:
        """Variable cost scaled to a month (only from whole simulated weeks)."""
        weeks = (self.end_h - self.start_h) / HOURS_PER_WEEK
        return self.cost_total_usd / weeks * WEEKS_PER_MONTH if self.full_week else None


@dataclass(frozen=True)
class SimResult:
    environment: str
    source: str
    seed: int
    endpoints: tuple[EndpointResult, ...]
    wall_requests: int = 0
    notes: tuple[str, ...] = ()

    def endpoint(self, name: str) -> EndpointResult:
        for e in self.endpoints:
            if e.endpoint == name:
                return e
        raise KeyError(name)


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------


def simulate_endpoint(
    inputs: CostInputs, spec: TopologySpec, name: str, *, seed: int = 0, trace: Trace | None = None,
    start_h: float = 0.0, end_h: float = float(HOURS_PER_WEEK), spike: Spike | None = None, overrides: Overrides | None = None,
    raw_tokens: bool = False, progress: Callable[[int], None] | None = None, rate_scale: float = 1.0,
    compiled: bool | None = None,
) -> EndpointResult:
    """Serve one endpoint's traffic over [start_h, end_h) hours of the week (Monday 00:00 local = 0).

    compiled: the numba engine (simulator/compiled.py, same results) when True, the pure-Python reference
    when False; None picks the compiled one when numba is installed and SIMULATOR_PURE_PYTHON is unset."""
    ep = spec.endpoint(name)
    ep_in = next(e for e in inputs.endpoints if e.name == name)
    rng = np.random.default_rng([seed, _stable_hash(name)])
    start_s, end_s = start_h * SECONDS_PER_HOUR, end_h * SECONDS_PER_HOUR
    if compiled is None:
        compiled = compiled_engine.available()
    elif compiled and compiled_engine.numba is None:
        raise RuntimeError("the compiled simulator needs numba: pip install numba")
    cls = compiled_engine.CompiledEndpointSim if compiled else EndpointSim
    sim = cls(inputs, ep_in, ep, start_s, end_s, rng, overrides)
    tick_s = float(ep.autoscaling.polling_interval_s) if ep.autoscaling else 15.0
    next_tick = start_s + tick_s
    chunks = arrivals(ep_in, trace, start_s, end_s, rng, spike=spike, raw_tokens=raw_tokens, chunk_s=CHUNK_S,
                      body_cap=ep.gateway.max_request_body_bytes, rate_scale=rate_scale)
    if compiled and not sim.draws_while_serving:
        # the next chunks are drawn on another core while this one is served: the same draws in the same order
        # (the simulation takes none from this generator), so the same results
        chunks = ahead(chunks)
    with contextlib.closing(chunks):  # an error while serving stops the drawing thread now, not when collected
        for chunk in chunks:
            next_tick = sim.feed(chunk, tick_s, next_tick)
            if progress is not None:
                progress(len(chunk.arrival_s))
    while next_tick <= end_s:
        sim.tick(next_tick)
        next_tick += tick_s
    sim.finish()
    return _result(sim, ep, start_h, end_h)


AHEAD_CHUNKS = 2  # chunks of arrivals drawn ahead of the one being served


def ahead(items: Iterator[T_], depth: int = AHEAD_CHUNKS) -> Iterator[T_]:
    """`items`, produced by a thread of their own up to `depth` ahead of the consumer: numpy's random draws and
    sorts release the GIL, and so do the compiled engine's kernels, so on two cores the arrivals of the next chunks
    are drawn while this one is served (a week at 3 req/s: 0.15 s of draws beside 0.2 s of serving). An error in
    the producer is raised here, at the item it would have been; a consumer that stops early stops the producer at
    its next item."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put((done, None))
        except BaseException as e:  # handed to the consumer, raised there
            q.put((done, e))

    worker = threading.Thread(target=produce, name="arrivals-ahead", daemon=True)
    worker.start()
    try:
        while True:
            item, err = q.get()
            if item is done:
                if err is not None:
                    raise err
                return
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                pass
            worker.join(timeout=0.05)


def simulate_week(
    inputs: CostInputs, spec: TopologySpec, *, seed: int = 0, trace: Trace | None = None, start_h: float = 0.0,
    end_h: float = float(HOURS_PER_WEEK), endpoints: Sequence[str] | None = None, raw_tokens: bool = False, progress: bool = False,
    spike: Spike | None = None, compiled: bool | None = None, workers: int | None = None,
) -> SimResult:
    """Every endpoint (or the named ones) of a stack over the window; progress shows a bar on a terminal.

    workers: endpoints simulated at once, in threads (None: one per CPU, up to one per endpoint, when the
    compiled engine runs — its kernels and numpy's random draws and sorts release the GIL; 1: one after the
    other). Each endpoint has its own random stream and state, so the results are the same either way."""
    names = list(endpoints) if endpoints else [e.name for e in spec.endpoints]
    bar = _progress_bar(inputs, names, start_h, end_h) if progress else None
    lock = threading.Lock()

    def update(k: int) -> None:
        with lock:
            bar.update(k)

    def run(n: str) -> EndpointResult:
        return simulate_endpoint(
            inputs, spec, n, seed=seed, trace=trace, start_h=start_h, end_h=end_h, raw_tokens=raw_tokens,
            progress=update if bar is not None else None, spike=spike, compiled=compiled,
        )

    if workers is None:
        fast = compiled if compiled is not None else compiled_engine.available()
        workers = min(len(names), os.cpu_count() or 1) if fast else 1
    if workers > 1 and len(names) > 1:
        # the busiest endpoints start first, so the last to finish is not a large one started late
        busiest = sorted(names, key=lambda n: -_expected_requests(inputs, [n], start_h, end_h))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {n: pool.submit(run, n) for n in busiest}
            out = [futures[n].result() for n in names]
    else:
        out = [run(n) for n in names]
    if bar is not None:
        bar.close()
    src = f"trace {getattr(trace, 'name', '')}" if trace is not None else "synthetic week"
    notes = (f"{trace.name}: {TRACE_SOURCES.get(trace.name, 'see traces/README.md for its source')}",) if trace else ()
    return SimResult(spec.environment, src, seed, tuple(out), sum(e.requests for e in out), notes)


def _expected_requests(inputs: CostInputs, names: Sequence[str], start_h: float, end_h: float) -> float:
    expected = 0.0
    for e in inputs.endpoints:
        if e.name in names and e.traffic.hourly_mean_requests_per_s:
            prof = np.asarray(e.traffic.hourly_mean_requests_per_s)
            hours = np.arange(math.floor(start_h), math.ceil(end_h)) % HOURS_PER_WEEK
            expected += float(prof[hours].sum()) * SECONDS_PER_HOUR
    return expected


def _progress_bar(inputs: CostInputs, names: Sequence[str], start_h: float, end_h: float):
    from tqdm import tqdm  # optional, heavy: only for long runs on a terminal

    expected = _expected_requests(inputs, names, start_h, end_h)
    return tqdm(total=int(expected), unit="req", unit_scale=True, file=sys.stderr, disable=not sys.stderr.isatty())


def _stable_hash(s: str) -> int:
    h = 0
    for ch in s.encode():
        h = (h * 131 + ch) % (2**31)
    return h


def _result(sim: EndpointSim, ep: EndpointSpec, start_h: float, end_h: float) -> EndpointResult:
    tl = sim.tally
    n = max(1, sim.n_total)
    hourly_goodput = np.where(tl.arrivals > 0, tl.met / np.maximum(tl.arrivals, 1), 1.0)
    busy = np.argsort(-tl.arrivals)[: max(1, int(math.ceil(len(tl.arrivals) * PEAK_HOURS_FRACTION)))]
    peak_good = float(tl.met[busy].sum() / max(1.0, tl.arrivals[busy].sum()))
    first_hour = int(math.floor(start_h))
    bad_hours = [(int((first_hour + h) % HOURS_PER_WEEK), float(hourly_goodput[h])) for h in range(len(hourly_goodput))
                 if tl.arrivals[h] > 0 and hourly_goodput[h] < GOODPUT_TARGET]
    bad_hours.sort(key=lambda x: x[1])
    window_s = (end_h - start_h) * SECONDS_PER_HOUR
    cost = {"reserved": 0.0, "on_demand": 0.0, "serverless": 0.0, "api": 0.0}
    gpu_h = {"dedicated": 0.0, "serverless": 0.0}
    if sim.has_floor:
        cost["reserved"] = sim.res_node_s * sim.res_node_usd_s
        cost["on_demand"] = sim.od_node_s * sim.od_node_usd_s
        gpu_h["dedicated"] = (sim.res_node_s + sim.od_node_s) * sim.gpus_per_node / SECONDS_PER_HOUR
    if sim.has_burst:
        cost["serverless"] = sim.container_usd_s
        gpu_h["serverless"] = sim.container_s_total * sim.b_gpus / SECONDS_PER_HOUR
    cost["api"] = sim.api_usd_total
    hours_len = np.full(len(tl.arrivals), SECONDS_PER_HOUR)
    hours_len[-1] = window_s - SECONDS_PER_HOUR * (len(tl.arrivals) - 1) or SECONDS_PER_HOUR
    sls_rps = 0.0
    if sim.has_burst:
        sls_rps = sim.ep.burst.planning_requests_per_s if sim.ep.burst is not None else 0.0
    return EndpointResult(
        endpoint=ep.name, tier=ep.tier, has_floor=ep.has_floor, start_h=start_h, end_h=end_h, requests=sim.n_total,
        goodput=float(tl.met.sum() / n), peak_hours_goodput=peak_good,
        ttft_p50_s=hist_quantile(tl.ttft_hist, 0.5), ttft_p99_s=hist_quantile(tl.ttft_hist, 0.99),
        itl_p50_s=hist_quantile(tl.itl_hist, 0.5), itl_p99_s=hist_quantile(tl.itl_hist, 0.99),
        ttft_slo_s=sim.ttft_slo, itl_slo_s=sim.itl_slo,
        cost_usd={k: round(v, 2) for k, v in cost.items()}, gpu_hours={k: round(v, 2) for k, v in gpu_h.items()},
        burst_share=sim.n_burst / n, rejected=sim.n_rejected,
        pod_cold_starts=sim.pod_starts, node_cold_starts=sim.node_starts,
        container_cold_starts=sim.container_launches, requests_waiting_on_cold_container=sim.cold_waits,
        floor_queue_peak=int(sim.waiting_peak_total), burst_queue_peak=int(max(0, sim.burst_waiting_peak)),
        hourly_requests=tuple(float(x) for x in tl.arrivals / (hours_len)),
        hourly_goodput=tuple(float(x) for x in hourly_goodput),
        hourly_floor_replicas=tuple(float(x) for x in tl.floor_replica_s / hours_len),
        hourly_burst_containers=tuple(float(x) for x in tl.container_s / hours_len),
        hourly_burst_requests=tuple(float(x) for x in tl.burst_requests / hours_len),
        worst_hours=tuple(bad_hours[:10]),
        planning_requests_per_s=ep.capacity.planning_requests_per_s, serverless_requests_per_s=sls_rps,
        floor_wait_mean_s=sim.floor_wait_s / max(1, sim.n_floor),
        itl_safe_inflight=sim.feng.itl_safe_batch(sim.itl_slo) if sim.has_floor else None,
        focus_start_s=tl.focus[0] if tl.focus else 0.0,
        focus_minute_requests=tuple(float(x) for x in tl.minute_arrivals),
        focus_minute_met=tuple(float(x) for x in tl.minute_met),
        focus_ttft_max_s=tl.focus_ttft_max,
        diagnostics=tuple(_diagnostics(sim, ep)),
        burst_backlog_threshold=_backlog_threshold(sim, ep), burst_backlog_polls=sim.backlog_polls,
        burst_backlog_replicas_added=sim.backlog_replicas_added, burst_inflight_peak=sim.backlog_peak,
        too_long_413=sim.n_too_long[413], too_long_400=sim.n_too_long[400], preemptions=sim.preemptions,
        recomputed_tokens=sim.recomputed_tokens, recompute_gpu_s=sim.recompute_gpu_s,
        kv_admission_waits=sim.kv_admission_waits, shed=sim.n_shed, timed_out=sim.n_timed_out,
        focus_minute_shed=tuple(float(x) for x in tl.minute_shed),
        non_streamed_burst=sim.n_ns_burst, non_streamed_capped=sim.n_ns_capped,
        non_streamed_refused=sim.n_ns_refused, non_streamed_redirected=sim.n_ns_redirected,
        token_gap_p99_s=next((d.value / 1000.0 for d in ep.derivations if d.figure == "token_gap_p99_ms"), None),
    )


def _backlog_threshold(sim: EndpointSim, ep: EndpointSpec) -> float | None:
    """The burst-backlog trigger's threshold when the simulated autoscaler has that trigger."""
    if not (sim.has_floor and sim.has_burst) or ep.autoscaling is None or sim.ov.fixed_replicas is not None:
        return None
    return ep.autoscaling.burst_backlog_threshold


def _diagnostics(sim: EndpointSim, ep: EndpointSpec) -> list[str]:
    out = []
    itl_ms = sim.itl_slo * 1000
    if sim.has_floor:
        limit = ep.gateway.overflow_inflight_per_replica if sim.has_burst else sim.feng.slots
        safe = sim.feng.itl_safe_batch(sim.itl_slo)
        if limit > safe:
            out.append(
                f"{ep.name}: a floor replica takes up to {limit} in flight "
                f"({'gateway overflow threshold' if sim.has_burst else 'max_num_seqs'}); at that batch the token gap "
                f"(decode step + the other sequences' prefill) is {sim.feng.gap_s(limit) * 1000:.0f} ms > the "
                f"{itl_ms:g} ms inter-token SLO; the largest batch within it is {safe}"
            )
    if sim.has_burst and ep.burst is not None:
        safe = sim.beng.itl_safe_batch(sim.itl_slo)
        if ep.burst.target_inputs > safe:
            out.append(
                f"{ep.name}: burst containers run up to target_inputs {ep.burst.target_inputs} (max_inputs "
                f"{ep.burst.max_inputs}); the token gap there is {sim.beng.gap_s(ep.burst.target_inputs) * 1000:.0f} ms "
                f"> {itl_ms:g} ms; the largest batch within the SLO is {safe}"
            )
        threshold = _backlog_threshold(sim, ep)
        if threshold is not None and sim.backlog_polls:
            out.append(
                f"{ep.name}: requests in flight to burst peaked at {sim.backlog_peak} (burst-backlog threshold "
                f"{threshold:g}, the burst's planned capacity); that KEDA trigger asked for more floor replicas than "
                f"the queue and cron triggers at {sim.backlog_polls} polls and added {sim.backlog_replicas_added} "
                "replicas beyond theirs (within the capped step and max replicas)"
            )
        elif sim.has_floor and sim.burst_waiting_peak > 0 and sim.waiting_peak_total == 0:
            why = ("the ScaledObject has no burst-backlog trigger, and the one on vllm:num_requests_waiting never saw "
                   "that backlog" if threshold is None else
                   f"in flight to burst peaked at {sim.backlog_peak}, never enough for the burst-backlog trigger "
                   f"(threshold {threshold:g}) to ask for more replicas than the other triggers, so the floor did not "
                   "grow from it")
            out.append(
                f"{ep.name}: up to {sim.burst_waiting_peak} requests waited in the burst tier's queue while floor "
                f"replicas had none waiting: {why}"
            )
    return out


# --------------------------------------------------------------------------------------------------
# Comparison with the planner (for `python -m topology plan`)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanComparison:
    endpoint: str
    simulated_goodput: float
    goodput_target: float
    simulated_monthly_usd: float | None  # variable cost from the simulated week + the plan's fixed shares
    planned_monthly_usd: float
    cost_delta_fraction: float | None  # (simulated − planned) / planned
    cost_tolerance_fraction: float
    ttft_p99_s: float
    itl_p99_s: float
    warnings: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.warnings


def compare_with_plan(result: EndpointResult, ep: EndpointSpec) -> PlanComparison:
    """The simulated SLO attainment and cost next to the planner's claim (SLO met at peak; its monthly cost)."""
    winner = next((a for a in ep.alternatives if a.option == ep.tier), None)
    fixed = sum(v for k, v in (winner.breakdown_usd.items() if winner else ()) if k.endswith("_fixed"))
    sim_month = result.monthly_usd()
    sim_total = None if sim_month is None else sim_month + fixed
    delta = None if sim_total is None or ep.monthly_usd <= 0 else (sim_total - ep.monthly_usd) / ep.monthly_usd
    warns = []
    if not result.meets_slo:
        worst = ", ".join(f"{hour_of_week_label(h)} {g:.1%}" for h, g in result.worst_hours[:3])
        warns.append(
            f"{ep.name}: simulated goodput {result.goodput:.2%} (busiest hours {result.peak_hours_goodput:.2%}) is below "
            f"the {GOODPUT_TARGET:.0%} the plan's p99 SLO implies" + (f"; worst hours: {worst}" if worst else "")
        )
    if delta is not None and abs(delta) > COST_TOLERANCE_FRACTION:
        warns.append(
            f"{ep.name}: simulated cost ${sim_total:,.0f}/month differs from the plan's ${ep.monthly_usd:,.0f} by "
            f"{delta:+.0%} (tolerance ±{COST_TOLERANCE_FRACTION:.0%})"
        )
    return PlanComparison(
        endpoint=ep.name, simulated_goodput=result.goodput, goodput_target=GOODPUT_TARGET,
        simulated_monthly_usd=None if sim_total is None else round(sim_total, 2), planned_monthly_usd=ep.monthly_usd,
        cost_delta_fraction=None if delta is None else round(delta, 4), cost_tolerance_fraction=COST_TOLERANCE_FRACTION,
        ttft_p99_s=result.ttft_p99_s, itl_p99_s=result.itl_p99_s, warnings=tuple(warns),
    )


def plan_check(inputs: CostInputs, spec: TopologySpec, *, seed: int = 0, progress: bool = False,
               start_h: float = 0.0, end_h: float = float(HOURS_PER_WEEK)) -> list[PlanComparison]:
    """Simulate every endpoint's synthetic week and compare with the plan (what the plan report shows).

    A full week is needed for the cost comparison (a shorter window compares goodput only). The compiled
    engine serves about 5 M requests per CPU-second: the bundled prod stack's 49 M requests/week take about
    10 s of CPU, less wall time with its endpoints in threads on more than one core (README, Benchmarks)."""
    res = simulate_week(inputs, spec, seed=seed, progress=progress, start_h=start_h, end_h=end_h)
    return [compare_with_plan(r, spec.endpoint(r.endpoint)) for r in res.endpoints]


def format_plan_check(rows: Sequence[PlanComparison], markdown: bool = False) -> str:
    head = ["endpoint", "sim goodput", "target", "sim TTFT p99", "sim ITL p99", "sim $/month", "plan $/month", "Δ cost"]
    body = []
    for r in rows:
        body.append([
            r.endpoint, f"{r.simulated_goodput:.2%}", f"≥ {r.goodput_target:.0%}", fmt_seconds(r.ttft_p99_s), fmt_seconds(r.itl_p99_s),
            "—" if r.simulated_monthly_usd is None else f"${r.simulated_monthly_usd:,.0f}", f"${r.planned_monthly_usd:,.0f}",
            "—" if r.cost_delta_fraction is None else f"{r.cost_delta_fraction:+.1%} (±{r.cost_tolerance_fraction:.0%})",
        ])
    text = table(head, body, markdown)
    warns = [w for r in rows for w in r.warnings]
    if warns:
        text += "\n" + "\n".join(("- ⚠ " if markdown else "WARNING: ") + w for w in warns)
    return text


# --------------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------------


def summary(res: SimResult, markdown: bool = False) -> str:
    """Terminal (or Markdown, for PR comments) summary of a simulation."""
    windows = {(e.start_h, e.end_h) for e in res.endpoints}
    when = (f", hours {res.endpoints[0].start_h:g}–{res.endpoints[0].end_h:g} of the week (Mon 00:00 = 0)"
            if len(windows) == 1 else "")
    title = f"Simulated {res.environment}: {res.source}, seed {res.seed}{when}"
    head = ["endpoint", "hours", "tier", "requests", "goodput", "peak-hours", "TTFT p50/p99 (SLO)", "ITL p50/p99 (SLO)",
            "burst", "cost USD (res/od/sls/api)", "GPU-h (ded/sls)", "cold starts (pod/node/ctr)", "queue peak"]
    rows = []
    for e in res.endpoints:
        c, g = e.cost_usd, e.gpu_hours
        rows.append([
            e.endpoint, f"{e.start_h:g}–{e.end_h:g}", e.tier, f"{e.requests:,}",
            "—" if not e.requests else f"{e.goodput:.2%}" + ("" if e.meets_slo else " ✗"),
            "—" if not e.requests else f"{e.peak_hours_goodput:.2%}",
            f"{fmt_seconds(e.ttft_p50_s)}/{fmt_seconds(e.ttft_p99_s)} ({fmt_seconds(e.ttft_slo_s)})",
            f"{fmt_seconds(e.itl_p50_s)}/{fmt_seconds(e.itl_p99_s)} ({fmt_seconds(e.itl_slo_s)})",
            f"{e.burst_share:.1%}",
            f"{c['reserved']:,.0f}/{c['on_demand']:,.0f}/{c['serverless']:,.0f}/{c['api']:,.0f}",
            f"{g['dedicated']:,.0f}/{g['serverless']:,.0f}",
            f"{e.pod_cold_starts}/{e.node_cold_starts}/{e.container_cold_starts}",
            f"{e.floor_queue_peak}/{e.burst_queue_peak}",
        ])
    out = [("### " if markdown else "") + title, "", table(head, rows, markdown)]
    crit = (f"Goodput = share of requests meeting both TTFT and inter-token SLOs; an endpoint meets its SLO at ≥ "
            f"{GOODPUT_TARGET:.0%} overall and over its busiest {PEAK_HOURS_FRACTION:.0%} of hours. TTFT = queue + "
            "prefill + first decode step (a 503 is a miss); ITL = a request's mean gap between tokens; a managed "
            "API's TTFT is drawn from its measured p99 and its ITL is not modelled.")
    out += ["", crit]
    for e in res.endpoints:
        if not e.requests:
            out.append(("- " if markdown else "  ") + f"{e.endpoint}: no requests in these hours; nothing to judge")
        if e.worst_hours:
            hrs = ", ".join(f"{hour_of_week_label(h)} {g:.1%}" for h, g in e.worst_hours[:5])
            out.append(("- " if markdown else "  ") + f"{e.endpoint}: hours below target: {hrs}")
        for d in e.diagnostics if not e.meets_slo else ():
            out.append(("- " if markdown else "  ") + d)
        if e.rejected:
            out.append(("- " if markdown else "  ") + f"{e.endpoint}: {e.rejected:,} requests got 503 (no ready replica)")
        if e.too_long_413 or e.too_long_400:
            out.append(("- " if markdown else "  ") + f"{e.endpoint}: {e.too_long_413 + e.too_long_400:,} prompts over "
                       f"the product limit refused ({e.too_long_413:,} × 413 at the gateway's body cap, "
                       f"{e.too_long_400:,} × 400 from the engine: a prompt of max_model_len tokens or more)")
        if e.token_gap_p99_s is not None and e.token_gap_p99_s > e.itl_slo_s:
            out.append(("- " if markdown else "  ") + f"{e.endpoint}: ITL here is each request's mean gap; per token, "
                       f"as vLLM's histogram and VllmInterTokenSloBreach read it, the plan puts the floor's p99 at "
                       f"{fmt_seconds(e.token_gap_p99_s)} or more against the {fmt_seconds(e.itl_slo_s)} SLO "
                       "(token_gap_p99_ms; README Known limits)")
        if e.preemptions or e.kv_admission_waits:
            out.append(("- " if markdown else "  ") + f"{e.endpoint}: KV cache full: {e.preemptions:,} preemptions "
                       f"recomputed {e.recomputed_tokens:,.0f} tokens ({e.recompute_gpu_s:,.0f} GPU-s); "
                       f"{e.kv_admission_waits:,} requests waited for KV blocks with a slot free")
        if e.shed:
            out.append(("- " if markdown else "  ") + f"{e.endpoint}: admission control shed {e.shed:,} requests "
                       f"({e.shed / max(1, e.requests):.2%}, 429 + Retry-After); admitted goodput "
                       f"{e.admitted_goodput:.2%}")
        if e.timed_out:
            out.append(("- " if markdown else "  ") + f"{e.endpoint}: {e.timed_out:,} requests "
                       f"({e.timed_out / max(1, e.requests):.2%}) got no first token within the gateway's first-byte "
                       "timeout and failed (the floor's queue outgrew it)")
        if e.non_streamed_capped or e.non_streamed_refused or e.non_streamed_redirected:
            out.append(("- " if markdown else "  ") + f"{e.endpoint}: non-streamed on burst: {e.non_streamed_burst:,} "
                       f"served, {e.non_streamed_capped:,} with max_tokens capped, {e.non_streamed_refused:,} refused "
                       f"(streaming required), {e.non_streamed_redirected:,} past Modal's web cap (303)")
    out += [("- " if markdown else "  ") + n for n in res.notes]
    return "\n".join(out)


def plot_week(res: SimResult, path: str | Path) -> Path:
    """One row per endpoint: demand vs floor and burst capacity (req/s), and hourly SLO attainment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    eps = res.endpoints
    fig, axes = plt.subplots(len(eps), 1, figsize=(14, 3.4 * len(eps)), squeeze=False)
    for ax, e in zip(axes[:, 0], eps):
        hours = np.arange(len(e.hourly_requests)) + math.floor(e.start_h)
        floor_cap = np.asarray(e.hourly_floor_replicas) * e.planning_requests_per_s
        burst_cap = np.asarray(e.hourly_burst_containers) * e.serverless_requests_per_s
        ax.fill_between(hours, 0, e.hourly_requests, step="post", color="#9ecae1", label="demand (req/s, hourly mean)")
        demand_top = float(np.max(e.hourly_requests)) if len(e.hourly_requests) else 0.0
        # one container can carry far more than a small endpoint's demand: keep the demand readable
        off_scale = e.serverless_requests_per_s > 4 * max(demand_top, 1e-9)
        if e.serverless_requests_per_s > 0:
            ax.step(hours, floor_cap + burst_cap, where="post", color="#e6550d", lw=1.2, ls="--",
                    label="+ burst containers running" + (
                        f" (off scale: 1 = {e.serverless_requests_per_s:.0f} req/s)" if off_scale else ""))
            ax.step(hours, e.hourly_burst_requests, where="post", color="#fd8d3c", lw=0.9,
                    label="served by burst (req/s)")
        if e.planning_requests_per_s > 0 and e.has_floor:
            ax.step(hours, floor_cap, where="post", color="#08519c", lw=1.8, label="floor replicas × planning req/s")
        top = demand_top * 1.2 if off_scale else max(demand_top, float(np.max(floor_cap + burst_cap)), 1e-9)
        ax.set_ylim(0, top * 1.45)  # room for the legend above the data
        ax.set_ylabel("requests/s")
        ax.set_title(f"{res.environment} / {e.endpoint} ({e.tier}): goodput {e.goodput:.2%}, "
                     f"TTFT p99 {fmt_seconds(e.ttft_p99_s)} (SLO {fmt_seconds(e.ttft_slo_s)}), ITL p99 {fmt_seconds(e.itl_p99_s)} "
                     f"(SLO {fmt_seconds(e.itl_slo_s)})", fontsize=10, loc="left")
        ax2 = ax.twinx()
        good = np.asarray(e.hourly_goodput) * 100
        ax2.step(hours, good, where="post", color="#31a354", lw=1.2, label="goodput % (right axis)")
        ax2.axhline(GOODPUT_TARGET * 100, color="#31a354", ls=":", lw=0.8, label=f"target {GOODPUT_TARGET:.0%}")
        low = min(90.0, float(good.min()) - 1)
        ax2.set_ylim(low, 100 + (100 - low) * 0.45)  # same legend room as the left axis
        ax2.set_yticks([v for v in matplotlib.ticker.MaxNLocator(5).tick_values(low, 100) if low <= v <= 100])
        ax2.set_ylabel("goodput %", color="#31a354")
        for d in range(int(hours[0] // 24), int(hours[-1] // 24) + 2):
            ax.axvline(d * 24, color="#bbbbbb", lw=0.5)
        ticks = [d * 24 + 12 for d in range(int(hours[0] // 24), int(hours[-1] // 24) + 1)]
        ax.set_xticks(ticks)
        ax.set_xticklabels([WEEKDAYS[(t // 24) % 7] for t in ticks])
        ax.set_xlim(hours[0], hours[-1] + 1)
        lines = ax.get_legend_handles_labels()
        lines2 = ax2.get_legend_handles_labels()
        ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=7, ncol=5, framealpha=0.9)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
