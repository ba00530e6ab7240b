"""serverless._switching compiled with numba: the same arithmetic, one pass per hour and minute factor.

The numpy version (`serverless._switching_numpy`) stays the reference; tests/test_serverless_compiled.py
checks the two agree to 1e-12 relative (or 1e-20 absolute, where the kernel's per-node level cuts take a rate
under 1e-30 per second as 0). Why faster: numpy builds every intermediate over hours × levels ×
quadrature nodes (and a table of Poisson terms per hour and node) in memory; here each hour and node builds its
table of P(N = j) once and reads every level from it, with no temporaries.

The planner uses it only where asked for (`serverless.USE_COMPILED`, PLANNER_COMPILED=1): numba is imported
when `switching` is first called (with loading the cached kernel 0.43–0.53 s CPU; 2.9 s from an empty cache),
which a stack of a few endpoints does not win back. Compiled functions are cached on disk
(`cache=True`, as simulator/compiled.py does); where no cache location is writable they compile in memory.
"""

from __future__ import annotations

import math

import numpy as np

_KERNEL = None  # the compiled kernel, once built; False when numba is not importable


def available() -> bool:
    """Whether the compiled kernel can run (numba importable)."""
    return _kernel() is not None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        try:
            import numba
        except ImportError:
            _KERNEL = False
        else:
            global _upper_series, _idle_run_on
            try:
                # the kernel calls _upper_series and _idle_run_on: compiled first (numba resolves the globals when it
                # compiles)
                _upper_series = numba.njit(cache=True, nogil=True)(_upper_series_py)
                _idle_run_on = numba.njit(cache=True, nogil=True)(_idle_run_on_py)
                _KERNEL = numba.njit(cache=True, nogil=True)(_switching_kernel)
            except RuntimeError:  # "cannot cache function …: no locator available"
                _upper_series = numba.njit(nogil=True)(_upper_series_py)
                _idle_run_on = numba.njit(nogil=True)(_idle_run_on_py)
                _KERNEL = numba.njit(nogil=True)(_switching_kernel)
    return _KERNEL or None


def switching(rate: np.ndarray, mean: np.ndarray, Q: np.ndarray, up: np.ndarray, k: np.ndarray, B: float,
              W: float, wg: np.ndarray, log_fact: np.ndarray, exact_levels: int, seconds_per_minute: float,
              upper_direct_below: float, upper_series_terms: int, upper_series_stop: float, on: np.ndarray,
              reach: np.ndarray, held: np.ndarray, reach_sd: float, reach_above: float, keep: float = 0.0,
              negligible: float = 1e-12, idle_expected: float = 1e-12) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """serverless._switching's (p_on, p_off), (H, P): rate and mean (H, 1, G), Q (H,), up and k (P,); on, reach
    (H,) the start levels each hour takes as surely on and those it works out (serverless.
    start_levels_on_and_within_reach: p_on the weights' sum below on, h_on = 0 from reach), held (H,) the stop
    levels it leaves out (serverless.stop_levels_held: r_off = 0 there); the kernel applies the same cuts again
    per minute factor with that node's own in flight (reach_sd, reach_above: serverless.REACH_SD, REACH_ABOVE),
    where numpy works the block out whole: the two agree to 1e-12 relative, or below 1e-20 absolute where the
    kernel takes a rate of under 1e-30 per second as 0. keep: the probability that a minute keeps the previous
    minute's factor (serverless.persistent_switching, worked out here from sums over the nodes; negligible: its
    PERSIST_NEGLIGIBLE). A node expecting fewer than idle_expected clusters in a minute brings no request (serverless.
    idle_run_switching, IDLE_EXPECTED); the third array is its time on in the minutes a run of them stops a level in,
    per unit of P(on)."""
    H, G = rate.shape[0], rate.shape[-1]
    r2 = np.ascontiguousarray(np.broadcast_to(rate, (H, 1, G))[:, 0, :], dtype=np.float64)
    m2 = np.ascontiguousarray(np.broadcast_to(mean, (H, 1, G))[:, 0, :], dtype=np.float64)
    p_on = np.zeros((H, len(k)))
    p_off = np.zeros((H, len(k)))
    stop_minute = np.zeros((H, len(k)))
    _kernel()(r2, m2, np.ascontiguousarray(Q, dtype=np.float64), np.ascontiguousarray(up, dtype=np.float64),
              np.ascontiguousarray(k, dtype=np.float64), float(B), float(W),
              np.ascontiguousarray(wg, dtype=np.float64), np.ascontiguousarray(log_fact, dtype=np.float64),
              int(exact_levels), float(seconds_per_minute), float(upper_direct_below), int(upper_series_terms),
              float(upper_series_stop), np.ascontiguousarray(on, dtype=np.int64),
              np.ascontiguousarray(reach, dtype=np.int64),
              np.ascontiguousarray(held, dtype=np.int64), float(reach_sd), float(reach_above), float(keep),
              float(negligible), float(idle_expected), p_on, p_off, stop_minute)
    return p_on, p_off, stop_minute


# where the result is a constant in doubles (the kernel skips the call): e^x for x < −746 is 0 (below the least
# subnormal, 4.9e-324 = e^−744.4), and expm1(−x) for x > 40 is −1 (e^−40 = 4e-18 < 2^−54, half an ulp of 1)
_EXP_IS_ZERO = -746.0
_EXPM1_IS_MINUS_ONE = 40.0


def _upper_series(L, m, at, terms, stop):
    """serverless._upper_series for one level: P(N ≥ L) from P(N = L − 1) by the series, the same terms in the
    same order (the stop checked every 8 terms)."""
    if not at > 0:
        return 0.0
    t = at
    s = 0.0
    n = 0
    while True:
        for _ in range(8):
            t *= m / (L + n)
            s += t
            n += 1
        if t <= stop * s or n >= terms:
            break
    r = m / (L + n)
    return s + t * r / max(1.0 - r, 1e-300)


_upper_series_py = _upper_series


def _idle_run_on(at_level, hW, s, W, per, A):
    """serverless.idle_run_on for one level and node: (returning on mass, minutes on) over a run of idle minutes
    that goes on with probability s a minute, the same terms in the same order."""
    one_minus_s = 1.0 - s
    geo_last = (1.0 - s ** (A - 1)) / one_minus_s if one_minus_s > 1e-12 else float(A - 1)
    ret = at_level * geo_last
    ont = at_level * (geo_last + s ** (A - 1) * (W / per - (A - 1)))
    below = 1.0 - at_level
    h = hW / max(W, 1e-9)
    tiny = hW < 1e-9
    whole = 1.0 if tiny else -math.expm1(-hW)
    for n in range(A):
        geo = (1.0 - s ** n) / one_minus_s if one_minus_s > 1e-12 else float(n)
        lo = max(0.0, W - per * (n + 1))
        hi = W - per * n
        width = hi - lo
        t = h * width
        if tiny:
            mass = width / max(W, 1e-9)
        else:
            mass = math.exp(-h * lo) * -math.expm1(-t) / whole
        if t < 1e-4:
            share = 0.5 - t / 12.0
        elif t > 700.0:
            share = 1.0 / t  # 1/(e^t − 1) is 0 in doubles (numpy: inf, then 0)
        else:
            share = 1.0 / t - 1.0 / math.expm1(t)
        frac = (W - (lo + width * share)) / per - n
        ret += below * mass * geo
        ont += below * mass * (geo + s ** n * frac)
    return ret, ont


_idle_run_on_py = _idle_run_on


def _switching_kernel(rate, mean, Q, up, k, B, W, wg, log_fact, exact_levels, spm, upper_direct_below,
                      upper_series_terms, upper_series_stop, on, reach, held, reach_sd, reach_above, keep, negligible,
                      idle_expected, p_on, p_off, stop_minute):
    """Fills p_on, p_off (H, P). Per hour h and node g: each level's P(N < L), P(N ≥ L) and P(N = L − 1) as in
    serverless.poisson_tails (exact sums up to exact_levels, Wilson–Hilferty above, the upper tail summed
    directly where it is small), then the hazards and the minute's switching probabilities as in
    serverless._switching, summed over g with weights wg; with keep > 0, the sums over g that
    serverless.persistent_switching reduces to the chain of a persisting factor."""
    H, G = rate.shape
    P = k.shape[0]
    inv_sqrt2 = 1 / math.sqrt(2.0)
    lev = np.empty(2 * P)
    cbrt_L = np.empty(2 * P)  # the Wilson–Hilferty factors of each level (per hour: levels move with Q)
    shift_L = np.empty(2 * P)
    sqrt_9L = np.empty(2 * P)
    term = np.empty(exact_levels)
    cdf = np.empty(exact_levels)
    below = np.empty(2 * P)
    above = np.empty(2 * P)
    at = np.empty(2 * P)
    wsum = wg.sum()
    # persistent_switching's sums over the nodes, per level: Σ w·pn/d, Σ w·pf/d, Σ w·pn·pf/d, Σ w·pn·ρ/d
    s_on = np.zeros(P)
    s_off = np.zeros(P)
    s_cross = np.zeros(P)
    s_stay = np.zeros(P)
    # and with idle nodes (a minute factor of 0: serverless.idle_run_switching) Σ w·ρ/d and the run's returning on
    # mass and minutes on, each times pn/d and ρ/d (over the nodes with requests)
    s_rho = np.zeros(P)
    r_on = np.zeros(P)
    r_rho = np.zeros(P)
    o_on = np.zeros(P)
    o_rho = np.zeros(P)
    A = max(1, math.ceil(W / spm - 1e-9))
    for h in range(H):
        p_idle = 0.0
        n_idle = 0
        for g in range(G):
            if rate[h, g] * spm < idle_expected:
                p_idle += wg[g]
                n_idle += 1
        idle = 0 < n_idle < G  # an hour with no request at all: every level stops W after its last (as numpy)
        s_run = keep + (1.0 - keep) * p_idle
        if idle:  # a level at or above when the run begins: no quiet before it
            ret_at, ont_at = _idle_run_on(1.0, 0.0, s_run, W, spm, A)
        chain = keep > 0.0 or idle
        if chain:
            s_on[:] = 0.0
            s_off[:] = 0.0
            s_cross[:] = 0.0
            s_stay[:] = 0.0
            s_rho[:] = 0.0
            r_on[:] = 0.0
            r_rho[:] = 0.0
            o_on[:] = 0.0
            o_rho[:] = 0.0
        n_exact = 0
        a = on[h]  # start levels before a are surely on: p_on the weights' sum
        c = reach[h]  # start levels from c on are beyond the hour's reach: not worked out, h_on = 0
        lo = P + held[h]  # stop levels before lo are never left: not worked out, r_off = 0
        for i in range(2 * P):
            if i < a or c <= i < P or P <= i < lo:
                continue
            L = math.ceil((Q[h] + (up[i] if i < P else k[i - P])) / B)
            lev[i] = L
            if L <= exact_levels:
                if L > n_exact:
                    n_exact = int(L)
            else:
                cbrt_L[i] = np.cbrt(L)
                shift_L[i] = 1 - 1 / (9 * L)
                sqrt_9L[i] = math.sqrt(9 * L)
        for g in range(G):
            m = max(mean[h, g], 1e-300)
            log_m = math.log(m)
            cbrt_m = np.cbrt(m)
            r = rate[h, g]
            w = wg[g]
            # this node's own cuts (serverless.start_levels_on_and_within_reach and stop_levels_held with this
            # node's in flight alone, within the hour's): start levels before a_g surely on, from c_g beyond
            # reach; stop levels before lo_g never left
            spread = reach_sd * math.sqrt(mean[h, g]) + reach_above
            low = mean[h, g] - spread
            on_low = min(low, mean[h, g] - mean[h, g] / r) if r > 0 else -math.inf
            a_g = a
            while a_g < c and lev[a_g] - 1 <= on_low:
                a_g += 1
            c_g = c
            while c_g > a_g and lev[c_g - 1] > mean[h, g] + spread:
                c_g -= 1
            lo_g = lo
            while lo_g < 2 * P and lev[lo_g] - 1 <= low:
                lo_g += 1
            n_exact = 0
            for i in range(2 * P):
                if i < a_g or c_g <= i < P or P <= i < lo_g:
                    continue
                if lev[i] <= exact_levels and lev[i] > n_exact:
                    n_exact = int(lev[i])
            # P(N = j) and P(N ≤ j) for j < n_exact, in the reference's order (a running sum)
            s = 0.0
            for j in range(n_exact):
                e = j * log_m - m - log_fact[j]
                if e > _EXP_IS_ZERO:
                    t = math.exp(e)
                elif j > m:  # past the mode the terms only fall: every later one is 0 too
                    for jj in range(j, n_exact):
                        term[jj] = 0.0
                        cdf[jj] = s
                    break
                else:
                    t = 0.0
                term[j] = t
                s += t
                cdf[j] = s
            for i in range(2 * P):
                if i < a_g or c_g <= i < P or P <= i < lo_g:
                    continue
                L = lev[i]
                if L <= exact_levels:
                    j = max(int(L) - 1, 0)
                    at[i] = term[j]
                    F = cdf[j]
                else:
                    e = (L - 1) * log_m - m - log_fact[int(L - 1)]
                    at[i] = math.exp(e) if e > _EXP_IS_ZERO else 0.0
                    # P(N ≤ L − 1) = P(Gamma(L, 1) > m): Wilson–Hilferty, then 1 − Φ(z) by A&S 7.1.26
                    z = (cbrt_m / cbrt_L[i] - shift_L[i]) * sqrt_9L[i]
                    x = abs(z) * inv_sqrt2
                    if z < 0 and x * x > _EXPM1_IS_MINUS_ONE:
                        # 1 − (poly < 1)·e^(−x²)/2 rounds to 1 (as expm1 to −1 above); the upper tail is summed
                        below[i] = 1.0
                        if i >= P:  # the upper tail of the stop levels only (as numpy's upper_from)
                            above[i] = min(max(_upper_series(L, m, at[i], upper_series_terms, upper_series_stop),
                                               0.0), 1.0)
                        continue
                    t = 1.0 / (0.3275911 * x + 1.0)
                    poly = t * 1.061405429
                    poly = (poly + -1.453152027) * t
                    poly = (poly + 1.421413741) * t
                    poly = (poly + -0.284496736) * t
                    poly = (poly + 0.254829592) * t
                    F = poly * math.exp(-(x * x)) * 0.5 if x * x < -_EXP_IS_ZERO else 0.0
                    if z < 0:
                        F = 1.0 - F
                below[i] = min(max(F, 0.0), 1.0)
                if i >= P:  # the upper tail of the stop levels only (numpy's upper_from), summed where small
                    if below[i] > 1.0 - upper_direct_below:
                        above[i] = min(max(_upper_series(L, m, at[i], upper_series_terms, upper_series_stop), 0.0),
                                       1.0)
                    else:
                        above[i] = 1.0 - below[i]
            for p in range(a, P):
                if p < a_g:  # surely on at this node (its stop level held)
                    p_on[h, p] += w
                    s_on[p] += w  # pn = 1, pf = 0: d = 1
                    if idle:  # ρ = 0; no quiet before a run
                        r_on[p] += w * ret_at
                        o_on[p] += w * ont_at
                    continue
                h_on = r * at[p] / max(below[p], 1e-300) if p < c_g else 0.0
                at_level = 1.0  # on at the minute's end with in flight at or above the stop level (idle runs)
                hW = 0.0
                if P + p < lo_g:
                    r_off = 0.0
                    if h_on == 0.0 and not idle:
                        continue
                else:
                    F_dn = below[P + p]
                    d = r * at[P + p]
                    hW = W * d / max(F_dn, 1e-300)
                    # e^(−x) − 1 is −1 in doubles once e^(−x) < 2^−54 (x > 37.5): expm1 skipped there; e^(−hW)
                    # from the same call where it is not small (there 1 + em is as exact as exp)
                    if hW > _EXPM1_IS_MINUS_ONE:
                        em = -1.0
                        q = math.exp(-hW) if -hW > _EXP_IS_ZERO else 0.0
                    else:
                        em = math.expm1(-hW)
                        q = 1.0 + em if hW < 0.5 else math.exp(-hW)
                    slack = above[P + p] + F_dn * -em
                    if slack > 0 and r != 0.0:  # (no request at factor 0: stops W after its last, as numpy)
                        r_off = q * d / max(slack, 1e-300)
                    else:
                        r_off = 1.0 / max(W, 1e-9)
                    at_level = above[P + p] / slack if slack > 0 else 0.0
                both = h_on + r_off
                x60 = both * spm
                settle = (1.0 if x60 > _EXPM1_IS_MINUS_ONE else -math.expm1(-x60)) / max(both, 1e-300)
                p_on[h, p] += w * h_on * settle
                p_off[h, p] += w * r_off * settle
                if chain and not (idle and r * spm < idle_expected):  # an idle node: its runs are idle_run_switching's
                    pn = h_on * settle
                    pf = r_off * settle
                    rho = 1.0 - pn - pf
                    d = 1.0 - keep * rho
                    s_on[p] += w * pn / d
                    s_off[p] += w * pf / d
                    s_cross[p] += w * pn * pf / d
                    s_stay[p] += w * pn * rho / d
                    if idle:
                        ret, ont = _idle_run_on(at_level, hW, s_run, W, spm, A)
                        s_rho[p] += w * rho / d
                        r_on[p] += w * pn * ret / d
                        r_rho[p] += w * rho * ret / d
                        o_on[p] += w * pn * ont / d
                        o_rho[p] += w * rho * ont / d
        for p in range(a):
            p_on[h, p] = wsum
        if idle:
            into = (1.0 - keep) * p_idle  # a minute's on mass at an active node that enters a run next
            for p in range(a, P):
                Z = (s_on[p] + into * r_on[p]) / max(1.0 - (1.0 - keep) * (s_rho[p] + into * r_rho[p]), 1e-300)
                y_a = s_on[p] + (1.0 - keep) * Z * s_rho[p]
                time_on = y_a + into * (o_on[p] + (1.0 - keep) * Z * o_rho[p])
                launches = keep * s_cross[p] + (1.0 - keep) * (1.0 - Z) * s_on[p]
                if Z > negligible and 1.0 - Z > negligible and launches > 0:
                    p_on[h, p] = launches / (1.0 - Z)
                    p_off[h, p] = launches / Z
                    stop_minute[h, p] = max(time_on - Z, 0.0) / Z
        elif keep > 0.0:
            for p in range(a, P):
                tot = s_on[p] + s_off[p]
                if not tot > 0.0:
                    continue
                y_on = s_on[p] / tot
                y_off = s_off[p] / tot
                if y_on > negligible and y_off > negligible:
                    launches = keep * s_cross[p] + (1.0 - keep) * y_off * (keep * s_stay[p] + p_on[h, p])
                    p_on[h, p] = launches / y_off
                    p_off[h, p] = launches / y_on
