"""The simulator's per-request loop compiled with numba: the same model as `EndpointSim.feed`, same results.

`CompiledEndpointSim` keeps every per-replica and per-container column in numpy arrays and serves a chunk of
arrivals in one compiled kernel (`_serve`): routing (least in flight), admission shedding, the gateway's
first-byte timeout, slot and prefill queues, the cheap KV check, abandonment, non-streamed rules, the burst
tier's container pick and the completion heap. The kernel hands control back to the Python engine for what is
rare or stateful — an autoscaler tick, a replica finishing its cold start, a burst container launch, the exact
KV fit (`engine.kv_fit`, called unchanged), a managed-API request (it draws from the shared random stream),
and growing an array — then resumes at the same request. Before it returns for a request it has changed
nothing, so resuming repeats the request's first steps on unchanged state. `EndpointSim` stays the pure-Python
reference; tests/test_compiled.py checks the two agree exactly.

Why numba: it installs from PyPI wheels (numba, and llvmlite with LLVM statically linked, per llvmlite's
installation guide; numba 0.68.1 / llvmlite 0.50.0 installed here by pip as wheels for CPython 3.11) with no
compiler on the user's machine, and the kernel stays Python source next to the reference. Cython or a Rust
extension would need a C compiler or a Rust toolchain on every fresh clone. Compiled functions are
cached on disk (`cache=True`, in `__pycache__` or numba's user-wide cache directory); where neither is
writable they compile in memory on each run instead.
"""

from __future__ import annotations

import math
import os

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
_DONE, _TICK, _READY, _LAUNCH, _KV_FLOOR, _KV_BURST, _API, _GROW_DONE, _GROW_FRUNS, _GROW_CRUNS = range(10)
_NS_RULES = {None: 0, "fits": 0, "floor_only": 1, "require_streaming": 2, "cap_max_tokens": 3}
# stats slots (float64: integer counts stay exact below 2**53)
(_S_WAIT, _S_NFLOOR, _S_SHED, _S_TIMED_OUT, _S_413, _S_400, _S_BINF, _S_COLD_WAITS, _S_BWPEAK, _S_ABANDONED,
 _S_WASTED, _S_NS_BURST, _S_NS_CAPPED, _S_NS_REFUSED, _S_NS_REDIRECTED) = range(15)
_N_STATS = 15

DISABLE_ENV = "SIMULATOR_PURE_PYTHON"  # set to 1: every run uses the pure-Python reference engine


def available() -> bool:
    """Whether the compiled engine can run (numba importable and not switched off)."""
    return numba is not None and os.environ.get(DISABLE_ENV, "") not in ("1", "true", "yes")


def _jit(fn):
    """numba.njit with its on-disk cache; without a writable cache location, compiled in memory each run."""
    try:
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # "cannot cache function …: no locator available"
        return numba.njit(nogil=True)(fn)


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

    def deepen(self) -> None:
        self.a = np.concatenate([self.a, np.zeros_like(self.a)], axis=1)


# --------------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------------


def _before(h, x, y):
    """Heap row x before row y in Python's tuple order on (finish, id, KV, prompt): pops in heapq's order."""
    for z in range(4):
        if h[x, z] != h[y, z]:
            return h[x, z] < h[y, z]
    return False


def _heap_push(h, dn, f, r, k, p):
    """Push (finish, id, KV, prompt); row `cap - 1` is scratch (the caller keeps a row free)."""
    tmp = h.shape[0] - 1
    h[tmp, 0], h[tmp, 1], h[tmp, 2], h[tmp, 3] = f, r, k, p
    pos = dn[0]
    dn[0] = pos + 1
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


def _heap_pop_into(h, dn, fi, fkv, fin_, ci, ckv, cin):
    """Pop the earliest completion and release its replica's (or container's) in-flight, KV and prompt
    counts; returns 1 when it was a burst container's (the caller's burst in-flight count drops)."""
    rid, kvd, pin = int(h[0, 1]), h[0, 2], h[0, 3]
    n = dn[0] - 1
    dn[0] = n
    if n > 0:
        pos = 0
        while True:
            child = 2 * pos + 1
            if child >= n:
                break
            right = child + 1
            if right < n and _before(h, right, child):
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
    if rid >= 0:
        fi[rid] -= 1
        fkv[rid] -= kvd
        fin_[rid] -= pin
        return 0
    j = -1 - rid
    ci[j] -= 1
    ckv[j] -= kvd
    cin[j] -= pin
    return 1


def _pop_done_until(now, h, dn, fi, fkv, fin_, ci, ckv, cin):
    """Every completion at or before `now`; returns how many were burst containers'."""
    burst = 0
    while dn[0] > 0 and h[0, 0] <= now:
        burst += _heap_pop_into(h, dn, fi, fkv, fin_, ci, ckv, cin)
    return burst


def _slot_replace(row, width, v):
    """heapq.heapreplace on a replica's slot heap: the earliest free slot takes `v`."""
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= width:
            break
        right = child + 1
        if right < width and row[right] < row[child]:
            child = right
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


def _serve(i0, next_tick, next_ready, T, IN, OUT, status, ns, abpos, pend, xo, ttft, itl, flag,
           fi, fkv, fin_, fpfree, fbad, fslots, routable, nrout, fruns, frc,
           ci, ckv, cin, cpfree, cready, clast, cbad, cslots, live, nlive, cruns, crc,
           h, dn, p, st):
    """Serve arrivals i0.. until the chunk ends or the Python engine must act; returns (why, request index).
    The order of operations per request is EndpointSim.feed's (see there for the model's reasons)."""
    n = T.shape[0]
    has_status = status.shape[0] > 0
    has_ns = ns.shape[0] > 0
    has_ab = abpos.shape[0] > 0
    has_burst = p[1] > 0.5
    is_api = p[2] > 0.5
    overflow = p[3]
    shed_after = p[4]
    first_byte_s = p[5]
    kvs = p[6]
    c = int(p[7])
    inv_p = p[8]
    gpus = p[9]
    t_min = p[10]
    k_step = p[11]
    interf = p[12]
    per_tok = p[13]
    dyn = p[14] > 0.5
    kcap = p[15]
    ns_rule = int(p[16])
    ns_max_tokens = p[17]
    web_cap_s = p[18]
    ab_propagate = p[19] > 0.5
    b_max_containers = int(p[20])
    b_target_inputs = p[21]
    b_buffer = int(p[22])
    b_max_inputs = int(p[23])
    b_slots = int(p[24])
    b_t_min = p[25]
    b_k = p[26]
    b_a0 = p[27]
    b_a1 = p[28]
    b_per_tok = p[29]
    b_dyn = p[30] > 0.5
    b_inv_p = p[31]
    b_kvcap = p[32]
    b_gpus = p[33]
    one_minus_hit = p[34]
    dcap = h.shape[0] - 1  # the last row is the push's scratch
    inf = math.inf
    i = i0
    while i < n:
        t = T[i]
        if t >= next_tick:
            return _TICK, i
        if t >= next_ready:
            return _READY, i
        while dn[0] > 0 and h[0, 0] <= t:
            st[_S_BINF] -= _heap_pop_into(h, dn, fi, fkv, fin_, ci, ckv, cin)
        if has_status and status[i] != 0:
            if status[i] == 413:
                st[_S_413] += 1
            else:
                st[_S_400] += 1
            ttft[i] = inf
            flag[i] = REJECTED | TOO_LONG
            i += 1
            continue
        if dn[0] >= dcap:
            return _GROW_DONE, i
        o = OUT[i]
        streamed = not (has_ns and ns[i])
        r = -1
        if nrout > 0:
            if nrout == 1:
                r = routable[0]
            else:  # min(routable, key=in flight): the first least-loaded in pool order
                r = routable[0]
                best = fi[r]
                for q in range(1, nrout):
                    rr = routable[q]
                    if fi[rr] < best:
                        best = fi[rr]
                        r = rr
            if fi[r] >= overflow and (streamed or ns_rule != 1):
                r = -1
        if r >= 0:
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
            if fkv[r] + kvfull > kcap:
                if pend[5] > 0.5 and int(pend[0]) == i:
                    start, pe, fin, first = pend[1], pend[2], pend[3], pend[4]
                    pend[5] = 0.0
                elif _kv_all_fit(fruns, frc, r, start, kvp, o, kcap):
                    ps = max(start, fpfree[r])
                    pe = ps + u * inv_p
                    fin = pe + o * gap
                    first = pe + gap
                else:
                    xo[0], xo[1], xo[2], xo[3], xo[4], xo[5], xo[6], xo[7] = r, start, fpfree[r], kvp, u, o, gap, 0.0
                    return _KV_FLOOR, i
                st[_S_WAIT] += start - t
                gap_mean = (fin - first) / (o - 1) if o > 1 else 0.0
            else:
                st[_S_WAIT] += start - t
                ps = fpfree[r]
                if ps < start:
                    ps = start
                pe = ps + u * inv_p
                fin = pe + o * gap
                first = pe + gap
                gap_mean = gap if o > 1 else 0.0
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
            _heap_push(h, dn, fin, r, kvfull, u)
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
            binf = st[_S_BINF] + 1
            want = min(b_max_containers, math.ceil(binf / b_target_inputs) + b_buffer)
            if nlive < want:
                xo[0] = want
                return _LAUNCH, i
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
            start = max(t, cslots[best, 0])
            if start - t > shed_after:
                if capped:  # the reference caps max_tokens before the burst tier sheds
                    st[_S_NS_CAPPED] += 1
                st[_S_SHED] += 1
                ttft[i] = inf
                flag[i] = REJECTED | SHED
                i += 1
                continue
            cold_wait = cready[best] > t and start >= cready[best]
            bsz = min(b_slots, ci[best] + 1)
            if b_dyn:
                gap = b_t_min + b_k * bsz + (b_per_tok * cin[best] * (bsz - 1) / ci[best] if bsz > 1 else 0.0)
            else:
                gap = b_a0 + b_a1 * bsz
            u = IN[i]
            kvp = u / one_minus_hit
            kvfull = kvp + o
            if ckv[best] + kvfull > b_kvcap:
                if pend[5] > 0.5 and int(pend[0]) == i:
                    start, pe, fin, first = pend[1], pend[2], pend[3], pend[4]
                    pend[5] = 0.0
                elif _kv_all_fit(cruns, crc, best, start, kvp, o, b_kvcap):
                    ps = max(start, cpfree[best])
                    pe = ps + u * b_inv_p
                    fin = pe + o * gap
                    first = pe + gap
                else:
                    xo[0], xo[1], xo[2], xo[3], xo[4], xo[5], xo[6], xo[7] = (best, start, cpfree[best], kvp, u, o,
                                                                              gap, 1.0)
                    return _KV_BURST, i
                gap_mean = (fin - first) / (o - 1) if o > 1 else 0.0
            else:
                ps = max(start, cpfree[best])
                pe = ps + u * b_inv_p
                fin = pe + o * gap
                first = pe + gap
                gap_mean = gap if o > 1 else 0.0
            # committed from here on
            if capped:
                st[_S_NS_CAPPED] += 1
            st[_S_BINF] = binf
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
            _heap_push(h, dn, fin, -1 - best, kvfull, u)
            ci[best] += 1
            ckv[best] += kvfull
            cin[best] += u
            _runs_add(cruns, crc, best, fin, pe, gap, kvp, o)
            if fin > clast[best]:
                clast[best] = fin
            waiting = binf - nlive * b_slots
            if waiting > st[_S_BWPEAK]:
                st[_S_BWPEAK] = waiting
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


def _tally(hour, ttft, itl, flag, hi_ttft, hi_itl, ttft_slo, itl_slo, arrivals, met_h, burst_h, rejected_h,
           ttft_hist, itl_hist, out):
    """EndpointSim._record's hourly counts and histograms in one pass (every figure is a count, so the order
    of the additions cannot change it); out = [TTFT max, burst, API, no replica (503), bad revision]."""
    for e in range(hour.shape[0]):
        h = hour[e]
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


def _burst_scan(now, window, minimum, live, nlive, clast, cready, ci, slots, stops):
    """EndpointSim._tick_burst's scan: the idle containers it stops, in pool order until the pool is down to
    the minimum (rows of `stops`: container, stop time), and the requests waiting for a container slot."""
    k = 0
    left = nlive
    waiting = 0
    for q in range(nlive):
        j = live[q]
        if left > minimum:
            idle_from = max(clast[j], cready[j])
            if ci[j] == 0 and now - idle_from >= window:
                stops[k, 0] = j
                stops[k, 1] = idle_from + window
                k += 1
                left -= 1
                continue
        w = ci[j] - slots
        if w > 0:
            waiting += w
    return k, waiting


def _promote_scan(st, ready_at, n, now, out):
    """EndpointSim.promote's scan: starting replicas whose cold start is over turn ready (their ids to `out`,
    in id order, for the gateway's pool); returns (how many, the next cold start to finish or inf)."""
    k = 0
    nxt = math.inf
    for i in range(n):
        if st[i] == 1:
            if ready_at[i] <= now:
                st[i] = 2
                out[k] = i
                k += 1
            elif ready_at[i] < nxt:
                nxt = ready_at[i]
    return k, nxt


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


if numba is not None:
    _promote_scan = _jit(_promote_scan)
    _census = _jit(_census)
    _count_states = _jit(_count_states)
    _burst_scan = _jit(_burst_scan)
    _tally = _jit(_tally)
    _before = _jit(_before)
    _heap_push = _jit(_heap_push)
    _heap_pop_into = _jit(_heap_pop_into)
    _pop_done_until = _jit(_pop_done_until)
    _slot_replace = _jit(_slot_replace)
    _runs_room = _jit(_runs_room)
    _runs_add = _jit(_runs_add)
    _kv_all_fit = _jit(_kv_all_fit)
    _serve = _jit(_serve)


# --------------------------------------------------------------------------------------------------
# the engine
# --------------------------------------------------------------------------------------------------


class CompiledEndpointSim(_eng.EndpointSim):
    """EndpointSim whose per-request loop runs compiled (see the module docstring); ticks, cold starts,
    launches, rollouts and the exact KV fit run the reference engine's Python code on the same state."""

    def _column(self, kind: type) -> Column:
        return Column({float: np.float64, int: np.int64, bool: np.bool_}[kind])

    def _rows(self, width: int) -> Rows:
        return Rows(width)

    def _runs(self) -> Runs:
        return Runs()

    def _init_state(self) -> None:
        self._heap = np.zeros((256, 4))  # (finish, replica id or −1 − container id, KV, prompt) per row
        self._stops = np.zeros((0, 2))
        self._promoted = np.zeros(0, dtype=np.int64)
        self._dn = np.zeros(1, dtype=np.int64)
        super()._init_state()

    @property
    def done(self) -> list[tuple[float, int, float, float]]:
        """The completion heap's entries (finish, replica id or −1 − container id, KV, prompt), unordered."""
        return [(f, int(r), k, p) for f, r, k, p in self._heap[: int(self._dn[0])].tolist()]

    @done.setter
    def done(self, value: list) -> None:
        if value:
            raise ValueError("the compiled engine's completion heap starts empty")
        self._dn[0] = 0

    # the autoscaler's scans of every replica and container, vectorised (same counts and the same order of
    # promotions and stops as the reference's loops)
    def promote(self, now: float) -> None:
        n = self.f_state.n
        if len(self._promoted) < n:
            self._promoted = np.zeros(2 * n, dtype=np.int64)
        k, self.next_ready = _promote_scan(self.f_state.a, self.f_ready_at.a, n, now, self._promoted)
        for q in range(k):
            self.routable.append(int(self._promoted[q]))

    def _floor_census(self) -> tuple[int, int]:
        ready_n, waiting = _census(self.f_state.a, self.f_inflight.a, self.f_state.n, self.feng.slots)
        return int(ready_n), int(waiting)

    def _n_replicas(self, lo: int, hi: int) -> int:
        return int(_count_states(self.f_state.a, self.f_state.n, lo, hi))

    def _tick_burst(self, now: float) -> None:
        b = self.ep.burst
        assert b is not None
        minimum = int(self.b_min[int(now // 60) % _eng.MINUTES_PER_WEEK])
        while len(self.live) < min(minimum, b.max_containers):
            self._launch_container(now)
        if len(self._stops) < len(self.live):
            self._stops = np.zeros((2 * len(self.live), 2))
        stops = self._stops
        k, waiting = _burst_scan(now, float(b.scaledown_window_s), minimum, self.live.a, self.live.n, self.c_last.a,
                                 self.c_ready.a, self.c_inflight.a, self.beng.slots, stops)
        for q in range(k):
            self._stop_container(int(stops[q, 0]), float(stops[q, 1]))
        self.burst_waiting_peak = max(self.burst_waiting_peak, int(waiting))

    def _pop_done(self, now: float) -> None:
        self.burst_inflight -= int(_pop_done_until(
            now, self._heap, self._dn, self.f_inflight.a, self.f_kv.a,
            self.f_in.a, self.c_inflight.a, self.c_kv.a, self.c_in.a))

    def _params(self) -> np.ndarray:
        p = np.zeros(35)
        p[1] = self.has_burst
        p[2] = self.is_api
        p[3] = self.ep.gateway.overflow_inflight_per_replica if self.has_burst else float(1 << 60)
        p[4] = self.admission_wait_s
        p[5] = self.ep.gateway.first_byte_timeout_s
        p[6] = 1.0 / (1.0 - self.hit)
        p[34] = 1.0 - self.hit
        if self.has_floor:
            fe = self.feng
            p[7], p[8], p[9] = fe.slots, 1.0 / fe.prefill_tokens_per_s, fe.gpus
            p[10], p[11], p[12] = fe.t_min, fe.k, fe.interference
            p[13], p[14], p[15] = fe.interference_per_token, fe.planned_uncached_prompt > 0, fe.kv_capacity_tokens
        p[16] = _NS_RULES[self.ns_rule]
        p[17] = self.ns_max_tokens
        p[18] = self.web_cap_s
        ab = self.ov.abandon
        p[19] = bool(ab is not None and ab.propagate)
        if self.has_burst:
            b, be = self.ep.burst, self.beng
            assert b is not None
            p[20], p[21], p[22], p[23] = b.max_containers, b.target_inputs, b.buffer_containers, b.max_inputs
            p[24], p[25], p[26], p[27], p[28] = be.slots, be.t_min, be.k, be.a0, be.a1
            p[29], p[30], p[31] = be.interference_per_token, be.planned_uncached_prompt > 0, 1.0 / be.prefill_tokens_per_s
            p[32], p[33] = be.kv_capacity_tokens, be.gpus
        return p

    def feed(self, chunk, tick_s: float, next_tick: float) -> float:
        """Serve one chunk of arrivals; returns the next tick time (EndpointSim.feed's contract)."""
        if not hasattr(self, "_p"):
            self._p = self._params()
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
        st[_S_BWPEAK] = self.burst_waiting_peak
        st[_S_WASTED] = ab.wasted_gpu_s if ab is not None else 0.0
        pend = np.zeros(6)
        xo = np.zeros(8)
        i = 0
        while True:
            st[_S_BINF] = self.burst_inflight
            why, i = _serve(
                i, next_tick, self.next_ready, T, IN, OUT, status, ns, abpos, pend, xo, ttft, itl, flag,
                self.f_inflight.a, self.f_kv.a, self.f_in.a, self.f_pfree.a, self.f_bad.a, self.f_slots.a,
                self.routable.a, self.routable.n, self.f_runs.a, self.f_runs.count,
                self.c_inflight.a, self.c_kv.a, self.c_in.a, self.c_pfree.a, self.c_ready.a, self.c_last.a,
                self.c_bad.a, self.c_slots.a, self.live.a, self.live.n, self.c_runs.a, self.c_runs.count,
                self._heap, self._dn, self._p, st)
            self.burst_inflight = int(st[_S_BINF])
            if why == _DONE:
                break
            t = float(T[i])
            if why == _TICK:
                while t >= next_tick:
                    self.tick(next_tick)
                    next_tick += tick_s
            elif why == _READY:
                self.promote(t)
            elif why == _LAUNCH:
                while len(self.live) < int(xo[0]):
                    self._launch_container(t)
            elif why in (_KV_FLOOR, _KV_BURST):
                r = int(xo[0])
                if why == _KV_FLOOR:
                    runs, cap, inv_p, gpus = (self.f_runs.running_at(r, float(xo[1])), self.feng.kv_capacity_tokens,
                                              self._p[8], self._p[9])
                else:
                    runs, cap, inv_p, gpus = (self.c_runs.running_at(r, float(xo[1])), self.beng.kv_capacity_tokens,
                                              self._p[31], self._p[33])
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
            elif why == _GROW_DONE:
                self._heap = np.concatenate([self._heap, np.zeros_like(self._heap)])
            elif why == _GROW_FRUNS:
                self.f_runs.deepen()
            elif why == _GROW_CRUNS:
                self.c_runs.deepen()
        self.floor_wait_s += float(st[_S_WAIT])
        self.n_floor += int(st[_S_NFLOOR])
        self.n_shed += int(st[_S_SHED])
        self.n_timed_out += int(st[_S_TIMED_OUT])
        self.n_too_long[413] += int(st[_S_413])
        self.n_too_long[400] += int(st[_S_400])
        self.cold_waits += int(st[_S_COLD_WAITS])
        self.burst_waiting_peak = max(self.burst_waiting_peak, int(st[_S_BWPEAK]))
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
        hour = np.clip(((t - self.start_s) // 3600).astype(np.int64), 0, tl.hours - 1)
        out = np.array([tl.ttft_max, 0.0, 0.0, 0.0, 0.0])
        _tally(hour, ttft, itl, flag, _eng.hist_index(ttft), _eng.hist_index(itl), self.ttft_slo, self.itl_slo,
               tl.arrivals, tl.met, tl.burst_requests, tl.rejected, tl.ttft_hist, tl.itl_hist, out)
        tl.ttft_max = float(out[0])
        self.n_total += len(t)
        self.n_burst += int(out[1])
        self.n_api += int(out[2])
        self.n_rejected += int(out[3])
        if self.ov.rollout is not None:
            self.ov.rollout.bad_requests += int(out[4])
