"""The simulator's engine: one endpoint's requests through its floor, gateway, autoscaler and burst tier.

The model (measured figures come from the inputs, decisions from the spec):

- A replica (dedicated or a burst container) holds at most `c` sequences (the spec's usable concurrency /
  burst max_inputs). Requests wait FIFO for a slot: per replica a heap of slot-free times, O(log c).
- Prefill is one server per replica (the GPU runs one prefill at a time): a request's uncached prompt
  (prompt × (1 − prefix_cache_hit_fraction)) waits for the replica's previous prefill, then runs at the
  measured prefill tok/s.
- Decode: the step time at batch b is t(b) = t_min + b·k (t_min reads the weights once; t(max_seqs) =
  max_seqs / measured decode tok/s — the planner's placement figures). Each token gap also carries the
  amortised prefill of the other b − 1 sequences (chunked prefill shares the GPU): gap = t(b) + (b−1)·p̄/ō.
  b is the replica's in-flight count when the request starts. At b = c this reproduces the planner's
  saturated requests/s; below it, lightly loaded replicas decode faster, as real engines do.
- Gateway: least-in-flight floor replica; at `overflow_inflight_per_replica` in flight (or no ready
  floor replica) the request overflows to burst; with no burst tier it queues on the floor, and with no
  ready replica at all it gets a 503.
- Dedicated autoscaler (KEDA → HPA), every polling interval: desired = max(cron floor window,
  ⌈waiting / target⌉, burst backlog, min) ≤ max, where the burst-backlog trigger (floor_plus_burst, when
  the spec sets burst_backlog_threshold; a Value metric) asks for ⌈current × in flight to burst / threshold⌉
  (current = starting + ready replicas; in flight to burst = running in burst containers + waiting in their
  queues, at the poll); scale-up uses the lowest desired over the up-stabilization window,
  scale-down the highest over the down window; steps capped per period. A new replica is ready after the
  pod cold start on a node with room, else the node cold start; an emptied on-demand node goes after
  NODE_SCALE_DOWN_S.
- Burst (Modal): containers launched when in-flight exceeds target_inputs × containers (+ buffer),
  up to max_containers; each serves after the (snapshot or not) cold start; an idle container stops
  after the scaledown window unless the clock-following minimum holds it (then its idle time restarts when
  the minimum lets it go); billed launch to stop.
- Managed API: billed per request; its latency is the measured p99 TTFT (lognormal, σ from a 2× p99/p50).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right, insort
from collections import deque
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from topology.costs import serverless_container_usd_per_s
from topology.inputs import CostInputs, EndpointInputs
from topology.spec import EndpointSpec, ReplicaCapacity
from topology.timebase import MINUTES_PER_WEEK, SECONDS_PER_HOUR
from topology.windows import floor_windows

from .traffic import Chunk

NODE_SCALE_DOWN_S = 600.0  # cluster-autoscaler scale-down-unneeded-time default
GATEWAY_SWITCH_S = 5.0  # gateway config reload that flips traffic to a warm pool
HIST_BINS = 3000
HIST_LO = -5.0  # log10 seconds
HIST_PER_DECADE = 300  # 0.77 % bin width: percentiles good to < 1 %
API_P99_OVER_P50 = 2.0

_FINISH = itemgetter(0)  # a run's finish time: run lists are kept sorted by it (see kv_fit)

# request flags
FLOOR, BURST, API, REJECTED = 0, 1, 2, 3
BAD = 4  # added: served by a bad revision (or otherwise failed after being served: Modal's 303)
TOO_LONG = 8  # with REJECTED: over the product limit (413/400) or refused by the burst's streaming rule (400)
SHED = 16  # with REJECTED: admission control's 429 after the bounded wait
# with REJECTED: no first token within the gateway's first-byte timeout; the gateway ends the request and vLLM aborts
# it on the disconnect, so it holds no slot or KV afterwards. Counted as a failure with an infinite TTFT.
TIMED_OUT = 32


@dataclass(frozen=True)
class Engine:
    """Per-replica physics: slots, prefill rate and the decode line t(b) = t_min + b·k, plus the amortised
    prefill of the other sequences per token gap (`interference`, s per other sequence)."""

    slots: int
    prefill_tokens_per_s: float
    t_min: float
    k: float
    interference: float
    kv_capacity_tokens: float
    gpus: float  # GPUs one replica bills (fractional for MIG slices)
    planned_uncached_prompt: float = 0.0  # the mean uncached prompt `interference` was computed from (0: fixed)

    @property
    def interference_per_token(self) -> float:
        """Interference per uncached prompt token of another in-flight sequence (s per token per token gap):
        the planned mean's interference scaled by the prompts actually in flight."""
        return self.interference / self.planned_uncached_prompt if self.planned_uncached_prompt > 0 else 0.0

    @property
    def a0(self) -> float:
        return self.t_min - self.interference

    @property
    def a1(self) -> float:
        return self.k + self.interference

    def gap_s(self, batch: int) -> float:
        """Token gap at batch b: t(b) + (b − 1)·interference."""
        return self.a0 + self.a1 * batch

    def itl_safe_batch(self, itl_slo_s: float) -> int:
        """Largest batch whose token gap stays within the inter-token SLO."""
        return max(0, min(self.slots, int((itl_slo_s - self.a0) / self.a1))) if self.a1 > 0 else self.slots


def engine_for(ep_in: EndpointInputs, cap: ReplicaCapacity, slots: int) -> Engine:
    """The decode line from the spec's replica physics (the planner's measured rates, weights over bandwidth)."""
    s, h = ep_in.shape, ep_in.prefix_cache_hit_fraction
    interference = s.input_tokens_mean * (1 - h) / cap.prefill_tokens_per_s / s.output_tokens_mean
    return Engine(
        slots=slots, prefill_tokens_per_s=cap.prefill_tokens_per_s, t_min=cap.decode_step_floor_s,
        k=cap.decode_step_s_per_sequence, interference=interference,
        kv_capacity_tokens=cap.kv_capacity_tokens, gpus=cap.gpu_fraction_per_replica,
        planned_uncached_prompt=s.input_tokens_mean * (1 - h),
    )


@dataclass
class Rollout:
    """A bad revision goes live at `at_s`; detected `detect_s` later; rolled back warm (N−1 kept) or cold."""

    at_s: float
    detect_s: float
    warm: bool
    recovered_s: float | None = None  # filled by the engine: when the last bad replica stopped serving
    bad_requests: int = 0
    phase: str = "pending"  # pending → bad → rollback → done


@dataclass
class Abandon:
    """A share of requests disconnects mid-stream; with propagation the engine aborts them at once."""

    fraction: float
    propagate: bool
    wasted_gpu_s: float = 0.0
    abandoned: int = 0


@dataclass
class Overrides:
    """What drills change: a different floor by hour or cron lead, no burst minimum, traffic to the API, …"""

    floor_by_hour: tuple[int, ...] | None = None
    lead_time_s: float | None = None
    rollout: Rollout | None = None
    abandon: Abandon | None = None
    min_replicas: int | None = None  # replaces the autoscaler's minimum (a drill's zero floor)
    burst_min_by_hour: tuple[int, ...] | None = None  # replaces the burst minimum schedule
    focus: tuple[float, float] | None = None  # [start_s, end_s): tally this span by minute
    engine: Engine | None = None  # replaces the floor replica's physics (queueing-theory checks)
    fixed_replicas: int | None = None  # exactly this many floor replicas, no autoscaler
    admission: bool = False  # the gateway's admission control (bounded wait, then 429) as the spec sets it (drills turn it on)


@dataclass
class Tally:
    """Running totals; the result is built from these."""

    start_s: float
    end_s: float
    hours: int
    arrivals: np.ndarray = field(init=False)
    met: np.ndarray = field(init=False)
    burst_requests: np.ndarray = field(init=False)
    rejected: np.ndarray = field(init=False)
    floor_replica_s: np.ndarray = field(init=False)
    container_s: np.ndarray = field(init=False)
    waiting_peak: np.ndarray = field(init=False)
    ttft_hist: np.ndarray = field(init=False)
    itl_hist: np.ndarray = field(init=False)
    ttft_max: float = 0.0
    focus: tuple[float, float] | None = None
    minute_arrivals: np.ndarray = field(init=False)
    minute_met: np.ndarray = field(init=False)
    minute_shed: np.ndarray = field(init=False)
    focus_ttft_max: float = 0.0

    def __post_init__(self) -> None:
        m = int(math.ceil((self.focus[1] - self.focus[0]) / 60.0)) if self.focus else 0
        self.minute_arrivals = np.zeros(m)
        self.minute_met = np.zeros(m)
        self.minute_shed = np.zeros(m)
        h = self.hours
        self.arrivals = np.zeros(h)
        self.met = np.zeros(h)
        self.burst_requests = np.zeros(h)
        self.rejected = np.zeros(h)
        self.floor_replica_s = np.zeros(h)
        self.container_s = np.zeros(h)
        self.waiting_peak = np.zeros(h)
        self.ttft_hist = np.zeros(HIST_BINS)
        self.itl_hist = np.zeros(HIST_BINS)


def hist_index(x: np.ndarray) -> np.ndarray:
    # the same operations in place (one temporary, not five): a week's tallies run this on 100 M values
    v = np.maximum(x, 1e-12)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.log10(v, out=v)
    v -= HIST_LO
    v *= HIST_PER_DECADE
    v[~np.isfinite(x)] = HIST_BINS - 1
    np.clip(v, 0, HIST_BINS - 1, out=v)
    return v.astype(np.int64)


def hist_quantile(hist: np.ndarray, q: float) -> float:
    total = hist.sum()
    if total <= 0:
        return float("nan")
    i = int(np.searchsorted(np.cumsum(hist), q * total))
    i = min(i, HIST_BINS - 1)
    if i == HIST_BINS - 1:
        return float("inf")
    return float(10 ** (HIST_LO + (i + 1) / HIST_PER_DECADE))  # bin's upper edge: never optimistic


def kv_fit(runs: list[tuple[float, float, float, float, float]], cap: float, t: float, start: float,
       pfree: float, kvp: float, uncached: float, out: float, gap: float,
       inv_p: float) -> tuple[float, float, float, float, bool, float]:
    """vLLM's KV accounting for one new sequence on a replica whose in-flight sequences `runs` (finish, decode
    start, token gap, prompt, output; sorted by finish) may, grown to full length, not fit the cache `cap` (tokens).

    The model (vLLM v1 scheduler, FCFS): a waiting request is admitted only when its prompt fits the free
    KV blocks; each decode step adds one token per running sequence; when a step cannot allocate, the most
    recently admitted running request is preempted — its blocks freed — and waits at the head of the queue;
    re-admitted once its prompt + generated tokens fit, it recomputes them as a prefill and continues. Here
    the new sequence is the most recently admitted one, so it is the one preempted; the sequences already
    running were checked on their own admission and fit without it. Occupancy grows linearly between
    finishes, so the overflow instant is interpolated between them. Returns (start, prefill end, finish,
    first token time, whether it waited for KV blocks, tokens recomputed after a preemption (0: none)).
    The simulator's one KV model: the week's replicas and the long-prompt drill both run it.

    Checked against vllm-project/vllm vllm/v1/core/sched/scheduler.py (commit 00024d31): under FCFS a running
    request that cannot allocate blocks makes `self.running.pop()` (the last admitted) preempted;
    `_preempt_request` frees its blocks, sets num_computed_tokens = 0 and prepends it to the waiting queue.
    Not modelled: a freed block's prefix-cache hit on the recompute (counted as a full recompute), a second
    preemption of the same request, and the recompute's place in the replica's prefill queue."""
    del runs[:bisect_right(runs, t, key=_FINISH)]
    waited = False
    # `runs` is sorted by finish (callers insert with insort): only sequences still running at `start` can hold
    # KV then or later, so the ones that finish before it (the queue ahead of this request when the replica is
    # behind) drop out exactly, and the arrays stay near the slot count however long the queue grows
    live = runs[bisect_right(runs, start, key=_FINISH):]
    if kvp + out + sum(x[3] + x[4] for x in live) <= cap:
        # everything still running at its start, grown to full length, fits with it: no wait, no preemption
        # (the caller's check counted the queue ahead too, which has left by then)
        ps = max(start, pfree)
        pe_i = ps + uncached * inv_p
        return start, pe_i, pe_i + out * gap, pe_i + gap, False, 0.0
    if live:
        a = np.asarray(live)
        fin, pe, g, pr, ou = a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4]
    else:
        fin = pe = g = pr = ou = np.zeros(0)

    def occ(tau: np.ndarray, after: bool) -> np.ndarray:
        """KV tokens the running sequences hold at each tau (after: once those finishing at tau left)."""
        tt = tau[:, None]
        alive = fin[None, :] > tt if after else fin[None, :] >= tt
        held = pr[None, :] + np.clip((tt - pe[None, :]) / g[None, :], 0.0, ou[None, :])
        return np.where(alive, held, 0.0).sum(axis=1)

    ends = np.sort(fin)
    if kvp + 1 > cap:  # cannot happen under vLLM's start-up check (max_model_len fits the cache)
        raise ValueError(f"a {kvp:.0f}-token prompt exceeds the {cap:.0f}-token KV cache")
    # admission: the prompt must fit the free blocks when it starts
    if occ(np.array([start]), True)[0] + kvp > cap:
        later = ends[ends > start]
        free = occ(later, True) + kvp <= cap
        start = float(later[np.argmax(free)]) if free.any() else float(ends[-1])
        waited = True
    ps = max(start, pfree)
    pe_i = ps + uncached * inv_p
    fin_i = pe_i + out * gap
    first = pe_i + gap
    # growth: the first instant the running sequences plus this one overflow the cache
    cand = np.concatenate([ends[(ends > ps) & (ends < fin_i)], [fin_i]])
    mine = kvp + np.clip((cand - pe_i) / gap, 0.0, out)
    left = occ(cand, False) + mine
    over = np.nonzero(left > cap)[0]
    if over.size == 0:
        return start, pe_i, fin_i, first, waited, 0.0
    kk = int(over[0])
    t0 = ps if kk == 0 else float(cand[kk - 1])
    right0 = occ(np.array([t0]), True)[0] + kvp + min(max((t0 - pe_i) / gap, 0.0), out)
    lk = float(left[kk])
    tau = t0 + (cap - right0) / (lk - right0) * (float(cand[kk]) - t0) if lk > right0 else t0
    tau = max(tau, t0)
    gen = min(max((tau - pe_i) / gap, 0.0), out)
    gen = float(math.floor(gen))
    need = kvp + gen
    # re-admitted at the first finish after which the others' KV leaves room for prompt + generated tokens
    later = ends[ends > tau]
    if later.size:
        free = occ(later, True) + need <= cap
        back = float(later[np.argmax(free)]) if free.any() else float(later[-1])
    else:
        back = tau
    redo_s = need * inv_p  # recompute: the prompt and the generated tokens, no prefix cache credit
    fin_new = back + redo_s + (out - gen) * gap
    if gen < 1:
        first = back + redo_s + gap
    return start, pe_i, fin_new, first, waited, need


class EndpointSim:
    """One endpoint, one run. `feed(chunk)` in time order, then `finish()`."""

    def __init__(self, inputs: CostInputs, ep_in: EndpointInputs, ep: EndpointSpec, start_s: float, end_s: float,
                 rng: np.random.Generator, ov: Overrides | None = None) -> None:
        self.inp, self.ep_in, self.ep, self.rng = inputs, ep_in, ep, rng
        self.ov = ov or Overrides()
        self.start_s, self.end_s = start_s, end_s
        hours = int(math.ceil((end_s - start_s) / 3600.0 - 1e-9))
        self.tally = Tally(start_s, end_s, max(1, hours), focus=self.ov.focus)
        gw = ep.gateway
        # admission control: a request that cannot start within the bounded wait gets 429 (None: no limit)
        self.admission_wait_s = (gw.admission_queue_timeout_s if self.ov.admission and gw.admission_queue_timeout_s
                                 else math.inf)
        adm = self.ov.admission
        # with admission control HAProxy holds a floor replica at admission_inflight_per_floor_replica (its
        # maxconn) and the floor pick overflows at the lower of that and the overflow threshold
        # (components/gateway_config.py: floor_cap, pick_threshold)
        self.floor_cap = gw.admission_inflight_per_floor_replica if adm and gw.admission_inflight_per_floor_replica > 0 else 0
        # the gateway sees only its own in-flight count to burst (acl burst_full: be_conn(burst) ≥ the cap), never
        # Modal's containers: below the cap a request goes to burst and waits there (a restore included); at
        # the cap it waits in HAProxy's queue for a floor slot (with no floor, a burst one), bounded, then 429
        self.burst_cap = (float(gw.admission_burst_inflight) if adm and ep.has_burst and gw.admission_burst_inflight > 0
                          else math.inf)
        # a request that finds its replica full waits in HAProxy's backend queue, which hands it to the first
        # replica slot to free (leastconn among those with room); without admission it queues at the replica
        self.floor_queue = adm
        # non-streamed requests on burst: Modal's web-request cap and the planner's rule for them
        b = ep.burst
        self.ns_rule = b.non_streamed_rule if b is not None and ep.has_burst else None
        self.ns_max_tokens = b.non_streamed_max_tokens if b is not None and b.non_streamed_max_tokens else 1 << 30
        self.web_cap_s = float(b.web_request_cap_s) if b is not None else math.inf
        self.ns_fraction = ep_in.traffic.non_streamed_fraction
        self.ns_rng = rng.spawn(1)[0]  # spawning draws nothing from rng: the other streams stay as they were
        self.ttft_slo = ep_in.slo.ttft_p99_ms / 1000.0
        self.itl_slo = ep_in.slo.inter_token_p99_ms / 1000.0
        self.hit = ep_in.prefix_cache_hit_fraction
        cap = ep.capacity
        self.has_floor = ep.has_floor
        self.has_burst = ep.has_burst
        self.is_api = not ep.gated
        prices = inputs.prices
        # --- dedicated floor
        if self.has_floor:
            slots = cap.usable_concurrency
            if 0 < self.floor_cap < slots:
                slots = self.floor_cap  # the gateway's maxconn: the engine never runs more than it lets in
            self.feng = self.ov.engine or engine_for(ep_in, cap, slots)
            self.rpn = cap.replicas_per_node
            od = prices.dedicated_on_demand_usd_per_gpu_hour[cap.gpu_kind]
            self.od_node_usd_s = od * cap.gpus_per_node / SECONDS_PER_HOUR
            self.res_node_usd_s = od * (1 - prices.reserved_discount_fraction) * cap.gpus_per_node / SECONDS_PER_HOUR
            self.gpus_per_node = cap.gpus_per_node
            self.reserved_nodes = math.ceil(ep.floor.reserved_replicas / self.rpn) if ep.floor.reserved_replicas else 0
            self.cron = self._cron_by_minute()
        # --- burst
        if self.has_burst:
            b, bcap = ep.burst, ep.burst_capacity
            assert b is not None and bcap is not None
            gpus = b.gpus_per_container
            self.beng = engine_for(ep_in, bcap, b.max_inputs)
            self.b_gpus = gpus
            # what a running container bills a second: its GPUs and the cores and memory the spec reserves
            self.b_usd_s = serverless_container_usd_per_s(
                prices.serverless_usd_per_gpu_second[b.gpu_kind], gpus, b.cpu_cores,
                prices.serverless_usd_per_cpu_core_second, b.memory_mib, prices.serverless_usd_per_memory_gib_second,
                ep_in.serverless.price_multiplier)
            self.b_cold = ep.serverless_cold_start_s
            self.b_min = self._burst_min_by_minute()
        # --- API
        if self.is_api:
            api = ep_in.managed_api
            assert api is not None
            p99 = api.measured_ttft_p99_ms / 1000.0
            self.api_sigma = math.log(API_P99_OVER_P50) / 2.3263
            self.api_mu = math.log(p99) - 2.3263 * self.api_sigma
            self.api_in = api.usd_per_million_input_tokens / 1e6
            self.api_out = api.usd_per_million_output_tokens / 1e6
        self._init_state()

    # ------------------------------------------------------------------ schedules
    def _cron_by_minute(self) -> np.ndarray:
        fl = self.ep.floor
        floor = list(self.ov.floor_by_hour) if self.ov.floor_by_hour is not None else list(fl.replicas_by_hour)
        base = min(floor)
        lead = fl.lead_time_s if self.ov.lead_time_s is None else self.ov.lead_time_s
        windows = (fl.windows if self.ov.floor_by_hour is None and self.ov.lead_time_s is None
                   else floor_windows(floor, base, lead))
        out = np.full(MINUTES_PER_WEEK, base, dtype=np.int64)
        for w in windows:
            _fill_window(out, w.start_minute_of_week, w.end_minute_of_week, w.replicas)
        return out

    def _burst_min_by_minute(self) -> np.ndarray:
        b = self.ep.burst
        assert b is not None
        if self.ov.burst_min_by_hour is not None:
            return np.repeat(np.asarray(self.ov.burst_min_by_hour, dtype=np.int64), 60)
        out = np.full(MINUTES_PER_WEEK, b.min_containers, dtype=np.int64)
        for w in b.min_containers_schedule:
            _fill_window(out, w.start_minute_of_week, w.end_minute_of_week, w.min_containers)
        return out

    # ------------------------------------------------------------------ state
    def _init_state(self) -> None:
        t0 = self.start_s
        self.bad_revision = False
        self.next_ready = math.inf  # earliest cold start to finish among starting replicas
        self._rb_next: float | None = None
        # (finish, replica id (≥ 0) or −1 − container id, KV at full length, uncached prompt tokens)
        self.done: list[tuple[float, int, float, float]] = []
        # KV cache and interference bookkeeping per replica / container: in flight at full length (prompt +
        # output, the cheap test of whether growth can overflow), uncached prompt tokens in flight (the
        # interference of the actual prompts) and the in-flight sequences (finish, decode start, token gap,
        # prompt tokens, output tokens) for the exact KV check
        self.f_kv: list[float] = self._column(float)
        self.f_in: list[float] = self._column(float)
        self.f_runs: list[list[tuple[float, float, float, float, float]]] = self._runs()
        self.c_kv: list[float] = self._column(float)
        self.c_in: list[float] = self._column(float)
        self.c_runs: list[list[tuple[float, float, float, float, float]]] = self._runs()
        self.preemptions = 0
        self.recomputed_tokens = 0.0
        self.recompute_gpu_s = 0.0
        self.kv_admission_waits = 0  # requests whose prompt did not fit the KV cache when a slot was free
        self.n_too_long = {413: 0, 400: 0}
        self.n_shed = 0  # admission control: 429 after the bounded wait
        self.n_timed_out = 0  # no first token within the gateway's first-byte timeout
        # floor replicas: parallel lists indexed by replica id
        self.f_inflight: list[int] = self._column(int)
        self.f_slots: list[list[float]] = self._rows(self.feng.slots if self.has_floor else 0)
        self.f_pfree: list[float] = self._column(float)
        self.f_state: list[int] = self._column(int)  # 1 starting, 2 ready, 3 draining, 0 gone
        self.f_ready_at: list[float] = self._column(float)
        self.f_bad: list[bool] = self._column(bool)
        self.routable: list[int] = self._column(int)
        self.nodes_up = 0
        self.node_surplus_since: float | None = None
        self.od_node_s = 0.0
        self.res_node_s = 0.0
        self.pod_starts = 0
        self.node_starts = 0
        self.hpa_hist: deque[tuple[float, int, int]] = deque()  # (poll, desired, desired without burst backlog)
        # the burst-backlog trigger: polls where it asked for more than every other trigger, replicas it added
        # beyond what the others asked for, and the highest in-flight-to-burst it read
        self.backlog_polls = 0
        self.backlog_replicas_added = 0
        self.backlog_peak = 0
        self.scale_events: deque[tuple[float, int]] = deque()
        self.waiting_peak_total = 0
        self.last_tick = t0
        if self.has_floor:
            n0 = int(self.cron[int(t0 // 60) % MINUTES_PER_WEEK])
            n0 = max(n0, self._min_replicas())
            if self.ov.fixed_replicas is not None:
                n0 = self.ov.fixed_replicas
            self.nodes_up = max(self.reserved_nodes, math.ceil(n0 / self.rpn))
            for _ in range(n0):
                self._add_replica(t0, ready=True)
        # burst containers
        self.c_inflight: list[int] = self._column(int)
        self.c_slots: list[list[float]] = self._rows(self.beng.slots if self.has_burst else 0)
        self.c_pfree: list[float] = self._column(float)
        self.c_ready: list[float] = self._column(float)
        self.c_launch: list[float] = self._column(float)
        self.c_last: list[float] = self._column(float)
        self.c_bad: list[bool] = self._column(bool)
        self.live: list[int] = self._column(int)
        self.container_usd_s = 0.0
        self.container_s_total = 0.0
        self.container_launches = 0
        self.cold_waits = 0
        self.burst_inflight = 0
        self.burst_waiting_peak = 0
        if self.has_burst:
            m0 = int(self.b_min[int(t0 // 60) % MINUTES_PER_WEEK])
            for _ in range(m0):
                self._launch_container(t0, warm=True)
        self.api_usd_total = 0.0
        self.n_api = 0
        self.n_burst = 0
        self.n_rejected = 0
        self.n_total = 0
        self.floor_wait_s = 0.0
        self.n_floor = 0
        self.n_ns_burst = 0  # non-streamed requests served by burst
        self.n_ns_capped = 0  # … whose max_tokens the rule capped
        self.n_ns_refused = 0  # … refused (400) because burst requires streaming
        self.n_ns_redirected = 0  # … that ran past Modal's cap and got its 303

    # per-replica and per-container state: plain lists here; the compiled engine (simulator/compiled.py) keeps
    # the same columns in numpy arrays its kernel reads, behind the same append/index/remove interface
    def _column(self, kind: type) -> list:
        return []

    def _rows(self, width: int) -> list:
        return []

    def _runs(self) -> list:
        return []

    def _min_replicas(self) -> int:
        if self.ov.min_replicas is not None:
            return self.ov.min_replicas
        return self.ep.autoscaling.min_replicas if self.ep.autoscaling else 0

    def _add_replica(self, t: float, ready: bool, in_place: bool = False) -> None:
        c = self.feng.slots
        alive = self._n_replicas(1, 3)
        if ready:
            ready_at = t
        elif in_place or alive < self.nodes_up * self.rpn:
            ready_at = t + self.ep.pod_cold_start_s
            self.pod_starts += 1
        else:
            self.nodes_up += 1
            self.node_starts += 1
            ready_at = t + self.ep.node_cold_start_s
        rid = len(self.f_state)
        self.f_inflight.append(0)
        self.f_kv.append(0.0)
        self.f_in.append(0.0)
        self.f_runs.append([])
        self.f_slots.append([ready_at] * c)
        self.f_pfree.append(ready_at)
        self.f_state.append(2 if ready else 1)
        self.f_ready_at.append(ready_at)
        self.f_bad.append(self.bad_revision)
        if ready:
            self.routable.append(rid)
        else:
            self.next_ready = min(self.next_ready, ready_at)

    def _launch_container(self, t: float, warm: bool = False) -> int:
        ready = t if warm else t + self.b_cold
        j = len(self.c_ready)
        self.c_inflight.append(0)
        self.c_kv.append(0.0)
        self.c_in.append(0.0)
        self.c_runs.append([])
        self.c_slots.append([ready] * self.beng.slots)
        self.c_pfree.append(ready)
        self.c_ready.append(ready)
        self.c_launch.append(t)
        self.c_last.append(ready)
        self.c_bad.append(self.bad_revision)
        self.live.append(j)
        if not warm:
            self.container_launches += 1
        return j

    def _stop_container(self, j: int, at: float) -> None:
        self.live.remove(j)
        dur = max(0.0, at - self.c_launch[j])
        self.container_s_total += dur
        self.container_usd_s += dur * self.b_usd_s
        self._spread(self.tally.container_s, self.c_launch[j], at)
        self.c_slots[j] = []

    def _spread(self, arr: np.ndarray, a: float, b: float) -> None:
        """Add the seconds of [a, b) to each hour they cover (for the hourly timeline)."""
        a, b = max(a, self.start_s), min(b, self.end_s)
        while a < b:
            h = int((a - self.start_s) // 3600)
            edge = min(b, self.start_s + (h + 1) * 3600.0)
            if 0 <= h < len(arr):
                arr[h] += edge - a
            a = edge

    # ------------------------------------------------------------------ autoscaler tick
    @property
    def draws_while_serving(self) -> bool:
        """Whether serving a chunk takes draws from the random generator the arrivals come from (abandonment
        positions, a managed API's TTFT): then the next chunk's arrivals must not be drawn before it is served."""
        return self.ov.abandon is not None or self.is_api

    def tick(self, now: float) -> None:
        dt = now - self.last_tick
        self.last_tick = now
        self._pop_done(now)
        hour = int((now - self.start_s) // 3600)
        if self.has_floor:
            self._tick_floor(now, dt, hour)
        if self.has_burst:
            self._tick_burst(now)
        self._tick_rollout(now)

    def promote(self, now: float) -> None:
        """Starting replicas whose cold start is over join the gateway's pool (checked at each arrival too)."""
        nxt = math.inf
        for i, s in enumerate(self.f_state):
            if s == 1:
                if self.f_ready_at[i] <= now:
                    self.f_state[i] = 2
                    self.routable.append(i)
                else:
                    nxt = min(nxt, self.f_ready_at[i])
        self.next_ready = nxt

    def _tick_floor(self, now: float, dt: float, hour: int) -> None:
        self.promote(now)
        ready_n, waiting = self._floor_census()
        if 0 <= hour < self.tally.hours:
            self.tally.floor_replica_s[hour] += ready_n * dt
            if waiting > self.tally.waiting_peak[hour]:
                self.tally.waiting_peak[hour] = waiting
        self.waiting_peak_total = max(self.waiting_peak_total, waiting)
        self.res_node_s += self.reserved_nodes * dt
        self.od_node_s += max(0, self.nodes_up - self.reserved_nodes) * dt
        if self.ov.fixed_replicas is not None:
            return
        a = self.ep.autoscaling
        cron = int(self.cron[int(now // 60) % MINUTES_PER_WEEK])
        current = self._n_replicas(1, 2)
        threshold = None
        if a is None:
            desired_raw, up_w, down_w = cron, 0, 0
            desired_other = desired_raw
        else:
            q = math.ceil(waiting / a.target_waiting_per_replica) if waiting > 0 else 0
            desired_other = min(a.max_replicas, max(cron, q, self._min_replicas()))
            desired_raw = desired_other
            threshold = a.burst_backlog_threshold if self.has_burst else None
            if threshold is not None:
                # KEDA's burst-backlog trigger (metricType Value): the HPA asks for ⌈current × value / target⌉;
                # from zero replicas KEDA itself scales to 1 once the value passes the trigger's activation
                # threshold, the target (components/floor_replicas.py); no series reads as 0 (ignoreNullValues)
                inflight = self.burst_inflight
                if inflight > self.backlog_peak:
                    self.backlog_peak = inflight
                if inflight > (threshold if current == 0 else 0):
                    b = min(a.max_replicas, math.ceil(current * inflight / threshold) if current else 1)
                    if b > desired_other:
                        self.backlog_polls += 1
                        desired_raw = b
            up_w, down_w = a.scale_up_stabilization_s, a.scale_down_stabilization_s
        hist = self.hpa_hist
        hist.append((now, desired_raw, desired_other))
        keep = max(up_w, down_w)
        while hist and hist[0][0] < now - keep:
            hist.popleft()
        if desired_raw > current:
            rec = min(v for t, v, _ in hist if t >= now - up_w)
            if rec > current:
                step_cap, period = (a.scale_up_pods_per_period, a.scale_up_period_s) if a else (10**6, 1)
                recent = sum(n for t, n in self.scale_events if t > now - period and n > 0)
                add = min(rec - current, max(0, step_cap - recent))
                for _ in range(add):
                    self._add_replica(now, ready=False)
                if add:
                    self.scale_events.append((now, add))
                    if threshold is not None:
                        # what the queue and cron triggers alone would have added at this poll
                        rec_other = min(v for t, _, v in hist if t >= now - up_w)
                        self.backlog_replicas_added += add - min(add, max(0, rec_other - current))
        elif desired_raw < current:
            rec = max(v for t, v, _ in hist if t >= now - down_w)
            if rec < current:
                cap, period = (a.scale_down_pods_per_period, a.scale_down_period_s) if a else (10**6, 1)
                recent = -sum(n for t, n in self.scale_events if t > now - period and n < 0)
                remove = min(current - rec, max(0, cap - recent))
                for _ in range(remove):
                    self._drain_one()
                if remove:
                    self.scale_events.append((now, -remove))
        while self.scale_events and self.scale_events[0][0] < now - 3600:
            self.scale_events.popleft()
        # nodes: on-demand ones beyond the reserved go once unneeded for NODE_SCALE_DOWN_S
        alive = self._n_replicas(1, 3)
        need = max(self.reserved_nodes, math.ceil(alive / self.rpn))
        if self.nodes_up > need:
            if self.node_surplus_since is None:
                self.node_surplus_since = now
            elif now - self.node_surplus_since >= NODE_SCALE_DOWN_S:
                self.nodes_up = need
                self.node_surplus_since = None
        else:
            self.node_surplus_since = None

    def _floor_census(self) -> tuple[int, int]:
        """Drained replicas with nothing in flight go; returns (ready replicas, requests waiting for a slot on
        the ready and draining ones)."""
        st, c = self.f_state, self.feng.slots
        ready_n = 0
        waiting = 0
        for i, s in enumerate(st):
            if s == 3 and self.f_inflight[i] == 0:
                st[i] = 0
                s = 0
            if s in (2, 3):
                ready_n += s == 2
                w = self.f_inflight[i] - c
                if w > 0:
                    waiting += w
        return ready_n, waiting

    def _n_replicas(self, lo: int, hi: int) -> int:
        """Floor replicas in states lo..hi (1 starting, 2 ready, 3 draining)."""
        return sum(1 for s in self.f_state if lo <= s <= hi)

    def _drain_one(self) -> None:
        st = self.f_state
        # a starting replica is cancelled first, else the newest ready one drains
        for i in range(len(st) - 1, -1, -1):
            if st[i] == 1:
                st[i] = 0
                return
        for i in range(len(st) - 1, -1, -1):
            if st[i] == 2:
                st[i] = 3
                self.routable.remove(i)
                return

    def _tick_burst(self, now: float) -> None:
        b = self.ep.burst
        assert b is not None
        minimum = int(self.b_min[int(now // 60) % MINUTES_PER_WEEK])
        while len(self.live) < min(minimum, b.max_containers):
            self._launch_container(now)
        for j in list(self.live):
            if self.c_inflight[j] != 0:
                continue
            if len(self.live) <= minimum:
                # held by the minimum: Modal keeps it (and bills it) now; once the minimum lets it go, its idle
                # time counts from then, not from its last request (which billed the held hours as nothing)
                self.c_last[j] = now
                continue
            idle_from = max(self.c_last[j], self.c_ready[j])
            if now - idle_from >= b.scaledown_window_s:
                self._stop_container(j, idle_from + b.scaledown_window_s)
        waiting = sum(max(0, self.c_inflight[j] - self.beng.slots) for j in self.live)
        self.burst_waiting_peak = max(self.burst_waiting_peak, waiting)

    def _tick_rollout(self, now: float) -> None:
        ro = self.ov.rollout
        if ro is None or ro.phase == "done":
            return
        if ro.phase == "pending":
            if now < ro.at_s:
                return
            self.bad_revision = True  # everything serving, and everything started, runs the bad revision
            _set_all(self.f_bad, True)
            _set_all(self.c_bad, True)
            ro.phase = "bad"
        if ro.phase == "bad" and now >= ro.at_s + ro.detect_s:
            self.bad_revision = False  # what starts from now on runs the previous revision
            ro.phase = "rollback"
        if ro.phase != "rollback":
            return
        if ro.warm:
            # N−1 kept warm: the gateway flips to it after a config reload; no capacity is lost
            if now >= ro.at_s + ro.detect_s + GATEWAY_SWITCH_S:
                _set_all(self.f_bad, False)
                _set_all(self.c_bad, False)
                ro.recovered_s, ro.phase = now, "done"
            return
        self._cold_rollback(now, ro)

    def _cold_rollback(self, now: float, ro: Rollout) -> None:
        """Roll the previous revision out again: replace bad replicas a capped step per period (maxUnavailable:
        the bad pod goes, the good one takes its GPU after a pod cold start); bad burst containers stop and
        new ones cold-start on demand."""
        st = self.f_state
        a = self.ep.autoscaling
        step = a.scale_up_pods_per_period if a else 1
        period = a.scale_up_period_s if a else 60
        if self._rb_next is None or now >= self._rb_next:
            bad = [i for i in range(len(st)) if st[i] in (1, 2) and self.f_bad[i]]
            for i in bad[:step]:
                if st[i] == 2:
                    self.routable.remove(i)
                st[i] = 3  # drains its in-flight, then goes
                self._add_replica(now, ready=False, in_place=True)
            self._rb_next = now + period
        for j in list(self.live):
            if self.c_bad[j]:
                self._stop_container(j, now)
        if not any(st[i] in (1, 2) and self.f_bad[i] for i in range(len(st))):
            ro.recovered_s, ro.phase = now, "done"

    # ------------------------------------------------------------------ completions
    def _pop_done(self, now: float) -> None:
        done = self.done
        fi, ci = self.f_inflight, self.c_inflight
        while done and done[0][0] <= now:
            _, rid, kv, pin = heapq.heappop(done)
            if rid >= 0:
                fi[rid] -= 1
                self.f_kv[rid] -= kv
                self.f_in[rid] -= pin
            else:
                j = -1 - rid
                ci[j] -= 1
                self.c_kv[j] -= kv
                self.c_in[j] -= pin
                self.burst_inflight -= 1

    # ------------------------------------------------------------------ requests
    def feed(self, chunk: Chunk, tick_s: float, next_tick: float) -> float:
        """Serve one chunk of arrivals; returns the next tick time."""
        T = chunk.arrival_s.tolist()
        IN = (chunk.input_tokens * (1.0 - self.hit)).tolist()
        OUT = chunk.output_tokens.tolist()
        n = len(T)
        ttft = [0.0] * n
        itl = [0.0] * n
        flag = [0] * n
        status = chunk.status.tolist() if chunk.status is not None else None
        ab = self.ov.abandon
        ab_pos = None
        if ab is not None:
            u = self.rng.random(n)
            ab_pos = np.where(u < ab.fraction, self.rng.random(n), -1.0).tolist()
        # non-streamed requests (from their own generator: the main stream, and so every other figure, is unchanged)
        ns = (self.ns_rng.random(n) < self.ns_fraction).tolist() if self.ns_rule else None
        heappush, heappop, heapreplace = heapq.heappush, heapq.heappop, heapq.heapreplace
        done = self.done
        fi, fslots, fpfree, fbad = self.f_inflight, self.f_slots, self.f_pfree, self.f_bad
        fkv, fin_, fruns = self.f_kv, self.f_in, self.f_runs
        routable = self.routable
        has_burst, is_api = self.has_burst, self.is_api
        overflow = self.ep.gateway.overflow_inflight_per_replica if has_burst else 1 << 60
        if has_burst and self.floor_cap:
            overflow = min(overflow, self.floor_cap)
        shed_after = self.admission_wait_s
        burst_cap, fq = self.burst_cap, self.floor_queue
        fslot0 = lambda q: fslots[q][0]  # noqa: E731
        # the gateway's Lua filter ends a stream with no first byte in this long (components/gateway_config.py);
        # it also bounds the replica's queue, which an under-provisioned floor would otherwise grow without end
        first_byte_s = self.ep.gateway.first_byte_timeout_s
        kvs = 1.0 / (1.0 - self.hit)  # KV holds the whole prompt, cached prefix included
        if self.has_floor:
            fe = self.feng
            c, inv_p, gpus = fe.slots, 1.0 / fe.prefill_tokens_per_s, fe.gpus
            t_min, k_step, interf = fe.t_min, fe.k, fe.interference
            per_tok = fe.interference_per_token
            dyn = fe.planned_uncached_prompt > 0
            kcap = fe.kv_capacity_tokens
            prune_at = 4 * c + 16
        ci, ckv, cin = self.c_inflight, self.c_kv, self.c_in
        key = fi.__getitem__
        wait_s, n_floor = 0.0, 0
        for i in range(n):
            t = T[i]
            while t >= next_tick:
                self.tick(next_tick)
                next_tick += tick_s
                routable = self.routable
                fbad = self.f_bad
            if t >= self.next_ready:
                self.promote(t)
            while done and done[0][0] <= t:
                _, rid, kvd, pin = heappop(done)
                if rid >= 0:
                    fi[rid] -= 1
                    fkv[rid] -= kvd
                    fin_[rid] -= pin
                else:
                    j = -1 - rid
                    ci[j] -= 1
                    ckv[j] -= kvd
                    cin[j] -= pin
                    self.burst_inflight -= 1
            if status is not None and status[i]:
                # over the product limit: the gateway's body cap (413) or the engine's context check (400)
                self.n_too_long[status[i]] += 1
                ttft[i] = math.inf
                flag[i] = REJECTED | TOO_LONG
                continue
            o = OUT[i]
            streamed = True
            if ns is not None and ns[i]:
                streamed = False
            r = -1
            if routable:
                r = routable[0] if len(routable) == 1 else min(routable, key=key)
                if fi[r] >= overflow and (streamed or self.ns_rule != "floor_only"):
                    r = -1
            if (r < 0 and has_burst and self.burst_inflight >= burst_cap
                    and (streamed or self.ns_rule != "require_streaming")):
                # the floor pick found no room and burst is full: HAProxy's queue, bounded, then 429
                if routable:
                    r = routable[0] if len(routable) == 1 else min(routable, key=key)
                elif (self.has_floor or not self.live
                      or min(self.c_slots[j][0] for j in self.live) - t > shed_after):
                    # (serverless only, a slot freeing within the wait: the burst server's own queue holds it and
                    # Modal starts it on the freed slot, below)
                    self.n_shed += 1
                    ttft[i] = math.inf
                    flag[i] = REJECTED | SHED
                    continue
            if r >= 0:
                sl = fslots[r]
                if fq and sl[0] > t and len(routable) > 1:  # full: the queue gives it the first slot to free
                    r = min(routable, key=fslot0)
                    sl = fslots[r]
                s0 = sl[0]
                start = s0 if s0 > t else t
                if start - t > shed_after:
                    self.n_shed += 1
                    ttft[i] = math.inf
                    flag[i] = REJECTED | SHED
                    continue
                if start - t > first_byte_s:  # a slot frees too late for any first token in time
                    self.n_timed_out += 1
                    ttft[i] = math.inf
                    flag[i] = REJECTED | TIMED_OUT
                    continue
                b = fi[r] + 1
                if b > c:
                    b = c
                if dyn:  # the other in-flight sequences' actual prompts, amortised per token gap
                    gap = t_min + k_step * b + (per_tok * fin_[r] * (b - 1) / fi[r] if b > 1 else 0.0)
                else:
                    gap = t_min + k_step * b + interf * (b - 1)
                u = IN[i]
                kvp = u * kvs
                kvfull = kvp + o
                if fkv[r] + kvfull > kcap:  # growth may overflow the KV cache: the exact check
                    start, pe, fin, first = self._kv_fit(fruns[r], kcap, t, start, fpfree[r], kvp, u, o, gap,
                                                         inv_p, gpus)
                    wait_s += start - t
                    gap_mean = (fin - first) / (o - 1) if o > 1 else 0.0
                else:
                    wait_s += start - t
                    ps = fpfree[r]
                    if ps < start:
                        ps = start
                    pe = ps + u * inv_p
                    fin = pe + o * gap
                    first = pe + gap
                    gap_mean = gap if o > 1 else 0.0
                if first - t > first_byte_s:  # waited for KV blocks (or behind long prefills) past the timeout
                    self.n_timed_out += 1
                    ttft[i] = math.inf
                    flag[i] = REJECTED | TIMED_OUT
                    continue
                n_floor += 1
                if pe > fpfree[r]:
                    fpfree[r] = pe
                if ab_pos is not None and ab_pos[i] >= 0:
                    fin = self._abandon(first, fin, ab_pos[i], gpus / b)
                heapreplace(sl, fin)
                heappush(done, (fin, r, kvfull, u))
                fi[r] += 1
                fkv[r] += kvfull
                fin_[r] += u
                rl = fruns[r]
                insort(rl, (fin, pe, gap, kvp, o), key=_FINISH)
                if len(rl) > prune_at:
                    del rl[:bisect_right(rl, t, key=_FINISH)]
                ttft[i] = first - t
                itl[i] = gap_mean
                if fbad[r]:
                    flag[i] = BAD
            elif has_burst:
                if not streamed and self.ns_rule == "require_streaming":
                    self.n_ns_refused += 1
                    ttft[i] = math.inf
                    flag[i] = REJECTED | TOO_LONG  # 400: streaming required on burst
                    continue
                if not streamed and self.ns_rule == "cap_max_tokens" and o > self.ns_max_tokens:
                    o = self.ns_max_tokens
                    self.n_ns_capped += 1
                ttft[i], itl[i], bad, total = self._burst(t, IN[i], o, ab_pos[i] if ab_pos is not None else -1.0)
                flag[i] = BURST | (BAD if bad else 0)
                if not streamed:
                    self.n_ns_burst += 1
                    if total > self.web_cap_s:  # Modal answers with a 303 the client does not follow
                        self.n_ns_redirected += 1
                        flag[i] |= BAD
            elif is_api:
                ttft[i] = math.exp(self.api_mu + self.api_sigma * float(self.rng.standard_normal()))
                itl[i] = 0.0
                self.api_usd_total += IN[i] / (1.0 - self.hit) * self.api_in + OUT[i] * self.api_out
                flag[i] = API
            else:
                ttft[i] = math.inf
                flag[i] = REJECTED
        self.floor_wait_s += wait_s
        self.n_floor += n_floor
        self._record(chunk.arrival_s, np.asarray(ttft), np.asarray(itl), np.asarray(flag))
        return next_tick

    def _kv_fit(self, runs: list[tuple[float, float, float, float, float]], cap: float, t: float, start: float,
                pfree: float, kvp: float, uncached: float, out: float, gap: float, inv_p: float,
                gpus: float) -> tuple[float, float, float, float]:
        """kv_fit, with its waits and preemptions booked."""
        start, pe, fin, first, waited, redo = kv_fit(runs, cap, t, start, pfree, kvp, uncached, out, gap, inv_p)
        if waited:
            self.kv_admission_waits += 1
        if redo:
            self.preemptions += 1
            self.recomputed_tokens += redo
            self.recompute_gpu_s += redo * inv_p * gpus
        return start, pe, fin, first

    def _abandon(self, first: float, fin: float, pos: float, gpu_share: float) -> float:
        ab = self.ov.abandon
        assert ab is not None
        ab.abandoned += 1
        leave = first + pos * (fin - first)
        if ab.propagate:
            return leave
        ab.wasted_gpu_s += (fin - leave) * gpu_share
        return fin

    def _burst(self, t: float, uncached: float, out: float, ab_pos: float) -> tuple[float, float, bool, float]:
        """One request to the burst tier: (TTFT, mean token gap, served by a bad revision, time to the last
        token). Never shed here: the gateway cannot see Modal's containers, so a request it sent waits at Modal
        for a slot (a restoring container's included); admission control acts before, on the burst cap."""
        b = self.ep.burst
        assert b is not None
        live, ci = self.live, self.c_inflight
        self.burst_inflight += 1
        want = min(b.max_containers, math.ceil(self.burst_inflight / b.target_inputs) + b.buffer_containers)
        while len(live) < want:
            self._launch_container(t)
        best, best_n = -1, 1 << 60
        for j in live:
            if self.c_ready[j] <= t and ci[j] < best_n and ci[j] < b.max_inputs:
                best, best_n = j, ci[j]
        if best < 0:  # every ready container is full: the earliest free slot, a starting container included
            best = min(live, key=lambda j: self.c_slots[j][0])
        eng = self.beng
        sl = self.c_slots[best]
        start = max(t, sl[0])
        if self.c_ready[best] > t and start >= self.c_ready[best]:
            self.cold_waits += 1
        bsz = min(eng.slots, ci[best] + 1)
        if eng.planned_uncached_prompt > 0:
            gap = (eng.t_min + eng.k * bsz
                   + (eng.interference_per_token * self.c_in[best] * (bsz - 1) / ci[best] if bsz > 1 else 0.0))
        else:
            gap = eng.gap_s(bsz)
        inv_p = 1.0 / eng.prefill_tokens_per_s
        kvp = uncached / (1.0 - self.hit)
        kvfull = kvp + out
        if self.c_kv[best] + kvfull > eng.kv_capacity_tokens:
            start, pe, fin, first = self._kv_fit(self.c_runs[best], eng.kv_capacity_tokens, t, start,
                                                 self.c_pfree[best], kvp, uncached, out, gap, inv_p, eng.gpus)
            gap_mean = (fin - first) / (out - 1) if out > 1 else 0.0
        else:
            ps = max(start, self.c_pfree[best])
            pe = ps + uncached * inv_p
            fin = pe + out * gap
            first = pe + gap
            gap_mean = gap if out > 1 else 0.0
        if pe > self.c_pfree[best]:
            self.c_pfree[best] = pe
        if ab_pos >= 0:
            fin = self._abandon(first, fin, ab_pos, eng.gpus / bsz)
        heapq.heapreplace(sl, fin)
        heapq.heappush(self.done, (fin, -1 - best, kvfull, uncached))
        ci[best] += 1
        self.c_kv[best] += kvfull
        self.c_in[best] += uncached
        rl = self.c_runs[best]
        insort(rl, (fin, pe, gap, kvp, out), key=_FINISH)
        if len(rl) > 4 * eng.slots + 16:
            del rl[:bisect_right(rl, t, key=_FINISH)]
        if fin > self.c_last[best]:
            self.c_last[best] = fin
        self.burst_waiting_peak = max(self.burst_waiting_peak, self.burst_inflight - len(live) * eng.slots)
        return first - t, gap_mean, self.c_bad[best], fin - t

    def _record(self, t: np.ndarray, ttft: np.ndarray, itl: np.ndarray, flag: np.ndarray) -> None:
        if len(t) == 0:
            return
        tl = self.tally
        hour = np.clip(((t - self.start_s) // 3600).astype(np.int64), 0, tl.hours - 1)
        tier = flag & 3
        met = (ttft <= self.ttft_slo) & (itl <= self.itl_slo) & ((flag & BAD) == 0) & (tier != REJECTED)
        shed = (flag & SHED) != 0
        no_replica = (flag & (3 | TOO_LONG | SHED | TIMED_OUT)) == REJECTED  # 503: no ready replica
        tl.arrivals += np.bincount(hour, minlength=tl.hours)
        tl.met += np.bincount(hour, weights=met, minlength=tl.hours)
        tl.burst_requests += np.bincount(hour, weights=tier == BURST, minlength=tl.hours)
        tl.rejected += np.bincount(hour, weights=no_replica, minlength=tl.hours)
        ttft_h, itl_h = ttft, itl
        if (flag >= TOO_LONG).any():  # refused before any GPU (413/400/429): counted apart, not as latencies
            kept = (flag & (TOO_LONG | SHED)) == 0
            ttft_h, itl_h = ttft[kept], itl[kept]
        tl.ttft_hist += np.bincount(hist_index(ttft_h), minlength=HIST_BINS)
        has_gap = itl_h > 0
        tl.itl_hist += np.bincount(hist_index(itl_h[has_gap]), minlength=HIST_BINS)
        fin = ttft[np.isfinite(ttft)]
        if fin.size:
            tl.ttft_max = max(tl.ttft_max, float(fin.max()))
        if tl.focus is not None:
            a, b = tl.focus
            sel = (t >= a) & (t < b)
            if sel.any():
                m = ((t[sel] - a) // 60).astype(np.int64)
                tl.minute_arrivals += np.bincount(m, minlength=len(tl.minute_arrivals))[: len(tl.minute_arrivals)]
                tl.minute_met += np.bincount(m, weights=met[sel], minlength=len(tl.minute_arrivals))[
                    : len(tl.minute_arrivals)]
                tl.minute_shed += np.bincount(m, weights=shed[sel], minlength=len(tl.minute_arrivals))[
                    : len(tl.minute_arrivals)]
                served = ttft[sel][np.isfinite(ttft[sel])]  # 503s are counted apart, not as a latency
                if served.size:
                    tl.focus_ttft_max = max(tl.focus_ttft_max, float(served.max()))
        self.n_total += len(t)
        self.n_burst += int((tier == BURST).sum())
        self.n_api += int((tier == API).sum())
        self.n_rejected += int(no_replica.sum())
        if self.ov.rollout is not None:
            self.ov.rollout.bad_requests += int(((flag & BAD) != 0).sum())

    def finish(self) -> None:
        """Close the books at the window's end: running containers are billed to the end."""
        end = self.end_s
        for j in list(self.live):
            self.container_s_total += end - self.c_launch[j]
            self.container_usd_s += (end - self.c_launch[j]) * self.b_usd_s
            self._spread(self.tally.container_s, self.c_launch[j], end)
        self.live = []


def _set_all(column: list, value: bool) -> None:
    """Set every entry in place (the compiled engine's columns are arrays its kernel holds)."""
    for i in range(len(column)):
        column[i] = value


def _fill_window(out: np.ndarray, start: int, end: int, value: int) -> None:
    if end > start:
        out[start:end] = np.maximum(out[start:end], value)
    else:  # wraps past Sunday
        out[start:] = np.maximum(out[start:], value)
        out[:end] = np.maximum(out[:end], value)
