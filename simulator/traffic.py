"""Traffic for the simulator: a synthetic week from the inputs, or a real trace replayed at the endpoint's rate.

Every source becomes the same thing: arrivals (seconds from Monday 00:00 local) with prompt and output
token counts, produced in time-ordered chunks so a week of millions of requests never sits in memory.

- synthetic: the hour-of-week profile, each minute's rate multiplied by a Gamma(α, 1/α) factor (mean 1)
  whose α makes the busiest of an hour's 60 minutes ≈ `within_hour_peak_factor` × the hour's mean (kept
  from one minute to the next with probability e^(−60/τ), τ = `within_hour_correlation_s`, 0 by default; 0 in
  a share `idle_minute_share` of minutes, the Gamma then that of the minutes with traffic, as the planner reads it);
  Poisson arrivals inside each minute; token counts lognormal, fitted to the shape's mean and p99.
- per-request traces (Azure 2023 CSV, Mooncake JSONL): the trace's arrival pattern is time-rescaled onto
  the endpoint's hour-of-week rate (arrival k of the tiled trace lands where the week's cumulative expected
  count reaches k), so the trace keeps its burstiness and the week keeps its rhythm; token counts are
  scaled so their means match the endpoint's shape (keeping the trace's distribution) unless raw.
- rate traces (ServeGen CSV of 10-minute windows): the first week of windows, scaled to the endpoint's
  mean rate, with the same within-minute Poisson arrivals and a Gamma factor for the burstiness the
  10-minute windows do not show.

Sources: Azure/AzurePublicDataset (CC-BY-4.0), kvcache-ai/Mooncake (Apache-2.0), alibaba/ServeGen
(Apache-2.0) — see traces/README.md.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from topology.inputs import EndpointInputs
from topology.minute_factors import factor_keep, gamma_alpha_for_peak_with_idle
from topology.loading import InputError
from topology.timebase import HOURS_PER_WEEK, MINUTES_PER_HOUR, MINUTES_PER_WEEK, SECONDS_PER_MINUTE
from topology.reading import loads_json, open_text_lines
from topology.token_shape import lognormal_params

SECONDS_PER_WEEK = MINUTES_PER_WEEK * SECONDS_PER_MINUTE


@dataclass(frozen=True)
class Spike:
    """Traffic multiplied by `factor` for `minutes` from `start_s` (seconds from Monday 00:00)."""

    factor: float
    start_s: float
    minutes: float


@dataclass(frozen=True)
class RequestTrace:
    name: str
    arrival_s: np.ndarray  # from 0, sorted
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    duration_s: float

    @property
    def mean_rate(self) -> float:
        return len(self.arrival_s) / self.duration_s


@dataclass(frozen=True)
class RateTrace:
    name: str
    window_s: float
    rates: np.ndarray  # requests/s per window, from local Monday 00:00


Trace = RequestTrace | RateTrace


def _bad_trace(path: Path, why: str) -> InputError:
    return InputError(
        f"--trace {str(path)!r}: {why}. Allowed: an Azure 2023 CSV (TIMESTAMP,ContextTokens,GeneratedTokens), "
        "a Mooncake JSONL (timestamp ms, input_length, output_length) or a ServeGen rate CSV "
        "(window_start_s,total_rate_rps)"
    )


def load_trace(path: str | Path) -> Trace:
    """Read a trace file, detecting its kind from its columns; errors name the file, the row and the fix."""
    p = Path(path)
    if not p.is_file():
        raise _bad_trace(p, "a directory, not a file" if p.is_dir() else
                         "not a regular file (a pipe or a device)" if p.exists() else "no such file")
    if p.suffix == ".jsonl":
        return _load_mooncake(p)
    try:
        with open_text_lines(p, "--trace") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise _bad_trace(p, "the file is empty")
            cols = [h.strip() for h in header]
            if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= set(cols):
                return _load_azure(p, cols, reader)
            if {"window_start_s", "total_rate_rps"} <= set(cols):
                return _load_rate(p, cols, reader)
    except (UnicodeDecodeError, csv.Error) as e:
        raise _bad_trace(p, f"not a text file ({e})") from None
    raise _bad_trace(p, f"unrecognised columns {cols}")


def _load_azure(p: Path, cols: list[str], reader) -> RequestTrace:
    it, ic, ig = cols.index("TIMESTAMP"), cols.index("ContextTokens"), cols.index("GeneratedTokens")
    ts, ins, outs = [], [], []
    for n, row in enumerate(reader, start=2):
        try:
            ts.append(dt.datetime.fromisoformat(row[it].strip()[:26]).timestamp())
            ins.append(float(row[ic]))
            outs.append(float(row[ig]))
        except (ValueError, IndexError):
            raise _bad_trace(p, f"row {n} is not TIMESTAMP,ContextTokens,GeneratedTokens: {row}") from None
    return _request_trace(p, np.asarray(ts), np.asarray(ins), np.asarray(outs))


def _load_mooncake(p: Path) -> RequestTrace:
    ts, ins, outs = [], [], []
    try:
        with open_text_lines(p, "--trace") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    d = loads_json(line, f"--trace {str(p)!r}", n)
                    ts.append(float(d["timestamp"]) / 1000.0)
                    ins.append(float(d["input_length"]))
                    outs.append(float(d["output_length"]))
                except (ValueError, KeyError, TypeError):
                    raise _bad_trace(p, f"line {n} lacks numeric timestamp/input_length/output_length") from None
    except UnicodeDecodeError as e:
        raise _bad_trace(p, f"not a text file ({e.reason})") from None
    return _request_trace(p, np.asarray(ts), np.asarray(ins), np.asarray(outs))


def _request_trace(p: Path, ts: np.ndarray, ins: np.ndarray, outs: np.ndarray) -> RequestTrace:
    if len(ts) < 2:
        raise _bad_trace(p, f"needs at least 2 requests, has {len(ts)}")
    if not (np.isfinite(ts).all() and np.isfinite(ins).all() and np.isfinite(outs).all()):
        raise _bad_trace(p, "a timestamp or token count is not a number (NaN or infinity)")
    order = np.argsort(ts, kind="stable")
    ts, ins, outs = ts[order] - ts[order][0], ins[order], outs[order]
    span = float(ts[-1])
    if span <= 0:
        raise _bad_trace(p, "all requests share one timestamp")
    if (ins < 0).any() or (outs < 0).any():
        raise _bad_trace(p, "token counts must be ≥ 0")
    duration = span * len(ts) / (len(ts) - 1)  # one mean gap after the last arrival, so tiles do not overlap
    return RequestTrace(p.name, ts, np.maximum(ins, 1.0), np.maximum(outs, 1.0), duration)


def _load_rate(p: Path, cols: list[str], reader) -> RateTrace:
    iw, ir = cols.index("window_start_s"), cols.index("total_rate_rps")
    starts, rates = [], []
    for n, row in enumerate(reader, start=2):
        try:
            starts.append(float(row[iw]))
            rates.append(float(row[ir]))
        except (ValueError, IndexError):
            raise _bad_trace(p, f"row {n} is not window_start_s,total_rate_rps: {row}") from None
    if len(starts) < 2:
        raise _bad_trace(p, "needs at least 2 windows")
    width = starts[1] - starts[0]
    if width <= 0 or MINUTES_PER_WEEK * 60 % width or width % 60:
        raise _bad_trace(p, f"windows must be whole minutes dividing a week, got {width:g} s")
    need = int(SECONDS_PER_WEEK // width)
    if len(rates) < need:
        raise _bad_trace(p, f"covers {len(rates)} windows of {width:g} s; a week needs {need}")
    r = np.asarray(rates[:need])
    if not (np.isfinite(r).all() and np.isfinite(starts[:need]).all()):
        raise _bad_trace(p, "a window_start_s or total_rate_rps is not a number (NaN or infinity)")
    if (r < 0).any() or r.sum() <= 0:
        raise _bad_trace(p, "rates must be ≥ 0 and not all zero")
    return RateTrace(p.name, width, r)


# --------------------------------------------------------------------------------------------------
# Shapes and burstiness
# --------------------------------------------------------------------------------------------------


def minute_rates(ep: EndpointInputs, trace: Trace | None) -> tuple[np.ndarray, float | None]:
    """Base requests/s for each of the week's 10,080 minutes, and the Gamma α for within-minute-set burstiness."""
    profile = np.asarray(ep.traffic.hourly_mean_requests_per_s or [0.0] * HOURS_PER_WEEK, dtype=float)
    pf = ep.traffic.within_hour_peak_factor
    if isinstance(trace, RateTrace):
        per = int(trace.window_s // 60)
        base = np.repeat(trace.rates, per)[:MINUTES_PER_WEEK].astype(float)
        mean = profile.mean()
        base *= mean / base.mean() if base.mean() > 0 else 0.0
        # the windows already show part of the hour's peak: the Gamma factor adds only the rest
        hours = base.reshape(HOURS_PER_WEEK, MINUTES_PER_HOUR)
        hmean = hours.mean(axis=1)
        shown = float(np.mean(hours.max(axis=1)[hmean > 0] / hmean[hmean > 0])) if (hmean > 0).any() else 1.0
        return base, _alpha(pf / shown, ep.traffic.idle_minute_share)
    base = np.repeat(profile, 60)
    if isinstance(trace, RequestTrace):
        return base, None  # the trace carries its own burstiness
    return base, _alpha(pf, ep.traffic.idle_minute_share)


FLAT = float("inf")  # α of minutes with traffic that all run at one rate (the idle share alone makes the peak)


def _alpha(peak_factor: float, idle_share: float) -> float | None:
    """The Gamma α of the minutes with traffic, as the planner reads the two inputs (topology/minute_factors.py);
    without idle minutes None (no factor at all) where the peak factor is 1, FLAT where the idle share alone
    reaches the peak factor."""
    a = gamma_alpha_for_peak_with_idle(peak_factor, idle_share)
    return FLAT if a is None and idle_share > 0 else a


def _clip_tokens(ep: EndpointInputs, ins: np.ndarray, outs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whole tokens, outputs within [1, max_tokens] and prompts within [1, context − output]; in place (the callers
    pass fresh arrays). np.maximum then np.minimum is np.clip's own definition (min(max(x, lo), hi)) without its
    Python wrapper, which cost more than the arithmetic on a 10-minute chunk."""
    s = ep.shape
    np.rint(outs, out=outs)
    np.minimum(np.maximum(outs, 1, out=outs), s.max_tokens, out=outs)
    np.rint(ins, out=ins)
    np.minimum(np.maximum(ins, 1, out=ins), s.product_max_context_tokens - outs, out=ins)
    return ins, outs


# --------------------------------------------------------------------------------------------------
# Arrivals
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    status: np.ndarray | None = None  # raw tokens: 413 / 400 for prompts at or over the product limit, else 0


# a prompt's request body, bytes per token: ~4 characters of English text per token (OpenAI's rule of thumb),
# JSON-escaped; the gateway's body cap allows 8 (topology/plan/gateway.py), so 413 comes only past ~2× the limit
BODY_BYTES_PER_TOKEN = 4


def over_limit_status(ep: EndpointInputs, max_request_body_bytes: int | None, ins: np.ndarray,
                      outs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the product does with a request whose prompt + output does not fit the context (max_model_len), as
    (status, output tokens): a prompt of max_model_len tokens or more gets vLLM's 400 (413 when its body already
    passes the gateway's cap); a shorter one is served, its output clipped to what still fits — the gateway leaves
    max_tokens to the engine when the client sends none, and vLLM generates min(cap, max_model_len − prompt)
    (vLLM 0.11.0 serving_engine.py _validate_input, entrypoints/utils.py get_max_tokens; tests/vllm_max_tokens.py).
    Replayed requests are taken as chat requests: a completion request (which the gateway stamps with the cap, as
    vLLM's request model would otherwise default to 16) or a client's own max_tokens that does not fit gets vLLM's
    other 400, prompt + max_tokens > max_model_len, which is not modelled (traces carry neither)."""
    limit = ep.shape.product_max_context_tokens
    over = ins >= limit
    status = np.where(over, 400, 0)
    if max_request_body_bytes is not None:
        status = np.where(over & (ins * BODY_BYTES_PER_TOKEN > max_request_body_bytes), 413, status)
    fitted = np.where(over, outs, np.maximum(np.minimum(outs, limit - ins), 1))
    return status.astype(np.int64), fitted


def arrivals(
    ep: EndpointInputs,
    trace: Trace | None,
    start_s: float,
    end_s: float,
    rng: np.random.Generator,
    *,
    spike: Spike | None = None,
    raw_tokens: bool = False,
    chunk_s: float = 600.0,
    rate_scale: float = 1.0,
    body_cap: int | None = None,
) -> Iterator[Chunk]:
    """Time-ordered chunks of arrivals in [start_s, end_s) (the week repeats when end_s > one week)."""
    base, alpha = minute_rates(ep, trace)
    base = base * rate_scale
    n_min = int(math.ceil(end_s / 60.0))
    first_min = int(start_s // 60)
    mins = np.arange(first_min, n_min)
    rates = base[mins % MINUTES_PER_WEEK]
    if alpha is not None:
        # one Gamma factor per minute, renormalised within each hour so the hour keeps its mean
        g = rng.gamma(alpha, 1.0 / alpha, size=len(mins)) if alpha != FLAT else np.ones(len(mins))
        if ep.traffic.idle_minute_share > 0:
            # a share of minutes with no request (`traffic.idle_minute_share`), the rest's factor scaled so the
            # hour keeps its mean (below), as the planner's zero node; drawn with the factor, so a minute that
            # keeps its factor (next) stays idle; the extra draws only then, so a week without it replays as before
            g = np.where(rng.random(len(mins)) < ep.traffic.idle_minute_share, 0.0, g)
        if ep.traffic.within_hour_correlation_s > 0:
            # a minute keeps the previous minute's factor with probability e^(−60/τ), as the planner reads
            # `traffic.within_hour_correlation_s` (topology/minute_factors.py); the extra draws only
            # then, so a week without it replays as before
            kept = rng.random(len(mins)) < factor_keep(ep.traffic.within_hour_correlation_s)
            kept[0] = False
            g = g[np.maximum.accumulate(np.where(kept, 0, np.arange(len(mins))))]
        hour = (mins // 60) - (first_min // 60)
        sums = np.bincount(hour, weights=g)
        counts = np.bincount(hour)
        mean_g = sums[hour] / counts[hour]
        # an hour drawn all idle (p⁶⁰ of them) keeps its mean flat: the profile's hour mean is the input
        g = np.where(mean_g > 0, g / np.where(mean_g > 0, mean_g, 1.0), 1.0)
        rates = rates * g
    if spike is not None:
        mid = (mins + 0.5) * 60.0
        on = (mid >= spike.start_s) & (mid < spike.start_s + spike.minutes * 60.0)
        rates = np.where(on, rates * spike.factor, rates)
    if isinstance(trace, RequestTrace):
        yield from _trace_arrivals(ep, trace, mins, rates, start_s, end_s, rng, raw_tokens, chunk_s, body_cap)
        return
    mu_in, sg_in = lognormal_params(ep.shape.input_tokens_mean, ep.shape.input_tokens_p99)
    mu_out, sg_out = lognormal_params(ep.shape.output_tokens_mean, ep.shape.output_tokens_p99)
    per_chunk = max(1, int(chunk_s // 60))
    for i in range(0, len(mins), per_chunk):
        m = mins[i : i + per_chunk]
        lam = rates[i : i + per_chunk] * 60.0
        counts = rng.poisson(lam)
        n = int(counts.sum())
        t = np.repeat(m * 60.0, counts) + rng.random(n) * 60.0
        t.sort()
        if n and (t[0] < start_s or t[-1] >= end_s):  # sorted: only a window's partial first or last minute
            t = t[(t >= start_s) & (t < end_s)]
        ins = rng.lognormal(mu_in, sg_in, size=len(t))
        outs = rng.lognormal(mu_out, sg_out, size=len(t))
        ins, outs = _clip_tokens(ep, ins, outs)
        yield Chunk(t, ins, outs)


def _trace_arrivals(
    ep: EndpointInputs, trace: RequestTrace, mins: np.ndarray, rates: np.ndarray, start_s: float, end_s: float,
    rng: np.random.Generator, raw_tokens: bool, chunk_s: float, body_cap: int | None = None,
) -> Iterator[Chunk]:
    # cumulative expected arrivals at each minute boundary of the window
    cum = np.concatenate([[0.0], np.cumsum(rates * 60.0)])
    n = len(trace.arrival_s)
    unit = trace.arrival_s * trace.mean_rate  # trace arrivals in units of expected arrivals
    k_in = 1.0 if raw_tokens else ep.shape.input_tokens_mean / float(trace.input_tokens.mean())
    k_out = 1.0 if raw_tokens else ep.shape.output_tokens_mean / float(trace.output_tokens.mean())
    offset = float(rng.random()) * n  # a random phase in the tiled trace: seeds give different replays
    per_chunk = max(1, int(chunk_s // 60))
    for i in range(0, len(mins), per_chunk):
        lo, hi = cum[i] + offset, cum[min(i + per_chunk, len(mins))] + offset
        if hi <= lo:
            continue
        tiles = np.arange(int(lo // n), int(hi // n) + 1)
        u = (tiles[:, None] * float(n) + unit[None, :]).ravel()
        idx = np.tile(np.arange(n), len(tiles))
        sel = (u >= lo) & (u < hi)
        u, idx = u[sel] - offset, idx[sel]
        # invert the piecewise-linear cumulative count: which minute, and where inside it
        j = np.searchsorted(cum, u, side="right") - 1
        j = np.clip(j, 0, len(mins) - 1)
        frac = (u - cum[j]) / np.maximum(rates[j] * 60.0, 1e-12)
        t = (mins[j] + np.clip(frac, 0.0, 1.0)) * 60.0
        order = np.argsort(t, kind="stable")
        t, idx = t[order], idx[order]
        keep = (t >= start_s) & (t < end_s)
        t, idx = t[keep], idx[keep]
        if raw_tokens:  # the replayed prompts as they are: past the product limit refused, outputs clipped to fit
            outs = np.clip(np.rint(trace.output_tokens[idx]), 1, ep.shape.max_tokens)
            ins = np.maximum(np.rint(trace.input_tokens[idx]), 1)
            status, outs = over_limit_status(ep, body_cap, ins, outs)
            yield Chunk(t, ins, outs, status)
            continue
        ins, outs = _clip_tokens(ep, trace.input_tokens[idx] * k_in, trace.output_tokens[idx] * k_out)
        yield Chunk(t, ins, outs)
