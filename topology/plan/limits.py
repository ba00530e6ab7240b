"""Limits at the edges of the plan: what a spike the endpoint must absorb costs in burst headroom, how
non-streamed requests fit under Modal's web-request cap, what a p99 prompt costs in KV cache, and the
gateway's admission control beyond all that. Pure functions: typed inputs → typed outputs with the arithmetic."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from ..costs import BYTES_PER_GIB
from ..inputs import EndpointInputs
from ..spec import Derivation
from ..token_shape import Z_P99, lognormal_params
from .placement import Placement
from .serverless import service_time_s

# Modal answers a web request that runs past 150 s with a 303 redirect (shared/notes/facts.md, "Checked
# against upstream"): OpenAI clients do not follow it, so a non-streamed burst request must finish within it.
MODAL_WEB_REQUEST_CAP_S = 150
WEB_CAP_MARGIN_S = 5.0  # connection setup and response write-out inside the cap


@dataclass(frozen=True)
class NonStreamedRule:
    rule: str  # fits | cap_max_tokens | floor_only | require_streaming
    max_tokens: int | None
    derivation: Derivation


def non_streamed_burst_rule(ep: EndpointInputs, sls: Placement, has_floor: bool, cold_start_s: float) -> NonStreamedRule:
    """How a non-streamed request sent to burst finishes within Modal's cap. Before its first token it waits
    either up to the TTFT budget (queue + prefill + first token, on a ready container) or, landing on a container
    that is still restoring (the gateway cannot see Modal's containers, so whenever the burst scales up under
    load a request can, and Modal's clock runs while it waits), the restore cold_start_s and then the restored
    container's first intake: it takes up to n waiting requests at once, so the last prefills after n − 1 mean
    prompts, then its own p99 prompt and one token gap. The longer of the two is budgeted. Then it decodes at the container's token gap at full batch (the slowest it
    runs): the decode step usable_concurrency / decode_tokens_per_s plus the other sequences' prefill amortised
    over their output (as the simulator's engine). The tokens that fit: ⌊(cap − margin − that wait) / gap⌋. All of max_tokens fit → 'fits'; else when the tokens
    that fit cover the p99 output (the cap truncates < 1% of answers) → 'cap_max_tokens'; else with a floor →
    'floor_only' (the floor has no such cap); else (serverless only) 'cap_max_tokens' while the tokens that fit
    cover the mean output, and 'require_streaming' below that."""
    ttft_s = ep.slo.ttft_p99_ms / 1000.0
    s = ep.shape
    n = sls.usable_concurrency
    # token gap at full batch: the decode step plus the other sequences' prefill amortised over their output
    step_s = n / sls.decode_tokens_per_s
    others_prefill_s = (n - 1) * s.input_tokens_mean * (1 - ep.prefix_cache_hit_fraction) / sls.prefill_tokens_per_s \
        / s.output_tokens_mean
    gap_s = step_s + others_prefill_s
    uncached = 1 - ep.prefix_cache_hit_fraction
    restored_s = (cold_start_s + (n - 1) * s.input_tokens_mean * uncached / sls.prefill_tokens_per_s
                  + s.input_tokens_p99 * uncached / sls.prefill_tokens_per_s + gap_s)
    first_s = max(ttft_s, restored_s)
    budget_s = MODAL_WEB_REQUEST_CAP_S - WEB_CAP_MARGIN_S - first_s
    fit = max(0, math.floor(budget_s / gap_s))
    if fit >= s.max_tokens:
        rule, mt = "fits", None
    elif fit >= s.output_tokens_p99:
        rule, mt = "cap_max_tokens", fit
    elif has_floor:
        rule, mt = "floor_only", None
    elif fit >= s.output_tokens_mean:  # no floor to send them to: a cap truncating > 1% beats refusing them all
        rule, mt = "cap_max_tokens", fit
    else:
        rule, mt = "require_streaming", None
    d = Derivation(
        figure="non_streamed_burst_max_tokens", value=float(fit), unit="tokens",
        formula=f"⌊({MODAL_WEB_REQUEST_CAP_S} s cap − {WEB_CAP_MARGIN_S:g} s margin − max({ttft_s:g} s TTFT budget, "
        f"{cold_start_s:g} s restore + ({n - 1} × {s.input_tokens_mean:g} mean + {s.input_tokens_p99:g} p99 prompt) "
        f"× (1 − {ep.prefix_cache_hit_fraction:g}) / {sls.prefill_tokens_per_s:g} tok/s + one gap = {restored_s:.2f} s "
        f"on a restoring container)) / "
        f"({n} / {sls.decode_tokens_per_s:g} tok/s step + {n - 1} × {s.input_tokens_mean:g} × "
        f"(1 − {ep.prefix_cache_hit_fraction:g}) / {sls.prefill_tokens_per_s:g} / {s.output_tokens_mean:g} others' "
        f"prefill = {gap_s * 1000:.1f} ms/token)⌋ = {fit} vs max_tokens {s.max_tokens}, output p99 "
        f"{s.output_tokens_p99:g} → {rule}",
        inputs=("slo.ttft_p99_ms", "engine.decode_tokens_per_s", "shape.max_tokens", "shape.output_tokens_p99",
                "cold_starts.serverless_snapshot_restore_s"),
    )
    return NonStreamedRule(rule, mt, d)


@dataclass(frozen=True)
class SpikeHeadroom:
    containers: int  # burst containers the spike needs above the floor
    usd_per_spike: float  # what one such spike costs in burst containers (nothing while none happens)
    derivation: Derivation


def spike_headroom(ep: EndpointInputs, peak_rps: np.ndarray, floor_rps: np.ndarray, sls: Placement,
                   usd_per_container_s: float, cold_start_s: float) -> SpikeHeadroom:
    """Containers for traffic.spike_factor × the within-hour peak above what the floor carries that hour, at the
    container's planning rate. The cap costs nothing until used (Modal bills running containers only); one spike
    bills the extra containers for its minutes + their cold start + the scaledown window."""
    t = ep.traffic
    need = np.maximum(0.0, peak_rps * t.spike_factor - floor_rps)
    containers = int(math.ceil(float(need.max()) / sls.planning_rps - 1e-9)) if need.max() > 0 else 0
    base = int(math.ceil(float(np.maximum(0.0, peak_rps - floor_rps).max()) / sls.planning_rps - 1e-9))
    extra = max(0, containers - base)
    held_s = t.spike_minutes * 60.0 + cold_start_s + ep.serverless.scaledown_window_s
    usd = extra * held_s * usd_per_container_s
    d = Derivation(
        figure="spike_burst_containers", value=float(containers), unit="containers",
        formula=f"⌈max over hours ({t.spike_factor:g} × peak − floor capacity) / {sls.planning_rps:.3f}⌉ = "
        f"{containers} ({extra} above the planned peak's {base}); one {t.spike_minutes:g}-min spike bills {extra} × "
        f"({t.spike_minutes * 60:g} + {cold_start_s:g} cold + {ep.serverless.scaledown_window_s} scaledown) s × "
        f"${usd_per_container_s * 3600:.2f}/h = ${usd:,.2f}; the cap itself costs nothing",
        inputs=("traffic.spike_factor", "traffic.spike_minutes", "serverless.scaledown_window_s"),
    )
    return SpikeHeadroom(containers, usd, d)


@dataclass(frozen=True)
class SpikeWarm:
    containers: np.ndarray  # (hours,) warm containers held for the spike: 0 outside the protected hours
    needed: np.ndarray  # (hours,) what each hour would need to carry the spike on ready containers
    protected: np.ndarray  # (hours,) bool: the hours the plan keeps warm (the busiest, where anything is needed)
    at_peak: tuple[float, ...]  # at the busiest hour, for the derivation: p, floor req/s, a0, a1, I0, I_plat, need, g


def spike_warm_by_hour(ep: EndpointInputs, peak_rps: np.ndarray, floor_by_hour: np.ndarray, pl: Placement | None,
                       sls: Placement, cold_start_s: float, floor_inflight_per_replica: int) -> SpikeWarm:
    """Warm burst containers that carry traffic.spike_factor × the hour's peak while the containers the spike
    makes Modal launch restore (a cold start R), in the busiest traffic.spike_warm_hours_fraction of hours.

    The gateway cannot see Modal's containers: below its in-flight cap it sends the excess over the floor to
    burst, and a request landing on a restoring container waits R there. So ready containers must hold what is
    in flight to burst until the launched ones are ready. The floor holds o in flight per replica (the pick's
    overflow threshold), serving F·o / D_f req/s (D_f its service time at o); burst gets a = (rate − F·o/D_f)⁺.
    Before the spike a₀ at the hour's peak p, during it a₁ at f·p: in flight to burst rises from I₀ = a₀·D(T)
    at g = a₁ − a₀ per second until it levels at I_plat = a₁·D(M) (D(b) the container's service time at batch
    b; under the spike each runs at its max_inputs M). Modal launches at target_inputs T per container, each
    ready R later with M places: launches made when I was x give x·M/T places R later, enough for x + g·R once
    x ≥ x* = g·R·T/(M − T). Below x* only warm containers hold it, so the warm places needed are
    min(I_plat, max(I₀ + g·R, g·R·M/(M − T))) — in containers ⌈…/M⌉, at most serverless.max_containers_cap
    (beyond it the gateway's burst cap sends the rest to the floor's queue, then 429)."""
    t = ep.traffic
    H = len(peak_rps)
    F = np.asarray(floor_by_hour, dtype=float) if pl is not None else np.zeros(H)
    o = max(1, int(floor_inflight_per_replica))
    floor_rps = F * o / float(service_time_s(ep, pl, o)) if pl is not None else np.zeros(H)
    M = sls.usable_concurrency
    T = sls.planned_inflight
    d_t, d_m = float(service_time_s(ep, sls, T)), float(service_time_s(ep, sls, M))
    a0 = np.maximum(0.0, peak_rps - floor_rps)
    a1 = np.maximum(0.0, t.spike_factor * peak_rps - floor_rps)
    g = a1 - a0
    i0, iplat = a0 * d_t, a1 * d_m
    chase = g * cold_start_s * M / (M - T) if M > T else np.full(H, np.inf)  # M = T: launches never catch up
    need = np.minimum(iplat, np.maximum(i0 + g * cold_start_s, chase))
    needed = np.minimum(ep.serverless.max_containers_cap, np.ceil(need / M - 1e-9)).astype(int)
    n = math.ceil(t.spike_warm_hours_fraction * H - 1e-9)
    protected = np.zeros(H, bool)
    protected[np.argsort(-peak_rps, kind="stable")[:n]] = True
    protected &= needed > 0
    h = int(np.argmax(peak_rps))
    return SpikeWarm(np.where(protected, needed, 0), needed, protected,
                     (float(peak_rps[h]), float(floor_rps[h]), float(a0[h]), float(a1[h]), float(i0[h]),
                      float(iplat[h]), float(need[h]), float(g[h])))


def spike_warm_derivation(ep: EndpointInputs, sw: SpikeWarm, sls: Placement, cold_start_s: float,
                          usd_per_month: float) -> Derivation:
    t = ep.traffic
    p, cf, a0, a1, i0, iplat, need, g = sw.at_peak
    M = sls.usable_concurrency
    T = sls.planned_inflight
    uncapped = int(math.ceil(need / M - 1e-9))
    return Derivation(
        figure="spike_warm_containers", value=float(sw.containers.max(initial=0)), unit="containers",
        formula=f"busiest hour: p {p:.2f} req/s, floor carries {cf:.2f} at its overflow threshold → burst "
        f"{a0:.2f} → {a1:.2f} req/s under {t.spike_factor:g}×; in flight to burst {i0:,.0f} rising {g:.2f}/s to "
        f"{iplat:,.0f}; warm places min({iplat:,.0f}, max({i0:,.0f} + {g:.2f} × {cold_start_s:g} s restore, "
        f"{g:.2f} × {cold_start_s:g} × {M} / ({M} − {T}))) = {need:,.0f} → ⌈{need:,.0f} / {M}⌉ = {uncapped} "
        f"containers, at most serverless.max_containers_cap {ep.serverless.max_containers_cap}; held as "
        f"min_containers in {int(sw.protected.sum())} hour(s) ({t.spike_warm_hours_fraction:g} of the week, busiest "
        f"first): +${usd_per_month:,.0f}/month",
        inputs=("traffic.spike_factor", "traffic.spike_warm_hours_fraction", "serverless.max_containers_cap",
                "cold_starts.serverless_snapshot_restore_s"),
    )


def p99_mean_prompt_factor(mean: float, p99: float, n: int) -> float:
    """The p99 of the mean of n prompts over the mean prompt, prompts lognormal (mean, p99): Fenton–Wilkinson,
    the mean of n independent lognormals taken as a lognormal with the same mean and variance,
    σ_n² = ln(1 + (e^σ² − 1)/n). 1 for n = 0 (no neighbours)."""
    if n <= 0 or p99 <= mean:
        return 1.0
    s2 = math.log1p(math.expm1(lognormal_params(mean, p99)[1] ** 2) / n)
    return math.exp(-s2 / 2 + Z_P99 * math.sqrt(s2))


def token_gap_s(ep: EndpointInputs, pl: Placement, batch: int, prompt_factor: float = 1.0) -> float:
    """A sequence's token gap at this batch: the decode step t_min + b·k plus the b − 1 neighbours' prefill
    amortised over their output, their prompts at `prompt_factor` × the mean (placement's gap(b) at 1)."""
    s = ep.shape
    prefill_per_token = s.input_tokens_mean * (1 - ep.prefix_cache_hit_fraction) / pl.prefill_tokens_per_s \
        / s.output_tokens_mean
    return pl.decode_step_floor_s + batch * pl.decode_step_s_per_sequence + (batch - 1) * prefill_per_token * prompt_factor


def saturated_rps_at(ep: EndpointInputs, pl: Placement, batch: int) -> float:
    """Requests/s one replica serves held at `batch` sequences: 1 / (mean prefill + ō × t(b) / b), the
    placement's saturated rate at its own batch."""
    s = ep.shape
    prefill_s = s.input_tokens_mean * (1 - ep.prefix_cache_hit_fraction) / pl.prefill_tokens_per_s
    step_s = pl.decode_step_floor_s + batch * pl.decode_step_s_per_sequence
    return 1.0 / (prefill_s + s.output_tokens_mean * step_s / batch)


def p99_freed_together(batch: int, output_tokens_mean: float) -> int:
    """The p99 of how many of a full replica's `batch` sequences end at the same decode step: vLLM ends a sequence
    at a step's boundary, and with geometric outputs of mean ō each running sequence ends at a given step with
    probability 1/ō, so the count is Binomial(batch, 1/ō). The smallest k with P(K ≤ k) ≥ 0.99 (at least 1)."""
    p = min(1.0, 1.0 / max(output_tokens_mean, 1.0))
    cdf = 0.0
    for k in range(batch + 1):
        cdf += math.comb(batch, k) * p ** k * (1.0 - p) ** (batch - k)
        if cdf >= 0.99 - 1e-12:
            return max(1, k)
    return max(1, batch)


def floor_overflow(adm: "Admission", pl: Placement) -> int:
    """The gateway's overflow threshold per floor replica: the planned batch, never above the admission cap (past
    the cap a replica queues in HAProxy, so the overflow to burst must come first)."""
    return min(adm.inflight_per_replica, pl.planned_inflight)


@dataclass(frozen=True)
class Admission:
    queue_timeout_s: float
    retry_after_s: int
    inflight_per_replica: int  # sequences the gateway lets one floor replica hold (HAProxy per-server maxconn)
    saturated_rps: float  # what one replica held there serves: the rate its bounded queue drains at
    derivations: tuple[Derivation, ...]
    queue_per_replica: int = 1  # requests one replica admits within the wait: the queue's length per replica


def admission(ep: EndpointInputs, pl: Placement, cold_start_s: float) -> Admission:
    """The gateway's admission control, so that an admitted request keeps both SLOs while every replica is full.

    In flight per replica: placement sizes the batch (max_num_seqs) for the inter-token SLO at the *mean*
    prompt, which is the batch the planned utilisation rarely reaches; under a spike every replica sits there,
    and whenever its neighbours' prompts run above the mean the gap passes the SLO. The gateway holds each
    replica at the largest batch whose gap meets the SLO with the neighbours' mean prompt at its p99
    (p99_mean_prompt_factor), never above max_num_seqs. The bounded wait: what is left of the TTFT budget after
    the prefill queue a request admitted at the end of its wait meets, a p99 prompt's prefill and the first
    token's gap at that batch (a request admitted later could not meet its TTFT SLO anyway). The prefill queue:
    HAProxy hands every slot a replica frees to the oldest queued requests at once (2.6 src/queue.c
    process_srv_queue dequeues while the server serves fewer than its maxconn), and a full replica frees the
    slots of the sequences that end at one decode step together — at the p99 k of them (p99_freed_together) —
    so the last of the k new prompts prefills after the k − 1 others, each a mean uncached prompt at the
    measured prefill rate. Retry-After: the burst's cold start (capacity added now serves then), at least 1 s."""
    s = ep.shape
    ttft_s = ep.slo.ttft_p99_ms / 1000.0
    itl_s = ep.slo.inter_token_p99_ms / 1000.0
    cap = 1
    for b in range(pl.usable_concurrency, 0, -1):
        if token_gap_s(ep, pl, b, p99_mean_prompt_factor(s.input_tokens_mean, s.input_tokens_p99, b - 1)) <= itl_s:
            cap = b
            break
    factor = p99_mean_prompt_factor(s.input_tokens_mean, s.input_tokens_p99, cap - 1)
    gap_s = token_gap_s(ep, pl, cap, factor)
    prefill_s = s.input_tokens_p99 * (1 - ep.prefix_cache_hit_fraction) / pl.prefill_tokens_per_s
    freed = p99_freed_together(cap, s.output_tokens_mean)
    mean_prefill_s = s.input_tokens_mean * (1 - ep.prefix_cache_hit_fraction) / pl.prefill_tokens_per_s
    ahead_s = (freed - 1) * mean_prefill_s
    wait = max(0.0, ttft_s - ahead_s - prefill_s - gap_s)
    retry = max(1, math.ceil(cold_start_s))
    rps = saturated_rps_at(ep, pl, cap)
    d_cap = Derivation(
        figure="admission_inflight_per_floor_replica", value=float(cap), unit="sequences",
        formula=f"largest b ≤ max_num_seqs {pl.usable_concurrency} with t_min {pl.decode_step_floor_s * 1000:.2f} ms + "
        f"b × {pl.decode_step_s_per_sequence * 1000:.3f} ms + (b − 1) neighbours' prefill at the p99 of their mean "
        f"prompt (×{factor:.2f} the mean for b = {cap}) = {gap_s * 1000:.1f} ms ≤ {itl_s * 1000:g} ms ITL SLO → {cap}; "
        f"held there a replica serves {rps:.3f} req/s",
        inputs=("slo.inter_token_p99_ms", "shape.input_tokens_mean", "shape.input_tokens_p99", "engine.decode_tokens_per_s"),
    )
    d_wait = Derivation(
        figure="admission_queue_timeout_s", value=round(wait, 3), unit="s",
        formula=f"{ttft_s:g} s TTFT − ({freed} − 1) new prompts ahead in the prefill queue (p99 of the {cap} "
        f"sequences ending at one decode step, Binomial({cap}, 1/{s.output_tokens_mean:g}); HAProxy hands their "
        f"slots to the queue at once) × {s.input_tokens_mean:g} × (1 − {ep.prefix_cache_hit_fraction:g}) / "
        f"{pl.prefill_tokens_per_s:g} tok/s = {ahead_s * 1000:.1f} ms − {s.input_tokens_p99:g} × "
        f"(1 − {ep.prefix_cache_hit_fraction:g}) / {pl.prefill_tokens_per_s:g} tok/s prefill − {gap_s * 1000:.1f} ms "
        f"first-token gap at {cap} in flight = {wait:.3f} s; then 429, Retry-After {retry} s",
        inputs=("slo.ttft_p99_ms", "shape.input_tokens_mean", "shape.input_tokens_p99", "shape.output_tokens_mean",
                "prefix_cache_hit_fraction"),
    )
    # the queue: a request further back than one replica admits within the wait would wait it out and get 429
    queue = max(1, math.ceil(rps * round(wait, 3)))
    d_queue = Derivation(
        figure="admission_queue_per_floor_replica", value=float(queue), unit="requests",
        formula=f"max(1, ⌈μ {rps:.3f} req/s (a replica at the admission cap of {cap}) × w {wait:.3f} s⌉) = {queue}: "
        f"requests one replica admits within the wait; past that many per replica up, 429 at once",
        inputs=("slo.ttft_p99_ms", "slo.inter_token_p99_ms", "shape.input_tokens_mean", "shape.output_tokens_mean"),
    )
    return Admission(round(wait, 3), retry, cap, rps, (d_cap, d_wait, d_queue), queue)


@dataclass(frozen=True)
class KvAtP99:
    sequences: int  # sequences one replica's KV cache holds at the planned p99 prompt
    warning: str | None
    derivation: Derivation


def kv_at_p99_prompt(ep: EndpointInputs, pl: Placement, admitted_per_replica: int) -> KvAtP99:
    """What the endpoint's p99 prompt costs in KV cache: sequences of (p99 prompt + mean output) one replica holds,
    against what the gateway admits per replica. When fewer fit, a replica full of long prompts preempts
    (vLLM recomputes the newest) — the report says so rather than shrinking every replica's admission for
    a 1% prompt (the simulator's raw-token replay counts those preemptions)."""
    s = ep.shape
    per_seq = s.input_tokens_p99 + s.output_tokens_mean
    fits = int(pl.kv_capacity_tokens // per_seq)
    warn = None
    if fits < admitted_per_replica:
        warn = (f"{ep.name}: at the planned p99 prompt ({s.input_tokens_p99:g} tokens + {s.output_tokens_mean:g} out) "
                f"one replica's KV cache ({pl.kv_capacity_tokens:,.0f} tokens) holds {fits} sequences, the gateway "
                f"admits {admitted_per_replica}: a replica whose in-flight prompts run long preempts and recomputes "
                f"(vLLM); at the mean prompt it holds {int(pl.kv_capacity_tokens // (s.input_tokens_mean + s.output_tokens_mean))}")
    d = Derivation(
        figure="kv_sequences_at_p99_prompt", value=float(fits), unit="sequences",
        formula=f"⌊{pl.kv_capacity_tokens:,.0f} KV tokens / ({s.input_tokens_p99:g} + {s.output_tokens_mean:g})⌋ = {fits} "
        f"vs {admitted_per_replica} admitted per replica",
        inputs=("shape.input_tokens_p99", "shape.output_tokens_mean"),
    )
    return KvAtP99(fits, warn, d)


def spike_warm_for(ep: EndpointInputs, peak_rps: np.ndarray, floor_by_hour: np.ndarray | None, pl: Placement | None,
                   sls: Placement, cold_start_s: float) -> SpikeWarm:
    """spike_warm_by_hour for an option: with a floor (pl), the floor holds the gateway's overflow threshold per
    replica (the lower of the admission cap and the planned batch, as gateway_spec sets it); serverless only, none."""
    if pl is None or floor_by_hour is None:
        return spike_warm_by_hour(ep, peak_rps, np.zeros(len(peak_rps)), None, sls, cold_start_s, 1)
    return spike_warm_by_hour(ep, peak_rps, floor_by_hour, pl, sls, cold_start_s,
                              floor_overflow(admission(ep, pl, 0.0), pl))


# vLLM 0.11.0's default token budget per engine step for the OpenAI server (engine/arg_utils.py _set_default_args):
# 8,192 on a device of at least 70 GiB that is not an A100, else 2,048. Chunked prefill is always on in V1, so a
# prompt is prefilled in chunks of (budget − running decodes) tokens, each inside a decode step.
STEP_TOKEN_BUDGET_LARGE = 8192
STEP_TOKEN_BUDGET_SMALL = 2048
TOKEN_GAP_QUANTILE = 0.99
_PROMPT_NODES = 4000  # quantile nodes of the prompt distribution


@functools.lru_cache(maxsize=1)
def _normal_nodes() -> np.ndarray:
    """Standard normal quantiles at the midpoints of _PROMPT_NODES equal-probability cells."""
    nd = NormalDist()
    return np.array([nd.inv_cdf((i + 0.5) / _PROMPT_NODES) for i in range(_PROMPT_NODES)])


def default_step_token_budget(pl: Placement) -> int:
    """vLLM's rule applied to the memory a replica's engine has per GPU — on a MIG slice, the slice's. vLLM itself
    reads the memory through NVML by the device index, which on a MIG slice is the parent GPU's (platforms/cuda.py
    get_device_total_memory), or fails and falls back to the small budget: its own pick there depended on the
    environment. The plan pins this value on the command line instead (step_token_budget)."""
    device_gib = pl.memory_gb / pl.gpus_per_replica * 1e9 / BYTES_PER_GIB
    large = device_gib >= 70 and "A100" not in pl.gpu_kind.upper()
    return STEP_TOKEN_BUDGET_LARGE if large else STEP_TOKEN_BUDGET_SMALL


def step_token_budget(pl: Placement, max_num_seqs: int) -> int:
    """The --max-num-batched-tokens an engine on this placement runs: the rule above, never below max_num_seqs
    (vLLM's SchedulerConfig refuses a budget under it)."""
    return max(default_step_token_budget(pl), max_num_seqs)


@dataclass(frozen=True)
class TokenGap:
    p99_s: float  # the per-token gap's 99th percentile at the planned batch (what vLLM's ITL histogram records)
    step_s: float  # a decode step without prefill, t(b)
    stalled_share: float  # share of tokens whose step also carries a prompt's chunk
    warning: str | None
    derivation: Derivation
    saturated: bool = False  # one prompt a step cannot keep up: prompts pack, and p99 is not bounded above here


def token_gap_p99(ep: EndpointInputs, pl: Placement, batch: int) -> TokenGap:
    """The inter-token gap every token sees, as vLLM's `vllm:inter_token_latency_seconds` histogram (and the
    VllmInterTokenSloBreach alert) records it, at the planned batch: a step without prefill takes t(b); a step that
    carries a chunk of c prompt tokens takes t(b) + c/P, and every running sequence's token waits that long. At the
    replica's planned rate λ, prompts (uncached share of the shape's lognormal) arrive and are cut into chunks of
    (budget − b) tokens; the share of steps with a chunk is λ·E[chunks] over the steps a second holds, and the p99
    is t(b) plus the chunk quantile that puts 1% of all tokens above it (t(b) alone when fewer than 1% stall).
    A lower bound: each prompt's chunks are taken alone, where vLLM packs prompts that queue into one step's budget
    (larger chunks, fewer steps) — tight while prefill is light (prod assist: 157 ms against 162 ms replayed step by
    step), short under heavy prefill (autocomplete 67 against 84 ms, guard on a whole H100 30 against 72 ms).
    The placement sizes b on each request's mean gap, t(b) + (b − 1)·p̄/ō (placement.py), which spreads the same
    prefill over every token: this is the tail that mean hides. Checked against a step-by-step replay of vLLM's
    budgeted packing (tests/test_token_gap.py), not against a GPU."""
    s, h = ep.shape, ep.prefix_cache_hit_fraction
    t_b = pl.decode_step_floor_s + batch * pl.decode_step_s_per_sequence
    budget = step_token_budget(pl, pl.usable_concurrency)  # what the engine is given (engine.py)
    room = max(budget - batch, 1)
    lam = pl.planning_rps
    mu, sigma = lognormal_params(s.input_tokens_mean * (1 - h), s.input_tokens_p99 * (1 - h)) if h < 1 else (0.0, 0.0)
    u = np.maximum(np.exp(mu + sigma * _normal_nodes()), 1.0)
    full = np.floor(u / room)
    rest = u - full * room
    n_chunks = full + (rest > 0)
    # chunk sizes over all stall steps, each prompt's weight 1/N: full chunks of `room`, one remainder
    sizes = np.concatenate([np.full(1, float(room)), rest[rest > 0]])
    weights = np.concatenate([[full.sum()], np.ones(int((rest > 0).sum()))]) / _PROMPT_NODES
    e_chunks, e_u = float(n_chunks.mean()), float(u.mean())
    prefill_busy = lam * e_u / pl.prefill_tokens_per_s  # seconds a second spent on prefill tokens
    stall_steps = lam * e_chunks
    # the second's time left for steps without a chunk; none: one prompt a step cannot keep up, prompts then queue
    # and vLLM packs them into steps of up to `room` tokens, which this estimate does not bound
    slack = 1.0 - stall_steps * t_b - prefill_busy
    saturated = slack <= 0.0
    plain_steps = max(slack, 0.0) / t_b
    share = stall_steps / (plain_steps + stall_steps) if plain_steps + stall_steps > 0 else 1.0
    tail = 1.0 - TOKEN_GAP_QUANTILE
    if share <= tail:
        p99 = t_b
    else:
        order = np.argsort(sizes)
        cum = np.cumsum(weights[order]) / weights.sum()
        c = float(sizes[order][min(int(np.searchsorted(cum, 1.0 - tail / share)), len(cum) - 1)])
        p99 = t_b + c / pl.prefill_tokens_per_s
    slo_s = ep.slo.inter_token_p99_ms / 1000.0
    warn = None
    packed_s = t_b + room / pl.prefill_tokens_per_s
    if saturated and packed_s > slo_s:
        warn = (f"{ep.name}: per-token gap p99 between {p99 * 1000:.0f} and {packed_s * 1000:.0f} ms at the planned "
                f"batch of {batch} (inter_token_p99_ms {ep.slo.inter_token_p99_ms:g}): at {lam:.3f} req/s a replica "
                "cannot prefill one prompt a step, so prompts queue and vLLM packs them into steps of up to "
                f"{room} prompt tokens (a budget of {budget}); the plan sizes the batch on each request's mean "
                "gap, so VllmInterTokenSloBreach (per token) may read the SLO as breached (README Known limits)")
    elif p99 > slo_s:
        warn = (f"{ep.name}: per-token gap p99 at least {p99 * 1000:.0f} ms at the planned batch of {batch} > "
                f"inter_token_p99_ms {ep.slo.inter_token_p99_ms:g}: {share:.0%} of tokens share an engine step with a "
                f"prompt's chunk (a budget of {budget} tokens a step, chunks up to {room}); the plan sizes the "
                "batch on each request's mean gap, so vLLM's ITL histogram and VllmInterTokenSloBreach (per token) "
                "will read the SLO as breached at planned load (README Known limits)")
    d = Derivation(
        figure="token_gap_p99_ms", value=round(p99 * 1000, 1), unit="ms",
        formula=f"t(b={batch}) {t_b * 1000:.1f} ms; {lam:.3f} req/s × {e_chunks:.2f} chunks of ≤{room} tokens → "
        f"{share:.1%} of steps carry a chunk{' (saturated: prompts queue and pack)' if saturated else ''}; "
        "p99 ≥ t(b) + the chunk that puts 1% of tokens above it / "
        f"{pl.prefill_tokens_per_s:g} tok/s = {p99 * 1000:.1f} ms (a lower bound: queued prompts share a step; SLO "
        f"{ep.slo.inter_token_p99_ms:g} ms, planned on the mean gap)",
        inputs=("shape.input_tokens_mean", "shape.input_tokens_p99", "prefix_cache_hit_fraction",
                "engine.prefill_tokens_per_s", "slo.inter_token_p99_ms"),
    )
    return TokenGap(p99, t_b, share, warn, d, saturated)
