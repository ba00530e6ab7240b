"""The doctrine's five failure drills, each one command (`python -m topology simulate STACK --drill NAME`).

Each drill runs the same traffic through two variants that differ in the one thing the drill is about and
reports what changed:

- morning-cold-start: the first users after an overnight zero floor. With a floor: the plan (clock-led
  floor windows) vs a zero overnight floor that only reacts to load. Serverless only: the plan
  (scale to zero) vs one container kept warm from a cold start ahead of the rise.
- spike: k× traffic for m minutes at the busiest hour, vs the same traffic without it.
- long-prompt: pastes at the product's max context × max concurrency, landing on one replica (no gateway
  cap) vs spread by the gateway's in-flight cap; the simulator's KV model (engine.kv_fit, the one the week
  runs) shows preemptions (recompute) and how far the demand exceeds the cache.
- disconnect: x% of requests abandon mid-stream, with and without abort propagation to the engine.
- rollback: a bad revision goes live, is detected after D minutes and rolled back, with the previous
  revision kept warm (gateway flip) vs cold (replicas replaced a capped step at a time); the warm pool's
  price is shown as a second pool the size of the first from the rollout on.
"""

from __future__ import annotations

import argparse
import heapq
import math
from bisect import insort
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from topology.inputs import CostInputs, EndpointInputs
from topology.loading import InputError
from topology.spec import TopologySpec
from topology.timebase import HOURS_PER_WEEK, SECONDS_PER_HOUR

from .engine import Abandon, Engine, Overrides, Rollout, engine_for, kv_fit
from .format import fmt_seconds, table
from .simulate import simulate_endpoint
from .traffic import RequestTrace, Spike, Trace

DRILLS = ("morning-cold-start", "spike", "long-prompt", "disconnect", "rollback")


@dataclass(frozen=True)
class DrillResult:
    drill: str
    endpoint: str
    variants: tuple[str, str]
    metrics: tuple[tuple[str, str, str], ...]  # (metric, variant 1, variant 2), formatted
    values: dict[str, tuple[float, float]]  # raw numbers for tests and tools
    finding: str
    shows_effect: bool


def _ep_in(inputs: CostInputs, name: str) -> EndpointInputs:
    return next(e for e in inputs.endpoints if e.name == name)


def _profile(ep_in: EndpointInputs) -> np.ndarray:
    return np.asarray(ep_in.traffic.hourly_mean_requests_per_s or [0.0] * HOURS_PER_WEEK, dtype=float)


def peak_hour(ep_in: EndpointInputs) -> int:
    return int(np.argmax(_profile(ep_in)))


def morning_rise_hour(ep_in: EndpointInputs) -> int:
    """The steepest rise of Monday morning (00:00–12:00), after the weekend."""
    p = _profile(ep_in)
    rises = [p[h] - p[h - 1] for h in range(0, 13)]
    return int(np.argmax(rises))


RECOVERY_GAP = 0.02  # a minute counts as not recovered while its goodput trails the baseline's by > 2 points


def minutes_to_recover(res, base, after_s: float) -> float:
    """Minutes from `after_s` to the end of the last minute whose goodput trails the baseline run's same minute
    (same window, same seed) by more than RECOVERY_GAP; 0 when none does."""
    a = res.focus_start_s
    last = None
    for m, (n, met) in enumerate(zip(res.focus_minute_requests, res.focus_minute_met)):
        if n <= 0 or a + (m + 1) * 60 <= after_s:
            continue
        bn, bmet = base.focus_minute_requests[m], base.focus_minute_met[m]
        ref = bmet / bn if bn > 0 else 1.0
        if met / n < ref - RECOVERY_GAP:
            last = m
    return 0.0 if last is None else max(0.0, a + (last + 1) * 60 - after_s) / 60.0


def _focus_goodput(res) -> float:
    arr, met = sum(res.focus_minute_requests), sum(res.focus_minute_met)
    return float(met / arr) if arr else 1.0


def _admitted_goodput(res) -> float:
    arr = sum(res.focus_minute_requests) - sum(res.focus_minute_shed)
    return float(sum(res.focus_minute_met) / arr) if arr > 0 else 1.0


def _worst_admitted_minute(res, a_s: float, b_s: float) -> tuple[float, int]:
    """The lowest admitted goodput of any whole minute of the focus window inside [a_s, b_s), and which minute
    (0 = the first): the bar must hold in each minute of a spike, the first ones (before any added capacity is
    ready) included."""
    worst, at = 1.0, 0
    for m, (n, met, shed) in enumerate(zip(res.focus_minute_requests, res.focus_minute_met, res.focus_minute_shed)):
        start = res.focus_start_s + m * 60
        if start >= a_s and start + 60 <= b_s + 1e-9 and n - shed > 0 and met / (n - shed) < worst:
            worst, at = float(met / (n - shed)), int(round((start - a_s) / 60))
    return worst, at


def _shed_share(res) -> float:
    arr = sum(res.focus_minute_requests)
    return float(sum(res.focus_minute_shed) / arr) if arr else 0.0


def _sec(v: float) -> str:
    return fmt_seconds(v)


def _fmt(v: float, unit: str = "") -> str:
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    if unit == "%":
        return f"{v:.2%}"
    if unit == "s":
        return _sec(v)
    if unit == "GPU-s":
        return f"{v:,.0f} GPU-s"
    if unit == "$":
        return f"${v:,.0f}"
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.2f}"


def admission_overrides(inputs: CostInputs, spec: TopologySpec, name: str, **kw) -> Overrides:
    """The gateway's admission control as the spec sets it (the engine reads admission_* from the spec: each
    floor replica held at its per-server cap, burst at its in-flight cap, a bounded wait, then 429)."""
    return Overrides(admission=True, **kw)


class _Focused:
    """Runs the variants of one drill over the same window and seed."""

    def __init__(self, inputs, spec, name, seed, start_h, end_h, trace: Trace | None = None):
        self.a = (inputs, spec, name, seed, start_h, end_h, trace)

    def __call__(self, ov: Overrides, spike: Spike | None = None):
        inputs, spec, name, seed, start_h, end_h, trace = self.a
        return simulate_endpoint(inputs, spec, name, seed=seed, start_h=start_h, end_h=end_h, overrides=ov,
                                 spike=spike, trace=trace)


# --------------------------------------------------------------------------------------------------
# 1. Morning cold start
# --------------------------------------------------------------------------------------------------


def morning_cold_start(inputs: CostInputs, spec: TopologySpec, name: str, seed: int = 0,
                       trace: Trace | None = None) -> DrillResult:
    """No traffic and a zero floor overnight; Monday's steepest morning rise arrives. With a floor the two
    variants differ only in when the floor window opens: the plan's lead ahead of the rise, or at the rise."""
    ep, ep_in = spec.endpoint(name), _ep_in(inputs, name)
    if not ep.gated:
        return _not_applicable("morning-cold-start", name, "a managed API has no cold start of ours")
    h = morning_rise_hour(ep_in)
    start_h, end_h = h - 2.0, h + 2.0
    if start_h < 0:  # the rise is just after midnight Monday: use the same hour on Tuesday
        start_h, end_h, h = start_h + 24, end_h + 24, h + 24
    focus = (h * SECONDS_PER_HOUR, end_h * SECONDS_PER_HOUR)
    night = Spike(0.0, start_h * SECONDS_PER_HOUR, (h - start_h) * 60.0)  # overnight: no requests at all
    run = _Focused(inputs, spec, name, seed, start_h, end_h, trace)
    has_floor = ep.has_floor
    zero = tuple([0] * HOURS_PER_WEEK)
    if has_floor:
        labels = (f"clock-led floor (plan's lead {ep.floor.lead_time_s:g} s)", "floor opens at the rise (reactive)")
        floor = list(ep.floor.replicas_by_hour)
        for k in range(1, 9):  # the night before the rise: nothing running
            floor[(h - k) % HOURS_PER_WEEK] = 0
        ov_a = Overrides(focus=focus, floor_by_hour=tuple(floor), lead_time_s=ep.floor.lead_time_s, min_replicas=0)
        ov_b = Overrides(focus=focus, floor_by_hour=tuple(floor), lead_time_s=0.0, min_replicas=0,
                         burst_min_by_hour=zero if ep.burst else None)
    else:
        labels = ("as planned (scale to zero)", "one container warmed an hour ahead")
        warm = [0] * HOURS_PER_WEEK
        for k in range(-1, 3):
            warm[(h + k) % HOURS_PER_WEEK] = 1
        ov_a = Overrides(focus=focus, burst_min_by_hour=zero)
        ov_b = Overrides(focus=focus, burst_min_by_hour=tuple(warm))
    ra, rb = run(ov_a, night), run(ov_b, night)
    rows, vals = _common_rows(ra, rb)
    cold, warm_i = (1, 0) if has_floor else (0, 1)
    worse_ttft, better_ttft = vals["max TTFT"][cold], vals["max TTFT"][warm_i]
    hurt = vals["goodput (window)"][cold] < vals["goodput (window)"][warm_i] or vals["503 (no ready replica)"][cold] > 0
    # the effect: users miss the SLO, or the first of them visibly wait a cold start the other variant avoids
    visible = min(ep.serverless_cold_start_s if ep.burst else math.inf, ep.pod_cold_start_s if has_floor else math.inf)
    shows = hurt or worse_ttft - better_ttft >= 0.5 * visible
    finding = (f"{name}: Monday {h % 24:02d}:00 rise after a night of no traffic and no floor — {labels[cold]}: "
               f"goodput {vals['goodput (window)'][cold]:.2%} in the first two hours, max TTFT {_sec(worse_ttft)}, "
               f"{int(vals['503 (no ready replica)'][cold]):,} 503s; {labels[warm_i]}: "
               f"{vals['goodput (window)'][warm_i]:.2%}, max TTFT {_sec(better_ttft)} (TTFT SLO {_sec(ra.ttft_slo_s)})")
    return DrillResult("morning-cold-start", name, labels, tuple(rows), vals, finding, shows)


def _common_rows(ra, rb):
    vals = {
        "goodput (window)": (_focus_goodput(ra), _focus_goodput(rb)),
        "max TTFT": (ra.focus_ttft_max_s, rb.focus_ttft_max_s),
        "TTFT p99": (ra.ttft_p99_s, rb.ttft_p99_s),
        "503 (no ready replica)": (float(ra.rejected), float(rb.rejected)),
        "pod / node cold starts": (float(ra.pod_cold_starts + ra.node_cold_starts),
                                   float(rb.pod_cold_starts + rb.node_cold_starts)),
        "container cold starts": (float(ra.container_cold_starts), float(rb.container_cold_starts)),
        "requests waiting on a cold container": (float(ra.requests_waiting_on_cold_container),
                                                 float(rb.requests_waiting_on_cold_container)),
        "queue peak (floor/burst)": (float(ra.floor_queue_peak + ra.burst_queue_peak),
                                     float(rb.floor_queue_peak + rb.burst_queue_peak)),
        "cost (window)": (ra.cost_total_usd, rb.cost_total_usd),
    }
    units = {"goodput (window)": "%", "max TTFT": "s", "TTFT p99": "s"}
    rows = [(k, _fmt(a, units.get(k, "")), _fmt(b, units.get(k, ""))) for k, (a, b) in vals.items()]
    return rows, vals


def _not_applicable(drill: str, name: str, why: str) -> DrillResult:
    return DrillResult(drill, name, ("-", "-"), (), {}, f"{name}: not applicable — {why}", False)


# --------------------------------------------------------------------------------------------------
# 2. Spike
# --------------------------------------------------------------------------------------------------


def spike(inputs: CostInputs, spec: TopologySpec, name: str, factor: float = 3.0, minutes: float = 10.0,
          seed: int = 0, trace: Trace | None = None, hour: int | None = None) -> DrillResult:
    """`hour`: the hour of the week the spike lands in (10 minutes after it starts); default the busiest."""
    ep, ep_in = spec.endpoint(name), _ep_in(inputs, name)
    if not ep.gated:
        return _not_applicable("spike", name, "a managed API absorbs spikes on the provider's side")
    p = peak_hour(ep_in) if hour is None else int(hour)
    at = p * SECONDS_PER_HOUR + 600.0
    start_h, end_h = max(0.0, p - 0.5), p + 1.5
    focus = (at - 300.0, min(end_h * SECONDS_PER_HOUR, at + minutes * 60 + 1800.0))
    run = _Focused(inputs, spec, name, seed, start_h, end_h, trace)
    ov_a = ov_b = admission_overrides(inputs, spec, name, focus=focus)
    ra = run(ov_a)
    rb = run(ov_b, Spike(factor, at, minutes))
    rows, vals = _common_rows(ra, rb)
    adm = (_admitted_goodput(ra), _admitted_goodput(rb))
    shed = (_shed_share(ra), _shed_share(rb))
    vals["admitted goodput (window)"] = adm
    vals["shed with 429 (window)"] = shed
    rows.insert(1, ("admitted goodput (window)", _fmt(adm[0], "%"), _fmt(adm[1], "%")))
    rows.insert(2, ("shed with 429 (window)", _fmt(shed[0], "%"), _fmt(shed[1], "%")))
    spike_end = at + minutes * 60
    (worst_a, _), (worst_b, worst_minute) = _worst_admitted_minute(ra, at, spike_end), _worst_admitted_minute(rb, at, spike_end)
    worst = (worst_a, worst_b)
    vals["admitted goodput, worst spike minute"] = worst
    rows.insert(3, ("admitted goodput, worst spike minute", _fmt(worst[0], "%"), _fmt(worst[1], "%")))
    rec = minutes_to_recover(rb, ra, at + minutes * 60)
    vals["minutes to recover after the spike"] = (0.0, rec)
    rows.append(("minutes to recover after the spike", "—", f"{rec:.1f}"))
    by_backlog = ""
    if rb.burst_backlog_threshold is not None:  # floor_plus_burst: the floor also grows on the burst's backlog
        key = "replicas added by the burst-backlog trigger"
        vals[key] = (float(ra.burst_backlog_replicas_added), float(rb.burst_backlog_replicas_added))
        vals["peak in flight to burst"] = (float(ra.burst_inflight_peak), float(rb.burst_inflight_peak))
        rows.append((key, _fmt(vals[key][0]), _fmt(vals[key][1])))
        rows.append(("peak in flight to burst", _fmt(vals["peak in flight to burst"][0]),
                     _fmt(vals["peak in flight to burst"][1])))
        by_backlog = (f" ({rb.burst_backlog_replicas_added} of them by the burst-backlog trigger: in flight to burst "
                      f"peaked at {rb.burst_inflight_peak} against its threshold {rb.burst_backlog_threshold:g})")
    absorbed = (vals["container cold starts"][1] > vals["container cold starts"][0]
                or vals["pod / node cold starts"][1] > vals["pod / node cold starts"][0])
    shows = vals["goodput (window)"][1] < vals["goodput (window)"][0] or vals["queue peak (floor/burst)"][1] > \
        vals["queue peak (floor/burst)"][0] or absorbed
    finding = (f"{name}: {factor:g}× for {minutes:g} min at {_how(p)}+10 min: admitted goodput in the window "
               f"{adm[1]:.2%} (worst spike minute {worst[1]:.2%}) with {shed[1]:.2%} shed (429 after the gateway's "
               f"{ep.gateway.admission_queue_timeout_s:g} s bounded wait"
               + (f", {ep.gateway.admission_inflight_per_floor_replica} in flight per floor replica" if ep.has_floor else "")
               + f"; burst headroom {ep.burst.max_containers if ep.burst else 0} "
               f"containers, the spike needs {ep.burst.spike_containers if ep.burst else 0}); goodput of all requests "
               f"{vals['goodput (window)'][1]:.2%} (baseline {vals['goodput (window)'][0]:.2%}), "
               f"burst container launches {int(vals['container cold starts'][1] - vals['container cold starts'][0]):+d} "
               f"and replicas {int(vals['pod / node cold starts'][1] - vals['pod / node cold starts'][0]):+d} against "
               "the baseline"
               f"{by_backlog}; "
               f"goodput back to the baseline's {rec:.1f} min after the spike ended")
    if ep.burst is not None:
        # the plan's warm minimum for the spike (traffic.spike_warm_hours_fraction): held this hour or not
        if p % HOURS_PER_WEEK in ep.burst.spike_warm_hours_of_week:
            finding += (f"; {_how(p)} is one of the {len(ep.burst.spike_warm_hours_of_week)} hours the plan keeps burst "
                        f"warm for the spike (+${ep.burst.spike_warm_usd_per_month:,.0f}/month)")
        elif ep.burst.spike_warm_hours_of_week:
            finding += (f"; {_how(p)} is not an hour the plan keeps burst warm for the spike "
                        f"({len(ep.burst.spike_warm_hours_of_week)} are): a spike here waits out its first restores")
        else:
            finding += ("; the plan keeps burst warm for the spike in no hour (traffic.spike_warm_hours_fraction 0): "
                        "a spike waits out its first restores")
    cold_waits = vals["requests waiting on a cold container"][1] - vals["requests waiting on a cold container"][0]
    if worst_b < 0.99 and ep.burst is not None and cold_waits > 0:
        # what bounds the first minutes: burst containers restoring while the excess load arrives
        finding += (f"; the worst spike minute is minute {worst_minute + 1}, while burst containers restore "
                    f"({ep.serverless_cold_start_s:g} s): the warm ones run at their full {ep.burst.max_inputs} inputs "
                    f"and {int(cold_waits):,} admitted requests waited on a starting container, which then starts "
                    f"them at once (their prefills queue)")
    return DrillResult("spike", name, ("baseline", f"spike {factor:g}× {minutes:g} min"), tuple(rows), vals, finding,
                       shows)


def _how(h: int) -> str:
    return f"{('Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun')[(h // 24) % 7]} {h % 24:02d}:00"


# --------------------------------------------------------------------------------------------------
# 3. Long-prompt paste at max context × max concurrency
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KvRun:
    sequences: int
    preemptions: int
    recomputed_tokens: float
    wasted_gpu_s: float
    kv_demand_over_capacity: float  # all admitted sequences at full length ÷ the KV cache
    ttft_max_s: float
    gap_p99_s: float
    drain_s: float
    unservable: int  # longer than the whole cache: vLLM rejects them


def kv_step_replica(eng: Engine, max_seqs: int, prompts: list[float], outs: list[int], prefill_gpus: float) -> KvRun:
    """Simultaneous long prompts on one vLLM replica, served by the simulator's own replica physics: sequence
    slots, one prefill at a time, the decode line at the running batch, and the KV cache through `kv_fit` (the
    one KV model the week's simulation runs: admit when the prompt fits, preempt the newest when growth
    overflows, recompute prompt + generated tokens on its return)."""
    cap = eng.kv_capacity_tokens
    inv_p = 1.0 / eng.prefill_tokens_per_s
    slots = [0.0] * max(1, max_seqs)
    runs: list[tuple[float, float, float, float, float]] = []
    pfree = 0.0
    preempt, recomputed, unservable = 0, 0.0, 0
    firsts, gaps, fins = [], [], []
    peak_demand = sum(p + o for p, o in zip(prompts[:max_seqs], outs[:max_seqs]))
    for i, (p, o) in enumerate(zip(prompts, outs)):
        t = i * 1e-6  # pasted together, in this order
        if p + 1 > cap:
            unservable += 1  # longer than the whole cache: vLLM refuses it
            continue
        start = max(t, slots[0])
        b = min(max_seqs, sum(1 for f in fins if f > start) + 1)
        gap = eng.t_min + eng.k * b  # prefill is modelled explicitly here (one at a time), not amortised
        start, pe, fin, first, _, redo = kv_fit(runs, cap, t, start, pfree, p, p, float(o), gap, inv_p)
        pfree = max(pfree, pe)
        heapq.heapreplace(slots, fin)
        insort(runs, (fin, pe, gap, p, float(o)), key=itemgetter(0))  # kv_fit reads runs sorted by finish
        fins.append(fin)
        firsts.append(first - t)
        if o > 1:
            gaps.append((fin - first) / (o - 1))
        if redo:
            preempt += 1
            recomputed += redo
    return KvRun(
        sequences=len(prompts), preemptions=preempt, recomputed_tokens=recomputed,
        wasted_gpu_s=recomputed * inv_p * prefill_gpus,
        kv_demand_over_capacity=peak_demand / cap, ttft_max_s=max(firsts) if firsts else math.inf,
        gap_p99_s=float(np.quantile(gaps, 0.99)) if gaps else 0.0, drain_s=max(fins) if fins else 0.0,
        unservable=unservable,
    )


def long_prompt(inputs: CostInputs, spec: TopologySpec, name: str, seed: int = 0,
                trace: Trace | None = None) -> DrillResult:
    """The paste worst case; given a per-request trace (with --raw-tokens), also its prompts as they are,
    replayed at the busiest hour through the planned spike (traffic.spike_factor for spike_minutes), admission
    control on: refusals over the product limit, preemptions, goodput."""
    ep, ep_in = spec.endpoint(name), _ep_in(inputs, name)
    if not ep.gated:
        return _not_applicable("long-prompt", name, "the API's context limit is the provider's")
    s = ep_in.shape
    if not ep.has_floor:
        assert ep.burst is not None and ep.burst_capacity is not None
        pl = ep.burst_capacity
        replicas = max(1, ep.burst.max_containers)
        cap_per = ep.burst.target_inputs
    else:
        pl = ep.capacity
        replicas = max(1, ep.floor.base_replicas)  # the fewest replicas the gateway can spread over
        cap_per = ep.gateway.overflow_inflight_per_replica
    eng = engine_for(ep_in, pl, pl.usable_concurrency)
    n = pl.usable_concurrency
    prompt = float(s.product_max_context_tokens - s.max_tokens)
    out = s.max_tokens
    # no cap: a session-sticky burst (one customer pasting in parallel) lands on one replica
    a = kv_step_replica(eng, n, [prompt] * n, [out] * n, pl.gpu_fraction_per_replica)
    # with the gateway: least-in-flight across the replicas up, at most cap_per each
    per = min(cap_per, math.ceil(n / replicas))
    b = kv_step_replica(eng, n, [prompt] * per, [out] * per, pl.gpu_fraction_per_replica)
    vals = {
        "long sequences on the busiest replica": (float(a.sequences), float(b.sequences)),
        "KV demand ÷ KV cache": (a.kv_demand_over_capacity, b.kv_demand_over_capacity),
        "preemptions": (float(a.preemptions), float(b.preemptions)),
        "recomputed prompt tokens": (a.recomputed_tokens, b.recomputed_tokens),
        "GPU-s wasted on recompute": (a.wasted_gpu_s, b.wasted_gpu_s),
        "max TTFT": (a.ttft_max_s, b.ttft_max_s),
        "inter-token p99": (a.gap_p99_s, b.gap_p99_s),
        "time to drain": (a.drain_s, b.drain_s),
    }
    units = {"max TTFT": "s", "inter-token p99": "s", "time to drain": "s", "GPU-s wasted on recompute": "GPU-s"}
    rows = [(k, _fmt(x, units.get(k, "")), _fmt(y, units.get(k, ""))) for k, (x, y) in vals.items()]
    fits = int(pl.kv_capacity_tokens // s.product_max_context_tokens)
    shows = a.preemptions > b.preemptions or a.kv_demand_over_capacity > 1 >= b.kv_demand_over_capacity
    finding = (f"{name}: {n} pastes of {prompt:,.0f} + {out} tokens; one replica's KV cache holds {fits} at max context. "
               f"Without the cap: {a.preemptions} preemptions, KV demand {a.kv_demand_over_capacity:.1f}× the cache "
               f"(an OOM without vLLM's accounting); with the gateway spreading {per} per replica over {replicas}: "
               f"{b.preemptions} preemptions")
    if isinstance(trace, RequestTrace):
        finding += "; " + _replay_row(inputs, spec, name, seed, trace, rows, vals)
    return DrillResult("long-prompt", name, ("no gateway cap (one replica)", f"gateway cap ({per}/replica)"),
                       tuple(rows), vals, finding, shows)


def _replay_row(inputs, spec, name, seed, trace, rows, vals) -> str:
    ep_in = _ep_in(inputs, name)
    p = peak_hour(ep_in)
    t = ep_in.traffic
    at = p * SECONDS_PER_HOUR + 600.0
    start_h, end_h = p, p + 0.5
    r = simulate_endpoint(inputs, spec, name, seed=seed, trace=trace, start_h=start_h, end_h=end_h, raw_tokens=True,
                          spike=Spike(t.spike_factor, at, t.spike_minutes),
                          overrides=admission_overrides(inputs, spec, name))
    refused = r.too_long_413 + r.too_long_400
    replay = {
        "replay: requests": float(r.requests),
        "replay: refused over the product limit (413/400)": float(refused),
        "replay: preemptions": float(r.preemptions),
        "replay: shed (429)": float(r.shed),
        "replay: goodput": r.goodput,
        "replay: admitted goodput": r.admitted_goodput,
    }
    for k, v in replay.items():
        vals[k] = (v, v)
        rows.append((k, "—", _fmt(v, "%" if "goodput" in k else "")))
    return (f"{trace.name} replayed with its own prompts at {_how(p)} through a {t.spike_factor:g}× "
            f"{t.spike_minutes:g}-min spike: {refused:,} of {r.requests:,} refused over the product limit "
            f"({r.too_long_413:,} × 413, {r.too_long_400:,} × 400), {r.preemptions:,} preemptions "
            f"({r.recomputed_tokens:,.0f} tokens recomputed), {r.shed:,} shed; goodput {r.goodput:.2%}, "
            f"admitted {r.admitted_goodput:.2%}")


# --------------------------------------------------------------------------------------------------
# 4. Mid-stream disconnects
# --------------------------------------------------------------------------------------------------


def disconnect(inputs: CostInputs, spec: TopologySpec, name: str, fraction: float = 0.2, seed: int = 0,
               trace: Trace | None = None) -> DrillResult:
    ep, ep_in = spec.endpoint(name), _ep_in(inputs, name)
    if not ep.gated:
        return _not_applicable("disconnect", name, "the API bills and stops generation on its side")
    p = peak_hour(ep_in)
    start_h, end_h = max(0.0, p - 1.0), p + 1.0
    focus = (start_h * SECONDS_PER_HOUR, end_h * SECONDS_PER_HOUR)
    run = _Focused(inputs, spec, name, seed, start_h, end_h, trace)
    ab_a, ab_b = Abandon(fraction, propagate=True), Abandon(fraction, propagate=False)
    ov_a, ov_b = Overrides(focus=focus, abandon=ab_a), Overrides(focus=focus, abandon=ab_b)
    ra, rb = run(ov_a), run(ov_b)
    gpu_s_a = (ra.gpu_hours["dedicated"] + ra.gpu_hours["serverless"]) * SECONDS_PER_HOUR
    gpu_s_b = (rb.gpu_hours["dedicated"] + rb.gpu_hours["serverless"]) * SECONDS_PER_HOUR
    vals = {
        "requests abandoned": (float(ab_a.abandoned), float(ab_b.abandoned)),
        "GPU-s generating for nobody": (ab_a.wasted_gpu_s, ab_b.wasted_gpu_s),
        "share of billed GPU-s": (ab_a.wasted_gpu_s / max(gpu_s_a, 1e-9), ab_b.wasted_gpu_s / max(gpu_s_b, 1e-9)),
        "goodput (window)": (_focus_goodput(ra), _focus_goodput(rb)),
        "burst share": (ra.burst_share, rb.burst_share),
        "cost (window)": (ra.cost_total_usd, rb.cost_total_usd),
    }
    units = {"GPU-s generating for nobody": "GPU-s", "share of billed GPU-s": "%", "goodput (window)": "%",
             "burst share": "%"}
    rows = [(k, _fmt(x, units.get(k, "")), _fmt(y, units.get(k, ""))) for k, (x, y) in vals.items()]
    shows = ab_b.wasted_gpu_s > 0 and ab_a.wasted_gpu_s == 0
    finding = (f"{name}: {fraction:.0%} abandon mid-stream over {_how(max(0, p - 1))}–{_how(p + 1)}: without abort "
               f"propagation {ab_b.wasted_gpu_s:,.0f} GPU-s ({vals['share of billed GPU-s'][1]:.1%} of billed GPU-s) "
               f"generate tokens nobody reads; with it, none")
    if abs(rb.cost_total_usd - ra.cost_total_usd) <= 0.001 * max(ra.cost_total_usd, 1e-9):
        # the window's bill does not move when what it pays for runs anyway: the floor's replicas, and burst
        # containers held warm in these hours; the waste then takes capacity instead of money
        paid = ("the floor and the burst's warm containers are paid regardless" if ep.has_burst
                else "the floor's replicas are paid regardless")
        finding += (f"; the window's cost is the same either way ({paid}): the waste takes capacity instead"
                    + (f" — burst share {ra.burst_share:.1%} → {rb.burst_share:.1%} — which in an hour without a warm "
                       "minimum would be billed" if ep.has_burst else
                       ", which the floor then lacks for the requests that are read"))
    return DrillResult("disconnect", name, ("abort propagates", "no abort propagation"), tuple(rows), vals, finding,
                       shows)


# --------------------------------------------------------------------------------------------------
# 5. Bad-model rollback
# --------------------------------------------------------------------------------------------------


def rollback(inputs: CostInputs, spec: TopologySpec, name: str, detect_minutes: float = 10.0, seed: int = 0,
             trace: Trace | None = None) -> DrillResult:
    """A bad candidate, detected `detect_minutes` after it starts taking traffic, at each stage the endpoint's rollout
    settings give it (spec.rollout: shadow share, canary share, N−1 warm replicas and days). Without a rollout in the
    spec there is no warm N−1 to read: the drill says so and compares a whole previous pool kept warm with none."""
    ep, ep_in = spec.endpoint(name), _ep_in(inputs, name)
    if not ep.gated:
        return _not_applicable("rollback", name, "the API's model version is the provider's")
    ro_spec = ep.rollout
    p = peak_hour(ep_in)
    at = p * SECONDS_PER_HOUR - 1800.0
    start_h, end_h = max(0.0, p - 1.0), p + 1.5
    focus = (at, end_h * SECONDS_PER_HOUR)
    run = _Focused(inputs, spec, name, seed, start_h, end_h, trace)
    # after promotion: everything serves the bad version until detection, then the warm N−1 takes over (or not)
    ro_a, ro_b = Rollout(at, detect_minutes * 60, warm=True), Rollout(at, detect_minutes * 60, warm=False)
    base = run(Overrides(focus=focus))
    ra, rb = run(Overrides(focus=focus, rollout=ro_a)), run(Overrides(focus=focus, rollout=ro_b))
    detected = at + detect_minutes * 60
    rec_a, rec_b = minutes_to_recover(ra, base, detected), minutes_to_recover(rb, base, detected)
    vals = {
        "bad responses served": (float(ro_a.bad_requests), float(ro_b.bad_requests)),
        "minutes from detection to baseline goodput": (rec_a, rec_b),
        "minutes from rollout to last bad replica out": (
            ((ro_a.recovered_s or math.inf) - at) / 60, ((ro_b.recovered_s or math.inf) - at) / 60),
        "goodput (from rollout)": (_focus_goodput(ra), _focus_goodput(rb)),
        "pod / node cold starts": (float(ra.pod_cold_starts + ra.node_cold_starts),
                                   float(rb.pod_cold_starts + rb.node_cold_starts)),
        "container cold starts": (float(ra.container_cold_starts), float(rb.container_cold_starts)),
    }
    units = {"goodput (from rollout)": "%"}
    # requests in the detection window at the drill's hour (the half hour before the peak hour), from the inputs
    rate = float(_profile(ep_in)[(p - 1) % HOURS_PER_WEEK])
    window_requests = rate * detect_minutes * 60
    if ro_spec is None:
        # no rollout settings: the warm variant stands for a whole previous pool, priced as a second pool
        held = (end_h * SECONDS_PER_HOUR - at) / ((end_h - start_h) * SECONDS_PER_HOUR)
        vals["cost of the warm N−1 pool (window)"] = (base.cost_total_usd * held, 0.0)
        units["cost of the warm N−1 pool (window)"] = "$"
        variants = ("N−1 kept warm (whole pool: no rollout configured)", "cold redeploy")
        coverage = ""
    else:
        warm = ro_spec.previous.replicas if ro_spec.previous is not None else ro_spec.previous_warm_replicas
        days = ro_spec.previous_warm_days
        serving = max(1, math.ceil(float(_profile(ep_in)[p]) * ep_in.traffic.within_hour_peak_factor
                                   / ep.capacity.planning_requests_per_s - 1e-9))
        # what a bad candidate reaches at each stage before it is caught
        vals["bad answers to users if caught in shadow"] = (0.0, 0.0)  # mirrored answers are discarded
        vals["requests mirrored to it in shadow"] = (round(window_requests * ro_spec.shadow_percent / 100),) * 2
        vals["bad answers to users if caught in canary"] = (round(window_requests * ro_spec.canary_percent / 100),) * 2
        vals["N−1 replicas warm / serving at the drill hour"] = (float(warm), float(serving))
        vals["N−1 warm price per day / for the window"] = (ro_spec.previous_warm_usd_per_day,
                                                          ro_spec.previous_warm_usd_per_day * days)
        units["N−1 warm price per day / for the window"] = "$"
        partial = warm < serving
        variants = (f"N−1 warm ×{warm} for {days} d" + (" (bound: fewer than serving)" if partial else ""), "cold redeploy")
        coverage = (f"; stages: shadow shows users 0 bad answers ({ro_spec.shadow_percent:g}% mirrored), canary "
                    f"{ro_spec.canary_percent:g}% of users ≈ {window_requests * ro_spec.canary_percent / 100:,.0f} bad answers "
                    f"before detection, promotion {ro_a.bad_requests:,}")
        if partial:
            coverage += (f"; the configured warm minimum ({warm}) is below the {serving} replicas serving at this hour: "
                         f"the warm column is a bound — the other {serving - warm} come back cold")
    same = {"bad answers to users if caught in shadow", "requests mirrored to it in shadow",
            "bad answers to users if caught in canary"}  # the same in both variants: N−1 matters after promotion only
    pair = {"N−1 replicas warm / serving at the drill hour", "N−1 warm price per day / for the window"}
    rows = [(k, f"{_fmt(x, units.get(k, ''))} / {_fmt(y, units.get(k, ''))}", "") if k in pair else
            (k, _fmt(x, units.get(k, "")), "same" if k in same else _fmt(y, units.get(k, ""))) for k, (x, y) in vals.items()]
    shows = rec_b > rec_a and ro_b.bad_requests >= ro_a.bad_requests
    finding = (f"{name}: bad version at {_how(p)}−30 min, detected after {detect_minutes:g} min: goodput back to baseline "
               f"{rec_a:.1f} min after detection with N−1 warm vs {rec_b:.1f} min cold; "
               f"{ro_a.bad_requests:,} vs {ro_b.bad_requests:,} bad responses after promotion{coverage}")
    return DrillResult("rollback", name, variants, tuple(rows), vals, finding, shows)


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def run_drill(drill: str, inputs: CostInputs, spec: TopologySpec, args: argparse.Namespace, markdown: bool = False,
              trace: Trace | None = None) -> str:
    if not (1.0 < args.spike_factor <= 100):
        raise InputError(f"--spike-factor {args.spike_factor:g}: allowed above 1 and at most 100")
    if not (0 < args.spike_minutes <= 120):
        raise InputError(f"--spike-minutes {args.spike_minutes:g}: allowed above 0 and at most 120")
    if not (0 < args.abandon_fraction <= 1):
        raise InputError(f"--abandon-fraction {args.abandon_fraction:g}: allowed above 0 and at most 1")
    hour = getattr(args, "spike_hour", None)
    if hour is not None and not (0 <= hour < HOURS_PER_WEEK):
        raise InputError(f"--spike-hour {hour}: allowed 0 to {HOURS_PER_WEEK - 1} (hours of the week, Monday 00:00 = 0)")
    if not (0 <= args.detect_minutes <= 240):
        raise InputError(f"--detect-minutes {args.detect_minutes:g}: allowed 0 to 240")
    names = args.endpoint or [e.name for e in spec.endpoints]
    results = []
    for n in names:
        if drill == "morning-cold-start":
            results.append(morning_cold_start(inputs, spec, n, seed=args.seed, trace=trace))
        elif drill == "spike":
            results.append(spike(inputs, spec, n, args.spike_factor, args.spike_minutes, seed=args.seed, trace=trace,
                                 hour=getattr(args, "spike_hour", None)))
        elif drill == "long-prompt":  # a fixed worst case; with --trace --raw-tokens also a replay of its prompts
            results.append(long_prompt(inputs, spec, n, seed=args.seed,
                                       trace=trace if getattr(args, "raw_tokens", False) else None))
        elif drill == "disconnect":
            results.append(disconnect(inputs, spec, n, args.abandon_fraction, seed=args.seed, trace=trace))
        else:
            results.append(rollback(inputs, spec, n, args.detect_minutes, seed=args.seed, trace=trace))
    return format_drills(spec.environment, drill, results, markdown)


def format_drills(env: str, drill: str, results: list[DrillResult], markdown: bool = False) -> str:
    out = [("### " if markdown else "") + f"Drill {drill} on {env}"]
    for r in results:
        out.append("")
        out.append(("**" if markdown else "") + r.finding + ("**" if markdown else ""))
        if r.metrics:
            out.append("")
            out.append(table(["metric", r.variants[0], r.variants[1]], [list(m) for m in r.metrics], markdown))
    return "\n".join(out)
