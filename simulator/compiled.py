"""The simulator's per-request loop and autoscaler compiled with numba: the model of `EndpointSim`, same results.

`CompiledEndpointSim` keeps every per-replica and per-container column in numpy arrays and serves a chunk of
arrivals in one compiled kernel (`_serve`): routing (least in flight), admission shedding, the gateway's
first-byte timeout, slot and prefill queues, the cheap KV check, abandonment, non-streamed rules, the burst
tier's container pick and launches, the completion heap, and every autoscaler poll that falls due (`_tick`:
KEDA's queue and burst-backlog triggers, the HPA's stabilization windows and capped steps, pod and node cold
starts, node scale-down, the floor's and the burst's clock schedules, idle containers stopping). The kernel
hands control back to the Python engine for what is rare — a rollout's polls (drills), the exact KV fit
(`engine.kv_fit`, called unchanged), a managed-API request (it draws from the shared random stream), and
growing an array — then resumes at the same request. Before it returns for a request it has changed nothing
(a poll checks for room before it starts), so resuming repeats the request's first steps on unchanged state.
`EndpointSim` stays the pure-Python reference; tests/test_compiled.py checks the two agree exactly.

Why numba: it installs from PyPI wheels (numba, and llvmlite with LLVM statically linked, per llvmlite's
installation guide; numba 0.68.1 / llvmlite 0.50.0 installed here by pip as wheels for CPython 3.11) with no
compiler on the user's machine, and the kernel stays Python source next to the reference. Cython or a Rust
extension would need a C compiler or a Rust toolchain on every fresh clone. Compiled functions are
cached on disk (`cache=True`, in `__pycache__` or numba's user-wide cache directory); where neither is
writable they compile in memory on each run instead.
"""

from __future__ import annotations

import math
import operator
import os
import re
import threading

import numpy as np

from . import engine as _eng

try:
    import numba
except ImportError:  # the reference engine serves instead
    numba = None

# the request flags, as compile-time constants of this file: numba's cache is keyed to this file's source, so a
# change to engine.py's values must be made here too (checked at import) or cached kernels would keep the old ones
FLOOR, BURST, API, REJECTED, BAD, TOO_LONG, SHED, TIMED_OUT = 0, 1, 2, 3, 4, 8, 16, 32
if (FLOOR, BURST, API, REJECTED, BAD, TOO_LONG, SHED, TIMED_OUT) != (
        _eng.FLOOR, _eng.BURST, _eng.API, _eng.REJECTED, _eng.BAD, _eng.TOO_LONG, _eng.SHED, _eng.TIMED_OUT):
    raise ImportError("simulator/compiled.py's request flags differ from simulator/engine.py's: update them")

# why the kernel returned
(_DONE, _TICK, _KV_FLOOR, _KV_BURST, _API, _GROW_DONE, _GROW_FRUNS, _GROW_CRUNS, _GROW_FLOOR, _GROW_BURST,
 _GROW_HPA, _GROW_EVENTS) = range(12)
_NS_RULES = {None: 0, "fits": 0, "floor_only": 1, "require_streaming": 2, "cap_max_tokens": 3}
# per-feed stats slots (float64: integer counts stay exact below 2**53)
(_S_WAIT, _S_NFLOOR, _S_SHED, _S_TIMED_OUT, _S_413, _S_400, _S_COLD_WAITS, _S_ABANDONED,
 _S_WASTED, _S_NS_BURST, _S_NS_CAPPED, _S_NS_REFUSED, _S_NS_REDIRECTED) = range(13)
_N_STATS = 13
# the engine's scalar state while a kernel runs (EndpointSim's attributes of these names, copied in and out;
# float64 holds the integer ones exactly); node_surplus_since None is NaN
_STATE = ("next_ready", "nodes_up", "node_surplus_since", "od_node_s", "res_node_s", "pod_starts", "node_starts",
          "backlog_polls", "backlog_replicas_added", "backlog_peak", "waiting_peak_total", "last_tick",
          "burst_inflight", "burst_waiting_peak", "container_usd_s", "container_s_total", "container_launches",
          "bad_revision")
(_V_NEXT_READY, _V_NODES_UP, _V_SURPLUS_SINCE, _V_OD_NODE_S, _V_RES_NODE_S, _V_POD_STARTS, _V_NODE_STARTS,
 _V_BACKLOG_POLLS, _V_BACKLOG_ADDED, _V_BACKLOG_PEAK, _V_WAITING_PEAK, _V_LAST_TICK, _V_BINF, _V_BWPEAK,
 _V_CONTAINER_USD_S, _V_CONTAINER_S, _V_LAUNCHES, _V_BAD, _V_NEXT_TICK) = range(19)
_N_STATE = 19
_get_state = operator.attrgetter(*_STATE)
_STATE_FLOAT = {"next_ready", "node_surplus_since", "od_node_s", "res_node_s", "last_tick", "container_usd_s",
                "container_s_total"}
# counts: floor replica ids, gateway pool, burst container ids, live containers, completions in the heap, and
# the autoscaler's two windows (the HPA's desired-replica history and its scale events: [start, end) rows)
_C_NF, _C_NROUT, _C_NC, _C_NLIVE, _C_DN, _C_HPA0, _C_HPA1, _C_EV0, _C_EV1 = range(9)
_N_COUNTS = 9
# parameters (one float64 array per engine)
(_P_HAS_FLOOR, _P_HAS_BURST, _P_IS_API, _P_OVERFLOW, _P_SHED_AFTER, _P_FIRST_BYTE, _P_KVS, _P_C, _P_INV_P,
 _P_GPUS, _P_T_MIN, _P_K, _P_INTERF, _P_PER_TOK, _P_DYN, _P_KCAP, _P_NS_RULE, _P_NS_MAX_TOKENS, _P_WEB_CAP,
 _P_AB_PROPAGATE, _P_B_MAX_CONTAINERS, _P_B_TARGET, _P_B_BUFFER, _P_B_MAX_INPUTS, _P_B_SLOTS, _P_B_T_MIN, _P_B_K,
 _P_B_A0, _P_B_A1, _P_B_PER_TOK, _P_B_DYN, _P_B_INV_P, _P_B_KVCAP, _P_B_GPUS, _P_ONE_MINUS_HIT,
 _P_START_S, _P_END_S, _P_TICK_S, _P_PY_TICK, _P_FIXED, _P_HAS_AUTOSCALER, _P_MAX_REPLICAS, _P_TARGET_WAITING,
 _P_MIN_REPLICAS, _P_THRESHOLD, _P_UP_W, _P_DOWN_W, _P_UP_STEP, _P_UP_PERIOD, _P_DOWN_STEP, _P_DOWN_PERIOD,
 _P_RESERVED_NODES, _P_RPN, _P_POD_COLD, _P_NODE_COLD, _P_NODE_SCALE_DOWN, _P_MAX_ADD, _P_B_COLD, _P_B_USD_S,
 _P_B_WINDOW, _P_MINUTES_PER_WEEK, _P_BURST_CAP, _P_FLOOR_QUEUE) = range(63)
_N_PARAMS = 63

TESTED_NUMBA = (0, 68)  # the numba line _kernel_cache_class's loader was read against (0.68.1)
DISABLE_ENV = "SIMULATOR_PURE_PYTHON"  # set to 1: every run uses the pure-Python reference engine


def available() -> bool:
    """Whether the compiled engine can run (numba importable and not switched off)."""
    return numba is not None and os.environ.get(DISABLE_ENV, "") not in ("1", "true", "yes")


def _jit(fn, inline="never"):
    """numba.njit with its on-disk cache; without a writable cache location, compiled in memory each run.

    inline="always": numba inlines the function into its callers (the per-request helpers of `_serve`). A call
    between compiled functions passes every array as its seven-word struct and reference-counts the arrays
    the callee keeps (an atomic increment and decrement each); inlined, most of those counts cancel out."""
    try:
        disp = numba.njit(cache=True, nogil=True, inline=inline)(fn)
    except RuntimeError:  # "cannot cache function …: no locator available"
        return numba.njit(nogil=True, inline=inline)(fn)
    if _KernelCache is not None and type(getattr(disp, "_cache", None)) is _KernelCache.replaces:
        try:
            disp._cache = _KernelCache(fn)  # as numba's Dispatcher.enable_caching makes its FunctionCache
        except (TypeError, AttributeError):  # FunctionCache's constructor moved: keep numba's own cache
            pass
    return disp


def _kernel_cache_class():
    """numba's on-disk function cache, loading a cached kernel without first refreshing numba's CPU target.

    numba's `FunctionCache.load_overload` refreshes the target context before it reads a cached function
    (numba 0.68.1 `numba/core/caching.py`; added in numba commit 15fcbb978, issue #2198, for cached (g)ufuncs,
    whose wrappers are built from the context's implementations on load). The refresh imports and installs every
    implementation registry numba has — ≈ 0.45 s of CPU here, more than the 3 req/s week's kernels take to load
    (≈ 0.08 s) — and nothing of it serves loading a plain `njit` function: its machine code is linked against
    numba's runtime (NRT) alone, which the refresh's first step initializes and which this loader initializes
    too. On a miss numba compiles as before, and its compiler refreshes the context itself
    (`numba/core/compiler.py`, `CompilerBase.__init__`). None where numba's cache does not have that shape
    (another numba version): the kernels then load the usual way."""
    if numba is None:
        return None
    # only on the numba release line whose source this was read in (pyproject allows any numba >= 0.60): a later
    # release whose runtime set-up moved out of rtsys.initialize would run a loaded kernel on an uninitialised
    # runtime and crash the process, which no exception handler can catch
    if tuple(int(x) for x in re.findall(r"\d+", numba.__version__)[:2]) != TESTED_NUMBA:
        return None
    try:
        from numba.core.caching import FunctionCache
        from numba.core.runtime import rtsys
    except ImportError:
        return None
    if not all(hasattr(FunctionCache, a) for a in ("load_overload", "_load_overload",
                                                   "_guard_against_spurious_io_errors")):
        return None

    class KernelCache(FunctionCache):
        replaces = FunctionCache

        def load_overload(self, sig, target_context):
            try:
                rtsys.initialize(target_context)
                with self._guard_against_spurious_io_errors():
                    return self._load_overload(sig, target_context)
            except (TypeError, AttributeError):  # a private signature moved within the line: numba's own path
                return super().load_overload(sig, target_context)
            return None  # an I/O error the guard swallowed: compiled afresh

    return KernelCache


_KernelCache = _kernel_cache_class()


# --------------------------------------------------------------------------------------------------
# growable columns with the list interface the Python engine uses (append, index, iterate, remove)
# --------------------------------------------------------------------------------------------------


class Column:
    """A 1-D column backed by a numpy array the kernel reads and writes in place."""

    __slots__ = ("a", "n")

    def __init__(self, dtype: type, cap: int = 16) -> None:
        self.a = np.zeros(cap, dtype=dtype)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i >= self.n:
            raise IndexError(i)
        return self.a[i]

    def __setitem__(self, i: int, v) -> None:
        self.a[i] = v

    def __iter__(self):
        return iter(self.a[: self.n].tolist())

    def append(self, v) -> None:
        if self.n == len(self.a):
            self.a = np.concatenate([self.a, np.zeros_like(self.a)])
        self.a[self.n] = v
        self.n += 1

    def resize(self, cap: int) -> None:
        if cap > len(self.a):
            self.a = np.concatenate([self.a, np.zeros(cap - len(self.a), dtype=self.a.dtype)])

    def remove(self, v) -> None:
        idx = np.flatnonzero(self.a[: self.n] == v)
        if not idx.size:
            raise ValueError(v)
        k = int(idx[0])
        self.a[k: self.n - 1] = self.a[k + 1: self.n]
        self.n -= 1


class Rows:
    """A replica's slot heap per row (width = its sequence slots)."""

    __slots__ = ("a", "n")

    def __init__(self, width: int, cap: int = 16) -> None:
        self.a = np.zeros((cap, max(1, width)))
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return self.a[i]

    def __setitem__(self, i: int, row) -> None:
        # the reference frees a stopped container's heap with `[]`; here the row just stays unused
        if len(row):
            self.a[i] = row

    def append(self, row) -> None:
        if self.n == len(self.a):
            self.a = np.concatenate([self.a, np.zeros_like(self.a)])
        self.a[self.n] = row
        self.n += 1

    def resize(self, cap: int) -> None:
        if cap > len(self.a):
            self.a = np.concatenate([self.a, np.zeros((cap - len(self.a), self.a.shape[1]))])


class Runs:
    """Per replica, its sequences (finish, decode start, token gap, prompt, output) in the order they were
    admitted, for the exact KV check. The reference keeps them sorted by finish (bisect.insort); here they
    are appended and sorted (stably, so equal finishes keep their admission order, as insort_right does) only
    when kv_fit needs them. Sequences finished by the current arrival are dropped when a block fills (kv_fit
    drops them itself first); a block still over half full after that is deepened."""

    __slots__ = ("a", "count", "n")

    def __init__(self, depth: int = 64, cap: int = 16) -> None:
        self.a = np.zeros((cap, depth, 5))
        self.count = np.zeros(cap, dtype=np.int64)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> list[tuple[float, float, float, float, float]]:
        return self.running_at(i, -math.inf)

    def running_at(self, i: int, start: float) -> list[tuple[float, float, float, float, float]]:
        """Replica i's sequences finishing after `start`, in kv_fit's order. kv_fit reads only these (it drops
        those finished by the arrival, and a sequence finished by the request's start holds no KV then)."""
        rows = self.a[i, : self.count[i]]
        rows = rows[rows[:, 0] > start]
        return [tuple(x) for x in rows[np.argsort(rows[:, 0], kind="stable")].tolist()]

    def append(self, _empty) -> None:
        if self.n == len(self.a):
            self.a = np.concatenate([self.a, np.zeros_like(self.a)])
            self.count = np.concatenate([self.count, np.zeros_like(self.count)])
        self.count[self.n] = 0
        self.n += 1

    def resize(self, cap: int) -> None:
        if cap > len(self.a):
            self.a = np.concatenate([self.a, np.zeros((cap - len(self.a),) + self.a.shape[1:])])
            self.count = np.concatenate([self.count, np.zeros(cap - len(self.count), dtype=np.int64)])

    def deepen(self) -> None:
        self.a = np.concatenate([self.a, np.zeros_like(self.a)], axis=1)


# --------------------------------------------------------------------------------------------------
# the latency histogram's bins without a logarithm per request
# --------------------------------------------------------------------------------------------------

_HIST_KEY_SHIFT = 44  # a float64's sign, exponent and top 8 mantissa bits: buckets narrower than a bin (0.4 % < 0.77 %)
_HIST_CHECK_ULPS = 256  # doubles checked on each side of every edge
_hist_cache: list = []
_hist_lock = threading.Lock()  # simulate_week runs endpoints in threads: the tables are built once


def hist_tables() -> tuple[np.ndarray, np.ndarray, int] | None:
    """Bin edges read off `engine.hist_index` itself, so the compiled tally bins exactly as the reference does
    without a log10 per request (which was most of the tally's time).

    Edge k (1 ≤ k < HIST_BINS) is the smallest double that engine.hist_index puts in bin k or above, found by
    bisection on the doubles' bit patterns; a value's bin is then the number of edges ≤ it. That equals
    hist_index wherever hist_index never decreases as its input grows, which can fail only where log10's
    rounding error straddles a bin edge: every double within _HIST_CHECK_ULPS of each edge is checked to sit
    in the bin the edge says (≥ 3e-14 relative: wider than the band a log10 error of up to 7 ulps could
    misplace; numpy's accuracy tests hold its SIMD float64 functions to 2 ulps, numpy PR #31333). Should that
    check fail on some platform's log10, this returns None and the tally calls hist_index instead. Also
    returned: a lookup from a double's top bits to the bin of the smallest double with those bits (where the
    kernel's search starts) and the first key. Built once per process (tens of ms)."""
    with _hist_lock:
        if not _hist_cache:
            _hist_cache.append(_build_hist_tables())
    return _hist_cache[0]


def _build_hist_tables() -> tuple[np.ndarray, np.ndarray, int] | None:
    nb = _eng.HIST_BINS
    k = np.arange(1, nb, dtype=np.int64)
    guess = (10.0 ** (_eng.HIST_LO + k / _eng.HIST_PER_DECADE)).view(np.int64)
    lo, hi = guess - (1 << 20), guess + (1 << 20)
    if not ((_eng.hist_index(lo.view(np.float64)) < k).all() and (_eng.hist_index(hi.view(np.float64)) >= k).all()):
        return None
    while (hi - lo > 1).any():  # invariant: hist_index(lo) < k ≤ hist_index(hi)
        mid = lo + (hi - lo) // 2
        up = _eng.hist_index(mid.view(np.float64)) >= k
        hi, lo = np.where(up, mid, hi), np.where(up, lo, mid)
    off = np.arange(-_HIST_CHECK_ULPS, _HIST_CHECK_ULPS + 1)
    near = _eng.hist_index((hi[:, None] + off[None, :]).view(np.float64).ravel()).reshape(len(k), len(off))
    if not (near == np.where(off < 0, k[:, None] - 1, k[:, None])).all():
        return None
    edges = np.concatenate([[-math.inf], hi.view(np.float64), [math.inf]])
    key_min = int(hi[0]) >> _HIST_KEY_SHIFT
    keys = np.arange(key_min, (int(hi[-1]) >> _HIST_KEY_SHIFT) + 1, dtype=np.int64)
    starts = (keys << _HIST_KEY_SHIFT).view(np.float64)
    lut = np.searchsorted(edges, starts, side="right").astype(np.int64) - 1
    return edges, lut, key_min


# --------------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------------


def _before(h, x, y):
    """Heap row x before row y in Python's tuple order on (finish, id, KV, prompt): pops in heapq's order."""
    for z in range(4):
        if h[x, z] != h[y, z]:
            return h[x, z] < h[y, z]
    return False


def _heap_push(h, cnt, f, r, k, p):
    """Push (finish, id, KV, prompt); row `cap - 1` is scratch (the caller keeps a row free)."""
    tmp = h.shape[0] - 1
    h[tmp, 0], h[tmp, 1], h[tmp, 2], h[tmp, 3] = f, r, k, p
    pos = cnt[_C_DN]
    cnt[_C_DN] = pos + 1
    while pos > 0:
        parent = (pos - 1) >> 1
        if _before(h, tmp, parent):
            for z in range(4):
                h[pos, z] = h[parent, z]
            pos = parent
        else:
            break
    for z in range(4):
        h[pos, z] = h[tmp, z]


def _heap_pop(h, cnt):
    """Pop the earliest completion: (replica id or −1 − container id, KV at full length, uncached prompt).

    The caller releases the replica's (or container's) counts itself: arrays a helper uses on only one of
    its branches (the floor's or the burst's columns) keep numba's atomic reference counts even inlined, six
    increments and decrements per completion when this released them (see `_jit`)."""
    rid, kvd, pin = int(h[0, 1]), h[0, 2], h[0, 3]
    n = cnt[_C_DN] - 1
    cnt[_C_DN] = n
    if n > 0:
        pos = 0
        while True:
            child = 2 * pos + 1
            if child >= n:
                break
            right = child + 1
            if right < n:
                a, b = h[right, 0], h[child, 0]
                if a != b:
                    child += np.int64(a < b)  # no branch: which child finishes first is a coin toss
                elif _before(h, right, child):
                    child = right
            if _before(h, child, n):
                for z in range(4):
                    h[pos, z] = h[child, z]
                pos = child
            else:
                break
        if pos != n:
            for z in range(4):
                h[pos, z] = h[n, z]
    return rid, kvd, pin


def _pop_done_until(now, h, cnt, fi, fkv, fin_, ci, ckv, cin):
    """Every completion at or before `now`, its replica's (or container's) in-flight, KV and prompt counts
    released; returns how many were burst containers'. (_serve has the same loop inline: see _heap_pop.)"""
    burst = 0
    while cnt[_C_DN] > 0 and h[0, 0] <= now:
        rid, kvd, pin = _heap_pop(h, cnt)
        if rid >= 0:
            fi[rid] -= 1
            fkv[rid] -= kvd
            fin_[rid] -= pin
        else:
            j = -1 - rid
            ci[j] -= 1
            ckv[j] -= kvd
            cin[j] -= pin
            burst += 1
    return burst


def _slot_replace(row, width, v):
    """heapq.heapreplace on a replica's slot heap: the earliest free slot takes `v`."""
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= width:
            break
        right = child + 1
        if right < width:
            child += np.int64(row[right] < row[child])  # no branch: which child is earlier is a coin toss
        if row[child] < v:
            row[pos] = row[child]
            pos = child
        else:
            break
    row[pos] = v


def _runs_room(runs, count, r, t):
    """Room for one more sequence in replica r's block: drop those finished by `t` when it is full (kv_fit
    ignores them); False when it stays over half full (the caller deepens the blocks)."""
    m = count[r]
    depth = runs.shape[1]
    if m < depth:
        return True
    k = 0
    for q in range(m):
        if runs[r, q, 0] > t:
            if k != q:
                for z in range(5):
                    runs[r, k, z] = runs[r, q, z]
            k += 1
    count[r] = k
    return 2 * k <= depth


def _kv_all_fit(runs, count, r, start, kvp, o, cap):
    """kv_fit's exact shortcut: the sequences still running at `start` (finish > start), grown to full length,
    fit with this one. Summed in kv_fit's order (by finish, equal finishes in admission order)."""
    m = count[r]
    idx = np.empty(m, dtype=np.int64)
    k = 0
    for q in range(m):
        f = runs[r, q, 0]
        if f > start:
            w = k
            while w > 0 and runs[r, idx[w - 1], 0] > f:  # stable insertion: after equal finishes
                idx[w] = idx[w - 1]
                w -= 1
            idx[w] = q
            k += 1
    total = 0.0
    for w in range(k):
        total += runs[r, idx[w], 3] + runs[r, idx[w], 4]
    return kvp + o + total <= cap


def _runs_add(runs, count, r, fin, pe, gap, kvp, o):
    m = count[r]
    runs[r, m, 0] = fin
    runs[r, m, 1] = pe
    runs[r, m, 2] = gap
    runs[r, m, 3] = kvp
    runs[r, m, 4] = o
    count[r] = m + 1


# --------------------------------------------------------------------------------------------------
# the autoscaler's poll (EndpointSim.tick and what it calls), on the same columns
# --------------------------------------------------------------------------------------------------


def _timing(start, pfree, u, inv_p, o, gap):
    """A request that fits the KV cache at its full length: (prefill end, finish, first token, mean token gap)
    from its start, after the replica's previous prefill."""
    pe = max(start, pfree) + u * inv_p
    return pe, pe + o * gap, pe + gap, (gap if o > 1 else 0.0)


def _kv_timing(pend, i, runs, count, r, start, pfree, kvp, o, u, inv_p, gap, cap):
    """Request i on replica or container r from `start` when its full length does not fit the KV cache beside
    what is held: (ok, start, prefill end, finish, first token, mean token gap) from the result the Python
    kv_fit left pending for it, else the exact all-fit shortcut; ok False when neither answers (kv_fit must
    run). One body for the floor and the burst paths. Not inlined, and the common case (it fits: `_timing`)
    is decided before it: its array arguments cost numba reference counting on every call."""
    if pend[5] > 0.5 and int(pend[0]) == i:
        start, pe, fin, first = pend[1], pend[2], pend[3], pend[4]
        pend[5] = 0.0
    elif _kv_all_fit(runs, count, r, start, kvp, o, cap):
        pe = max(start, pfree) + u * inv_p
        fin = pe + o * gap
        first = pe + gap
    else:
        return False, start, 0.0, 0.0, 0.0, 0.0
    return True, start, pe, fin, first, ((fin - first) / (o - 1) if o > 1 else 0.0)


def _remove(arr, cnt, slot, v):
    """list.remove on the first cnt[slot] entries of `arr` (the first occurrence; order kept)."""
    n = cnt[slot]
    k = 0
    while k < n and arr[k] != v:
        k += 1
    for q in range(k, n - 1):
        arr[q] = arr[q + 1]
    cnt[slot] = n - 1


def _promote(now, fstate, fready, routable, cnt, sv):
    """EndpointSim.promote: starting replicas whose cold start is over join the gateway's pool (in id order)."""
    k = cnt[_C_NROUT]
    nxt = math.inf
    for i in range(cnt[_C_NF]):
        if fstate[i] == 1:
            if fready[i] <= now:
                fstate[i] = 2
                routable[k] = i
                k += 1
            elif fready[i] < nxt:
                nxt = fready[i]
    cnt[_C_NROUT] = k
    sv[_V_NEXT_READY] = nxt


def _census(st, fi, n, c):
    """EndpointSim._floor_census: drained replicas with nothing in flight go; (ready, waiting for a slot)."""
    ready_n = 0
    waiting = 0
    for i in range(n):
        s = st[i]
        if s == 3 and fi[i] == 0:
            st[i] = 0
            s = 0
        if s == 2 or s == 3:
            if s == 2:
                ready_n += 1
            w = fi[i] - c
            if w > 0:
                waiting += w
    return ready_n, waiting


def _count_states(st, n, lo, hi):
    k = 0
    for i in range(n):
        if lo <= st[i] <= hi:
            k += 1
    return k


def _add_replica(now, fi, fkv, fin_, fpfree, fready, fbad, fstate, fslots, frc, cnt, sv, p):
    """EndpointSim._add_replica(now, ready=False): on a node with room after the pod cold start, else on a new
    node after the node cold start. The caller has checked the columns have room."""
    n = cnt[_C_NF]
    alive = _count_states(fstate, n, 1, 3)
    if alive < sv[_V_NODES_UP] * p[_P_RPN]:
        ready_at = now + p[_P_POD_COLD]
        sv[_V_POD_STARTS] += 1
    else:
        sv[_V_NODES_UP] += 1
        sv[_V_NODE_STARTS] += 1
        ready_at = now + p[_P_NODE_COLD]
    fi[n] = 0
    fkv[n] = 0.0
    fin_[n] = 0.0
    frc[n] = 0
    for z in range(int(p[_P_C])):
        fslots[n, z] = ready_at
    fpfree[n] = ready_at
    fstate[n] = 1
    fready[n] = ready_at
    fbad[n] = sv[_V_BAD] != 0.0
    cnt[_C_NF] = n + 1
    if ready_at < sv[_V_NEXT_READY]:
        sv[_V_NEXT_READY] = ready_at


def _drain_one(fstate, routable, cnt):
    """EndpointSim._drain_one: a starting replica is cancelled first, else the newest ready one drains."""
    n = cnt[_C_NF]
    for i in range(n - 1, -1, -1):
        if fstate[i] == 1:
            fstate[i] = 0
            return
    for i in range(n - 1, -1, -1):
        if fstate[i] == 2:
            fstate[i] = 3
            _remove(routable, cnt, _C_NROUT, i)
            return


def _spread(arr, a, b, start_s, end_s):
    """EndpointSim._spread: the seconds of [a, b) added to each hour they cover."""
    if start_s > a:
        a = start_s
    if end_s < b:
        b = end_s
    while a < b:
        h = int((a - start_s) // 3600)
        edge = start_s + (h + 1) * 3600.0
        if b < edge:
            edge = b
        if 0 <= h < arr.shape[0]:
            arr[h] += edge - a
        a = edge


def _bill_stop(j, at, claunch, container_s, sv, p):
    """EndpointSim._stop_container's books (the caller takes the container out of the live pool)."""
    x = at - claunch[j]
    dur = x if x > 0.0 else 0.0
    sv[_V_CONTAINER_S] += dur
    sv[_V_CONTAINER_USD_S] += dur * p[_P_B_USD_S]
    _spread(container_s, claunch[j], at, p[_P_START_S], p[_P_END_S])


def _launch(t, ci, ckv, cin, cpfree, cready, claunch, clast, cbad, cslots, crc, live, cnt, sv, p):
    """EndpointSim._launch_container(t): serves after the cold start. The caller has checked for room."""
    ready = t + p[_P_B_COLD]
    j = cnt[_C_NC]
    ci[j] = 0
    ckv[j] = 0.0
    cin[j] = 0.0
    crc[j] = 0
    for z in range(int(p[_P_B_SLOTS])):
        cslots[j, z] = ready
    cpfree[j] = ready
    cready[j] = ready
    claunch[j] = t
    clast[j] = ready
    cbad[j] = sv[_V_BAD] != 0.0
    cnt[_C_NC] = j + 1
    live[cnt[_C_NLIVE]] = j
    cnt[_C_NLIVE] += 1
    sv[_V_LAUNCHES] += 1


def _window_room(w, cnt, c0, c1):
    """Room for one more row at the end of a [start, end) window of rows: slides it to the front when the
    end is reached; False when it is full (the caller grows it)."""
    if cnt[c1] < w.shape[0]:
        return True
    a = cnt[c0]
    if a == 0:
        return False
    for q in range(a, cnt[c1]):
        for z in range(w.shape[1]):
            w[q - a, z] = w[q, z]
    cnt[c1] -= a
    cnt[c0] = 0
    return True


def _tick_floor(now, dt, hour, fi, fkv, fin_, fpfree, fready, fbad, fstate, fslots, frc, routable, cron, hpa, ev,
                floor_replica_s, waiting_peak, cnt, sv, p):
    """EndpointSim._tick_floor: the floor's books for the poll, then KEDA → HPA (see there for the model)."""
    _promote(now, fstate, fready, routable, cnt, sv)
    ready_n, waiting = _census(fstate, fi, cnt[_C_NF], int(p[_P_C]))
    if 0 <= hour < floor_replica_s.shape[0]:
        floor_replica_s[hour] += ready_n * dt
        if waiting > waiting_peak[hour]:
            waiting_peak[hour] = waiting
    if waiting > sv[_V_WAITING_PEAK]:
        sv[_V_WAITING_PEAK] = waiting
    reserved = int(p[_P_RESERVED_NODES])
    nodes_up = int(sv[_V_NODES_UP])
    sv[_V_RES_NODE_S] += reserved * dt
    sv[_V_OD_NODE_S] += max(0, nodes_up - reserved) * dt
    if p[_P_FIXED] != 0.0:
        return
    cron_n = cron[int(now // 60) % int(p[_P_MINUTES_PER_WEEK])]
    current = _count_states(fstate, cnt[_C_NF], 1, 2)
    max_r = int(p[_P_MAX_REPLICAS])
    has_autoscaler = p[_P_HAS_AUTOSCALER] != 0.0
    threshold = p[_P_THRESHOLD]
    has_threshold = has_autoscaler and p[_P_HAS_BURST] != 0.0 and not math.isnan(threshold)
    if not has_autoscaler:
        desired_raw = cron_n
        desired_other = cron_n
        up_w = 0.0
        down_w = 0.0
    else:
        q = math.ceil(waiting / p[_P_TARGET_WAITING]) if waiting > 0 else 0
        desired_other = min(max_r, max(cron_n, q, int(p[_P_MIN_REPLICAS])))
        desired_raw = desired_other
        if has_threshold:
            # KEDA's burst-backlog trigger (a Value metric): ⌈current × value / target⌉; from 0 KEDA scales to 1
            # once the value passes the activation threshold, the target (as engine.py)
            inflight = int(sv[_V_BINF])
            if inflight > sv[_V_BACKLOG_PEAK]:
                sv[_V_BACKLOG_PEAK] = inflight
            if inflight > (threshold if current == 0 else 0):
                b = min(max_r, math.ceil(current * inflight / threshold) if current else 1)
                if b > desired_other:
                    sv[_V_BACKLOG_POLLS] += 1
                    desired_raw = b
        up_w = p[_P_UP_W]
        down_w = p[_P_DOWN_W]
    e = cnt[_C_HPA1]
    hpa[e, 0] = now
    hpa[e, 1] = desired_raw
    hpa[e, 2] = desired_other
    cnt[_C_HPA1] = e + 1
    keep = max(up_w, down_w)
    while cnt[_C_HPA0] < cnt[_C_HPA1] and hpa[cnt[_C_HPA0], 0] < now - keep:
        cnt[_C_HPA0] += 1
    if desired_raw > current:
        rec = 1 << 62
        for q in range(cnt[_C_HPA0], cnt[_C_HPA1]):
            if hpa[q, 0] >= now - up_w and hpa[q, 1] < rec:
                rec = int(hpa[q, 1])
        if rec > current:
            step_cap, period = (int(p[_P_UP_STEP]), p[_P_UP_PERIOD]) if has_autoscaler else (10**6, 1.0)
            recent = 0
            for q in range(cnt[_C_EV0], cnt[_C_EV1]):
                if ev[q, 0] > now - period and ev[q, 1] > 0:
                    recent += int(ev[q, 1])
            add = min(rec - current, max(0, step_cap - recent))
            for _ in range(add):
                _add_replica(now, fi, fkv, fin_, fpfree, fready, fbad, fstate, fslots, frc, cnt, sv, p)
            if add:
                e = cnt[_C_EV1]
                ev[e, 0] = now
                ev[e, 1] = add
                cnt[_C_EV1] = e + 1
                if has_threshold:
                    # what the queue and cron triggers alone would have added at this poll
                    rec_other = 1 << 62
                    for q in range(cnt[_C_HPA0], cnt[_C_HPA1]):
                        if hpa[q, 0] >= now - up_w and hpa[q, 2] < rec_other:
                            rec_other = int(hpa[q, 2])
                    sv[_V_BACKLOG_ADDED] += add - min(add, max(0, rec_other - current))
    elif desired_raw < current:
        rec = -(1 << 62)
        for q in range(cnt[_C_HPA0], cnt[_C_HPA1]):
            if hpa[q, 0] >= now - down_w and hpa[q, 1] > rec:
                rec = int(hpa[q, 1])
        if rec < current:
            step_cap, period = (int(p[_P_DOWN_STEP]), p[_P_DOWN_PERIOD]) if has_autoscaler else (10**6, 1.0)
            recent = 0
            for q in range(cnt[_C_EV0], cnt[_C_EV1]):
                if ev[q, 0] > now - period and ev[q, 1] < 0:
                    recent -= int(ev[q, 1])
            remove = min(current - rec, max(0, step_cap - recent))
            for _ in range(remove):
                _drain_one(fstate, routable, cnt)
            if remove:
                e = cnt[_C_EV1]
                ev[e, 0] = now
                ev[e, 1] = -remove
                cnt[_C_EV1] = e + 1
    while cnt[_C_EV0] < cnt[_C_EV1] and ev[cnt[_C_EV0], 0] < now - 3600:
        cnt[_C_EV0] += 1
    # nodes: on-demand ones beyond the reserved go once unneeded for NODE_SCALE_DOWN_S
    alive = _count_states(fstate, cnt[_C_NF], 1, 3)
    need = max(reserved, math.ceil(alive / p[_P_RPN]))
    if sv[_V_NODES_UP] > need:
        if math.isnan(sv[_V_SURPLUS_SINCE]):
            sv[_V_SURPLUS_SINCE] = now
        elif now - sv[_V_SURPLUS_SINCE] >= p[_P_NODE_SCALE_DOWN]:
            sv[_V_NODES_UP] = need
            sv[_V_SURPLUS_SINCE] = math.nan
    else:
        sv[_V_SURPLUS_SINCE] = math.nan


def _tick_burst(now, ci, ckv, cin, cpfree, cready, claunch, clast, cbad, cslots, crc, live, bmin, container_s, cnt,
                sv, p):
    """EndpointSim._tick_burst: the clock-following minimum launched; idle containers past the scaledown window
    stop, in pool order, down to the minimum."""
    minimum = bmin[int(now // 60) % int(p[_P_MINUTES_PER_WEEK])]
    lim = min(minimum, int(p[_P_B_MAX_CONTAINERS]))
    while cnt[_C_NLIVE] < lim:
        _launch(now, ci, ckv, cin, cpfree, cready, claunch, clast, cbad, cslots, crc, live, cnt, sv, p)
    window = p[_P_B_WINDOW]
    slots = int(p[_P_B_SLOTS])
    n = cnt[_C_NLIVE]
    left = n
    w = 0
    waiting = 0
    for q in range(n):
        j = live[q]
        if ci[j] == 0:
            if left <= minimum:
                clast[j] = now  # held by the minimum: billed on, idle from its release (EndpointSim._tick_burst)
            else:
                idle_from = max(clast[j], cready[j])
                if now - idle_from >= window:
                    _bill_stop(j, idle_from + window, claunch, container_s, sv, p)
                    left -= 1
                    continue
        live[w] = j
        w += 1
        x = ci[j] - slots
        if x > 0:
            waiting += x
    cnt[_C_NLIVE] = w
    if waiting > sv[_V_BWPEAK]:
        sv[_V_BWPEAK] = waiting


_OK = -1


def _tick(now, fi, fkv, fin_, fpfree, fready, fbad, fstate, fslots, frc, routable,
          ci, ckv, cin, cpfree, cready, claunch, clast, cbad, cslots, crc, live,
          h, hpa, ev, cron, bmin, floor_replica_s, waiting_peak, container_s, cnt, sv, p):
    """EndpointSim.tick without the rollout (the Python engine runs that after it): completions, the floor's
    autoscaler, the burst pool. Returns _OK, or which columns must grow first (before it changed anything)."""
    has_floor = p[_P_HAS_FLOOR] != 0.0
    has_burst = p[_P_HAS_BURST] != 0.0
    if has_floor and p[_P_FIXED] == 0.0:
        if cnt[_C_NF] + int(p[_P_MAX_ADD]) > fstate.shape[0]:
            return _GROW_FLOOR
        if not _window_room(hpa, cnt, _C_HPA0, _C_HPA1):
            return _GROW_HPA
        if not _window_room(ev, cnt, _C_EV0, _C_EV1):
            return _GROW_EVENTS
    if has_burst and cnt[_C_NC] + int(p[_P_B_MAX_CONTAINERS]) > cready.shape[0]:
        return _GROW_BURST
    dt = now - sv[_V_LAST_TICK]
    sv[_V_LAST_TICK] = now
    sv[_V_BINF] -= _pop_done_until(now, h, cnt, fi, fkv, fin_, ci, ckv, cin)
    hour = int((now - p[_P_START_S]) // 3600)
    if has_floor:
        _tick_floor(now, dt, hour, fi, fkv, fin_, fpfree, fready, fbad, fstate, fslots, frc, routable, cron, hpa, ev,
                    floor_replica_s, waiting_peak, cnt, sv, p)
    if has_burst:
        _tick_burst(now, ci, ckv, cin, cpfree, cready, claunch, clast, cbad, cslots, crc, live, bmin, container_s,
                    cnt, sv, p)
    return _OK


# --------------------------------------------------------------------------------------------------
# the per-request loop
# --------------------------------------------------------------------------------------------------


def _serve(i0, T, IN, OUT, status, ns, abpos, pend, xo, ttft, itl, flag,
           fi, fkv, fin_, fpfree, fready, fbad, fstate, fslots, frc, routable, fruns,
           ci, ckv, cin, cpfree, cready, claunch, clast, cbad, cslots, crc, live, cruns,
           h, hpa, ev, cron, bmin, floor_replica_s, waiting_peak, container_s, cnt, sv, p, st):
    """Serve arrivals i0.. until the chunk ends or the Python engine must act; returns (why, request index).
    The order of operations per request is EndpointSim.feed's (see there for the model's reasons); the
    autoscaler's polls due before a request run here too (`_tick`), unless a rollout needs the Python engine's."""
    n = T.shape[0]
    has_status = status.shape[0] > 0
    has_ns = ns.shape[0] > 0
    has_ab = abpos.shape[0] > 0
    has_burst = p[_P_HAS_BURST] != 0.0
    is_api = p[_P_IS_API] != 0.0
    overflow = p[_P_OVERFLOW]
    shed_after = p[_P_SHED_AFTER]
    burst_cap = p[_P_BURST_CAP]
    fq = p[_P_FLOOR_QUEUE] != 0.0
    has_floor = p[_P_HAS_FLOOR] != 0.0
    first_byte_s = p[_P_FIRST_BYTE]
    kvs = p[_P_KVS]
    c = int(p[_P_C])
    inv_p = p[_P_INV_P]
    gpus = p[_P_GPUS]
    t_min = p[_P_T_MIN]
    k_step = p[_P_K]
    interf = p[_P_INTERF]
    per_tok = p[_P_PER_TOK]
    dyn = p[_P_DYN] != 0.0
    kcap = p[_P_KCAP]
    ns_rule = int(p[_P_NS_RULE])
    ns_max_tokens = p[_P_NS_MAX_TOKENS]
    web_cap_s = p[_P_WEB_CAP]
    ab_propagate = p[_P_AB_PROPAGATE] != 0.0
    b_max_containers = int(p[_P_B_MAX_CONTAINERS])
    b_target_inputs = p[_P_B_TARGET]
    b_buffer = int(p[_P_B_BUFFER])
    b_max_inputs = int(p[_P_B_MAX_INPUTS])
    b_slots = int(p[_P_B_SLOTS])
    b_t_min = p[_P_B_T_MIN]
    b_k = p[_P_B_K]
    b_a0 = p[_P_B_A0]
    b_a1 = p[_P_B_A1]
    b_per_tok = p[_P_B_PER_TOK]
    b_dyn = p[_P_B_DYN] != 0.0
    b_inv_p = p[_P_B_INV_P]
    b_kvcap = p[_P_B_KVCAP]
    b_gpus = p[_P_B_GPUS]
    one_minus_hit = p[_P_ONE_MINUS_HIT]
    tick_s = p[_P_TICK_S]
    py_tick = p[_P_PY_TICK] != 0.0
    dcap = h.shape[0] - 1  # the last row is the push's scratch
    inf = math.inf
    i = i0
    while i < n:
        t = T[i]
        while t >= sv[_V_NEXT_TICK]:
            if py_tick:
                return _TICK, i
            why = _tick(sv[_V_NEXT_TICK], fi, fkv, fin_, fpfree, fready, fbad, fstate, fslots, frc, routable,
                        ci, ckv, cin, cpfree, cready, claunch, clast, cbad, cslots, crc, live,
                        h, hpa, ev, cron, bmin, floor_replica_s, waiting_peak, container_s, cnt, sv, p)
            if why != _OK:
                return why, i
            sv[_V_NEXT_TICK] += tick_s
        if t >= sv[_V_NEXT_READY]:
            _promote(t, fstate, fready, routable, cnt, sv)
        while cnt[_C_DN] > 0 and h[0, 0] <= t:  # _pop_done_until, inline (see _heap_pop)
            rid, kvd, pin = _heap_pop(h, cnt)
            if rid >= 0:
                fi[rid] -= 1
                fkv[rid] -= kvd
                fin_[rid] -= pin
            else:
                j = -1 - rid
                ci[j] -= 1
                ckv[j] -= kvd
                cin[j] -= pin
                sv[_V_BINF] -= 1
        if has_status and status[i] != 0:
            if status[i] == 413:
                st[_S_413] += 1
            else:
                st[_S_400] += 1
            ttft[i] = inf
            flag[i] = REJECTED | TOO_LONG
            i += 1
            continue
        if cnt[_C_DN] >= dcap:
            return _GROW_DONE, i
        o = OUT[i]
        streamed = not (has_ns and ns[i])
        r = -1
        nrout = cnt[_C_NROUT]
        if nrout > 0:
            if nrout == 1:
                r = routable[0]
            else:  # min(routable, key=in flight): the first least-loaded in pool order
                r = routable[0]
                best = fi[r]
                for q in range(1, nrout):
                    rr = routable[q]
                    v = fi[rr]
                    lt = -np.int64(v < best)  # all ones when v is smaller: a select without a branch
                    best ^= (best ^ v) & lt
                    r ^= (r ^ rr) & lt
            if fi[r] >= overflow and (streamed or ns_rule != 1):
                r = -1
        if r < 0 and has_burst and sv[_V_BINF] >= burst_cap and (streamed or ns_rule != 2):
            # the floor pick found no room and burst is full: HAProxy's queue, bounded, then 429
            if nrout > 0:
                r = routable[0]
                for q in range(1, nrout):
                    if fi[routable[q]] < fi[r]:
                        r = routable[q]
            else:
                queued = False
                if not has_floor and cnt[_C_NLIVE] > 0:  # serverless only: the burst server's own queue
                    w = cslots[live[0], 0]
                    for q in range(1, cnt[_C_NLIVE]):
                        if cslots[live[q], 0] < w:
                            w = cslots[live[q], 0]
                    queued = w - t <= shed_after
                if not queued:
                    st[_S_SHED] += 1
                    ttft[i] = inf
                    flag[i] = REJECTED | SHED
                    i += 1
                    continue
        if r >= 0:
            if fq and fslots[r, 0] > t and nrout > 1:  # full: the queue gives it the first slot to free
                r = routable[0]
                for q in range(1, nrout):
                    if fslots[routable[q], 0] < fslots[r, 0]:
                        r = routable[q]
            if not _runs_room(fruns, frc, r, t):
                return _GROW_FRUNS, i
            s0 = fslots[r, 0]
            start = s0 if s0 > t else t
            if start - t > shed_after:
                st[_S_SHED] += 1
                ttft[i] = inf
                flag[i] = REJECTED | SHED
                i += 1
                continue
            if start - t > first_byte_s:
                st[_S_TIMED_OUT] += 1
                ttft[i] = inf
                flag[i] = REJECTED | TIMED_OUT
                i += 1
                continue
            b = fi[r] + 1
            if b > c:
                b = c
            if dyn:
                gap = t_min + k_step * b + (per_tok * fin_[r] * (b - 1) / fi[r] if b > 1 else 0.0)
            else:
                gap = t_min + k_step * b + interf * (b - 1)
            u = IN[i]
            kvp = u * kvs
            kvfull = kvp + o
            ok = True
            if fkv[r] + kvfull <= kcap:
                pe, fin, first, gap_mean = _timing(start, fpfree[r], u, inv_p, o, gap)
            else:
                ok, start, pe, fin, first, gap_mean = _kv_timing(pend, i, fruns, frc, r, start, fpfree[r], kvp, o, u,
                                                                 inv_p, gap, kcap)
            if not ok:
                xo[0], xo[1], xo[2], xo[3], xo[4], xo[5], xo[6], xo[7] = r, start, fpfree[r], kvp, u, o, gap, 0.0
                return _KV_FLOOR, i
            st[_S_WAIT] += start - t
            if first - t > first_byte_s:
                st[_S_TIMED_OUT] += 1
                ttft[i] = inf
                flag[i] = REJECTED | TIMED_OUT
                i += 1
                continue
            st[_S_NFLOOR] += 1
            if pe > fpfree[r]:
                fpfree[r] = pe
            if has_ab and abpos[i] >= 0:
                st[_S_ABANDONED] += 1
                leave = first + abpos[i] * (fin - first)
                if ab_propagate:
                    fin = leave
                else:
                    st[_S_WASTED] += (fin - leave) * (gpus / b)
            _slot_replace(fslots[r], c, fin)
            _heap_push(h, cnt, fin, r, kvfull, u)
            fi[r] += 1
            fkv[r] += kvfull
            fin_[r] += u
            _runs_add(fruns, frc, r, fin, pe, gap, kvp, o)
            ttft[i] = first - t
            itl[i] = gap_mean
            if fbad[r]:
                flag[i] = BAD
        elif has_burst:
            if not streamed and ns_rule == 2:
                st[_S_NS_REFUSED] += 1
                ttft[i] = inf
                flag[i] = REJECTED | TOO_LONG
                i += 1
                continue
            capped = not streamed and ns_rule == 3 and o > ns_max_tokens
            if capped:
                o = ns_max_tokens
            # the burst tier (EndpointSim._burst): launch toward target, pick the least-loaded ready container
            binf = sv[_V_BINF] + 1
            want = min(b_max_containers, math.ceil(binf / b_target_inputs) + b_buffer)
            if cnt[_C_NLIVE] < want:
                if cnt[_C_NC] + want - cnt[_C_NLIVE] > cready.shape[0]:
                    return _GROW_BURST, i
                while cnt[_C_NLIVE] < want:
                    _launch(t, ci, ckv, cin, cpfree, cready, claunch, clast, cbad, cslots, crc, live, cnt, sv, p)
            nlive = cnt[_C_NLIVE]
            best = -1
            best_n = 1 << 60
            for q in range(nlive):
                j = live[q]
                if cready[j] <= t and ci[j] < best_n and ci[j] < b_max_inputs:
                    best = j
                    best_n = ci[j]
            if best < 0:
                best = live[0]
                for q in range(1, nlive):
                    j = live[q]
                    if cslots[j, 0] < cslots[best, 0]:
                        best = j
            if not _runs_room(cruns, crc, best, t):
                return _GROW_CRUNS, i
            start = max(t, cslots[best, 0])  # never shed here (EndpointSim._burst)
            cold_wait = cready[best] > t and start >= cready[best]
            bsz = min(b_slots, ci[best] + 1)
            if b_dyn:
                gap = b_t_min + b_k * bsz + (b_per_tok * cin[best] * (bsz - 1) / ci[best] if bsz > 1 else 0.0)
            else:
                gap = b_a0 + b_a1 * bsz
            u = IN[i]
            kvp = u / one_minus_hit
            kvfull = kvp + o
            ok = True
            if ckv[best] + kvfull <= b_kvcap:
                pe, fin, first, gap_mean = _timing(start, cpfree[best], u, b_inv_p, o, gap)
            else:
                ok, start, pe, fin, first, gap_mean = _kv_timing(pend, i, cruns, crc, best, start, cpfree[best], kvp, o,
                                                                 u, b_inv_p, gap, b_kvcap)
            if not ok:
                xo[0], xo[1], xo[2], xo[3], xo[4], xo[5], xo[6], xo[7] = best, start, cpfree[best], kvp, u, o, gap, 1.0
                return _KV_BURST, i
            # committed from here on
            if capped:
                st[_S_NS_CAPPED] += 1
            sv[_V_BINF] = binf
            if cold_wait:
                st[_S_COLD_WAITS] += 1
            if pe > cpfree[best]:
                cpfree[best] = pe
            if has_ab and abpos[i] >= 0:
                st[_S_ABANDONED] += 1
                leave = first + abpos[i] * (fin - first)
                if ab_propagate:
                    fin = leave
                else:
                    st[_S_WASTED] += (fin - leave) * (b_gpus / bsz)
            _slot_replace(cslots[best], b_slots, fin)
            _heap_push(h, cnt, fin, -1 - best, kvfull, u)
            ci[best] += 1
            ckv[best] += kvfull
            cin[best] += u
            _runs_add(cruns, crc, best, fin, pe, gap, kvp, o)
            if fin > clast[best]:
                clast[best] = fin
            waiting = binf - nlive * b_slots
            if waiting > sv[_V_BWPEAK]:
                sv[_V_BWPEAK] = waiting
            ttft[i] = first - t
            itl[i] = gap_mean
            fl = BURST
            if cbad[best]:
                fl |= BAD
            if not streamed:
                st[_S_NS_BURST] += 1
                if fin - t > web_cap_s:
                    st[_S_NS_REDIRECTED] += 1
                    fl |= BAD
            flag[i] = fl
        elif is_api:
            return _API, i
        else:
            ttft[i] = inf
            flag[i] = REJECTED
        i += 1
    return _DONE, n


def _hist_bins(x, bits, edges, lut, key_min, out):
    """The latency histogram's bin of each x: how many bin edges are ≤ x (see `hist_tables`); the non-finite
    go to the last bin, as engine.hist_index puts them. `bits` is x's float64 bit patterns (an int64 view)."""
    last = edges.shape[0] - 2
    first_edge = edges[1]
    top_edge = edges[last]
    for e in range(x.shape[0]):
        v = x[e]
        if not (-math.inf < v < math.inf):
            out[e] = last
        elif v < first_edge:
            out[e] = 0
        elif v >= top_edge:
            out[e] = last
        else:
            b = lut[(bits[e] >> _HIST_KEY_SHIFT) - key_min]
            b += v >= edges[b + 1]  # a bucket spans at most two bins: no branch to mispredict
            while v >= edges[b + 1]:
                b += 1
            out[e] = b


def _tally(t, start_s, ttft, itl, flag, hi_ttft, hi_itl, ttft_slo, itl_slo, arrivals, met_h, burst_h, rejected_h,
           ttft_hist, itl_hist, out):
    """EndpointSim._record's hourly counts and histograms in one pass (every figure is a count, so the order
    of the additions cannot change it); out = [TTFT max, burst, API, no replica (503), bad revision]."""
    last = arrivals.shape[0] - 1
    # the hour is ⌊(t − start) / 3600⌋ (exact: fmod-based floor division, as numpy's and Python's), kept while
    # the arrivals stay inside it (they come sorted) rather than divided again for each one
    lo, hi, hour = 1.0, 0.0, 0
    for e in range(t.shape[0]):
        x = t[e] - start_s
        if not (lo <= x < hi):
            hour = int(x // 3600)
            lo, hi = hour * 3600.0, (hour + 1) * 3600.0
        h = hour
        if h < 0:
            h = 0
        elif h > last:
            h = last
        fl = flag[e]
        tier = fl & 3
        x = ttft[e]
        arrivals[h] += 1.0
        if x <= ttft_slo and itl[e] <= itl_slo and (fl & BAD) == 0 and tier != REJECTED:
            met_h[h] += 1.0
        if tier == BURST:
            burst_h[h] += 1.0
            out[1] += 1
        elif tier == API:
            out[2] += 1
        if (fl & (3 | TOO_LONG | SHED | TIMED_OUT)) == REJECTED:
            rejected_h[h] += 1.0
            out[3] += 1
        if (fl & BAD) != 0:
            out[4] += 1
        if (fl & (TOO_LONG | SHED)) == 0:  # refused before any GPU: not a latency
            ttft_hist[hi_ttft[e]] += 1.0
            if itl[e] > 0:
                itl_hist[hi_itl[e]] += 1.0
        if x < math.inf and x > out[0]:
            out[0] = x


if numba is not None:
    _hist_bins = _jit(_hist_bins)
    _tally = _jit(_tally)
    _before = _jit(_before)
    _heap_push = _jit(_heap_push, 'always')
    _heap_pop = _jit(_heap_pop, 'always')
    _pop_done_until = _jit(_pop_done_until)
    _slot_replace = _jit(_slot_replace, 'always')
    _runs_room = _jit(_runs_room, 'always')
    _runs_add = _jit(_runs_add, 'always')
    _kv_all_fit = _jit(_kv_all_fit)
    _timing = _jit(_timing, 'always')
    _kv_timing = _jit(_kv_timing)
    _remove = _jit(_remove)
    _promote = _jit(_promote)
    _census = _jit(_census)
    _count_states = _jit(_count_states)
    _add_replica = _jit(_add_replica)
    _drain_one = _jit(_drain_one)
    _spread = _jit(_spread)
    _bill_stop = _jit(_bill_stop)
    _launch = _jit(_launch)
    _window_room = _jit(_window_room)
    _tick_floor = _jit(_tick_floor)
    _tick_burst = _jit(_tick_burst)
    _tick = _jit(_tick)
    _serve = _jit(_serve)


# --------------------------------------------------------------------------------------------------
# the engine
# --------------------------------------------------------------------------------------------------


class CompiledEndpointSim(_eng.EndpointSim):
    """EndpointSim whose per-request loop and autoscaler polls run compiled (see the module docstring); a
    rollout, the exact KV fit and managed-API requests run the reference engine's Python code on the same state.

    Between kernel calls the reference's attributes hold the state (so its Python methods work unchanged);
    each call copies the scalar ones into an array (`_STATE`) and back, and the columns' lengths into `_cnt`."""

    # starting sizes of the arrays, doubled as needed (tests start them tiny to exercise the growth)
    initial_rows = 16  # replicas, containers
    initial_runs_depth = 64  # sequences per replica in the KV check's block
    initial_heap_rows = 256  # completions in flight
    initial_window_rows = 64  # the HPA's history, scale events

    def _column(self, kind: type) -> Column:
        return Column({float: np.float64, int: np.int64, bool: np.bool_}[kind], self.initial_rows)

    def _rows(self, width: int) -> Rows:
        return Rows(width, self.initial_rows)

    def _runs(self) -> Runs:
        return Runs(self.initial_runs_depth, self.initial_rows)

    def _init_state(self) -> None:
        self._heap = np.zeros((self.initial_heap_rows, 4))  # (finish, replica id or −1 − container id, KV, prompt)
        self._cnt = np.zeros(_N_COUNTS, dtype=np.int64)
        self._sv = np.zeros(_N_STATE)
        w = self.initial_window_rows
        self._hpa = np.zeros((w, 3))  # the HPA's window: (poll, desired, desired without the burst backlog)
        self._events = np.zeros((w, 2))  # scale events in the last hour: (poll, replicas added (+) or drained (−))
        self._p = np.zeros(_N_PARAMS)
        super()._init_state()
        self._p = self._params()

    @property
    def done(self) -> list[tuple[float, int, float, float]]:
        """The completion heap's entries (finish, replica id or −1 − container id, KV, prompt), unordered."""
        return [(f, int(r), k, p) for f, r, k, p in self._heap[: int(self._cnt[_C_DN])].tolist()]

    @done.setter
    def done(self, value: list) -> None:
        if value:
            raise ValueError("the compiled engine's completion heap starts empty")
        self._cnt[_C_DN] = 0

    def _n_replicas(self, lo: int, hi: int) -> int:
        # numpy, not the _count_states kernel: called from Python only while the engine starts (and by drills'
        # rollouts), where loading one more kernel from numba's cache cost more than the count
        st = self.f_state.a[: self.f_state.n]
        return int(np.count_nonzero((st >= lo) & (st <= hi)))

    def _pop_done(self, now: float) -> None:
        self._pack()
        self._sv[_V_BINF] -= _pop_done_until(now, self._heap, self._cnt, self.f_inflight.a, self.f_kv.a,
                                             self.f_in.a, self.c_inflight.a, self.c_kv.a, self.c_in.a)
        self._unpack()

    # ---------------------------------------------------------------- state in and out of the kernels
    def _floor_columns(self) -> tuple:
        return (self.f_inflight, self.f_kv, self.f_in, self.f_pfree, self.f_ready_at, self.f_bad, self.f_state,
                self.f_slots, self.f_runs, self.routable)

    def _burst_columns(self) -> tuple:
        return (self.c_inflight, self.c_kv, self.c_in, self.c_pfree, self.c_ready, self.c_launch, self.c_last,
                self.c_bad, self.c_slots, self.c_runs, self.live)

    @staticmethod
    def _fit(columns: tuple, rows: int = 0) -> None:
        """Every column of a group at least `rows` long and all as long (the kernels check one of them)."""
        cap = max(rows, max(len(c.a) for c in columns))
        for c in columns:
            if len(c.a) < cap:
                c.resize(cap)

    def _pack(self) -> None:
        # one slice assignment (the list converts to float64 as each item's assignment did); once per kernel call
        self._sv[: len(_STATE)] = [math.nan if v is None else v for v in _get_state(self)]
        c = self._cnt
        c[_C_NF], c[_C_NROUT] = self.f_state.n, self.routable.n
        c[_C_NC], c[_C_NLIVE] = self.c_ready.n, self.live.n
        self._fit(self._floor_columns())
        self._fit(self._burst_columns())
        ro = self.ov.rollout
        self._p[_P_PY_TICK] = ro is not None and ro.phase != "done"

    def _unpack(self) -> None:
        for name, v in zip(_STATE, self._sv[: len(_STATE)].tolist()):  # tolist: the Python floats float() gave
            if name == "node_surplus_since":
                self.node_surplus_since = None if math.isnan(v) else v
            elif name == "bad_revision":
                self.bad_revision = v != 0.0
            else:
                setattr(self, name, v if name in _STATE_FLOAT else int(v))
        c = self._cnt
        for col in self._floor_columns()[:-1]:
            col.n = int(c[_C_NF])
        self.routable.n = int(c[_C_NROUT])
        for col in self._burst_columns()[:-1]:
            col.n = int(c[_C_NC])
        self.live.n = int(c[_C_NLIVE])

    def _grow(self, why: int) -> None:
        if why == _GROW_DONE:
            self._heap = np.concatenate([self._heap, np.zeros_like(self._heap)])
        elif why == _GROW_FRUNS:
            self.f_runs.deepen()
        elif why == _GROW_CRUNS:
            self.c_runs.deepen()
        elif why == _GROW_FLOOR:
            self._fit(self._floor_columns(), 2 * len(self.f_state.a) + int(self._p[_P_MAX_ADD]))
        elif why == _GROW_BURST:
            self._fit(self._burst_columns(), 2 * len(self.c_ready.a) + int(self._p[_P_B_MAX_CONTAINERS]))
        elif why == _GROW_HPA:
            self._hpa = np.concatenate([self._hpa, np.zeros_like(self._hpa)])
        elif why == _GROW_EVENTS:
            self._events = np.concatenate([self._events, np.zeros_like(self._events)])
        else:
            raise AssertionError(why)

    def _columns(self) -> tuple:
        """The kernels' shared arguments, in their order."""
        return (self.f_inflight.a, self.f_kv.a, self.f_in.a, self.f_pfree.a, self.f_ready_at.a, self.f_bad.a,
                self.f_state.a, self.f_slots.a, self.f_runs.count, self.routable.a,
                self.c_inflight.a, self.c_kv.a, self.c_in.a, self.c_pfree.a, self.c_ready.a, self.c_launch.a,
                self.c_last.a, self.c_bad.a, self.c_slots.a, self.c_runs.count, self.live.a,
                self._heap, self._hpa, self._events, self._cron_a, self._bmin_a, self.tally.floor_replica_s,
                self.tally.waiting_peak, self.tally.container_s, self._cnt, self._sv, self._p)

    # ---------------------------------------------------------------- the autoscaler's poll
    def tick(self, now: float) -> None:
        self._pack()
        while True:
            why = _tick(now, *self._columns())
            if why == _OK:
                break
            self._grow(why)
        self._unpack()
        self._tick_rollout(now)

    def _params(self) -> np.ndarray:
        p = np.zeros(_N_PARAMS)
        p[_P_HAS_FLOOR] = self.has_floor
        p[_P_HAS_BURST] = self.has_burst
        p[_P_IS_API] = self.is_api
        p[_P_OVERFLOW] = self.ep.gateway.overflow_inflight_per_replica if self.has_burst else float(1 << 60)
        if self.has_burst and self.floor_cap:
            p[_P_OVERFLOW] = min(p[_P_OVERFLOW], self.floor_cap)
        p[_P_SHED_AFTER] = self.admission_wait_s
        p[_P_BURST_CAP] = self.burst_cap
        p[_P_FLOOR_QUEUE] = self.floor_queue
        p[_P_FIRST_BYTE] = self.ep.gateway.first_byte_timeout_s
        p[_P_KVS] = 1.0 / (1.0 - self.hit)
        p[_P_ONE_MINUS_HIT] = 1.0 - self.hit
        p[_P_START_S], p[_P_END_S] = self.start_s, self.end_s
        p[_P_MINUTES_PER_WEEK] = _eng.MINUTES_PER_WEEK
        p[_P_NODE_SCALE_DOWN] = _eng.NODE_SCALE_DOWN_S
        self._cron_a = np.zeros(1, dtype=np.int64)
        self._bmin_a = np.zeros(1, dtype=np.int64)
        if self.has_floor:
            fe = self.feng
            p[_P_C], p[_P_INV_P], p[_P_GPUS] = fe.slots, 1.0 / fe.prefill_tokens_per_s, fe.gpus
            p[_P_T_MIN], p[_P_K], p[_P_INTERF] = fe.t_min, fe.k, fe.interference
            p[_P_PER_TOK], p[_P_DYN], p[_P_KCAP] = (fe.interference_per_token, fe.planned_uncached_prompt > 0,
                                                    fe.kv_capacity_tokens)
            self._cron_a = np.ascontiguousarray(self.cron, dtype=np.int64)
            p[_P_FIXED] = self.ov.fixed_replicas is not None
            p[_P_RESERVED_NODES], p[_P_RPN] = self.reserved_nodes, self.rpn
            p[_P_POD_COLD], p[_P_NODE_COLD] = self.ep.pod_cold_start_s, self.ep.node_cold_start_s
            a = self.ep.autoscaling
            p[_P_HAS_AUTOSCALER] = a is not None
            p[_P_THRESHOLD] = math.nan
            most = int(self._cron_a.max())
            if a is not None:
                p[_P_MAX_REPLICAS], p[_P_TARGET_WAITING] = a.max_replicas, a.target_waiting_per_replica
                p[_P_MIN_REPLICAS] = self._min_replicas()
                if a.burst_backlog_threshold is not None:
                    p[_P_THRESHOLD] = a.burst_backlog_threshold
                p[_P_UP_W], p[_P_DOWN_W] = a.scale_up_stabilization_s, a.scale_down_stabilization_s
                p[_P_UP_STEP], p[_P_UP_PERIOD] = a.scale_up_pods_per_period, a.scale_up_period_s
                p[_P_DOWN_STEP], p[_P_DOWN_PERIOD] = a.scale_down_pods_per_period, a.scale_down_period_s
                most = max(most, a.max_replicas)
            p[_P_MAX_ADD] = most + 1  # a poll adds at most the desired count (≤ max replicas, or the cron's)
        p[_P_NS_RULE] = _NS_RULES[self.ns_rule]
        p[_P_NS_MAX_TOKENS] = self.ns_max_tokens
        p[_P_WEB_CAP] = self.web_cap_s
        ab = self.ov.abandon
        p[_P_AB_PROPAGATE] = bool(ab is not None and ab.propagate)
        if self.has_burst:
            b, be = self.ep.burst, self.beng
            assert b is not None
            p[_P_B_MAX_CONTAINERS], p[_P_B_TARGET] = b.max_containers, b.target_inputs
            p[_P_B_BUFFER], p[_P_B_MAX_INPUTS] = b.buffer_containers, b.max_inputs
            p[_P_B_SLOTS], p[_P_B_T_MIN], p[_P_B_K], p[_P_B_A0], p[_P_B_A1] = be.slots, be.t_min, be.k, be.a0, be.a1
            p[_P_B_PER_TOK], p[_P_B_DYN] = be.interference_per_token, be.planned_uncached_prompt > 0
            p[_P_B_INV_P], p[_P_B_KVCAP], p[_P_B_GPUS] = 1.0 / be.prefill_tokens_per_s, be.kv_capacity_tokens, be.gpus
            p[_P_B_COLD], p[_P_B_USD_S], p[_P_B_WINDOW] = self.b_cold, self.b_usd_s, b.scaledown_window_s
            self._bmin_a = np.ascontiguousarray(self.b_min, dtype=np.int64)
        return p

    # ---------------------------------------------------------------- requests
    def feed(self, chunk, tick_s: float, next_tick: float) -> float:
        """Serve one chunk of arrivals; returns the next tick time (EndpointSim.feed's contract)."""
        T = np.ascontiguousarray(chunk.arrival_s, dtype=np.float64)
        IN = np.ascontiguousarray(chunk.input_tokens * (1.0 - self.hit), dtype=np.float64)
        OUT = np.ascontiguousarray(chunk.output_tokens, dtype=np.float64)
        n = len(T)
        ttft = np.zeros(n)
        itl = np.zeros(n)
        flag = np.zeros(n, dtype=np.int64)
        status = (np.ascontiguousarray(chunk.status, dtype=np.int64) if chunk.status is not None
                  else np.zeros(0, dtype=np.int64))
        ab = self.ov.abandon
        abpos = np.zeros(0)
        if ab is not None:  # the same draws, in the same order, as the reference
            u = self.rng.random(n)
            abpos = np.where(u < ab.fraction, self.rng.random(n), -1.0)
        ns = (self.ns_rng.random(n) < self.ns_fraction) if self.ns_rule else np.zeros(0, dtype=np.bool_)
        st = np.zeros(_N_STATS)
        st[_S_WASTED] = ab.wasted_gpu_s if ab is not None else 0.0
        pend = np.zeros(6)
        xo = np.zeros(8)
        self._p[_P_TICK_S] = tick_s
        i = 0
        while True:
            self._pack()
            self._sv[_V_NEXT_TICK] = next_tick
            cols = self._columns()
            why, i = _serve(i, T, IN, OUT, status, ns, abpos, pend, xo, ttft, itl, flag, *cols[:10], self.f_runs.a,
                            *cols[10:21], self.c_runs.a, *cols[21:], st)
            self._unpack()
            next_tick = float(self._sv[_V_NEXT_TICK])
            if why == _DONE:
                break
            t = float(T[i])
            if why == _TICK:
                while t >= next_tick:
                    self.tick(next_tick)
                    next_tick += tick_s
            elif why in (_KV_FLOOR, _KV_BURST):
                r = int(xo[0])
                if why == _KV_FLOOR:
                    runs, cap, inv_p, gpus = (self.f_runs.running_at(r, float(xo[1])), self.feng.kv_capacity_tokens,
                                              self._p[_P_INV_P], self._p[_P_GPUS])
                else:
                    runs, cap, inv_p, gpus = (self.c_runs.running_at(r, float(xo[1])), self.beng.kv_capacity_tokens,
                                              self._p[_P_B_INV_P], self._p[_P_B_GPUS])
                start, pe, fin, first = self._kv_fit(runs, cap, t, float(xo[1]), float(xo[2]), float(xo[3]),
                                                     float(xo[4]), float(xo[5]), float(xo[6]), float(inv_p),
                                                     float(gpus))
                pend[:] = (i, start, pe, fin, first, 1.0)
            elif why == _API:
                ttft[i] = math.exp(self.api_mu + self.api_sigma * float(self.rng.standard_normal()))
                itl[i] = 0.0
                self.api_usd_total += IN[i] / (1.0 - self.hit) * self.api_in + OUT[i] * self.api_out
                flag[i] = API
                i += 1
            else:
                self._grow(why)
        self.floor_wait_s += float(st[_S_WAIT])
        self.n_floor += int(st[_S_NFLOOR])
        self.n_shed += int(st[_S_SHED])
        self.n_timed_out += int(st[_S_TIMED_OUT])
        self.n_too_long[413] += int(st[_S_413])
        self.n_too_long[400] += int(st[_S_400])
        self.cold_waits += int(st[_S_COLD_WAITS])
        if ab is not None:
            ab.abandoned += int(st[_S_ABANDONED])
            ab.wasted_gpu_s = float(st[_S_WASTED])
        self.n_ns_burst += int(st[_S_NS_BURST])
        self.n_ns_capped += int(st[_S_NS_CAPPED])
        self.n_ns_refused += int(st[_S_NS_REFUSED])
        self.n_ns_redirected += int(st[_S_NS_REDIRECTED])
        self._record(chunk.arrival_s, ttft, itl, flag)
        return next_tick

    def _record(self, t: np.ndarray, ttft: np.ndarray, itl: np.ndarray, flag: np.ndarray) -> None:
        tl = self.tally
        if len(t) == 0 or tl.focus is not None:  # drills' per-minute tallies: the reference's numpy code
            super()._record(t, ttft, itl, flag)
            return
        out = np.array([tl.ttft_max, 0.0, 0.0, 0.0, 0.0])
        _tally(np.ascontiguousarray(t, dtype=np.float64), self.start_s, ttft, itl, flag, hist_bins(ttft),
               hist_bins(itl), self.ttft_slo, self.itl_slo, tl.arrivals, tl.met, tl.burst_requests, tl.rejected,
               tl.ttft_hist, tl.itl_hist, out)
        tl.ttft_max = float(out[0])
        self.n_total += len(t)
        self.n_burst += int(out[1])
        self.n_api += int(out[2])
        self.n_rejected += int(out[3])
        if self.ov.rollout is not None:
            self.ov.rollout.bad_requests += int(out[4])


def hist_bins(x: np.ndarray) -> np.ndarray:
    """engine.hist_index's bins for a float64 array, from the edge tables (hist_tables) where they hold."""
    tables = hist_tables()
    if tables is None:
        return _eng.hist_index(x)
    edges, lut, key_min = tables
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = np.empty(len(x), dtype=np.int64)
    _hist_bins(x, x.view(np.int64), edges, lut, key_min, out)
    return out
