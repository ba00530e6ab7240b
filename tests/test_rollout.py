"""Model rollout in the planner: version identity, the eval gate, shadow, canary, promotion with N−1 warm, rollback."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path

import pytest

from inputs_factory import inputs_dict, office_profile
from topology import CostInputs, PlanningError, plan
from topology.loading import InputError, inputs_from_document
from topology.rollout import engine_settings_sha256, identity_sha256
from topology.rollout_loading import MAX_EVAL_RECORDS_BYTES

IMAGE = "vllm/vllm-openai:v0.11.0"
# the factory endpoint's output-changing engine settings, written out by hand (tokenizer, TP=2, product limit)
INCUMBENT_SETTINGS = {"tokenizer": "llama3", "tensor_parallel_size": "2", "kv_cache_dtype": "auto", "quantization": "",
                      "max_model_len": "16384"}
CANDIDATE_SETTINGS = {**INCUMBENT_SETTINGS, "kv_cache_dtype": "fp8"}
PRICE = 2.69  # the factory's H100 on-demand $/GPU-h
PEAK = 20 * 1.5  # office_profile(20, …) × within-hour peak factor 1.5, req/s


def record(**over):
    r = {"version": "chat-v2", "weights_revision": "rev1", "engine_image": IMAGE,
         "engine_settings_sha256": engine_settings_sha256(CANDIDATE_SETTINGS), "metric": "win_rate", "value": 0.58,
         "threshold": 0.5, "higher_is_better": True, "dataset": "chat-golden@v3", "evaluated_on": "2026-11-20"}
    r.update(over)
    return r


def rollout(stage="canary", records=(None,), **over):
    r = {"incumbent_version": "chat-v1", "candidate": {"version": "chat-v2", "weights_revision": "rev1", "kv_cache_dtype": "fp8"},
         "stage": stage, "eval_records_path": "evals/chat.yaml",
         "outcome_metric": {"name": "draft_acceptance_rate", "higher_is_better": True, "comparison_window_hours": 168}}
    if records != (None,):
        r["eval_records"] = list(records)
    else:
        r["eval_records"] = [record()]
    r.update(over)
    return r


def planned(ro, planning_date=None, **endpoint):
    d = inputs_dict(managed_api=None, traffic={"hourly_mean_requests_per_s": office_profile(20, 1, 2)}, rollout=ro, **endpoint)
    return plan(CostInputs.model_validate(d), planning_date=planning_date).endpoints[0]


# ── 1. identity ────────────────────────────────────────────────────────────────────────────────


def test_identity_changes_with_each_part_and_not_with_key_order():
    base = identity_sha256("rev1", IMAGE, engine_settings_sha256(INCUMBENT_SETTINGS))
    assert engine_settings_sha256(dict(reversed(list(INCUMBENT_SETTINGS.items())))) == engine_settings_sha256(INCUMBENT_SETTINGS)
    assert identity_sha256("rev2", IMAGE, engine_settings_sha256(INCUMBENT_SETTINGS)) != base
    assert identity_sha256("rev1", "vllm/vllm-openai:v0.11.1", engine_settings_sha256(INCUMBENT_SETTINGS)) != base
    for k, v in (("kv_cache_dtype", "fp8"), ("quantization", "fp8"), ("tensor_parallel_size", "4"), ("tokenizer", "t2")):
        assert engine_settings_sha256({**INCUMBENT_SETTINGS, k: v}) != engine_settings_sha256(INCUMBENT_SETTINGS), k


def test_the_spec_carries_both_identities():
    e = planned(rollout())
    r = e.rollout
    assert r.incumbent.version == "chat-v1" and r.incumbent.engine_settings == INCUMBENT_SETTINGS
    assert r.incumbent.identity_sha256 == identity_sha256("rev1", IMAGE, engine_settings_sha256(INCUMBENT_SETTINGS))
    assert r.candidate.engine_settings == CANDIDATE_SETTINGS and r.candidate.engine_image == IMAGE
    assert r.candidate_engine.kv_cache_dtype == "fp8" and e.engine.kv_cache_dtype == "auto"  # canary: incumbent serves


def test_an_engine_only_change_under_the_same_version_name_is_refused():
    ro = rollout(candidate={"version": "chat-v1", "weights_revision": "rev1", "kv_cache_dtype": "fp8"})
    with pytest.raises(PlanningError, match=r"rollout.candidate.version='chat-v1'.*engine_settings_sha256"):
        planned(ro)


def test_a_candidate_identical_to_the_incumbent_is_refused():
    ro = rollout(candidate={"version": "chat-v2", "weights_revision": "rev1"})
    with pytest.raises(PlanningError, match="has the incumbent's identity"):
        planned(ro)


def test_a_served_engine_that_drifts_from_the_pinned_incumbent_identity_is_refused():
    pinned = identity_sha256("rev1", IMAGE, engine_settings_sha256(INCUMBENT_SETTINGS))
    planned(rollout(incumbent_identity_sha256=pinned))  # matches: plans
    # same version name, a longer product context (an engine setting) → not the pinned version any more
    shape = copy.deepcopy(inputs_dict()["endpoints"][0]["shape"])
    shape["product_max_context_tokens"] = 32768
    with pytest.raises(PlanningError, match=r"rollout.incumbent_identity_sha256=.*max_model_len=32768.*new version"):
        planned(rollout(incumbent_identity_sha256=pinned), shape=shape)


# ── 2. eval gate ───────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("stage", ["shadow", "canary", "promoted"])
def test_no_records_read_means_no_shadow_canary_or_promotion(stage):
    ro = rollout(stage=stage, promoted_on="2026-11-30" if stage == "promoted" else None)
    del ro["eval_records"]
    with pytest.raises(PlanningError, match=r"eval_records_path='evals/chat.yaml'.*not read"):
        planned(ro, planning_date=dt.date(2026, 12, 1))


def test_a_missing_record_names_the_version_and_what_the_file_has():
    with pytest.raises(PlanningError, match=r"no offline evaluation record for candidate version 'chat-v2'.*\['chat-v0'\]"):
        planned(rollout(records=[record(version="chat-v0")]))


def test_a_record_for_another_identity_names_the_field_that_differs():
    other = record(engine_settings_sha256=engine_settings_sha256(INCUMBENT_SETTINGS))  # evaluated without FP8 KV
    with pytest.raises(PlanningError, match=r"another identity \(engine_settings_sha256: record"):
        planned(rollout(records=[other]))
    with pytest.raises(PlanningError, match=r"engine_image: record 'vllm/vllm-openai:v0.10.2'"):
        planned(rollout(records=[record(engine_image="vllm/vllm-openai:v0.10.2")]))


def test_a_failing_record_names_metric_value_threshold_and_dataset():
    with pytest.raises(PlanningError, match=r"failed its offline evaluation: win_rate = 0.47 on chat-golden@v3 \(2026-11-20\), needs ≥ 0.5"):
        planned(rollout(records=[record(value=0.47)]))
    lower = record(metric="edit_distance", value=0.31, threshold=0.25, higher_is_better=False)
    with pytest.raises(PlanningError, match="needs ≤ 0.25"):
        planned(rollout(records=[lower]))


def test_the_latest_evaluation_of_the_exact_identity_decides():
    old_pass, new_fail = record(evaluated_on="2026-11-01"), record(value=0.4, evaluated_on="2026-11-25")
    with pytest.raises(PlanningError, match="failed"):
        planned(rollout(records=[old_pass, new_fail]))
    e = planned(rollout(records=[record(value=0.4, evaluated_on="2026-11-01"), record(evaluated_on="2026-11-25")]))
    ev = e.rollout.eval
    assert (ev.metric, ev.value, ev.threshold, ev.dataset, ev.evaluated_on) == ("win_rate", 0.58, 0.5, "chat-golden@v3",
                                                                               dt.date(2026, 11, 25))


def test_every_metric_of_the_exact_identity_must_pass_not_only_the_latest_record():
    """Records of several metrics (or datasets) for one candidate: each is judged by its own latest evaluation,
    and one failing is a failed gate, whichever record is newest or first in the file (before, the newest record
    alone decided, so a passing win rate dated the same day hid a failing false-positive rate)."""
    fpr_fail = record(metric="false_positive_rate", value=0.30, threshold=0.05, higher_is_better=False,
                      dataset="guard-negatives@v2")
    for records in ([record(), fpr_fail], [fpr_fail, record()],
                    [dict(fpr_fail, evaluated_on="2026-11-19"), record(evaluated_on="2026-11-21")]):
        with pytest.raises(PlanningError, match=r"failed its offline evaluation: false_positive_rate = 0\.3 on "
                                                r"guard-negatives@v2 \(2026-11-(19|20)\), needs ≤ 0\.05"):
            planned(rollout(records=records))
    # a later passing evaluation of that metric clears it; both metrics now pass
    fpr_pass = dict(fpr_fail, value=0.03, evaluated_on="2026-11-22")
    e = planned(rollout(records=[record(), fpr_fail, fpr_pass]))
    assert (e.rollout.eval.metric, e.rollout.eval.evaluated_on) == ("false_positive_rate", dt.date(2026, 11, 22))


def test_rollback_needs_no_evaluation():
    ro = rollout(stage="rolled_back", records=[record(value=0.1)])
    e = planned(ro)
    assert e.rollout.eval is None and e.gateway.canary is None and e.gateway.shadow is None
    assert e.rollout.served_version == "chat-v1" and e.rollout.candidate_replicas == 0


def test_the_loader_reads_the_named_file_and_the_planner_gets_its_records(tmp_path: Path):
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "chat.yaml").write_text(
        "records:\n" + "".join(f"  - {k}: {v!r}\n" if i == 0 else f"    {k}: {v!r}\n" for i, (k, v) in enumerate(record().items()))
    )
    ro = rollout()
    del ro["eval_records"]
    d = inputs_dict(managed_api=None, traffic={"hourly_mean_requests_per_s": office_profile(20, 1, 2)}, rollout=ro)
    inputs = inputs_from_document(d, "t.yaml", tmp_path)
    assert inputs.endpoints[0].rollout.eval_records[0].dataset == "chat-golden@v3"
    assert plan(inputs).endpoints[0].rollout.eval.source == "evals/chat.yaml"


@pytest.mark.parametrize("content, message", [
    (None, "cannot read"),
    (b"records: [\n", "not valid YAML"),
    (b"\xff\xfe", "is not UTF-8 text"),
    (b"records:\n  - version: chat-v2\n", "records.0.metric"),
    (b"x" * (MAX_EVAL_RECORDS_BYTES + 1), "larger than the 1,000,000-byte limit"),
])
def test_a_bad_record_file_is_an_input_error_naming_the_field(tmp_path: Path, content, message):
    if content is not None:
        (tmp_path / "e.yaml").write_bytes(content)
    ro = rollout(eval_records_path="e.yaml")
    del ro["eval_records"]
    d = inputs_dict(rollout=ro)
    with pytest.raises(InputError, match=rf"(?s)endpoints\.0\.rollout\.eval_records_path.*{message}"):
        inputs_from_document(d, "t.yaml", tmp_path)


# ── 3. shadow, 4. canary ───────────────────────────────────────────────────────────────────────


def test_shadow_mirrors_a_bounded_share_to_enough_candidate_replicas_and_is_costed():
    e = planned(rollout(stage="shadow", shadow_percent=10))
    s, per = e.gateway.shadow, e.capacity.planning_requests_per_s
    assert e.gateway.canary is None and s.responses_discarded and s.version == "chat-v2"
    # enough replicas for 10% of the peak, and not one more
    assert s.replicas * per >= PEAK * 0.10 > (s.replicas - 1) * per
    assert s.max_inflight == s.replicas * e.gateway.overflow_inflight_per_replica
    # the candidate's pods share the floor's nodes (4 replicas of 2 GPUs per 8-GPU node, 1 reserved): the floor
    # runs 4, 8 or 12 replicas, each filling its nodes, so its 2 pods need one more node every hour:
    # 24 node-hours × 8 GPUs × $2.69 = $516.48/day (priced as 2 × 2 GPUs × $2.69 × 24 h = $258.24 before, half
    # of what the node they hold costs)
    assert s.replicas == 2 and set(e.floor.replicas_by_hour) == {4, 8, 12} and e.floor.reserved_replicas == 4
    assert e.rollout.candidate_usd_per_day == pytest.approx(24 * 8 * PRICE, abs=0.01)
    assert e.rollout.shadow_licenses_promotion is False


def test_canary_by_user_hash_overflows_to_the_incumbent_and_is_costed():
    e = planned(rollout(stage="canary", canary_percent=20, canary_hash_key="session"))
    c, per = e.gateway.canary, e.capacity.planning_requests_per_s
    assert e.gateway.shadow is None
    assert c.version == "chat-v2" and c.hash_key == "session" and c.overflow_to_incumbent
    assert c.full_at_inflight_per_replica == e.gateway.overflow_inflight_per_replica
    assert c.replicas * per >= PEAK * 0.20 > (c.replicas - 1) * per
    assert e.rollout.outcome_metric.name == "draft_acceptance_rate" and e.rollout.outcome_metric.comparison_window_hours == 168
    # 4 canary pods on full nodes of 4: one more node every hour, $516.48/day
    assert c.replicas == 4 and e.rollout.candidate_usd_per_day == pytest.approx(24 * 8 * PRICE, abs=0.01)
    # N−1's price is known before promotion: 1 replica (default) on nodes the floor fills needs a node of its own
    # every hour: $516.48/day (1 × 2 GPUs × $2.69 × 24 h = $129.12 before)
    assert (e.rollout.previous_warm_replicas, e.rollout.previous_warm_usd_per_day) == (1, pytest.approx(516.48, abs=0.01))


def test_a_new_weights_revision_travels_with_the_weight_caches():
    ro = rollout(candidate={"version": "chat-v2", "weights_revision": "rev2"}, records=[record(
        weights_revision="rev2", engine_settings_sha256=engine_settings_sha256(INCUMBENT_SETTINGS))])
    d = inputs_dict(managed_api=None, traffic={"hourly_mean_requests_per_s": office_profile(20, 1, 2)}, rollout=ro)
    spec = plan(CostInputs.model_validate(d))
    c = spec.endpoints[0].gateway.canary
    assert c.revision == "rev2" and c.weights_uri_suffix == "models/llama-3.3-70b-instruct/rev2/"
    assert all(c.weights_uri_suffix in w.model_prefixes for w in spec.weight_caches)


# ── 5. promotion, N−1 warm, rollback ───────────────────────────────────────────────────────────


def test_promotion_serves_the_candidate_and_keeps_the_incumbent_warm_for_the_window():
    ro = rollout(stage="promoted", promoted_on="2026-11-30", previous_warm_replicas=2, previous_warm_days=7)
    e = planned(ro, planning_date=dt.date(2026, 12, 6))
    p = e.rollout.previous
    assert e.engine.kv_cache_dtype == "fp8" and e.rollout.served_version == "chat-v2"
    assert e.gateway.canary is None and e.gateway.shadow is None
    assert p.version.version == "chat-v1" and p.replicas == 2 and p.warm_until == dt.date(2026, 12, 7) and p.active
    assert p.usd_per_day == pytest.approx(24 * 8 * PRICE, abs=0.01)  # 516.48: a node of its own every hour
    assert p.window_usd == pytest.approx(24 * 8 * PRICE * 7, abs=0.05)  # 3,615.36
    assert planned(ro, planning_date=dt.date(2026, 12, 7)).rollout.previous.active is False  # the window has ended


def test_promotion_without_a_planning_date_keeps_n_minus_1_warm():
    assert planned(rollout(stage="promoted", promoted_on="2020-01-01")).rollout.previous.active


def test_rollback_after_promotion_sends_the_floor_to_the_warm_incumbent_pods():
    ro = rollout(stage="rolled_back", promoted_on="2026-11-30")
    e = planned(ro, planning_date=dt.date(2026, 12, 2))
    assert e.rollout.served_version == "chat-v1" and e.engine.kv_cache_dtype == "auto"
    assert e.rollout.floor_backend_version == "chat-v1" and e.rollout.previous.active
    late = planned(ro, planning_date=dt.date(2026, 12, 20))
    assert late.rollout.floor_backend_version is None and not late.rollout.previous.active


def test_promotion_needs_its_date_and_a_canary_has_none():
    with pytest.raises(Exception, match="needs rollout.promoted_on"):
        planned(rollout(stage="promoted"))
    with pytest.raises(Exception, match="has not been promoted"):
        planned(rollout(stage="canary", promoted_on="2026-11-30"))


def test_a_rollout_needs_dedicated_replicas():
    # a trickle of traffic with an API available: managed or serverless, never a floor to put a candidate on
    d = inputs_dict(traffic={"hourly_mean_requests_per_s": office_profile(2.5, 0.05, 0.2)}, rollout=rollout())
    with pytest.raises(PlanningError, match="rollout needs dedicated replicas"):
        plan(CostInputs.model_validate(d))


# ── 6. quality sampling ────────────────────────────────────────────────────────────────────────


def test_quality_sampling_writes_each_version_under_its_own_prefix():
    q = {"sample_fraction": 0.01, "sink_uri": "s3://acme-evals/prod/"}
    e = planned(rollout(quality_sampling=q))
    assert e.rollout.quality_sampling.prefixes == {"chat-v1": "s3://acme-evals/prod/chat/chat-v1/",
                                                   "chat-v2": "s3://acme-evals/prod/chat/chat-v2/"}
    with pytest.raises(Exception, match="less than or equal to 0.05"):
        planned(rollout(quality_sampling={**q, "sample_fraction": 0.2}))


def test_every_rollout_input_field_is_described():
    from pydantic import BaseModel

    import topology.rollout as m

    models = [o for o in vars(m).values() if isinstance(o, type) and issubclass(o, BaseModel) and o.__module__ == m.__name__]
    assert len(models) >= 6
    for o in models:
        for fname, f in o.model_fields.items():
            assert f.description, f"{o.__name__}.{fname} has no description"


# ── the report ────────────────────────────────────────────────────────────────────────────────


def _report(e):
    from topology.report import _endpoint_lines

    return "\n".join(_endpoint_lines(e))


def test_the_report_shows_each_stage_with_its_price_and_what_shadow_cannot_do():
    shadow = _report(planned(rollout(stage="shadow")))
    assert "rollout — stage shadow; serving chat-v1" in shadow
    assert "kv_cache_dtype auto→fp8" in shadow and "eval gate: passed — win_rate 0.58 ≥ 0.5 on chat-golden@v3" in shadow
    assert "shadow validates latency, memory and output distributions; it can never license promotion" in shadow
    assert "$516/day" in shadow  # N−1 after promotion: 1 pod on the floor's full nodes needs a node every hour
    canary = _report(planned(rollout(stage="canary", canary_percent=20)))
    assert "canary (now): 20% of users by user hash" in canary and "draft_acceptance_rate (higher is better) over 168 h" in canary
    assert "a full candidate overflows to the incumbent" in canary
    promoted = _report(planned(rollout(stage="promoted", promoted_on="2026-11-30", previous_warm_replicas=2),
                               planning_date=dt.date(2026, 12, 1)))
    assert "serving chat-v2" in promoted and "N−1 warm: chat-v1 × 2 until 2026-12-07 (warm now) — $516/day, $3,615 for the window" in promoted
    back = _report(planned(rollout(stage="rolled_back", promoted_on="2026-11-30"), planning_date=dt.date(2026, 12, 1)))
    assert "the floor backend selects chat-v1's pods" in back and "eval gate" not in back


def test_a_spec_with_every_rollout_field_round_trips_through_json(planned_stacks):
    from topology.spec import TopologySpec

    _, spec = planned_stacks["prod"]
    assert spec.endpoint("assist").rollout.stage == "shadow" and spec.endpoint("guard").rollout.stage == "promoted"
    assert TopologySpec.model_validate_json(spec.to_json()) == spec


def test_a_promotion_fills_and_serves_the_new_revision_from_its_own_burst_volume():
    """One Modal Volume per weights revision: a promotion fills the candidate revision's volume while the running
    burst app still serves from the incumbent's, then deploys onto it; a rollback returns to the incumbent's, still
    filled. Under one volume per endpoint the fill met the incumbent's revision marker and refused, failing the
    promotion's `pulumi up`; forcing it would have overwritten the weights under the serving containers."""
    from topology.names import burst_volume_name

    cand = {"version": "chat-v2", "weights_revision": "rev2", "kv_cache_dtype": "fp8"}
    recs = [record(weights_revision="rev2")]
    canary = planned(rollout(stage="canary", candidate=cand, records=recs))
    promoted = planned(rollout(stage="promoted", promoted_on="2026-11-30", candidate=cand, records=recs),
                       planning_date=dt.date(2026, 12, 2))
    back = planned(rollout(stage="rolled_back", promoted_on="2026-11-30", candidate=cand, records=recs),
                   planning_date=dt.date(2026, 12, 2))
    assert canary.burst is not None and promoted.burst is not None and back.burst is not None
    assert promoted.model_revision == "rev2" and canary.model_revision == back.model_revision == "rev1"
    assert canary.burst.volume_name == back.burst.volume_name != promoted.burst.volume_name
    assert promoted.burst.volume_name == burst_volume_name("llm-serving", promoted.burst.environment, "chat", "rev2")
    # as long as the app's name: the inputs' check of the app name (Modal's 64) covers every volume it will need
    assert len(promoted.burst.volume_name) == len(promoted.burst.app_name)


def test_rollout_pods_cost_the_nodes_they_add_and_fit_under_the_pools_cap():
    """The candidate's and the warm previous version's pods run on the floor's pools. Where the floor leaves room on
    its nodes they cost nothing more; where it fills them they cost a whole node; and the on-demand pool's cap
    leaves room for them beside the replicas KEDA may scale to, or a canary stays Pending at the floor's peak."""
    from topology.plan.rollout import extra_pods_usd_per_day

    e = planned(rollout(stage="canary", canary_percent=20, canary_hash_key="session"))
    spec_pools = plan(CostInputs.model_validate(inputs_dict(
        managed_api=None, traffic={"hourly_mean_requests_per_s": office_profile(20, 1, 2)},
        rollout=rollout(stage="canary", canary_percent=20, canary_hash_key="session")))).node_pools
    on_demand = next(p for p in spec_pools if p.capacity_type == "on_demand")
    reserved = next(p for p in spec_pools if p.capacity_type == "reserved")
    rpn = 4
    # KEDA's cap plus the 4 canary pods fit the pools
    assert (reserved.max_nodes + on_demand.max_nodes) * rpn >= e.autoscaling.max_replicas + 4
    assert (reserved.max_nodes + on_demand.max_nodes - 1) * rpn < e.autoscaling.max_replicas + 4

    class Pl:  # a placement of 4 replicas per 8-GPU node
        replicas_per_node, gpus_per_node = 4, 8

    # hand-worked: a day of 6 floors, 1 reserved node, 1 more pod, $2 per GPU-hour
    # floor 0 → 1 pod fits the reserved node: 0; 3 → 4 fits: 0; 4 → 5: +1 node; 5 → 6: 0 (2 nodes either way);
    # 8 → 9: +1; 12 → 13: +1 — 3 node-hours over 6 hours = 12 node-hours a day × 8 GPUs × $2 = $192
    assert extra_pods_usd_per_day(Pl, 2.0, [0, 3, 4, 5, 8, 12], 1, 1) == pytest.approx(192.0)
    assert extra_pods_usd_per_day(Pl, 2.0, [0, 3, 4, 5, 8, 12], 1, 0) == 0.0


def test_a_rollback_that_the_warm_previous_replicas_cannot_carry_is_flagged():
    """After a promotion, a rollback points the floor at the incumbent's pods at once: the warm previous ones, then
    each stable pod as it rolls back one at a time. Prod guard keeps 1 warm replica for a floor of up to 14 on a
    dedicated-only plan (no burst), so a rollback would answer most of its traffic with 429 for the minutes the
    stable Deployment takes: the plan says so, with what a dip-free rollback would cost; with enough warm
    replicas it says nothing."""
    from tests.conftest import ROOT
    from topology.loading import load_inputs

    inputs = load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml")
    spec = plan(inputs, planning_date=dt.date(2026, 12, 3))
    guard = spec.endpoint("guard")
    most = max(guard.floor.replicas_by_hour)
    assert guard.rollout.stage == "promoted" and guard.rollout.previous_warm_replicas < most
    (w,) = [w for w in guard.warnings if "a rollback before" in w]
    assert f"floor runs up to {most} replicas" in w and f"rollout.previous_warm_replicas {most} would roll back" in w
    eps = [e if e.name != "guard" else e.model_copy(update={"rollout": e.rollout.model_copy(
        update={"previous_warm_replicas": most})}) for e in inputs.endpoints]
    enough = plan(inputs.model_copy(update={"endpoints": eps}), planning_date=dt.date(2026, 12, 3))
    assert not any("a rollback before" in w for w in enough.endpoint("guard").warnings)
    # past the warm window nothing is kept warm, and nothing is said
    later = plan(inputs, planning_date=dt.date(2026, 12, 8))
    assert not any("a rollback before" in w for w in later.endpoint("guard").warnings)
