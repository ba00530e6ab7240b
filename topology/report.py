"""Readable reports of a TopologySpec: terminal, Markdown (PR comments) and diffs between two plans."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .loading import load_spec_or_inputs
from .plan import plan
from .spec import EndpointSpec, TopologySpec
from .timebase import HOURS_PER_WEEK

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
TIER_TITLES = {
    "managed_api": "managed API",
    "serverless_only": "serverless only",
    "dedicated_only": "dedicated only",
    "floor_plus_burst": "dedicated floor + serverless burst",
}


def usd(x: float | None) -> str:
    return "—" if x is None else f"${x:,.0f}"


def per_request(x: float) -> str:
    """Dollars per request to three significant figures (small models cost fractions of a cent)."""
    return f"${x:.3g}"


def _cell(n: int) -> str:
    if n < 10:
        return str(n) if n else "·"
    if n < 36:
        return chr(ord("a") + n - 10)
    return "+"


def floor_grid(replicas_by_hour: Sequence[int], indent: str = "  ") -> list[str]:
    """7 rows × 24 hours; · = 0, digits, a = 10 … z = 35, + above."""
    head = indent + "     " + "".join(f"{h:<3d}" if h % 3 == 0 else "" for h in range(24))
    rows = [head.rstrip()]
    for d in range(7):
        cells = " ".join(_cell(replicas_by_hour[d * 24 + h]) for h in range(24))
        rows.append(f"{indent}{DAYS[d]}  {cells}")
    return rows


def _minute_label(m: int) -> str:
    d, r = divmod(m, 1440)
    return f"{DAYS[d]} {r // 60:02d}:{r % 60:02d}"


def _endpoint_lines(e: EndpointSpec) -> list[str]:
    L: list[str] = []
    c, ec = e.capacity, e.economics
    place = f"{c.gpu_kind} {c.mig_profile}" if c.mig_profile else (
        f"{c.gpu_kind}×{c.gpus_per_replica}" if c.gpus_per_replica > 1 else c.gpu_kind)
    L.append(f"== {e.name}: {TIER_TITLES[e.tier]} — {usd(e.monthly_usd)}/month")
    L.append(f"  model {e.model_name} @ {e.model_revision[:12]}; replica = {place}")
    L.append("  alternatives (monthly, at the SLO):")
    for a in sorted(e.alternatives, key=lambda a: (not a.feasible, a.monthly_usd or 0)):
        mark = "✓" if a.option == e.tier else (" " if a.feasible else "✗")
        L.append(f"    {mark} {a.option:<17} {usd(a.monthly_usd):>10}  {a.reason}")
    L.append(f"  why the runner-up lost: {e.why_runner_up_lost}")
    api = "" if ec.api_usd_per_request is None else (
        f" vs API {per_request(ec.api_usd_per_request)}; break-even duty cycle {ec.break_even_duty_cycle_on_demand:.0%} "
        f"on-demand, {ec.break_even_duty_cycle_reserved:.0%} reserved")
    # the doctrine's GPU-time method on a whole GPU of the replica's kind (economics.py), also for a MIG replica
    L.append(f"  economics (whole GPU): {ec.gpu_s_per_request:.3g} GPU-s/request → {per_request(ec.dedicated_usd_per_request_at_saturation)} "
             f"on-demand at saturation ({per_request(ec.reserved_usd_per_request_at_saturation)} reserved){api}")
    be = ec.serverless_break_even_busy_hours_per_day
    be_text = f"{be:.1f} busy h/day" if be < 24 else "never (serverless is cheaper per GPU-hour)"
    L.append(f"  serverless premium {ec.serverless_premium:.2f}× on-demand → dedicated beats serverless above {be_text}")
    L.append(f"  traffic: mean {ec.mean_requests_per_s:.2f} req/s, peak {ec.peak_requests_per_s:.2f} req/s, "
             f"{ec.weekly_requests:,.0f} requests/week")
    L.append(f"  capacity: {c.planning_requests_per_s:.2f} req/s per replica planned = saturated "
             f"{c.saturated_requests_per_s:.2f} × {c.planning_utilisation:.2f} (TTFT-SLO limit {c.slo_utilisation:.2f}, "
             f"headroom {c.headroom_fraction:.0%}); {c.usable_concurrency} sequences per replica")
    if e.layers:
        tiers: dict[str, int] = {}
        for layer in e.layers:
            tiers[layer.tier] = tiers.get(layer.tier, 0) + 1
        L.append("  layers (load-duration curve): " + ", ".join(f"{n} {t.replace('_', ' ')}" for t, n in tiers.items()))
        L += ["    " + row for row in layer_rows(e)]
    f = e.floor
    if any(f.replicas_by_hour):
        L.append(f"  floor — replicas ready each hour ({f.timezone}); {f.reserved_replicas} reserved, "
                 f"windows start {f.lead_time_s / 60:.0f} min ahead of each rise:")
        L += floor_grid(f.replicas_by_hour, "    ")
        for w in f.windows[:6]:
            rise = f" (demand rises {_minute_label(w.demand_rise_minute_of_week)})" if w.demand_rise_minute_of_week is not None else ""
            L.append(f"    ≥{w.replicas} from {_minute_label(w.start_minute_of_week)} to {_minute_label(w.end_minute_of_week)}{rise}")
        if len(f.windows) > 6:
            L.append(f"    … {len(f.windows) - 6} more windows")
    else:
        L.append("  floor: none (no dedicated replicas)")
    if e.autoscaling:
        a = e.autoscaling
        L.append(f"  autoscaling: {a.metric} > {a.target_waiting_per_replica:g} per replica; replicas {a.min_replicas}–"
                 f"{a.max_replicas}; up ≤{a.scale_up_pods_per_period} pods/{a.scale_up_period_s} s after "
                 f"{a.scale_up_stabilization_s} s; down after {a.scale_down_stabilization_s} s")
        L.append(f"  steepest ramp {a.steepest_ramp_requests_per_s_per_min:.3f} req/s per min × pod cold start "
                 f"→ needs {a.required_headroom_fraction:.0%} headroom")
    h = e.herd
    L.append(f"  thundering herd: {h.weights_gb:g} GB × replicas over {h.shared_path_gb_per_s:g} GB/s shared "
             f"({h.per_node_gb_per_s:g} GB/s per node) → step ≤{h.step_replicas} replicas ({h.step_load_s:.0f} s load), "
             f"start jitter ≤{h.start_jitter_s} s")
    if e.burst:
        b = e.burst
        top = max((w.min_containers for w in b.min_containers_schedule), default=0)
        warm = f"min {b.min_containers}" + (
            f", warm {'1' if top == 1 else f'up to {top}'} in {len(b.min_containers_schedule)} windows"
            if b.min_containers_schedule else "")
        L.append(f"  burst: Modal {b.gpu} in {b.region}, {warm}, max {b.max_containers}, buffer {b.buffer_containers}, "
                 f"scaledown {b.scaledown_window_s} s, {b.max_inputs} inputs/container (target {b.target_inputs}), "
                 f"snapshots {'on' if b.enable_gpu_snapshot else 'off'}; ${b.usd_per_container_hour:.2f}/h a container "
                 f"running ({b.cpu_cores:g} cores and {b.memory_mib / 1024:.1f} GiB reserved beside its GPUs)")
        L.append(_spike_line(e))
    g = e.gateway
    L.append(f"  gateway: overflow above {g.overflow_inflight_per_replica} in flight per replica; first byte ≤{g.first_byte_timeout_s} s, "
             f"chunk gap ≤{g.inter_chunk_timeout_s} s; body ≤{g.max_request_body_bytes:,} B; max_tokens {g.max_tokens}; "
             f"tenancy {g.cache_isolation}")
    en = e.engine
    L.append(f"  engine: --max-model-len {en.max_model_len} (product limit) --max-num-seqs {en.max_num_seqs} "
             f"-tp {en.tensor_parallel_size} prefix caching {'on' if en.enable_prefix_caching else 'off'}"
             + (f", LoRA max {en.lora.max_loras} rank {en.lora.max_lora_rank}" if en.lora else ""))
    L.append(f"  MIG: {e.mig_decision}")
    L += _rollout_lines(e)
    for w in e.warnings:
        L.append(f"  ! {w}")
    return L


def hour_ranges(hours: tuple[int, ...]) -> str:
    """Hours of the week as day ranges: (20, 21, 44) → 'Mon 20:00–22:00, Tue 20:00–21:00'."""
    out: list[str] = []
    hs = sorted(hours)
    i = 0
    while i < len(hs):
        j = i
        while j + 1 < len(hs) and hs[j + 1] == hs[j] + 1 and hs[j + 1] % 24 != 0:
            j += 1
        out.append(f"{DAYS[hs[i] // 24 % 7]} {hs[i] % 24:02d}:00–{(hs[j] % 24) + 1:02d}:00")
        i = j + 1
    return ", ".join(out)


def _spike_line(e: EndpointSpec) -> str:
    """The spike the burst absorbs: its headroom, the hours it is kept warm for it and their price, and what a
    spike in any other hour meets."""
    b = e.burst
    assert b is not None
    head = f"  spike: burst headroom {b.max_containers} containers (the spike needs {b.spike_containers})"
    cold = f"{e.serverless_cold_start_s:g} s"
    if not b.spike_warm_hours_of_week:
        return (head + f"; kept warm for it in no hour (traffic.spike_warm_hours_fraction 0): the requests a spike "
                f"sends to burst wait out its first restores ({cold})")
    return (head + f"; kept warm for it in {len(b.spike_warm_hours_of_week)} hours "
            f"({hour_ranges(b.spike_warm_hours_of_week)}), +${b.spike_warm_usd_per_month:,.0f}/month; in any other "
            f"hour the requests a spike sends to burst wait out its first restores ({cold})")


def _rollout_lines(e: EndpointSpec) -> list[str]:
    """A model rollout: both identities, the eval gate, each stage with its price, N−1 warm and quality sampling."""
    r = e.rollout
    if r is None:
        return []
    inc, cand = r.incumbent, r.candidate
    changed = [f"{k} {inc.engine_settings[k] or '—'}→{v or '—'}" for k, v in cand.engine_settings.items() if inc.engine_settings[k] != v]
    if cand.weights_revision != inc.weights_revision:
        changed.insert(0, f"weights {inc.weights_revision[:12]}→{cand.weights_revision[:12]}")
    if cand.engine_image != inc.engine_image:
        changed.insert(0, f"image {inc.engine_image}→{cand.engine_image}")
    L = [f"  rollout — stage {r.stage.replace('_', ' ')}; serving {r.served_version}",
         f"    incumbent {inc.version} identity {inc.identity_sha256} (weights {inc.weights_revision[:12]}, {inc.engine_image}, "
         f"settings {inc.engine_settings_sha256})",
         f"    candidate {cand.version} identity {cand.identity_sha256} (settings {cand.engine_settings_sha256}): "
         + ", ".join(changed)]
    if r.eval is not None:
        ev = r.eval
        L.append(f"    eval gate: passed — {ev.metric} {ev.value:g} {'≥' if ev.higher_is_better else '≤'} {ev.threshold:g} on "
                 f"{ev.dataset} ({ev.evaluated_on}, {ev.source})")
    now = {"shadow": "now", "canary": "next" if r.stage == "shadow" else "now"}
    if r.stage in ("shadow",):
        L.append(f"    shadow ({now['shadow']}): {r.shadow_percent:g}% of requests mirrored to {r.candidate_replicas} candidate "
                 f"replica(s), {usd(r.candidate_usd_per_day)}/day; answers discarded, the user never waits for them")
    if r.stage in ("shadow", "canary"):
        L.append("    shadow validates latency, memory and output distributions; it can never license promotion "
                 "(no user acted on a shadow answer)")
        n = f"{r.candidate_replicas} candidate replica(s), {usd(r.candidate_usd_per_day)}/day" if r.stage == "canary" else "sized when it starts"
        L.append(f"    canary ({now['canary']}): {r.canary_percent:g}% of users by {r.canary_hash_key} hash, {n}; judged on "
                 f"{r.outcome_metric.name} ({'higher' if r.outcome_metric.higher_is_better else 'lower'} is better) over "
                 f"{r.outcome_metric.comparison_window_hours} h against the incumbent; a full candidate overflows to the incumbent")
    if r.stage in ("shadow", "canary"):
        L.append(f"    N−1 warm after promotion: {inc.version} × {r.previous_warm_replicas} for {r.previous_warm_days} days — "
                 f"{usd(r.previous_warm_usd_per_day)}/day, {usd(r.previous_warm_usd_per_day * r.previous_warm_days)} for the window")
    if r.previous is not None:
        p = r.previous
        state = "warm now" if p.active else "window over, removed"
        L.append(f"    N−1 warm: {p.version.version} × {p.replicas} until {p.warm_until} ({state}) — {usd(p.usd_per_day)}/day, "
                 f"{usd(p.window_usd)} for the window")
    if r.floor_backend_version:
        L.append(f"    rolled back: the floor backend selects {r.floor_backend_version}'s pods (the warm ones serve at once)")
    if r.quality_sampling is not None:
        q = r.quality_sampling
        L.append(f"    quality sampling: {q.sample_fraction:.2%} of requests and responses per version → "
                 + ", ".join(f"{v}: {u}" for v, u in q.prefixes.items()))
    return L


def _fixed_shares(e: EndpointSpec) -> dict[str, float]:
    """The winner's fixed-cost shares (platform, serverless), monthly — the part of its cost no layer carries."""
    win = next((a for a in e.alternatives if a.option == e.tier), None)
    return {k: v for k, v in (win.breakdown_usd.items() if win else ()) if k.endswith("_fixed") and v}


def _spike_warm_label(e: EndpointSpec) -> str:
    assert e.burst is not None
    return f"burst warm for the spike ({len(e.burst.spike_warm_hours_of_week)} h/week)"


def _layer_split(layer) -> str:
    """For a node that runs part of the hours it is needed: what it pays running, and the burst that carries it
    in the others (a scheduled node needed 89% of hours may run 3% of them, the rest of its row burst)."""
    if layer.tier == "serverless_burst" or layer.serverless_usd_per_month <= 0:
        return ""
    running = layer.monthly_usd - layer.serverless_usd_per_month
    return (f"  (runs {layer.runs_fraction:.0%} of hours: {usd(running)}; burst the rest of its hours: "
            f"{usd(layer.serverless_usd_per_month)})")


def layer_rows(e: EndpointSpec) -> list[str]:
    """The layer table: each node of the load-duration curve with what the plan pays for it (the hours it
    runs, its share of the serverless bill), the burst kept warm for the spike, then the fixed shares; the rows
    sum to the endpoint's cost."""
    rows = []
    for layer in e.layers:
        label = f"node {layer.index:>2}  needed {layer.duty_fraction:>4.0%} of hours  {layer.tier.replace('_', ' ')}"
        rows.append(f"{label:<50} {usd(layer.monthly_usd):>10}" + _layer_split(layer))
    spike = e.burst.spike_warm_usd_per_month if e.burst else 0.0
    if spike:  # no node's: the burst kept warm for the spike in its hours
        rows.append(f"{_spike_warm_label(e):<50} {usd(spike):>10}")
    fixed = _fixed_shares(e)
    for k, v in fixed.items():
        rows.append(f"{k.replace('_', ' '):<50} {usd(v):>10}")
    total = sum(layer.monthly_usd for layer in e.layers) + spike + sum(fixed.values())
    rows.append(f"{'total':<50} {usd(total):>10}")
    return rows


def terminal(spec: TopologySpec) -> str:
    t = spec.monthly_usd_by_tier
    L = [
        f"{spec.project} / {spec.environment} — prices as of {spec.prices_as_of.isoformat()} — "
        f"total {usd(spec.monthly_usd_total)}/month",
        "  " + " · ".join(f"{k.replace('_', ' ')} {usd(v)}" for k, v in t.items() if v),
        "",
    ]
    for e in spec.endpoints:
        L += _endpoint_lines(e)
        L.append("")
    if spec.node_pools:
        L.append("node pools:")
        for p in spec.node_pools:
            mig = f", MIG {p.mig_layout.name}" if p.mig_layout else ""
            L.append(f"  {p.name}: {p.instance_type} × {p.min_nodes}–{p.max_nodes} ({p.capacity_type}{mig})")
    L.append("weight caches: " + ", ".join(f"s3://{w.bucket_name} ({w.region})" for w in spec.weight_caches))
    return "\n".join(L)


def markdown(spec: TopologySpec) -> str:
    L = [
        f"### Serving plan `{spec.project}/{spec.environment}` — {usd(spec.monthly_usd_total)}/month",
        f"Prices as of **{spec.prices_as_of.isoformat()}** · spec v{spec.spec_version} · inputs `{spec.inputs_sha256[:12]}`",
        "",
        "| endpoint | decision | monthly | runner-up | why it lost |",
        "|---|---|---:|---|---|",
    ]
    for e in spec.endpoints:
        L.append(f"| `{e.name}` | {TIER_TITLES[e.tier]} | {usd(e.monthly_usd)} | {e.runner_up or '—'} | {e.why_runner_up_lost} |")
    for e in spec.endpoints:
        L += ["", f"<details><summary><b>{e.name}</b>: {TIER_TITLES[e.tier]}</summary>", "", "| option | feasible | monthly | detail |",
              "|---|---|---:|---|"]
        for a in e.alternatives:
            L.append(f"| {a.option} | {'yes' if a.feasible else 'no'} | {usd(a.monthly_usd)} | {a.reason} |")
        L += ["", "| figure | value | arithmetic |", "|---|---:|---|"]
        for d in e.derivations:
            L.append(f"| {d.figure} | {d.value:g} {d.unit} | `{d.formula}` |")
        if e.layers:
            L += ["", "| node | needed (share of hours) | tier | pays monthly | alone: reserved / on the clock / serverless |",
                  "|---:|---:|---|---:|---|"]
            for layer in e.layers:
                c = layer.costs_usd_per_month
                L.append(f"| {layer.index} | {layer.duty_fraction:.0%} | {layer.tier}{_layer_split(layer)} | {usd(layer.monthly_usd)} | "
                         f"{usd(c.get('reserved'))} / {usd(c.get('scheduled_on_demand'))} / {usd(c.get('serverless_burst'))} |")
            if e.burst and e.burst.spike_warm_usd_per_month:
                L.append(f"| | | {_spike_warm_label(e)} | {usd(e.burst.spike_warm_usd_per_month)} | |")
            for k, v in _fixed_shares(e).items():
                L.append(f"| | | {k} | {usd(v)} | |")
        if any(e.floor.replicas_by_hour):
            L += ["", "Floor (replicas ready per hour, " + e.floor.timezone + "):", "```"] + floor_grid(e.floor.replicas_by_hour, "") + ["```"]
        if e.rollout is not None:
            L += ["", "Rollout:", "```"] + [x.strip() for x in _rollout_lines(e)] + ["```"]
        for w in e.warnings:
            L.append(f"> ⚠️ {w}")
        L += ["", "</details>"]
    return "\n".join(L)


# ---------------------------------------------------------------------------------------------
# diff
# ---------------------------------------------------------------------------------------------


def _as_spec(path: str | Path) -> TopologySpec:
    obj = load_spec_or_inputs(path)
    return obj if isinstance(obj, TopologySpec) else plan(obj)


def diff_specs(old: TopologySpec, new: TopologySpec) -> list[str]:
    """What changed between two plans: decisions, floors, burst and monthly cost."""
    L: list[str] = []
    delta = new.monthly_usd_total - old.monthly_usd_total
    L.append(f"monthly total: {usd(old.monthly_usd_total)} → {usd(new.monthly_usd_total)} ({delta:+,.0f} USD)")
    if old.prices_as_of != new.prices_as_of:
        L.append(f"prices as of: {old.prices_as_of} → {new.prices_as_of}")
    olds = {e.name: e for e in old.endpoints}
    news = {e.name: e for e in new.endpoints}
    for name in sorted(olds.keys() - news.keys()):
        L.append(f"- endpoint {name} removed (was {olds[name].tier}, {usd(olds[name].monthly_usd)}/month)")
    for name in sorted(news.keys() - olds.keys()):
        L.append(f"+ endpoint {name} added: {news[name].tier}, {usd(news[name].monthly_usd)}/month")
    for name in sorted(olds.keys() & news.keys()):
        a, b = olds[name], news[name]
        changes: list[str] = []
        if a.tier != b.tier:
            changes.append(f"decision {a.tier} → {b.tier}")
        if round(a.monthly_usd) != round(b.monthly_usd):
            changes.append(f"monthly {usd(a.monthly_usd)} → {usd(b.monthly_usd)} ({b.monthly_usd - a.monthly_usd:+,.0f})")
        fa, fb = a.floor.replicas_by_hour, b.floor.replicas_by_hour
        moved = [h for h in range(HOURS_PER_WEEK) if fa[h] != fb[h]]
        if moved:
            changes.append(
                f"floor changed in {len(moved)} hours (replica-hours/week {sum(fa)} → {sum(fb)}, max {max(fa)} → {max(fb)}, "
                f"reserved {a.floor.reserved_replicas} → {b.floor.reserved_replicas})"
            )
        ba = a.burst.max_containers if a.burst else 0
        bb = b.burst.max_containers if b.burst else 0
        if ba != bb:
            changes.append(f"burst max containers {ba} → {bb}")
        pa = (a.capacity.gpu_kind, a.capacity.mig_profile, a.capacity.gpus_per_replica)
        pb = (b.capacity.gpu_kind, b.capacity.mig_profile, b.capacity.gpus_per_replica)
        if pa != pb:
            changes.append(f"replica placement {pa} → {pb}")
        if a.engine != b.engine:
            fields = [k for k in type(a.engine).model_fields if getattr(a.engine, k) != getattr(b.engine, k)]
            changes.append("engine settings changed: " + ", ".join(fields))
        if changes:
            L.append(f"~ {name}: " + "; ".join(changes))
        else:
            L.append(f"= {name}: unchanged")
    return L


def diff_files(old: str | Path, new: str | Path, markdown: bool = False) -> str:
    return format_diff(diff_specs(_as_spec(old), _as_spec(new)), markdown)


def format_diff(lines: list[str], markdown: bool = False) -> str:
    if markdown:
        return "\n".join(["### Serving plan diff", "", "```diff"] + lines + ["```"])
    return "\n".join(lines)
