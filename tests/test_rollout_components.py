"""The rollout under Pulumi's mocks: candidate pods in shadow and canary with their own engine settings, the warm
previous version after promotion (and gone after its window), a rollback that reaches the warm pods at once."""

from __future__ import annotations

import json

import pytest

from offline.mockrun import read_stack_config, run_program
from offline.validate import validate_objects
from pulumi_support import ROOT

PROD = ROOT / "stacks" / "Pulumi.prod.yaml"


def run_prod(planning_date: str | None = "2026-12-02", edit=None):
    stack, config = read_stack_config(PROD)
    inputs = json.loads(json.dumps(config["llm-serving:inputs"]))
    if edit is not None:
        edit({e["name"]: e for e in inputs["endpoints"]})
    config = {**config, "llm-serving:inputs": inputs}
    if planning_date is not None:
        config["llm-serving:planningDate"] = planning_date
    rec = run_program(stack, config)
    return rec, {(o["kind"], o["metadata"]["name"]): o for o in rec.kubernetes_objects()}


def container(dep):
    return dep["spec"]["template"]["spec"]["containers"][0]


def flag(cmd, name):
    return cmd[cmd.index(name) + 1] if name in cmd else None


@pytest.fixture(scope="module")
def prod():
    return run_prod()


def to_canary(eps):
    eps["assist"]["rollout"]["stage"] = "canary"  # the one config change from shadow to canary


def test_canary_candidate_runs_its_own_engine_settings_on_its_own_track():
    rec, objs = run_prod(edit=to_canary)
    stable, cand = objs[("Deployment", "assist-vllm")], objs[("Deployment", "assist-vllm-canary")]
    s_cmd, c_cmd = container(stable)["command"], container(cand)["command"]
    assert flag(s_cmd, "--kv-cache-dtype") == "auto" and flag(c_cmd, "--kv-cache-dtype") == "fp8"
    differ = {a for a in c_cmd if a not in s_cmd} | {a for a in s_cmd if a not in c_cmd}
    assert differ == {"fp8", "auto"}  # an engine-only change: the same weights, one setting apart
    assert cand["spec"]["template"]["metadata"]["labels"]["serving.llm/model-version"] == "assist-2026-12-kvfp8"
    assert stable["spec"]["template"]["metadata"]["labels"]["serving.llm/model-version"] == "assist-2026-10"
    assert cand["spec"]["selector"]["matchLabels"]["serving.llm/track"] == "canary" and cand["spec"]["replicas"] == 1
    # the PodMonitor scrapes the candidate's pods too, under the endpoint's label (queries select by endpoint)
    monitor = objs[("PodMonitor", "assist-vllm")]["spec"]
    assert cand["spec"]["template"]["metadata"]["labels"]["serving.llm/endpoint"] == "assist"
    assert monitor["selector"]["matchLabels"].items() <= cand["spec"]["template"]["metadata"]["labels"].items()
    assert monitor["podTargetLabels"] == ["serving.llm/endpoint", "serving.llm/track"]
    assert cand["metadata"]["annotations"]["serving.llm/rollout-stage"] == "canary"
    assert cand["metadata"]["annotations"]["serving.llm/canary-percent"] == "5"
    assert objs[("Service", "assist-vllm-canary-pods")]["spec"]["selector"]["serving.llm/track"] == "canary"
    assert objs[("Service", "assist-vllm-pods")]["spec"]["selector"]["serving.llm/track"] == "stable"
    # the candidate stays out of the stable track's autoscaling signal and has no autoscaler of its own
    query = next(t for t in objs[("ScaledObject", "assist-vllm")]["spec"]["triggers"] if t["type"] == "prometheus")
    assert 'serving_llm_track="stable"' in query["metadata"]["query"]
    assert all(o["spec"]["scaleTargetRef"]["name"] != "assist-vllm-canary" for (k, _), o in objs.items() if k == "ScaledObject")
    assert rec.outputs["endpoints"]["assist"]["canaryPods"].startswith("assist-vllm-canary-pods.")
    # the gateway got the candidate's pods as its canary servers
    cfg = next(o for (k, n), o in objs.items() if k == "ConfigMap" and "haproxy.cfg" in o.get("data", {}))["data"]["haproxy.cfg"]
    assert "be_assist_canary" in cfg
    assert validate_objects(rec.kubernetes_objects()) == []


def test_shadow_candidate_pods_exist_for_the_mirror(prod):
    rec, objs = prod
    cand = objs[("Deployment", "assist-vllm-canary")]
    assert cand["metadata"]["annotations"]["serving.llm/rollout-stage"] == "shadow"
    assert cand["metadata"]["annotations"]["serving.llm/shadow-percent"] == "5"
    assert flag(container(cand)["command"], "--kv-cache-dtype") == "fp8"
    assist = next(e for e in rec.outputs["spec"]["endpoints"] if e["name"] == "assist")
    assert assist["gateway"]["shadow"]["percent"] == 5 and assist["gateway"]["canary"] is None
    assert rec.outputs["endpoints"]["assist"]["canaryPods"].startswith("assist-vllm-canary-pods.")
    assert ("Deployment", "autocomplete-vllm-canary") not in objs  # no rollout there


def test_after_promotion_the_candidate_serves_and_the_previous_version_stays_warm(prod):
    rec, objs = prod
    stable, prev = objs[("Deployment", "guard-vllm")], objs[("Deployment", "guard-vllm-previous")]
    assert flag(container(stable)["command"], "--quantization") == "fp8"  # guard-2026-11-fp8 serves
    assert flag(container(prev)["command"], "--quantization") is None  # guard-2026-08, bf16
    assert prev["spec"]["replicas"] == 1 and prev["metadata"]["annotations"]["serving.llm/warm-until"] == "2026-12-07"
    assert prev["spec"]["template"]["metadata"]["labels"]["serving.llm/model-version"] == "guard-2026-08"
    assert prev["spec"]["selector"]["matchLabels"]["serving.llm/track"] == "previous"
    assert prev["spec"]["template"]["metadata"]["labels"]["serving.llm/endpoint"] == "guard"
    assert objs[("PodMonitor", "guard-vllm")]["spec"]["selector"]["matchLabels"].items() <= \
        prev["spec"]["template"]["metadata"]["labels"].items()
    assert all(o["spec"]["scaleTargetRef"]["name"] != "guard-vllm-previous" for (k, _), o in objs.items() if k == "ScaledObject")
    assert ("Deployment", "guard-vllm-canary") not in objs
    assert rec.outputs["endpoints"]["guard"]["previousPods"].startswith("guard-vllm-previous-pods.")
    assert validate_objects(rec.kubernetes_objects()) == []


def test_the_warm_previous_version_is_removed_when_its_window_ends():
    _, objs = run_prod("2026-12-07")
    assert ("Deployment", "guard-vllm-previous") not in objs and ("Service", "guard-vllm-previous-pods") not in objs
    assert ("Deployment", "guard-vllm") in objs


def test_rollback_after_promotion_points_the_floor_at_the_warm_incumbent_pods():
    def roll_back(eps):
        eps["guard"]["rollout"]["stage"] = "rolled_back"

    _, objs = run_prod("2026-12-03", roll_back)
    stable, prev = objs[("Deployment", "guard-vllm")], objs[("Deployment", "guard-vllm-previous")]
    assert flag(container(stable)["command"], "--quantization") is None  # the stable track rolls back too
    pods = objs[("Service", "guard-vllm-pods")]["spec"]["selector"]
    assert pods == {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": "guard",
                    "serving.llm/endpoint": "guard", "serving.llm/model-version": "guard-2026-08"}
    assert prev["spec"]["template"]["metadata"]["labels"]["serving.llm/model-version"] == "guard-2026-08"


def test_a_new_weights_revision_reaches_the_candidate_pods_and_the_reader_role():
    rev = "0123456789abcdef0123456789abcdef01234567"

    def new_weights(eps):
        ro = eps["assist"]["rollout"]
        ro["stage"] = "canary"
        ro["candidate"] = {"version": "assist-2027-01", "weights_revision": rev}
        ro["eval_records"] = [{
            "version": "assist-2027-01", "weights_revision": rev, "engine_image": "vllm/vllm-openai:v0.11.0",
            "engine_settings_sha256": "7e99dc1b3c50ba2f",  # the incumbent's settings (report: engine_settings_sha256)
            "metric": "win_rate", "value": 0.6, "threshold": 0.5, "higher_is_better": True, "dataset": "d@1",
            "evaluated_on": "2026-12-01"}]

    rec, objs = run_prod("2026-12-02", new_weights)
    c_cmd = container(objs[("Deployment", "assist-vllm-canary")])["command"]
    assert c_cmd[2].endswith(f"/{rev}")
    role = next(r for r in rec.of_type("aws:iam/role:Role") if r.name.endswith("-reader-assist"))
    (attached,) = [p for p in rec.of_type("aws:iam/rolePolicy:RolePolicy") if p.name == f"{role.name}-policy"]
    resources = json.loads(attached.inputs["policy"])["Statement"][0]["Resource"]
    assert any(r.endswith(f"/{rev}/*") for r in resources)


def test_a_bad_planning_date_names_the_setting():
    with pytest.raises(Exception, match=r"planningDate='yesterday': must be a date"):
        run_prod("yesterday")


def test_a_reader_policy_names_each_prefix_once():
    """The stable track, a candidate and the previous version often serve one weights revision (prod's assist and
    guard do): the reader policy lists each prefix once (it listed assist's twice)."""
    from pulumi_support import recording

    rec = recording("prod")
    policies = [p for p in rec.of_type("aws:iam/rolePolicy:RolePolicy") if "-reader-" in p.name]
    assert len(policies) >= 3
    for p in policies:
        doc = json.loads(p.inputs["policy"])
        for st in doc["Statement"]:
            res = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            assert len(res) == len(set(res)), (p.name, res)
            for values in st.get("Condition", {}).get("StringLike", {}).values():
                assert len(values) == len(set(values)), (p.name, values)
