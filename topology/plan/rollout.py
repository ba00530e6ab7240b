"""A model rollout's spec: identities, the eval gate, shadow and canary sizing and cost, the warm N−1 window.

Pure: the evaluation records arrive parsed in the inputs (the loader reads `rollout.eval_records_path`), and
the planning date comes from the caller — this module never reads a file or the clock.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from ..engines import EngineVersionError, engine_release
from ..inputs import CostInputs, EndpointInputs
from ..rollout import OUTPUT_SETTINGS, EvalRecord, RolloutInputs, engine_settings_sha256, identity_sha256
from ..spec import (
    CanarySpec, Derivation, EngineSpec, EvalEvidenceSpec, ModelVersionSpec, OutcomeMetricSpec, PreviousWarmSpec,
    QualitySamplingSpec, RolloutSpec, ShadowSpec,
)
from .errors import PlanningError
from .placement import Placement
from .weights import weights_prefix

HOURS_PER_DAY = 24


@dataclass(frozen=True)
class RolloutPlan:
    spec: RolloutSpec
    served_engine: EngineSpec  # what the stable track (and the burst tier) runs
    canary: CanarySpec | None
    shadow: ShadowSpec | None
    derivations: tuple[Derivation, ...]
    warnings: tuple[str, ...]


def model_version(version: str, engine: EngineSpec) -> ModelVersionSpec:
    settings = {k: "" if getattr(engine, k) is None else str(getattr(engine, k)) for k in OUTPUT_SETTINGS}
    s_sha = engine_settings_sha256(settings)
    return ModelVersionSpec(
        version=version, weights_revision=engine.model_revision, engine_image=engine.image, engine_settings=settings,
        engine_settings_sha256=s_sha, identity_sha256=identity_sha256(engine.model_revision, engine.image, s_sha),
    )


def candidate_engine(ep: EndpointInputs, r: RolloutInputs, incumbent: EngineSpec) -> EngineSpec:
    c = r.candidate
    image = c.engine_image or incumbent.image
    try:  # an engine bump brings its own flags and metric names (topology/engines.py)
        vllm_version, release = engine_release(image)
    except EngineVersionError as e:
        raise PlanningError(f"endpoint {ep.name!r}: rollout.candidate.engine_image: {e}") from None
    return incumbent.model_copy(update={
        "image": image, "vllm_version": vllm_version, "request_log_flags": release.request_log_flags,
        "metrics": release.metrics,
        "model_revision": c.weights_revision,
        "weights_uri_suffix": weights_prefix(ep.model.name, c.weights_revision),
        "kv_cache_dtype": c.kv_cache_dtype or incumbent.kv_cache_dtype,
        "quantization": c.quantization if c.quantization is not None else incumbent.quantization,
    })


def _describe(v: ModelVersionSpec) -> str:
    return (f"weights {v.weights_revision}, image {v.engine_image}, settings {v.engine_settings_sha256} "
            f"({', '.join(f'{k}={x}' for k, x in v.engine_settings.items())})")


def check_identities(ep_name: str, r: RolloutInputs, inc: ModelVersionSpec, cand: ModelVersionSpec) -> None:
    """A change of weights, engine image or output-changing settings is a new version with a new name."""
    where = f"endpoint {ep_name!r}: rollout"
    if r.incumbent_identity_sha256 is not None and r.incumbent_identity_sha256 != inc.identity_sha256:
        raise PlanningError(
            f"{where}.incumbent_identity_sha256={r.incumbent_identity_sha256!r} but version {r.incumbent_version!r} is now "
            f"served as identity {inc.identity_sha256} ({_describe(inc)}): the weights, engine image or engine settings "
            "changed under the same version name. A change that can alter outputs is a new version: declare it as "
            "rollout.candidate with a new name and roll it out."
        )
    if cand.identity_sha256 == inc.identity_sha256:
        raise PlanningError(
            f"{where}.candidate ({cand.version!r}) has the incumbent's identity {inc.identity_sha256}: nothing to roll out"
        )
    if r.candidate.version == r.incumbent_version:
        changed = [k for k in ("weights_revision", "engine_image", "engine_settings_sha256")
                   if getattr(cand, k) != getattr(inc, k)]
        raise PlanningError(
            f"{where}.candidate.version={r.candidate.version!r} is the incumbent's version name, but the candidate "
            f"changes {', '.join(changed)}: an engine-only (or weights) change is a new model version; give "
            "rollout.candidate.version a new name"
        )


def eval_gate(ep_name: str, r: RolloutInputs, cand: ModelVersionSpec) -> EvalEvidenceSpec:
    """The candidate's passing offline evaluation for exactly its identity, or a PlanningError naming what is missing."""
    where = f"endpoint {ep_name!r}: rollout.stage={r.stage!r}"
    if r.eval_records is None:
        raise PlanningError(
            f"{where} needs the evaluation records of rollout.eval_records_path={r.eval_records_path!r}, which were not "
            "read: the caller reads the file and passes its records in (topology.loading.load_inputs does)"
        )
    named = [x for x in r.eval_records if x.version == cand.version]
    if not named:
        versions = sorted({x.version for x in r.eval_records})
        raise PlanningError(
            f"{where}: no offline evaluation record for candidate version {cand.version!r} in {r.eval_records_path} "
            f"(it has records for {versions}); the candidate cannot enter shadow or canary before it is evaluated"
        )

    def mismatches(x: EvalRecord) -> list[str]:
        return [f"{k}: record {getattr(x, k)!r} ≠ candidate {getattr(cand, k)!r}"
                for k in ("weights_revision", "engine_image", "engine_settings_sha256") if getattr(x, k) != getattr(cand, k)]

    exact = [x for x in named if not mismatches(x)]
    if not exact:
        raise PlanningError(
            f"{where}: the evaluation records for {cand.version!r} in {r.eval_records_path} are for another identity "
            f"({'; '.join(mismatches(named[-1]))}); evaluate exactly the candidate ({_describe(cand)})"
        )
    # each metric on each dataset is judged by its latest evaluation of this exact identity (a later line of the
    # same date wins), and every one must pass: a failing metric is not hidden by a passing one of another kind
    latest: dict[tuple[str, str], EvalRecord] = {}
    for x in exact:
        k = (x.metric, x.dataset)
        if k not in latest or x.evaluated_on >= latest[k].evaluated_on:
            latest[k] = x
    failed = [x for x in latest.values() if not x.passed]
    if failed:
        raise PlanningError(
            f"{where}: candidate {cand.version!r} failed its offline evaluation: "
            + "; ".join(f"{x.metric} = {x.value:g} on {x.dataset} ({x.evaluated_on}), needs "
                        f"{'≥' if x.higher_is_better else '≤'} {x.threshold:g}" for x in failed)
        )
    rec = max(latest.values(), key=lambda x: x.evaluated_on)  # the evidence shown: the latest of the passing ones
    return EvalEvidenceSpec(
        source=r.eval_records_path, metric=rec.metric, value=rec.value, threshold=rec.threshold,
        higher_is_better=rec.higher_is_better, dataset=rec.dataset, evaluated_on=rec.evaluated_on,
    )


def share_replicas(ep: EndpointInputs, pl: Placement, percent: float) -> int:
    """Replicas for a share of the peak hour's requests at the planning rate (at least one)."""
    peak = max(ep.traffic.hourly_mean_requests_per_s or [0.0]) * ep.traffic.within_hour_peak_factor
    return max(1, math.ceil(peak * percent / 100.0 / pl.planning_rps - 1e-9))


def extra_pods_usd_per_day(pl: Placement, usd_per_gpu_h: float, floor_by_hour, reserved_nodes: int, pods: int) -> float:
    """What `pods` more pods on the floor's node pools cost a day: the rollout's pods share the floor's nodes, so
    they cost the on-demand nodes they add in whole nodes, hour by hour over the planned floor — nothing in an hour
    whose nodes have room, a whole node where the floor fills its nodes (the reserved nodes are paid anyway)."""
    if pods <= 0:
        return 0.0
    rpn = pl.replicas_per_node
    nodes = [max(math.ceil(f / rpn), reserved_nodes) for f in floor_by_hour]
    more = [max(math.ceil((f + pods) / rpn), reserved_nodes) for f in floor_by_hour]
    node_hours = sum(m - n for m, n in zip(more, nodes))
    return node_hours * pl.gpus_per_node * usd_per_gpu_h / (len(nodes) / HOURS_PER_DAY)


def rollout_section(
    inp: CostInputs, ep: EndpointInputs, pl: Placement | None, incumbent_engine: EngineSpec,
    overflow_inflight_per_replica: int, planning_date: dt.date | None, floor_by_hour=None, reserved_nodes: int = 0,
) -> RolloutPlan:
    """floor_by_hour, reserved_nodes: the floor the plan runs by hour of the week and its reserved nodes, which the
    rollout's pods share (extra_pods_usd_per_day); None: priced as if the floor filled its nodes every hour."""
    r = ep.rollout
    assert r is not None  # the caller plans a rollout only when the inputs have one (internal invariant)
    if pl is None:
        raise PlanningError(
            f"endpoint {ep.name!r}: rollout needs dedicated replicas (the candidate and the warm previous version run as "
            "pods on the endpoint's node pools); this endpoint's plan has none"
        )
    inc = model_version(r.incumbent_version, incumbent_engine)
    cand_engine = candidate_engine(ep, r, incumbent_engine)
    cand = model_version(r.candidate.version, cand_engine)
    check_identities(ep.name, r, inc, cand)
    evidence = eval_gate(ep.name, r, cand) if r.stage != "rolled_back" else None

    usd_per_gpu_h = inp.prices.dedicated_on_demand_usd_per_gpu_hour[pl.gpu_kind]
    if floor_by_hour is None:  # every hour's nodes full: each pod's share of a new node, rounded up to whole nodes
        floor_by_hour = [pl.replicas_per_node] * HOURS_PER_DAY

    def usd_day(pods: int) -> float:
        return extra_pods_usd_per_day(pl, usd_per_gpu_h, floor_by_hour, reserved_nodes, pods)

    def priced(pods: int) -> str:
        return (f"the on-demand nodes {pods} more pod(s) add to the planned floor, hour by hour over the week "
                f"({pl.replicas_per_node} replica(s)/node, {reserved_nodes} reserved node(s) paid anyway) × "
                f"{pl.gpus_per_node} GPUs × ${usd_per_gpu_h:g}/GPU-h, per day")
    derivs: list[Derivation] = []
    warnings: list[str] = []
    canary = shadow = None
    cand_replicas = 0
    if r.stage in ("shadow", "canary"):
        pct = r.shadow_percent if r.stage == "shadow" else r.canary_percent
        cand_replicas = share_replicas(ep, pl, pct)
        derivs.append(Derivation(
            figure=f"{r.stage}_candidate_replicas", value=cand_replicas, unit="replicas",
            formula=f"⌈peak req/s × {pct:g}% / {pl.planning_rps:.3g} req/s per replica⌉ (≥ 1)",
            inputs=("traffic", f"rollout.{r.stage}_percent", "engine"),
        ))
        if r.stage == "shadow":
            shadow = ShadowSpec(percent=r.shadow_percent, version=cand.version, replicas=cand_replicas,
                                max_inflight=cand_replicas * overflow_inflight_per_replica)
        else:
            canary = CanarySpec(
                percent=r.canary_percent, revision=cand.weights_revision, hash_key=r.canary_hash_key,
                weights_uri_suffix=cand_engine.weights_uri_suffix, replicas=cand_replicas, version=cand.version,
                full_at_inflight_per_replica=overflow_inflight_per_replica, overflow_to_incumbent=True,
            )
    cand_usd_day = round(usd_day(cand_replicas), 2)
    if cand_replicas:
        derivs.append(Derivation(
            figure="candidate_usd_per_day", value=cand_usd_day, unit="USD/day", formula=priced(cand_replicas),
            inputs=("prices.dedicated_on_demand_usd_per_gpu_hour",),
        ))

    previous = None
    if r.promoted_on is not None:  # promoted, or rolled back after a promotion
        # no planning date from the caller: N−1 stays declared (the safe side for a rollback) until a date says otherwise
        until = r.promoted_on + dt.timedelta(days=r.previous_warm_days)
        per_day = round(usd_day(r.previous_warm_replicas), 2)
        previous = PreviousWarmSpec(
            version=inc, engine=incumbent_engine, replicas=r.previous_warm_replicas, warm_until=until,
            active=planning_date is None or planning_date < until, usd_per_day=per_day, window_usd=round(per_day * r.previous_warm_days, 2),
        )
        derivs.append(Derivation(
            figure="previous_warm_usd_window", value=previous.window_usd, unit="USD",
            formula=f"{priced(r.previous_warm_replicas)} × {r.previous_warm_days} days (until {until})",
            inputs=("rollout.previous_warm_replicas", "rollout.previous_warm_days", "prices.dedicated_on_demand_usd_per_gpu_hour"),
        ))
        most = max(floor_by_hour) if floor_by_hour is not None else 0
        if previous.active and r.previous_warm_replicas < most:
            # a rollback points the floor's Service at the incumbent's pods at once (floor_backend_version): the warm
            # ones, then each stable pod as the Deployment rolls back one at a time (maxSurge 1, maxUnavailable 0)
            warnings.append(
                f"a rollback before {until} serves the floor from the {r.previous_warm_replicas} warm previous "
                f"replica(s) at once, then from each stable replica as it rolls back, one pod start at a time; the floor "
                f"runs up to {most} replicas, so until then the rest of its traffic overflows to burst where the plan "
                f"has one, else waits and gets 429. rollout.previous_warm_replicas {most} would roll back without that "
                f"dip (${usd_day(most):,.2f}/day against ${usd_day(r.previous_warm_replicas):,.2f})")

    served = cand if r.stage == "promoted" else inc
    served_engine = cand_engine if r.stage == "promoted" else incumbent_engine
    # rolled back after a promotion: the warm previous pods run the incumbent, which serves again; the floor's
    # Service selects the incumbent's pods by version, so they take traffic at once while the stable Deployment
    # rolls back pod by pod
    floor_backend_version = inc.version if (r.stage == "rolled_back" and previous is not None and previous.active) else None

    sampling = None
    if r.quality_sampling is not None:
        q = r.quality_sampling
        versions = [inc.version, cand.version] if r.stage != "rolled_back" else [inc.version]
        sampling = QualitySamplingSpec(sample_fraction=q.sample_fraction, sink_uri=q.sink_uri,
                                       prefixes={v: f"{q.sink_uri}{ep.name}/{v}/" for v in versions})
    spec = RolloutSpec(
        stage=r.stage, incumbent=inc, candidate=cand, candidate_engine=cand_engine, served_version=served.version,
        eval=evidence, shadow_percent=r.shadow_percent, canary_percent=r.canary_percent, canary_hash_key=r.canary_hash_key,
        outcome_metric=OutcomeMetricSpec(**r.outcome_metric.model_dump()), candidate_replicas=cand_replicas,
        candidate_usd_per_day=cand_usd_day, promoted_on=r.promoted_on, previous_warm_replicas=r.previous_warm_replicas,
        previous_warm_days=r.previous_warm_days,
        previous_warm_usd_per_day=round(usd_day(r.previous_warm_replicas), 2), previous=previous,
        floor_backend_version=floor_backend_version, quality_sampling=sampling,
    )
    return RolloutPlan(spec, served_engine, canary, shadow, tuple(derivs), tuple(warnings))
