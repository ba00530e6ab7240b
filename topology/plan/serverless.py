"""What a serverless (Modal) tier bills: container-hours from the arrival process and the routing.

The platform (and the simulator that reproduces it) launches a container whenever the requests in flight
exceed `target_inputs` × containers (+ `buffer_containers`), routes each request to the ready container with
the fewest in flight, and stops a container after `scaledown_window_s` (W) without a request. With requests
spread over the containers, a container idles for a whole window only when demand stayed below it for W, so

    containers alive at t = max over s in [t − W, t] of needed(s),   needed = ⌈in flight / target_inputs⌉

(the k-th container is kept while in flight reaches its level L_k at least once a window), and each launch
bills its cold start on top. The expected value follows from the arrival process, with no fitted constant:

1. In flight. Requests arrive as a Poisson process whose rate in each minute is the hour's mean × a factor g,
   g ~ Gamma(α, 1/α) (mean 1; independent per minute, or persisting: step 3), α set so the busiest of 60 minutes is
   `traffic.within_hour_peak_factor` × the mean (Wilson–Hilferty, the simulator's definition). Idle minutes
   (`traffic.idle_minute_share` p > 0: clients that come and go, minutes with no request that Poisson noise does
   not explain) make it a mixture: g = 0 with probability p, else G/(1 − p) with G ~ Gamma(α, 1/α), so E g = 1
   still. The peak factor keeps its meaning, the busiest minute of the hour over the hour's mean: that is the
   busiest of the n = 60·(1 − p) active minutes, G's n/(n + 1) quantile (the rule that reads the largest of 60 at
   60/61) over 1 − p, and α solves (1 − 1/(9α) + z_n/(3√α))³ = peak × (1 − p), z_n = Φ⁻¹(n/(n + 1))
   (minute_factors.gamma_alpha_for_peak_with_idle; the active minutes flat where peak × (1 − p) ≤ 1). The node at
   g = 0 is a minute with no request: every level is left and stops a window after its last request. Each request
   holds its place for its service time S (prefill + output × decode gap at the container's batch), so in a
   minute at rate λg the number in flight is Poisson(λ·g·S) (M/G/∞). With a floor in front, the gateway
   overflows to serverless only what the floor's Q = replicas × overflow_inflight_per_replica places cannot
   hold, so the burst holds in-flight − Q.
2. One level, one minute. The level L is reached at the rate of arrivals that find L − 1 in flight,
   u = λg·P(N = L − 1) (exact for M/G/∞: the up-crossing rate); from below, the hazard is h = u / P(N < L).
   Treating up-crossings of a level as a Poisson stream (the Poisson clumping heuristic),
   P(no need for the k-th container in a stretch d | below now) = e^(−h·d).
3. Minute by minute. Inside a minute at factor g each level is a two-state chain with those hazards (on from
   off at h, off from on at the rate a stretch below it outlasts W); its switching probabilities over the
   minute, averaged over g by equal-probability quadrature, make a chain over minutes, closed-form over the
   hour's 60. The factor need not be drawn afresh each minute: `traffic.within_hour_correlation_s` (τ, measured
   from the lag-1 autocorrelation of minute counts, correlation_s_from_minute_counts) keeps it with
   probability e^(−60/τ). Then quiet minutes come together: a factor that lasts longer than W lets the
   containers above the base see a run of quiet minutes and stop (and busy ones hold the level through a busy
   run), where independent minutes keep breaking the quiet stretch; a factor much shorter than W averages out
   (τ → 0, the independent minutes). The level and the factor then form one chain, whose stationary P(on)
   and launch rate have a closed form in sums over the nodes (persistent_switching); τ = 0 is the independent
   case exactly. Minutes at g = 0 (idle minutes) bring no request, so a run of them stops a level only once
   the quiet, from before the run, lasts W: the chain counts such a run by its age (idle_run_switching). Hand-worked against the exact answer for instant requests in tests/test_cost_model.py.
   Expected containers alive = Σ_k P(k-th alive), floored by the warm minimum (P = 1 for k ≤ minimum).
4. Launches: the k-th container starts at an up-crossing of L_k that found none in the previous window,
   at rate ≈ u·e^(−h·W); each bills its cold start (launch to ready) on top.
5. The start-up burst: from no container (the start of the billed span), nothing is served for the cold
   start c, and routing queues requests on the starting containers; the first request a container takes
   finds it empty and completes S₁ (its service alone) after the container is ready. So until c + S₁ every
   request is in flight — Poisson(λ·g·(c + S₁)) in the first minute — and the autoscaler launches up to that
   level; a container so launched stops only like any other (in flight below k for a window), which at a
   rate that needs it never happens. This is a lower bound of the burst: after c + S₁ in flight still grows
   until completions outpace arrivals, how long depends on the spread of service times, which the plan does
   not know (only their mean).

Checks on the limits: W → 0 gives E⌈N / target⌉ (the mean of the occupancy's ceiling); W → ∞ gives the
largest number ever needed; a constant rate with zero service time gives the first container alive
1 − e^(−λW) of the time. The correlation time of in flight (≈ S) enters through h, not as a constant.

Pure and vectorised: numpy only, no randomness, no clock; one call costs every hour of the week at once.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from ..inputs import EndpointInputs
from ..minute_factors import (Z_PEAK_MINUTE, active_minute_z, busiest_minute_factor, factor_keep,
                              gamma_alpha_for_peak, gamma_alpha_for_peak_with_idle)
from ..timebase import MINUTES_PER_HOUR, SECONDS_PER_HOUR, SECONDS_PER_MINUTE
from .placement import Placement

QUADRATURE_NODES = 32  # equal-probability nodes over the minute factor g
EXACT_LEVELS = 64
LEVEL_POINTS = 64  # levels evaluated (geometric above DENSE_LEVELS); the rest are interpolated
DENSE_LEVELS = 16
WARMUP_WEEKS = 0  # weeks run before the billed one (see expected_containers)




@functools.lru_cache(maxsize=64)
def gamma_quadrature(alpha: float | None, n: int = QUADRATURE_NODES) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights (summing to 1) for E[f(g)], g ~ Gamma(α, 1/α): the midpoints of n equal-probability
    bins, by the Wilson–Hilferty quantile (the transform the peak factor is defined by), rescaled to mean 1.

    Equal-probability nodes, not Gauss–Laguerre: at high rates f is nearly a step in g (whether a minute's
    in flight reaches a level), which a few Gauss nodes integrate badly."""
    if alpha is None:
        g, w = np.ones(1), np.ones(1)
    else:
        z = np.array([NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)])
        g = np.maximum(1 - 1 / (9 * alpha) + z / (3 * math.sqrt(alpha)), 0.0) ** 3
        g, w = g / g.mean(), np.full(n, 1.0 / n)
    g.flags.writeable = w.flags.writeable = False  # cached: shared by every call
    return g, w


@functools.lru_cache(maxsize=64)
def factor_quadrature(alpha: float | None, idle_share: float = 0.0, n: int = QUADRATURE_NODES
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights of the minute factor with a share p = idle_share of idle minutes (step 1): a node at 0 of
    weight p, then the active minutes' Gamma nodes (gamma_quadrature) × 1/(1 − p) of weight (1 − p)/n each, so
    the factor's mean stays 1. p = 0: gamma_quadrature(alpha) itself."""
    if idle_share <= 0.0:
        return gamma_quadrature(alpha, n)
    g, w = gamma_quadrature(alpha, n)
    g = np.concatenate([[0.0], g / (1.0 - idle_share)])
    w = np.concatenate([[idle_share], w * (1.0 - idle_share)])
    g.flags.writeable = w.flags.writeable = False
    return g, w


def _norm_sf(z: np.ndarray) -> np.ndarray:
    """1 − Φ(z), Abramowitz–Stegun 7.1.26 (|error| < 1.5e-7); in place on temporaries (the planner's hot loop)."""
    x = np.abs(z) * (1 / math.sqrt(2.0))
    t = 0.3275911 * x
    t += 1.0
    np.reciprocal(t, out=t)
    poly = t * 1.061405429
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += c
        poly *= t
    np.square(x, out=x)
    np.negative(x, out=x)
    np.exp(x, out=x)
    poly *= x
    poly *= 0.5  # half erfc(|z|/√2) = the upper tail at |z|
    np.subtract(1.0, poly, out=poly, where=z < 0)  # the lower tail below 0 (in place: np.where costs more)
    return poly


def poisson_below_and_at(levels: np.ndarray, mean: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P(N < L) and P(N = L − 1) for N ~ Poisson(mean): levels (H, P, 1) integers ≥ 1, means (H, 1, G)."""
    L = np.asarray(levels, dtype=float)
    m = np.maximum(np.asarray(mean, dtype=float), 1e-300)
    shape = np.broadcast_shapes(L.shape, m.shape)
    top = int(L.max(initial=1))
    log_fact = log_fact_upto(top + 1)
    log_m = np.log(m)  # on the unbroadcast means: the full (levels × nodes) arrays are the planner's cost
    # Wilson–Hilferty for the levels above EXACT_LEVELS, exact sums at or below. Each is worked out on the block
    # of hours (rows) × levels (columns) that has such a level, not on the whole array; a value depends only on
    # its own level and mean, so the blocks give what the whole array would
    Lb = np.broadcast_to(L, shape[:2] + L.shape[2:])
    mb = np.broadcast_to(m, shape[:1] + m.shape[1:])
    lmb = np.broadcast_to(log_m, mb.shape)
    small = Lb <= EXACT_LEVELS
    small_rc = small.reshape(shape[:2] + (-1,)).any(axis=2)
    big_rc = (~small).reshape(shape[:2] + (-1,)).any(axis=2)
    below = np.empty(shape)
    at = np.empty(shape)
    rows, cols = _run(np.flatnonzero(big_rc.any(axis=1))), _run(np.flatnonzero(big_rc.any(axis=0)))
    if _size(rows, shape[0]):
        L_b, m_b = _block(Lb, rows, cols), _block(mb, rows, cols)
        at[_cell(rows, cols)] = np.exp((L_b - 1) * _block(lmb, rows, cols) - m_b - log_fact[(L_b - 1).astype(int)])
        # P(N ≤ L − 1) = P(Gamma(L, 1) > m): Wilson–Hilferty
        # (each factor on its own axis first: cbrt(m / L) = cbrt(m) / cbrt(L); only z is full size)
        z = (np.cbrt(m_b) / np.cbrt(L_b) - (1 - 1 / (9 * L_b))) * np.sqrt(9 * L_b)
        below[_cell(rows, cols)] = _norm_sf(z)
    # exact sums: one table of P(N = j) and its cumulative sum per mean, as long as the largest small level in the
    # row, both read at L − 1 (the same terms P(N = L − 1) as the formula above gives); rows grouped by that
    # length rounded up to a power of two, so a quiet hour does not pay a busy one's table
    need = np.where(small, Lb, 0).reshape(shape[0], -1).max(axis=1, initial=0)
    bucket = np.where(need > 0, 2 ** np.ceil(np.log2(np.maximum(need, 1))), 0).astype(int)
    for n_exact in np.unique(bucket[bucket > 0]).tolist():
        rows_i = np.flatnonzero(bucket == n_exact)
        rows, cols = _run(rows_i), _run(np.flatnonzero(small_rc[rows_i].any(axis=0)))
        n_exact = min(n_exact, int(need[rows_i].max()))
        L_r, m_r = _block(Lb, rows, cols), _block(mb, rows, cols)
        j = np.arange(n_exact)
        terms = np.exp(j * _block(lmb, rows, cols)[..., None] - m_r[..., None] - log_fact[:n_exact])
        cdf = np.cumsum(terms, axis=-1)
        # flat index of (row, node, L − 1) in the tables (one gather each instead of take_along_axis)
        idx = np.clip(L_r - 1, 0, n_exact - 1).astype(np.intp)
        idx = idx + (np.arange(cdf.size // n_exact) * n_exact).reshape(cdf.shape[:-1])
        small_b = _block(small, rows, cols)
        if small_b.all():
            below[_cell(rows, cols)] = cdf.take(idx)
            at[_cell(rows, cols)] = terms.take(idx)
        else:
            for out, tab in ((below, cdf), (at, terms)):
                block = out[_cell(rows, cols)]
                np.copyto(block, tab.take(idx), where=small_b)
                out[_cell(rows, cols)] = block
    return np.clip(below, 0.0, 1.0, out=below), at


UPPER_DIRECT_BELOW = 1e-4  # P(N ≥ L) under this is summed directly (1 − P(N < L) keeps < 12 digits of it)
UPPER_SERIES_TERMS = 48  # at most this many terms of that sum, then a geometric closure at the last ratio, an upper
# bound: against direct sums it is high by < 1e-10 relative where mean/L ≤ 0.7, 9e-8 at 0.8, 3e-6 at 0.85, 8e-5 at
# 0.9 and 7e-4 at 0.93 (L ≈ 3,000, where the tail is still < 1e-4): a sum shared across levels would be exact there
UPPER_SERIES_STOP = 1e-17  # the sum stops once a term is below this share of it (the closure adds the rest)


def poisson_tails(levels: np.ndarray, mean: np.ndarray, upper_from: int = 0
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """P(N < L), P(N ≥ L) and P(N = L − 1) for N ~ Poisson(mean): levels (H, P, 1) integers ≥ 1, means (H, 1, G).
    upper_from: the first level column whose P(N ≥ L) is wanted (the columns before it are left 0).

    P(N ≥ L) is summed directly where it is small, not taken as 1 − P(N < L): far above the mean it is far below
    the double resolution of 1 (P(N ≥ 60) at mean 5 is 1e-36), and the stop rate of a level reached there depends
    on it relative to W·P(N = L − 1) (how long in flight stays at or above the level once it is reached). Below
    1e-4 the Wilson–Hilferty levels' own tail is no better: good in absolute terms only (P(N ≥ 100) at mean 30:
    2.5e-23 for 7.3e-24), so the sum serves both."""
    below, at = poisson_below_and_at(levels, mean)
    shape = below.shape
    above = np.zeros(shape)
    b = below[:, upper_from:]
    up = np.subtract(1.0, b, out=above[:, upper_from:])
    far = b > 1.0 - UPPER_DIRECT_BELOW
    if far.any():
        L = np.broadcast_to(np.asarray(levels, dtype=float), shape)[:, upper_from:]
        m = np.broadcast_to(np.maximum(np.asarray(mean, dtype=float), 1e-300), shape)[:, upper_from:]
        up[far] = _upper_series(L[far], m[far], at[:, upper_from:][far])
    return below, np.clip(above, 0.0, 1.0, out=above), at


def _upper_series(L: np.ndarray, m: np.ndarray, at: np.ndarray) -> np.ndarray:
    """P(N ≥ L) = P(N = L − 1)·Σ_{n ≥ 1} Π_{i < n} m/(L + i), for m < L, every term positive (no digit lost): summed
    until a term falls below UPPER_SERIES_STOP of the sum (checked every 8 terms) or for UPPER_SERIES_TERMS, the
    rest bounded by a geometric series at the last ratio (the ratios only fall). 1-D arrays."""
    out = np.zeros_like(at)
    idx = np.flatnonzero(at > 0)  # P(N = L − 1) below the least double: the tail is too
    t, m = at[idx], m[idx]
    D = L[idx]  # L + n, kept as it grows (integers: exact)
    s = np.zeros_like(t)
    r = np.empty_like(t)
    n = 0
    while idx.size:
        for _ in range(8):
            t *= np.divide(m, D, out=r)
            s += t
            D += 1.0
            n += 1
        done = (t <= UPPER_SERIES_STOP * s) | (n >= UPPER_SERIES_TERMS)
        if done.any():
            r_d = m[done] / D[done]
            out[idx[done]] = s[done] + t[done] * r_d / np.maximum(1.0 - r_d, 1e-300)
            keep = ~done
            idx, t, D, m, s = idx[keep], t[keep], D[keep], m[keep], s[keep]
            r = r[:idx.size]
    return out


def _run(idx: np.ndarray) -> np.ndarray | slice:
    """An index array as a slice when it is a run of consecutive indices (slices read and write views, not
    copies)."""
    if idx.size and idx[-1] - idx[0] == idx.size - 1:
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx


def _size(idx: np.ndarray | slice, n: int) -> int:
    return len(range(*idx.indices(n))) if isinstance(idx, slice) else idx.size


def _cell(rows: np.ndarray | slice, cols: np.ndarray | slice) -> tuple:
    """The index of the block rows × cols of a 3-axis array (a slice of rows takes any index of columns; index
    arrays for both are crossed)."""
    if isinstance(cols, slice) and not isinstance(rows, slice):
        cols = np.arange(cols.start, cols.stop)
    if isinstance(rows, slice):
        return rows, cols
    return rows[:, None], cols[None, :]


def _block(x: np.ndarray, rows: np.ndarray | slice, cols: np.ndarray | slice) -> np.ndarray:
    """x[rows][:, cols] for x of 3 axes, an axis of size 1 (broadcast) left as it is."""
    x = x[rows] if x.shape[0] > 1 else x
    return x[:, cols] if x.shape[1] > 1 else x


def log_fact_upto(n: int) -> np.ndarray:
    """ln j! for j = 0 … n − 1."""
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n)))])


@dataclass(frozen=True)
class ContainerHours:
    alive: np.ndarray  # (hours,) expected containers alive (container-hours per hour)
    launches: np.ndarray  # (hours,) expected cold starts per hour


def expected_containers(
    rate_rps: np.ndarray, service_s: np.ndarray | float, *, floor_inflight: np.ndarray | float = 0.0,
    target_inputs: int, buffer_containers: int = 0, scaledown_window_s: float, alpha: float | None,
    warm_min: np.ndarray | int = 0, max_containers: int | None = None, start_hour: int | None = None,
    cluster_size: float = 1.0, floor_service_line: tuple[float, float, np.ndarray, int] | None = None,
    startup: tuple[float, float] | None = None, factor_correlation_s: float = 0.0, warm_lead_s: float = 0.0,
    idle_share: float = 0.0,
) -> ContainerHours:
    """Expected containers alive and launches in each hour (see the module docstring for the derivation).

    rate_rps: each hour's mean arrival rate at the gateway (all of it: a floor takes its Q first);
    service_s: time a request holds its place; floor_inflight: Q, requests the floor holds before overflow;
    floor_service_line: (s0, s1, replicas by hour, batch cap o) — in front of a floor a request's time is
    s0 + s1·b at the floor's batch b = in flight / replicas ≤ o, and in flight settles where
    N = λ·g·S(N / replicas): S = s0 / (1 − s1·λ·g / replicas), or S(o) once the floor is full.
    start_hour None: the week from Monday 00:00 with no container up, as a deploy starts it and as the
    one-week simulation bills it (WARMUP_WEEKS more weeks before it would carry over levels reached once in a
    rare minute and never released: a deployment left running for months bills up to that); an hour index:
    no container is up before that hour, hours before it bill nothing.
    startup: (cold start c, launch to ready; S₁, the service time of a request that finds its container
    empty) — starting from no container, every request of the first c + S₁ is in flight at once (the start-up
    burst, step 5); None: no start-up burst.
    factor_correlation_s: how long the minute factor persists (`traffic.within_hour_correlation_s`): a minute
    keeps the previous minute's factor with probability e^(−60 / it) (step 3); 0: independent minutes.
    warm_lead_s: how long before its hour a rise of the warm minimum is deployed (the burst schedule's windows
    start a whole number of minutes ahead, topology/windows.py): the containers it launches then (the levels up
    to the new minimum that were off at the end of the hour before) are billed that long in the hour before.
    idle_share: the share p of minutes with no request (`traffic.idle_minute_share`): the factor is 0 in them and
    the Gamma of α (already solved for the peak factor with p, gamma_alpha_for_peak_with_idle) over 1 − p in the
    others (step 1, factor_quadrature); 0: every minute's factor from the Gamma.

    A pure function of its arguments, memoised on them (`_CALLS`): the planner asks again for the same
    endpoint's week (copies of an endpoint, candidate schedules that land on the same floor). The returned
    arrays are read-only."""
    line = floor_service_line
    key = (_key_array(rate_rps), _key_array(service_s), _key_array(floor_inflight), int(target_inputs),
           int(buffer_containers), float(scaledown_window_s), alpha, _key_array(warm_min),
           max_containers, start_hour, float(cluster_size), startup, float(factor_correlation_s), float(warm_lead_s),
           float(idle_share),
           None if line is None else (float(line[0]), float(line[1]), _key_array(line[2]), int(line[3])),
           USE_COMPILED)  # numpy and the kernel agree to 1e-12, not to the bit: a mode's figures stay its own
    with _MEMO_LOCK:  # the memos are shared by the process: one planning thread at a time works on them
        hit = _CALLS.get(key)
        if hit is None:
            hit = _expected_containers(rate_rps, service_s, floor_inflight=floor_inflight, target_inputs=target_inputs,
                                       buffer_containers=buffer_containers, scaledown_window_s=scaledown_window_s,
                                       alpha=alpha, warm_min=warm_min, max_containers=max_containers,
                                       start_hour=start_hour, cluster_size=cluster_size, floor_service_line=line,
                                       startup=startup, factor_correlation_s=factor_correlation_s,
                                       warm_lead_s=warm_lead_s, idle_share=idle_share)
            hit.alive.flags.writeable = hit.launches.flags.writeable = False
            _remember(_CALLS, key, hit, MEMO_CALLS)
        return hit


# Memos of pure functions, bounded (the oldest entry goes first); clear_memos() empties them.
MEMO_CALLS = 4096  # whole weeks (two arrays of 168 floats each)
MEMO_ROWS = 200_000  # one hour's switching probabilities (three arrays of at most a few hundred levels)
_CALLS: dict = {}
_MEMO_LOCK = threading.RLock()  # a library user may plan from threads: evictions would race on the dicts
_BURSTS: dict = {}  # (in flight at the first completion, B, weights) → {start level: P(launched in the burst)}
_ROWS: dict = {}  # settings → {(rate, service, floor, replicas) → (levels, (3, levels) array)}


def clear_memos() -> None:
    """Forget every memoised result (benchmarks time a planner that pays for what it computes)."""
    with _MEMO_LOCK:
        _CALLS.clear()
        _ROWS.clear()
        _BURSTS.clear()
    _level_grid.cache_clear()


def _trim_rows() -> None:
    """Bound _ROWS (a dict of rows per setting) to about MEMO_ROWS rows: the oldest settings' rows go first."""
    total = sum(map(len, _ROWS.values()))
    while total > MEMO_ROWS:
        oldest = next(iter(_ROWS))
        if len(_ROWS) == 1:  # one setting alone: its oldest rows
            rows = _ROWS[oldest]
            for _ in range(total - MEMO_ROWS):
                del rows[next(iter(rows))]
            return
        total -= len(_ROWS.pop(oldest))


def _remember(memo: dict, key, value, limit: int) -> None:
    if len(memo) >= limit:
        del memo[next(iter(memo))]
    memo[key] = value


def _key_array(x) -> tuple:
    """A hashable stand-in for an array argument: dtype, shape and bytes (a scalar stays a scalar)."""
    a = np.asarray(x)
    if a.ndim == 0:
        return (a.dtype.str, float(a))
    return (a.dtype.str, a.shape, a.tobytes())


@functools.lru_cache(maxsize=256)
def _level_grid(K: int) -> tuple[np.ndarray, np.ndarray]:
    """The levels evaluated for K containers (every level up to DENSE_LEVELS, then geometric) and each one's
    summed interpolation weight over the levels 1 … K (Σ over 1 … K of the linear interpolant = row · these)."""
    k_all = np.arange(1, K + 1)
    k = np.unique(np.concatenate([np.arange(1, min(K, DENSE_LEVELS) + 1),
                                  np.rint(np.geomspace(1, K, LEVEL_POINTS)).astype(int)]))
    hat_sum = (np.ones(len(k)) if len(k) == K else
               np.array([np.interp(k_all, k, np.eye(len(k))[i]).sum() for i in range(len(k))]))
    k.flags.writeable = hat_sum.flags.writeable = False
    return k, hat_sum


def _expected_containers(
    rate_rps, service_s, *, floor_inflight, target_inputs, buffer_containers, scaledown_window_s, alpha, warm_min,
    max_containers, start_hour, cluster_size, floor_service_line, startup, factor_correlation_s, warm_lead_s=0.0,
    idle_share=0.0,
) -> ContainerHours:
    lam = np.atleast_1d(np.asarray(rate_rps, dtype=float))
    H = lam.shape[0]
    S = np.broadcast_to(np.asarray(service_s, dtype=float), (H,))
    Q = np.broadcast_to(np.asarray(floor_inflight, dtype=float), (H,)).round()
    warm = np.broadcast_to(np.asarray(warm_min), (H,)).astype(int)
    T, b, W = max(1, int(target_inputs)), max(0, int(buffer_containers)), float(scaledown_window_s)
    p_idle = min(max(float(idle_share), 0.0), 1.0 - 1e-9)
    g, wg = factor_quadrature(alpha, p_idle)
    keep = factor_keep(factor_correlation_s) if alpha is not None or p_idle > 0 else 0.0
    # levels that can matter: up to mean + 10 sd of in flight at the largest g, in the busiest hour
    m_top = float((lam * S).max(initial=0.0) * g.max())
    order = (np.tile(np.arange(H), WARMUP_WEEKS + 1) if start_hour is None else np.arange(start_hour, H))
    if startup is not None and order.size:
        # and in the start-up burst (step 5), which can reach above any hour's own
        m_top = max(m_top, float(lam[order[0]]) * g.max() * (startup[0] + startup[1]))
    n_top = max(m_top + 10 * math.sqrt(m_top) + 10 - float(Q.min(initial=0.0)), 1.0)
    K = max(int(math.ceil(n_top / T)) + b + 1, int(warm.max(initial=0)), 1)
    if max_containers is not None:
        K = max(min(K, int(max_containers)), int(warm.max(initial=0)), 1)
    # one grid of levels for every hour (the state carries over hours): every level up to DENSE_LEVELS, then
    # geometric; P(k-th alive) is interpolated in between (smooth there over the spread of in flight)
    k, hat_sum = _level_grid(K)
    # the k-th container starts when the burst holds ≥ up_k = max(T·(k − 1 − b) + 1, k) (the autoscaler's
    # ⌈in flight / target⌉ + buffer), and stops after W in which the burst held < k (least-in-flight routing
    # reaches the k-th only when the first k − 1 are busy)
    up = np.where(k <= b, k, np.maximum(T * (k - 1 - b) + 1, k))
    # requests arrive in clusters of B (B = 1: Poisson): count clusters, each holding B places
    B = max(1.0, float(cluster_size))
    rate = lam[:, None, None] * g[None, None, :] / B
    S_hg = np.broadcast_to(S[:, None, None], rate.shape)
    reps_key = np.zeros(H)
    line_key = None
    if floor_service_line is not None:
        s0, s1, reps, cap_b = floor_service_line
        reps_key = np.broadcast_to(np.asarray(reps, dtype=float), (H,))
        line_key = (float(s0), float(s1), int(cap_b))
        reps_h = reps_key[:, None, None]
        F = np.maximum(reps_h, 1e-9)
        load = s1 * lam[:, None, None] * g[None, None, :] / F
        settled = s0 / np.maximum(1.0 - load, 1e-9)
        full = s0 + s1 * cap_b
        S_hg = np.where((load < 1.0) & (settled < full), np.maximum(settled, s0 + s1), full)
        S_hg = np.where(reps_h > 0, S_hg, full)  # no floor: the burst carries all at its own full batch
    mean = rate * S_hg  # (H, 1, G) clusters in flight
    # hours whose in flight can reach the burst's first level (at the largest g, within 10 sd + 10): only they
    # need the level arithmetic; in the others no level is reached, so none starts and an alive one stops W
    # after its last request (the limit of the rates in _switching: p_on = 0, r_off = 1/W)
    m_h = mean.max(axis=(1, 2))
    act = np.flatnonzero((lam > 0) & (m_h + 10 * np.sqrt(m_h) + 10 >= np.ceil((Q + 1) / B)))
    p_on = np.zeros((H, len(k)))
    # a container alive in an hour with no traffic (carried over, or released by the warm minimum) stops W after
    # its last request like any other, not at once (it was 1 per minute here: the plan billed none of those W)
    p_off = np.full((H, len(k)), -math.expm1(-SECONDS_PER_MINUTE / max(W, 1e-9)))
    stop_minute = np.zeros((H, len(k)))
    if act.size:
        p_on[act], p_off[act], stop_minute[act] = _switching_rows(act, lam, S, Q, reps_key, rate, mean, up, k, K, T,
                                                                  b, B, W, (alpha, p_idle), line_key, wg, keep)
    # each level a two-state chain by minute; closed form over an hour's 60 steps
    tot = p_on + p_off
    star = np.where(tot > 0, p_on / np.maximum(tot, 1e-300), 0.0)
    rho = 1.0 - tot
    rho60 = rho ** MINUTES_PER_HOUR
    # the hour's mean of ρ^t for t in [0, 60] minutes (the state relaxes continuously, not at minute ends)
    neg_log = -np.log(np.clip(rho, 1e-300, 1.0))
    mean_decay = np.where(neg_log > 1e-12, (1 - rho60) / np.maximum(MINUTES_PER_HOUR * neg_log, 1e-300), 1.0)
    # the billed week (`order`), after WARMUP_WEEKS from empty
    # a level the warm minimum holds is on all hour and after it (on at 1, relaxing to 1, no launch)
    on_warm = k[None, :] <= warm[:, None]
    stop_minute[on_warm] = 0.0
    star = np.where(on_warm, 1.0, star)
    mean_decay = np.where(on_warm, 0.0, mean_decay)
    rho60 = np.where(on_warm, 0.0, rho60)
    avg = np.zeros((H, len(k)))
    lead = np.zeros((H, len(k)))
    burst0 = np.zeros(len(k))
    if order.size:
        # the start-up burst (step 5): the levels launched before the first request completes
        h0 = int(order[0])
        burst0 = np.where(on_warm[h0], 0.0, _startup_burst(rate[h0], Q[h0], startup, up, B, wg))
        # P(on) at the start of each hour in order: the state after an hour is star + (before − star)·ρ⁶⁰, an
        # affine map of the state before, composed over the hours by a scan
        pi = _affine_prefix(rho60[order], star[order] * (1.0 - rho60[order]), burst0)
        last = order[-H:] if start_hour is None else order
        pi_last = pi[-len(last):]
        avg[last] = star[last] + (pi_last - star[last]) * mean_decay[last]
        if warm_lead_s > 0 and len(last) > 1:
            # a rise of the warm minimum is deployed warm_lead_s before its hour: the levels up to it that were off
            # at the end of the hour before (1 − P(on) at the hour's start) are launched then and billed that
            # long in the hour before (its cold start inside the lead); the first billed hour has none before it
            off = np.where(on_warm[last[1:]], 1.0 - pi_last[1:], 0.0)
            lead[last[:-1]] = off * (warm_lead_s / SECONDS_PER_HOUR)
    launch = (1.0 - avg) * p_on * MINUTES_PER_HOUR
    # the chain is on at minute ends; a level stopped by a run of idle minutes was on for part of the minute it
    # stopped in (idle_run_switching): that time, per unit of P(on), on top (not a base for launches)
    if stop_minute.any():
        avg *= 1.0 + stop_minute
    if order.size and (start_hour is not None or WARMUP_WEEKS == 0):
        launch[int(order[0])] += burst0  # each launched once, at the start
    if start_hour is not None:
        avg[:start_hour] = 0.0
        launch[:start_hour] = 0.0
    # back onto every level 1 … K (interpolation is linear in the row: the summed hat weights)
    alive = (avg + lead) @ hat_sum
    launches = launch @ hat_sum
    return ContainerHours(alive=alive, launches=launches)


def _startup_burst(rate_g: np.ndarray, Q: float, startup: tuple[float, float] | None, up: np.ndarray, B: float,
                   wg: np.ndarray) -> np.ndarray:
    """P(the k-th container is launched in the start-up burst), levels up (P,), for an hour with no floor.

    From no container, a container serves only a cold start c after its launch; the autoscaler launches on
    requests in flight, and with no container ready the routing queues requests on starting ones. The first
    request a container takes finds it empty and completes S₁ (its service alone) after the container is
    ready; until then nothing completes, so every request that arrived since the start is in flight:
    Poisson(λ·g·(c + S₁)) (clusters of B), against the hour's Poisson(λ·g·S). After it, each container
    completes its queue one request per decode-line step s₁, faster than requests arrive while
    launched containers > λ·s₁, so in flight falls back. The k-th container is launched when the burst reaches
    up_k and stops, like any other, only when in flight stays below k for a window — which at a rate that
    needs it never happens. Behind a floor the floor serves from the start and only its overflow waits: no
    start-up burst."""
    if startup is None or Q > 0 or not np.any(rate_g > 0):
        return np.zeros(len(up))
    cold_start_s, first_service_s = startup
    mean0 = rate_g * (cold_start_s + first_service_s)  # (1, G) clusters in flight when the first request completes
    # memoised per level (each level's figure depends on its own value alone: the calls of an endpoint ask for the
    # same first hour on grids that differ with K)
    key = (_key_array(mean0), float(B), _key_array(wg))
    memo = _BURSTS.get(key)
    if memo is None:
        memo = _BURSTS[key] = {}
        while len(_BURSTS) > MEMO_CALLS:
            del _BURSTS[next(iter(_BURSTS))]
    levels = up.tolist()
    miss = [u for u in dict.fromkeys(levels) if u not in memo]
    if miss:
        _, above, _ = poisson_tails(np.ceil(np.array(miss) / B)[None, :, None], mean0[None])
        memo.update(zip(miss, (above[0] * wg[None, :]).sum(axis=1).tolist()))
    return np.array([memo[u] for u in levels])


def _affine_prefix(a: np.ndarray, c: np.ndarray, x0: np.ndarray | None = None) -> np.ndarray:
    """x_0 given (0 by default), x_{t+1} = a_t·x_t + c_t (rows t, columns independent): every x_t for
    t < len(a), by a doubling scan (log₂ steps of whole-array arithmetic instead of a loop over the rows;
    a_t ∈ [0, 1], so the composed products only shrink)."""
    A, C = a.copy(), c.copy()
    n, d = len(a), 1
    while d < n:
        # compose each map with the one d rows before it: (A, C)[i] ∘ (A, C)[i − d]
        C[d:] = A[d:] * C[:-d] + C[d:]
        A[d:] = A[d:] * A[:-d]
        d *= 2
    if x0 is None or not np.any(x0):
        return np.concatenate([np.zeros((1,) + c.shape[1:]), C[:-1]])
    return np.concatenate([x0[None], A[:-1] * x0 + C[:-1]])


def _switching_rows(act, lam, S, Q, reps, rate, mean, up, k, K, T, b, B, W, alpha, line_key, wg, keep=0.0):
    """_switching for the active hours, each hour's entries read from the memo where the same hour (rate, service,
    floor, settings) was worked out before at the same level, and worked out once for the hours of a week alike in
    those (a profile of a few distinct hourly rates repeats them; the floor's DP gives equal hours equal floors).
    A row depends only on its own hour, and each level's entry on that level's value alone (its start level up_k
    follows from k and the settings; the cuts are thresholds on the level's value): so the memo keeps each hour's
    levels worked out so far, from any grid (the grids of two calls differ with their K: a warm minimum, a burst
    cap), and a call works out only the levels of its grid that the hour lacks. K itself is not part of the key.
    A memo entry: (levels, (3, levels) array of p_on, p_off, stop_minute)."""
    const = (T, b, B, W, alpha, line_key, wg.shape[0], keep, USE_COMPILED)
    # one dict of rows per setting (a row's key, four floats, hashes cheaply; the settings' tuple once a call),
    # the keys built and looked up in C (zip, map), not per hour in Python
    memo = _ROWS.get(const)
    if memo is None:
        memo = _ROWS[const] = {}
    keys = list(zip(lam[act].tolist(), S[act].tolist(), Q[act].tolist(), reps[act].tolist()))
    n = len(k)
    found = list(map(memo.get, keys))
    # the hours by the levels they have (entries worked out together share one levels array)
    groups: dict[int, list[int]] = {}
    for i, f in enumerate(found):
        groups.setdefault(0 if f is None else id(f[0]), []).append(i)
    out = np.empty((len(keys), 3, n))
    stored = False
    for gid, idx in groups.items():
        lv = None if gid == 0 else found[idx[0]][0]
        if lv is k:  # worked out on this very grid
            out[idx] = np.array([found[i][1] for i in idx])
            continue
        if lv is None:
            have, pos = np.zeros(n, dtype=bool), None
        else:
            pos = np.minimum(np.searchsorted(lv, k), len(lv) - 1)
            have = lv[pos] == k
        if have.all():
            out[idx] = np.array([found[i][1] for i in idx])[:, :, pos]
            continue
        # the distinct hours of the group, their missing levels worked out in one call
        rep: dict = {}  # each distinct hour's key → one of its hours (alike hours have alike entries)
        for i in idx:
            rep.setdefault(keys[i], i)
        todo = list(rep.values())
        first = {key: j for j, key in enumerate(rep)}
        miss = np.flatnonzero(~have)
        new = np.stack(_switching(rate[act[todo]], mean[act[todo]], Q[act[todo]], up[miss], k[miss], B, W, wg, keep),
                       axis=1)
        if lv is None:
            lv_new, vals = k, new
        else:
            both = np.concatenate([lv, k[miss]])
            order = np.argsort(both, kind="stable")
            lv_new = both[order]
            lv_new.flags.writeable = False
            vals = np.concatenate([np.array([found[i][1] for i in todo]), new], axis=2)[:, :, order]
        for j, i in enumerate(todo):
            memo[keys[i]] = (lv_new, vals[j])
        stored = True
        rows = vals[[first[keys[i]] for i in idx]]
        out[idx] = rows if lv_new is k else rows[:, :, np.searchsorted(lv_new, k)]
    if stored:
        _trim_rows()
    return out[:, 0], out[:, 1], out[:, 2]


def _switching(rate: np.ndarray, mean: np.ndarray, Q: np.ndarray, up: np.ndarray, k: np.ndarray, B: float,
               W: float, wg: np.ndarray, keep: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """_switching_numpy, or the compiled kernel where asked for (USE_COMPILED; same figures to 1e-12)."""
    if _use_compiled():
        from . import serverless_compiled
        top = int(math.ceil((float(Q.max(initial=0.0)) + float(max(up.max(), k.max()))) / B))
        return serverless_compiled.switching(rate, mean, Q, up, k, B, W, wg, log_fact_upto(top + 2), EXACT_LEVELS,
                                             float(SECONDS_PER_MINUTE), UPPER_DIRECT_BELOW, UPPER_SERIES_TERMS,
                                             UPPER_SERIES_STOP, *start_levels_on_and_within_reach(rate, mean, Q, up, B),
                                             stop_levels_held(mean, Q, k, B), REACH_SD, REACH_ABOVE, keep,
                                             PERSIST_NEGLIGIBLE, IDLE_EXPECTED)
    return _switching_numpy(rate, mean, Q, up, k, B, W, wg, keep)


# Whether _switching runs the compiled kernel (serverless_compiled; numba). Off unless asked for (PLANNER_COMPILED=1
# or setting this True): the kernel is ≈ 2.8× faster than numpy on this arithmetic (the 100-endpoint distinct
# fleet's 463 calls: 0.91 against 2.55 s CPU), but importing numba and loading the cached kernel cost 0.43–0.53 s
# CPU per process (its first compile, from an empty numba cache, 2.9 s), while it saves ≈ 0.1 s on the prod stack
# and ≈ 1.6 s on that fleet. Both give the same plans: figures agree to 1e-12 relative or 1e-20 absolute
# (tests/test_serverless_compiled.py), specs byte for byte (benchmarks/plans_unchanged.py --compiled yes).
USE_COMPILED: bool = os.environ.get("PLANNER_COMPILED", "") in ("1", "true", "yes")


def _use_compiled() -> bool:
    if not USE_COMPILED:
        return False
    from . import serverless_compiled
    return serverless_compiled.available()


def _switching_numpy(rate: np.ndarray, mean: np.ndarray, Q: np.ndarray, up: np.ndarray, k: np.ndarray, B: float,
                     W: float, wg: np.ndarray, keep: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-minute probabilities (H, P) that each level switches on (from off) and off (from on), for hours
    with traffic: rate and mean (H, 1, G) are clusters per second and in flight at each minute factor g; keep: the
    probability that a minute keeps the previous minute's factor (0: independent minutes; persistent_switching).
    And (H, P) the time on in the minutes where a run of idle minutes stops the level, per unit of P(on) at minute
    ends (idle_run_switching; 0 where no node is idle).

    Worked out on blocks of hours of about SWITCHING_BLOCK values (hours × levels × nodes): each hour's row
    depends on that hour alone, and arrays that size stay in the processor's cache and are allocated from the
    heap, where whole-week arrays (megabytes each, some twenty of them) cost a page fault per 4 KB and a pass
    through memory per step — twice the time, for the same figures bit for bit. Each block works out the start
    levels only up to the highest its hours can reach (start_levels_within_reach) and the stop levels only from
    the lowest its hours can leave (stop_levels_held); hours are grouped by reach, so a quiet hour does not pay a
    busy one's levels."""
    H, n = rate.shape[0], max(1, SWITCHING_BLOCK // (2 * len(k) * rate.shape[-1]))
    on, reach = start_levels_on_and_within_reach(rate, mean, Q, up, B)
    held = stop_levels_held(mean, Q, k, B)
    if H > n:
        order = np.argsort(reach, kind="stable")
        out = tuple(np.empty((H, len(k))) for _ in range(3))
        for i in range(0, H, n):
            rows = order[i:i + n]
            for o, x in zip(out, _switching_block(rate[rows], mean[rows], Q[rows], up, k, B, W, wg, on[rows],
                                                  reach[rows], held[rows], keep)):
                o[rows] = x
        return out
    return _switching_block(rate, mean, Q, up, k, B, W, wg, on, reach, held, keep)


# A start level more than this many standard deviations (+ this many) above an hour's largest in flight (its
# busiest minute factor) is never reached in it: P(N = L − 1) < 1e-30 there (Poisson tail; Chernoff), so its
# start rate h_on is taken as 0 instead of worked out (a change below 1e-28 containers in any hour's bill); and
# a stop level as far below its smallest in flight is never left: P(N ≤ L − 1) < 1e-31, r_off < 1e-31 × rate,
# taken as 0
REACH_SD = 12.0
REACH_ABOVE = 20.0


def start_levels_on_and_within_reach(rate: np.ndarray, mean: np.ndarray, Q: np.ndarray, up: np.ndarray, B: float
                                     ) -> tuple[np.ndarray, np.ndarray]:
    """For each hour (rows of rate and mean (H, 1, G)), of the start levels ⌈(Q + up_k) / B⌉ (ascending in k):
    how many are surely on every minute (`on`), and how many lie within REACH_SD standard deviations +
    REACH_ABOVE of its largest in flight (`reach`). The start levels worked out are those from `on` to `reach`.

    Surely on: L − 1 at least REACH_SD sd + REACH_ABOVE below every minute factor's in flight m (so its stop
    level, no higher, is held: r_off = 0) and below m − S (S = m / rate, the request's time): then
    h_on = rate·P(N = L − 1)/P(N ≤ L − 1) ≥ rate·(1 − (L − 1)/m) > 1/S (P(N ≤ n) ≤ P(N = n)/(1 − n/m), the terms
    falling at least by n/m below n), so e^(−60·h_on) < e^(−60) and the minute's switch-on probability
    w·(1 − e^(−60·h_on)) is w to the last bit: its row sums the weights."""
    m_top = mean.max(axis=(1, 2))
    top = m_top + REACH_SD * np.sqrt(m_top) + REACH_ABOVE
    m = np.broadcast_to(mean, rate.shape)
    S = np.divide(m, rate, out=np.full(rate.shape, np.inf), where=rate > 0)
    m_low = m.min(axis=(1, 2))
    low = np.minimum(m_low - REACH_SD * np.sqrt(m_low) - REACH_ABOVE, (m - S).min(axis=(1, 2)))
    L_up = np.ceil((Q[:, None] + up[None, :]) / B)
    on = np.logical_and.accumulate(L_up - 1 <= low[:, None], axis=1).sum(axis=1)
    return on, np.logical_and.accumulate(L_up <= top[:, None], axis=1).sum(axis=1)


def stop_levels_held(mean: np.ndarray, Q: np.ndarray, k: np.ndarray, B: float) -> np.ndarray:
    """For each hour, how many of the stop levels ⌈(Q + k) / B⌉ (ascending) lie REACH_SD standard deviations +
    REACH_ABOVE or more below its smallest in flight (its quietest minute factor): in flight never falls below
    them, so their r_off is 0 and they are not worked out."""
    m_low = mean.min(axis=(1, 2))
    low = m_low - REACH_SD * np.sqrt(m_low) - REACH_ABOVE
    L_dn = np.ceil((Q[:, None] + k[None, :]) / B)
    return np.logical_and.accumulate(L_dn - 1 <= low[:, None], axis=1).sum(axis=1)


SWITCHING_BLOCK = 65_536  # values per block of _switching_numpy (512 KB a array: L2-sized)


def _switching_block(rate: np.ndarray, mean: np.ndarray, Q: np.ndarray, up: np.ndarray, k: np.ndarray, B: float,
                     W: float, wg: np.ndarray, on: np.ndarray, reach: np.ndarray, held: np.ndarray, keep: float = 0.0
                     ) -> tuple[np.ndarray, np.ndarray]:
    """_switching_numpy for one block of hours (start_levels_on_and_within_reach, stop_levels_held): each hour's
    first `on` start levels are surely on (p_on the weights' sum), those from its `reach` on are beyond it (h_on
    = 0); its first `held` stop levels are never left (r_off = 0). The block works out the start levels from its
    smallest `on` to its largest reach and the stop levels from its smallest held, and sets the rest of each row,
    so a row's figures do not depend on the hours it is blocked with."""
    # both level sets in one call (one table of Poisson sums per hour and g): start levels, then stop levels
    P, lo = len(k), int(held.min(initial=0))
    a, c = int(on.min(initial=0)), int(reach.max(initial=0))
    levels = np.ceil((Q[:, None] + np.concatenate([up[a:c], k[lo:]])[None, :]) / B)[:, :, None]
    F, above, at = poisson_tails(levels, mean, upper_from=c - a)  # the upper tail of the stop levels only
    F_up, at_up = F[:, :c - a], at[:, :c - a]
    F_dn, at_dn, above_dn = F[:, c - a:], at[:, c - a:], above[:, c - a:]
    # The arithmetic below runs on (hours, levels, nodes) arrays, the planner's largest: each step writes into an
    # array whose value is no longer needed (F, at and above are this call's own), in the same order of operations
    # as the formulas in the comments, so the figures are the same to the last bit
    # h_on = rate · at_up / max(F_up, 1e-300): hazard of reaching up_k from below
    h_on = rate * at_up
    h_on /= np.maximum(F_up, 1e-300, out=F_up)
    d = np.multiply(rate, at_dn, out=at_dn)  # down-crossings of k per second (= up-crossings)
    # −hW = −W·d / max(F_dn, 1e-300) (negation is exact); q = e^(−hW): a sojourn below k outlasts W
    neg_hW = d * -W
    q = np.maximum(F_dn, 1e-300)
    neg_hW /= q
    np.exp(neg_hW, out=q)
    # 1 / expected on-period, q·d / (1 − F·q), with 1 − F·q = P(N ≥ k) + F·(1 − q) kept accurate when both are
    # tiny (far above the mean: the on-period is W plus the excursion at or above k, P(N ≥ k) / d, which with the
    # tail taken as 1 − F was lost; a level the hour never reaches again: its container stops W after the last
    # request, rate 1/W)
    # slack = above_dn + F_dn·(−expm1(−hW)) = above_dn − F_dn·expm1(−hW)
    # nodes that bring no request (an idle minute, or a Gamma node at or next to 0: fewer than IDLE_EXPECTED
    # clusters expected in the minute) in an hour with requests at others: a run of them stops a level only once
    # it lasts the window, which the minute-by-minute rates cannot say (idle_run_switching); (H, G)
    idle = rate[:, 0, :] * SECONDS_PER_MINUTE < IDLE_EXPECTED
    idle[idle.all(axis=1)] = False  # an hour with no request at all: every level stops W after its last
    if idle.any():
        hW_dn = -neg_hW  # for the quiet time before a run of idle minutes (idle_run_switching)
    slack = np.expm1(neg_hW, out=neg_hW)
    slack *= F_dn
    np.subtract(above_dn, slack, out=slack)
    if idle.any():
        # on at the end of a minute: in flight at or above the level (P(N ≥ L), no quiet yet) or below it for less
        # than W (F·(1 − e^(−hW))): slack is their sum
        at_level = np.divide(above_dn, slack, out=np.zeros_like(slack), where=slack > 0)
    # and at a minute factor of 0 (Wilson–Hilferty's nodes are 0 below its cube's root at α ≲ 0.6, busiest minute
    # ≳ 5× the mean) no request comes: every level is left and stops W after its last request. (The mean's floor
    # of 1e-300 left level 1 a tail P(N ≥ 1) of 1e-300 > 0, and with d = 0 its stop rate was 0: the container
    # was held through every quiet minute)
    never = ~(slack > 0) | (rate == 0.0)
    r_off = np.multiply(q, d, out=q)
    r_off /= np.maximum(slack, 1e-300, out=slack)
    np.copyto(r_off, 1.0 / max(W, 1e-9), where=never)
    # per-minute switching probabilities, averaged over the minute factor g (independent per minute)
    # (a two-state chain in continuous time inside the minute: rates h_on and r_off)
    # settle = −expm1(−both·60) / max(both, 1e-300), both = h_on + r_off
    both = np.zeros((rate.shape[0], P, rate.shape[-1]))
    both[:, a:c] = h_on
    both[:, lo:] += r_off  # h_on + r_off (h_on = 0 beyond reach, r_off = 0 where held)
    settle = np.multiply(both, -float(SECONDS_PER_MINUTE))
    np.expm1(settle, out=settle)
    settle /= np.maximum(both, 1e-300, out=both)
    np.negative(settle, out=settle)
    m = np.broadcast_to(mean, rate.shape)
    S = np.divide(m, rate, out=np.full(rate.shape, np.inf), where=rate > 0)
    on_low = np.minimum(m - REACH_SD * np.sqrt(m) - REACH_ABOVE, m - S)
    cols = np.arange(P)[None, :]
    if keep > 0.0 or idle.any():
        # each minute factor's own switching probabilities, then the levels' chains with the factor persisting
        pn, pf = np.zeros(both.shape), np.zeros(both.shape)
        pn[:, a:c] = h_on * settle[:, a:c]
        np.copyto(pn[:, a:c], 1.0, where=levels[:, :c - a] - 1 <= on_low)
        pf[:, lo:] = r_off * settle[:, lo:]
        pn[np.broadcast_to((cols >= reach[:, None])[:, :, None], pn.shape)] = 0.0
        pn[np.broadcast_to((cols < on[:, None])[:, :, None], pn.shape)] = 1.0
        pf[np.broadcast_to((cols < held[:, None])[:, :, None], pf.shape)] = 0.0
        if not idle.any():
            return (*persistent_switching(pn, pf, wg, keep), np.zeros((rate.shape[0], P)))
        # the stop levels never left (before lo) are at or above: no quiet before a run
        a_full, h_full = np.ones(pn.shape), np.zeros(pn.shape)
        a_full[:, lo:], h_full[:, lo:] = at_level, hW_dn
        rows = idle.any(axis=1)
        p_on, p_off, stop_minute = np.empty((rate.shape[0], P)), np.empty((rate.shape[0], P)), np.zeros((rate.shape[0], P))
        p_on[rows], p_off[rows], stop_minute[rows] = idle_run_switching(pn[rows], pf[rows], wg, keep, idle[rows], W,
                                                                        a_full[rows], h_full[rows])
        if not rows.all():
            # hours with a request in every minute, or with none at all (a block mixes them only in tests)
            rest = ~rows
            p_on[rest], p_off[rest] = (persistent_switching(pn[rest], pf[rest], wg, keep) if keep > 0.0 else
                                       ((wg * pn[rest]).sum(axis=-1), (wg * pf[rest]).sum(axis=-1)))
        return p_on, p_off, stop_minute
    w = wg[None, None, :]
    h_on *= w
    h_on *= settle[:, a:c]
    # a start level surely on at a minute factor's own in flight (as start_levels_on_and_within_reach for the
    # hour) switches on within the minute: its weight, where P(N < L) may have underflowed (h_on lost)
    np.copyto(h_on, np.broadcast_to(w, h_on.shape), where=levels[:, :c - a] - 1 <= on_low)
    r_off *= w
    r_off *= settle[:, lo:]
    p_on, p_off = np.zeros((rate.shape[0], P)), np.zeros((rate.shape[0], P))
    p_on[:, a:c] = h_on.sum(axis=2)
    p_on[cols >= reach[:, None]] = 0.0
    p_on[cols < on[:, None]] = float(wg.sum())
    p_off[:, lo:] = r_off.sum(axis=2)
    p_off[cols < held[:, None]] = 0.0
    return p_on, p_off, np.zeros((rate.shape[0], P))  # (H, P)


PERSIST_NEGLIGIBLE = 1e-12  # a level on (or off) less than this share of the time keeps the independent-minute sums
IDLE_EXPECTED = 1e-12  # a minute factor node expecting fewer clusters than this in a minute brings no request


def persistent_switching(pn: np.ndarray, pf: np.ndarray, wg: np.ndarray, keep: float
                         ) -> tuple[np.ndarray, np.ndarray]:
    """A level's per-minute switching probabilities (…,) when the minute factor persists: pn, pf (…, G) are the
    probabilities that the level switches on from off and off from on within a minute at each factor node g_i
    (weights w_i); each minute keeps the previous minute's factor with probability `keep` and otherwise draws it
    afresh (so the factor's autocorrelation at a lag of n minutes is keep^n, the same marginal).

    The level and the factor make one chain over minutes. With x_i the probability that a minute starts on at
    node i and y_i that it ends on there: y_i = w_i·pn_i + ρ_i·x_i (ρ_i = 1 − pn_i − pf_i), and the next minute
    starts from x'_i = keep·y_i + (1 − keep)·w_i·Y, Y = Σ y. Stationary, y_i = w_i·(pn_i + ρ_i·(1 − keep)·Y) /
    (1 − keep·ρ_i), and summing, with d_i = 1 − keep·ρ_i:

        P(on) = Y = Σ w·pn/d / Σ w·(pn + pf)/d,

    a mean of each node's own P(on) pn/(pn + pf) weighted by how long a node's chain holds: at keep → 1 each
    node's level settles as if its factor lasted, at keep = 0 it is Σ w·pn / Σ w·(pn + pf), the rates averaged
    over independent minutes. Launches per minute, Σ (w_i − x_i)·pn_i, with the off mass at the start of a
    minute w_i − x_i = keep·w_i·(pf_i + ρ_i·(1 − keep)·(1 − Y))/d_i + (1 − keep)·w_i·(1 − Y) (all terms ≥ 0):

        launches = keep·Σ w·pn·pf/d + (1 − keep)·(1 − Y)·(keep·Σ w·pn·ρ/d + Σ w·pn).

    Returned as the two-state chain with that P(on) and that launch rate (what the hour's chain in
    _expected_containers reads): p_on = launches / (1 − Y), p_off = launches / Y; at keep = 0 they are the
    weighted sums Σ w·pn and Σ w·pf. A level never left (pf = 0 at every node) or never reached (pn = 0) keeps
    those sums, and so does one on or off less than PERSIST_NEGLIGIBLE of the time (there the two forms differ
    by a share of a container no bill shows, and launches / Y would divide rounding noise by nearly 0)."""
    w = np.asarray(wg, dtype=float)
    rho = 1.0 - pn - pf
    d = 1.0 - keep * rho
    a_on = (w * pn / d).sum(axis=-1)
    a_off = (w * pf / d).sum(axis=-1)
    p_bar_on, p_bar_off = (w * pn).sum(axis=-1), (w * pf).sum(axis=-1)
    cross = (w * pn * pf / d).sum(axis=-1)
    stay = (w * pn * rho / d).sum(axis=-1)
    tot = a_on + a_off
    pos = tot > 0
    y_on = np.divide(a_on, tot, out=np.zeros_like(tot), where=pos)
    y_off = np.divide(a_off, tot, out=np.zeros_like(tot), where=pos)
    ok = (y_on > PERSIST_NEGLIGIBLE) & (y_off > PERSIST_NEGLIGIBLE)
    y_on[~ok] = y_off[~ok] = 1.0
    launches = keep * cross + (1.0 - keep) * y_off * (keep * stay + p_bar_on)
    p_on = np.where(ok, launches / y_off, p_bar_on)
    p_off = np.where(ok, launches / y_on, p_bar_off)
    return p_on, p_off


def idle_run_switching(pn: np.ndarray, pf: np.ndarray, wg: np.ndarray, keep: float, idle: np.ndarray, W: float,
                       at_level: np.ndarray | None = None, hW: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """persistent_switching where some nodes (`idle`, a mask over the last axis, or (H, G) per hour) bring no
    request: a level on when a run of them begins stays on until the quiet has lasted the window W, then stops —
    not at the rate 1/W a minute, which stops it in an isolated quiet minute 1 − e^(−60/W) of the time (39% at
    W = 120 s) where it never stops, and keeps it in a long run's minutes after W.

    The factor's chain as in persistent_switching (each minute keeps the factor with probability κ = `keep`, else
    draws it afresh), with the idle nodes (weight p) one state counted by the run's age: a run goes on with
    probability s = κ + (1 − κ)·p a minute. A level on at the end of an active minute i enters a run with
    probability (1 − κ)·p; per unit so entering, ret_i is its expected on mass at the ends of the run's minutes
    (each weighted by the chance the run lasts to it) and ont_i its expected minutes on in the run (idle_run_on:
    it stops T = W − q₀ into the run, q₀ the quiet before it, from at_level and hW; at_level None: q₀ = 0). The
    on mass at the ends of minutes that draw afresh is Z = y_a + E, y_a = Σ y_i over the active nodes and
    E = (1 − κ)·p·Σ y_i·ret_i the runs' share, and stationary y_i = w_i·(pn_i + (1 − κ)·ρ_i·Z)/d_i
    (ρ = 1 − pn − pf, d = 1 − κ·ρ). With the sums over the active nodes S_on = Σ w·pn/d, S_ρ = Σ w·ρ/d,
    S_× = Σ w·pn·pf/d, R_on = Σ w·pn·ret/d, R_ρ = Σ w·ρ·ret/d (O_on, O_ρ the same with ont) and
    u = (1 − κ)·p:

        Z = (S_on + u·R_on) / (1 − (1 − κ)·(S_ρ + u·R_ρ)),   y_a = S_on + (1 − κ)·Z·S_ρ,
        launches = κ·S_× + (1 − κ)·(1 − Z)·S_on   (the off mass at active minutes' starts × pn),
        time on = y_a + u·(O_on + (1 − κ)·Z·O_ρ)

    (at p = 0 persistent_switching's forms; checked against the explicit chain solved numerically). Z is the P(on)
    at minute ends, what the hour's two-state chain reads (p_on = launches / (1 − Z), p_off = launches / Z, both in
    [0, 1]: launches come from the off mass and equal the stops, from the on mass); the time on beyond it, the part
    of the minute a run stops the level in, is returned apart, per unit of Z ((time on − Z)/Z ≥ 0, for the
    containers alive only). A level on or off less than PERSIST_NEGLIGIBLE of the time keeps the minute-by-minute
    sums (every node's own rates, the idle nodes' 1 − e^(−60/W) included) and no extra time."""
    w = np.asarray(wg, dtype=float)
    idle = np.asarray(idle, dtype=bool)
    if idle.ndim >= 2:
        idle = idle[..., None, :]  # (H, 1, G): an hour's idle nodes, the same for each level
    p = np.asarray((w * idle).sum(axis=-1))[..., None]  # each hour's idle share, (H, 1, 1)
    wa = w * ~idle  # the sums run over the active nodes
    rho = 1.0 - pn - pf
    d = 1.0 - keep * rho
    if at_level is None:
        at_level, hW = np.ones(pn.shape), np.zeros(pn.shape)
    ret, ont = idle_run_on(at_level, hW, keep + (1.0 - keep) * p, W)
    u = (1.0 - keep) * p[..., 0]  # a minute's on mass at an active node that enters a run next
    s_on = (wa * pn / d).sum(axis=-1)
    s_rho = (wa * rho / d).sum(axis=-1)
    s_cross = (wa * pn * pf / d).sum(axis=-1)
    r_on, r_rho = (wa * pn * ret / d).sum(axis=-1), (wa * rho * ret / d).sum(axis=-1)
    o_on, o_rho = (wa * pn * ont / d).sum(axis=-1), (wa * rho * ont / d).sum(axis=-1)
    Z = (s_on + u * r_on) / np.maximum(1.0 - (1.0 - keep) * (s_rho + u * r_rho), 1e-300)
    y_a = s_on + (1.0 - keep) * Z * s_rho
    time_on = y_a + u * (o_on + (1.0 - keep) * Z * o_rho)
    launches = keep * s_cross + (1.0 - keep) * (1.0 - Z) * s_on
    ok = (Z > PERSIST_NEGLIGIBLE) & (1.0 - Z > PERSIST_NEGLIGIBLE) & (launches > 0)
    safe_z = np.where(ok, Z, 0.5)
    p_on = np.where(ok, launches / (1.0 - safe_z), (w * pn).sum(axis=-1))
    p_off = np.where(ok, launches / safe_z, (w * pf).sum(axis=-1))
    stop_minute = np.where(ok, np.maximum(time_on - Z, 0.0) / safe_z, 0.0)
    return p_on, p_off, stop_minute


def idle_run_on(at_level: np.ndarray, hW: np.ndarray, s: float, W: float) -> tuple[np.ndarray, np.ndarray]:
    """For a level on at the end of an active minute that a run of idle minutes follows (the run goes on with
    probability s a minute): the expected on mass at the ends of the run's minutes (each weighted by the chance the
    run lasts to it: what returns to the active minutes, over 1 − s) and the expected minutes on within the run.

    It stops once the quiet has lasted W: T = W − q₀ into the run, q₀ the quiet before it — 0 with probability
    `at_level` (in flight at or above the level), else the age of a sojourn below it, Exp(h) (hW = h·W, the
    level's hazard of being reached again, as _switching_block's stop rate reads it) cut at W. On through n = ⌈T/60⌉
    − 1 whole minutes and T/60 − n of the next: returns Σ_{r ≤ n} s^(r−1) = (1 − sⁿ)/(1 − s) and is on that plus
    sⁿ·(T/60 − n), averaged over q₀ interval by interval (T in (60n, 60(n + 1)]), each with the cut exponential's
    mass and mean there (uniform where h·W → 0)."""
    per = float(SECONDS_PER_MINUTE)
    A = max(1, math.ceil(W / per - 1e-9))
    s = np.asarray(s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):  # s → 1 (a run never ends): n whole minutes
        geo = [np.where(1.0 - s > 1e-12, (1.0 - s ** n) / (1.0 - s), float(n)) for n in range(A)]
    # q₀ = 0: T = W
    ret = at_level * geo[A - 1]
    ont = at_level * (geo[A - 1] + s ** (A - 1) * (W / per - (A - 1)))
    below = 1.0 - at_level
    h = hW / max(W, 1e-9)
    whole = -np.expm1(-hW)
    tiny = hW < 1e-9
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for n in range(A):
            lo, hi = max(0.0, W - per * (n + 1)), W - per * n
            width = hi - lo
            t = h * width
            mass = np.where(tiny, width / max(W, 1e-9),
                            np.exp(-h * lo) * -np.expm1(-t) / np.where(tiny, 1.0, whole))
            # mean of an exponential cut to [lo, hi): lo + width·(1/t − 1/(e^t − 1)) (→ width/2 as t → 0)
            share = np.where(t < 1e-4, 0.5 - t / 12.0, 1.0 / t - 1.0 / np.expm1(t))
            frac = (W - (lo + width * share)) / per - n
            ret += below * mass * geo[n]
            ont += below * mass * (geo[n] + s ** n * frac)
    return ret, ont


def service_time_s(ep: EndpointInputs, pl: Placement, batch: np.ndarray | float) -> np.ndarray:
    """Seconds a request holds a sequence slot at this batch: its prefill, then output × the decode gap, the
    gap carrying the amortised prefill of the other b − 1 sequences (the placement's decode line)."""
    s, hit = ep.shape, ep.prefix_cache_hit_fraction
    prefill = s.input_tokens_mean * (1 - hit) / pl.prefill_tokens_per_s
    interference = prefill / s.output_tokens_mean
    b = np.clip(np.asarray(batch, dtype=float), 1.0, pl.usable_concurrency)
    gap = pl.decode_step_floor_s + pl.decode_step_s_per_sequence * b + (b - 1) * interference
    return prefill + s.output_tokens_mean * gap


def buffer_containers(peak_rps: np.ndarray, planning_rps: float, cold_start_s: float, planned_max_containers: int) -> int:
    """Idle containers kept launched ahead of demand (serverless only): the steepest hour-to-hour rise of the
    within-hour peak, over one cold start, in containers — at most the planned peak's cap − 1 beyond the
    containers in use (the BurstSpec's buffer; spike headroom raises the cap but not the buffer)."""
    ramp_rps_per_s = max(0.0, float(np.max(np.diff(peak_rps)))) / 3600.0 if len(peak_rps) > 1 else 0.0
    return max(0, min(planned_max_containers - 1, math.ceil(ramp_rps_per_s * cold_start_s / planning_rps)))


def peak_factor_of_alpha(alpha: float | None) -> float:
    """The expected busiest of 60 minutes over the mean for Gamma(α, 1/α) minute factors (Wilson–Hilferty). The
    transform peaks at α = 4/(9z²) (z = Z_PEAK_MINUTE; 9.7× the mean) and falls below it: a burstier α reads that
    most bursty figure (as gamma_alpha_for_peak_with_idle clamps the other way), not a calmer one — a log of 59
    minutes at 100 and one at 20,000 read 2.15."""
    if alpha is None:
        return 1.0
    return max(1.0, busiest_minute_factor(max(alpha, _most_bursty_alpha(Z_PEAK_MINUTE))))


def _most_bursty_alpha(z: float) -> float:
    """The α at which Wilson–Hilferty's busiest-minute transform at quantile z peaks (minute_factors)."""
    return 4.0 / (9.0 * z * z)


def peak_factor_from_minute_counts(counts: np.ndarray, cluster_size: float = 1.0) -> float:
    """`traffic.within_hour_peak_factor` measured from a request log: counts[h, m] = requests in minute m of
    hour h. The busiest minute of raw counts also carries Poisson noise (large at low rates), so the rate's
    own burstiness is taken from the counts' excess dispersion: Var(c) = B·c̄ + c̄²/α (B: arrival cluster size,
    1 for Poisson), i.e. 1/α = (Var − B·c̄)/c̄², averaged over the hours with traffic, then turned into the
    busiest-minute factor the input means. Read within each hour, around that hour's own mean, on purpose: the
    plan multiplies the hour-of-week profile's mean by the factor, so the part of a slowly drifting rate that
    moves the hour's mean is in the profile already. A persisting factor therefore reads lower than its whole
    variance (at τ = 10 min a peak of 3 reads 2.68); correcting for that (÷ n(1 − V)/(n − 1), V the hour mean's
    share of the variance) counted the bundled replays' slow drifts twice (Azure conversation at 3 req/s:
    τ ≈ 44 min), and its 3-hour cell in tests/test_cost_model.py planned 11% over the simulated bill."""
    V = _excess_variance(np.asarray(counts, dtype=float), cluster_size)
    return 1.0 if V is None else _peak_of_variance(V)


def _excess_variance(counts: np.ndarray, cluster_size: float) -> float | None:
    """The minute factor's variance from counts[h, m]: (Var − B·c̄)/c̄² averaged over the hours with traffic (c̄ ≥ 1),
    each around its own mean (peak_factor_from_minute_counts says why); None without such an hour."""
    mean = counts.mean(axis=1)
    busy = mean >= 1.0
    if not busy.any():
        return None
    return float(np.mean((counts[busy].var(axis=1, ddof=1) - cluster_size * mean[busy]) / mean[busy] ** 2))


def _peak_of_variance(V: float) -> float:
    """The peak factor of a Gamma factor of variance V = 1/α (1 where the factor does not vary)."""
    return peak_factor_of_alpha(1.0 / V) if V > 1e-9 else 1.0


def correlation_s_from_minute_counts(counts: np.ndarray, cluster_size: float = 1.0) -> float:
    """`traffic.within_hour_correlation_s` measured from a request log: counts[h, m] = requests in minute m of
    hour h. Poisson noise is independent from one minute to the next, so the counts' lag-1 autocovariance is the
    rate factor's alone, c̄²·Cov(g_m, g_{m+1}), while their variance carries the noise too (B·c̄ +
    c̄²/α, as in peak_factor_from_minute_counts): the factor's lag-1 autocorrelation r is the autocovariance
    over the excess variance, each summed over the hours with traffic (in counts: divided by each hour's own
    mean², the hours where the factor ran high would weigh less, and r read 10% low at τ = 300 s). Deviations
    are taken from each hour's own mean, which a persisting factor drags along: with autocorrelation rᵏ at lag
    k over n = 60
    minutes, V = (1 + 2·Σ (1 − k/n)·rᵏ) / n the mean's share of the variance and c = Σ_{j<n} rʲ, the sums'
    expectations are n·(1 − V) (squares) and (n − 1)·r − (n + 1)·V + 2c/n (neighbours) times the factor's
    variance, and −(n − 1)/n times the noise's for the neighbours; r is the one whose ratio is the measured one
    (increasing in r: bisection). A factor kept from one minute to the next with probability r has lag-k
    autocorrelation rᵏ = e^(−60·k / τ): τ = −60 / ln r; 0 where the ratio shows none, at most an hour."""
    c = np.asarray(counts, dtype=float)
    mean = c.mean(axis=1)
    busy = mean >= 1.0
    n = c.shape[1]
    if not busy.any() or n < 3:
        return 0.0
    dev = c[busy] - mean[busy, None]
    noise = cluster_size * mean[busy]
    squares = (dev ** 2).sum(axis=1) - (n - 1) * noise  # the factor's part
    pairs = (dev[:, 1:] * dev[:, :-1]).sum(axis=1) + (n - 1) / n * noise
    if not squares.sum() > 0:
        return 0.0
    ratio = float(pairs.sum() / squares.sum())
    k = np.arange(1, n)

    def expected_ratio(r: float) -> float:
        V = (1.0 + 2.0 * float(np.sum((1.0 - k / n) * r ** k))) / n
        return ((n - 1) * r - (n + 1) * V + 2.0 * float(np.sum(r ** np.arange(n))) / n) / (n * (1.0 - V))

    r_top = factor_keep(MAX_CORRELATION_S)
    if ratio <= expected_ratio(0.0):
        return 0.0
    if ratio >= expected_ratio(r_top):
        return MAX_CORRELATION_S
    lo, hi = 0.0, r_top
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if expected_ratio(mid) < ratio else (lo, mid)
    r = 0.5 * (lo + hi)
    return -SECONDS_PER_MINUTE / math.log(r) if r > 0 else 0.0


IDLE_NOISE_SD = 2.0  # empty minutes beyond the Gamma's within this many standard deviations of its count: noise


def idle_share_from_minute_counts(counts: np.ndarray, cluster_size: float = 1.0, peak_factor: float = 1.0) -> float:
    """`traffic.idle_minute_share` measured from a request log: counts[h, m] = requests in minute m of hour h, with
    the log's arrival_cluster_size B and within_hour_peak_factor. The share p of idle minutes is the one with which
    the plan's own factor (step 1: 0 in a share p of minutes, else G/(1 − p) with G ~ Gamma(α_p, 1/α_p) keeping
    the peak factor) leaves as many minutes empty as the log shows: at an hour's mean c̄ a minute is empty with
    probability p + (1 − p)·(1 + c̄/(B·(1 − p)·α_p))^(−α_p) (the Gamma's Laplace transform; e^(−c̄/(B(1 − p)))
    where the active minutes are flat), summed over the hours with traffic (c̄ ≥ 1, as
    peak_factor_from_minute_counts) against their empty minutes. 0 where the Gamma alone leaves as many, or where
    the empty minutes beyond it are within IDLE_NOISE_SD binomial standard deviations of its count (noise: the model
    then stops levels in idle minutes that are not there; a ServeGen week at 0.3 req/s reads 5e-5).

    Not the excess over Poisson at each hour's mean alone: a bursty rate leaves minutes empty by itself (a
    Gamma(2) rate at 3 requests a minute 16% of them, Poisson at the mean 5%), and that excess would count them
    twice, once in the Gamma and once as idle minutes. At 18 requests a minute and a peak factor of 7.3 (Azure
    code replayed at 0.3 req/s) the Gamma alone leaves 30% empty against the replay's 61%."""
    return _idle_share(counts, cluster_size, lambda p: gamma_alpha_for_peak_with_idle(peak_factor, p))


def within_hour_from_minute_counts(counts: np.ndarray, cluster_size: float = 1.0) -> tuple[float, float]:
    """(`traffic.within_hour_peak_factor`, `traffic.idle_minute_share`) measured together from a request log:
    counts[h, m] = requests in minute m of hour h. The counts' excess dispersion V (as peak_factor_from_minute_counts:
    the factor's variance, Poisson noise removed) is that of the whole factor, idle minutes' included: at an idle
    share p the active minutes' Gamma has 1/α_p = (1 + V)·(1 − p) − 1 (E g² = (1 + 1/α_p)/(1 − p); flat where that is
    ≤ 0), p is the share with which that factor leaves as many minutes empty as the log shows (as
    idle_share_from_minute_counts, with this α_p), and the peak factor is then the busiest active minute,
    (1 − 1/(9α_p) + z_n/(3√α_p))³ / (1 − p) (what gamma_alpha_for_peak_with_idle inverts). Read one after the
    other — the peak factor from all of V as a Gamma's, then p for that peak — the idle minutes' share of the
    variance was counted in the active minutes too: drawn at peak 3.0 with 30% idle minutes the peak read 3.6–3.9
    and the plan's factor had a variance 21% over the log's. Without idle minutes it is
    peak_factor_from_minute_counts's figure and p = 0."""
    c = np.asarray(counts, dtype=float)
    V = _excess_variance(c, cluster_size)
    if V is None:
        return 1.0, 0.0

    def alpha(p: float) -> float | None:
        inv = (1.0 + V) * (1.0 - p) - 1.0
        return 1.0 / inv if inv > 1e-9 else None

    p = _idle_share(c, cluster_size, alpha)
    if p <= 0.0:
        return _peak_of_variance(V), 0.0
    a, z = alpha(p), active_minute_z(p)
    peak = (busiest_minute_factor(max(a, _most_bursty_alpha(z)), z) if a is not None else 1.0) / (1.0 - p)
    return max(1.0, peak), p


def _idle_share(counts: np.ndarray, cluster_size: float, alpha_of_p) -> float:
    """idle_share_from_minute_counts with the active minutes' Gamma α at an idle share p given by alpha_of_p(p)
    (None: flat)."""
    c = np.asarray(counts, dtype=float)
    mean = c.mean(axis=1)
    busy = mean >= 1.0
    if not busy.any():
        return 0.0
    seen = float((c[busy] == 0).mean())
    per = mean[busy] / max(1.0, float(cluster_size))

    def active_empty(p: float) -> np.ndarray:
        """Each hour's chance that a minute with traffic comes out empty, at an idle share p."""
        a = alpha_of_p(p)
        act = per / (1.0 - p)
        return np.exp(-act) if a is None else (1.0 + act / a) ** -a

    def excess(p: float) -> float:
        return float(np.mean(p + (1.0 - p) * active_empty(p))) - seen

    e0 = active_empty(0.0)
    n = c.shape[1]
    if (seen - float(np.mean(e0))) * n * e0.size <= IDLE_NOISE_SD * math.sqrt(float(np.sum(n * e0 * (1.0 - e0)))):
        return 0.0
    lo, hi = 0.0, 0.999
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if excess(mid) < 0.0 else (lo, mid)
    return 0.5 * (lo + hi)


MAX_CORRELATION_S = 3600.0  # `traffic.within_hour_correlation_s`'s upper limit: a within-hour factor


CLUSTER_WINDOW_S = 10  # the window `traffic.arrival_cluster_size` is measured over


def cluster_size_from_counts(counts: np.ndarray) -> float:
    """`traffic.arrival_cluster_size` measured from a request log: counts[m, j] = requests in the j-th
    CLUSTER_WINDOW_S window of minute m. Within a minute the rate is one figure, so the windows' variance over
    their mean is the cluster size (1 for Poisson arrivals; B for arrivals in bunches of B)."""
    c = np.asarray(counts, dtype=float)
    mean = c.mean(axis=1)
    busy = mean > 0
    if not busy.any():
        return 1.0
    return max(1.0, float(np.mean(c[busy].var(axis=1, ddof=1) / mean[busy])))
