"""Quality sampling as the program declares it, under Pulumi's mocks: the recorder (Deployment, Service, config,
PodMonitor), a role that may only put objects under the spec's per-version prefixes, and the gateway told
the share, the versions and where the recorder is. Expected values come from the stack file, not the planner."""

from __future__ import annotations

import json

import pytest

from offline.mockrun import read_stack_config, run_program
from offline.validate import validate_objects
from tests.test_rollout_components import PROD, run_prod

RECORDER_DNS = "quality-recorder.llm-serving.svc.cluster.local:8080"


def stack_rollout() -> tuple[dict, str]:
    _, config = read_stack_config(PROD)
    assist = next(e for e in config["llm-serving:inputs"]["endpoints"] if e["name"] == "assist")
    return assist["rollout"], config["llm-serving:qualityRecorderImage"]


def recorder_parts(rec, objs):
    dep = objs[("Deployment", "quality-recorder")]
    # named by its content (quality-recorder-<digest>), immutable, and the one the pods mount
    (name, cm), = [(n, o) for (kind, n), o in objs.items() if kind == "ConfigMap" and n.startswith("quality-recorder-")]
    assert cm["immutable"] is True
    assert dep["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == name
    config = json.loads(cm["data"]["config.json"])
    (role,) = [r for r in rec.of_type("aws:iam/role:Role") if r.name == "quality-role"]
    (policy,) = [p for p in rec.of_type("aws:iam/rolePolicy:RolePolicy") if p.name == "quality-role-policy"]
    return dep, config, role, json.loads(policy.inputs["policy"])


def gateway_cfg(objs) -> str:
    # the gateway's ConfigMap is named by its content (gateway-haproxy-<digest>)
    (cm,) = [o for (kind, name), o in objs.items() if kind == "ConfigMap" and name.startswith("gateway-haproxy-")]
    return cm["data"]["haproxy.cfg"]


@pytest.fixture(scope="module")
def prod():
    return run_prod()


def test_the_recorder_writes_exactly_the_stacks_versions_under_their_prefixes(prod):
    rec, objs = prod
    rollout, image = stack_rollout()
    bucket, _, base = rollout["quality_sampling"]["sink_uri"].removeprefix("s3://").partition("/")
    versions = [rollout["incumbent_version"], rollout["candidate"]["version"]]  # in shadow: both are sampled
    dep, config, role, policy = recorder_parts(rec, objs)
    assert {v: (e["bucket"], e["prefix"]) for v, e in config["versions"]["assist"].items()} == {
        v: (bucket, f"{base}assist/{v}/") for v in versions}
    assert list(config["versions"]) == ["assist"]  # the other endpoints do not sample
    spec_assist = next(e for e in rec.outputs["spec"]["endpoints"] if e["name"] == "assist")["rollout"]
    assert config["versions"]["assist"][rollout["incumbent_version"]]["identity"]["identity_sha256"] == \
        rollout["incumbent_identity_sha256"] == spec_assist["incumbent"]["identity_sha256"]
    assert config["region"] == "us-east-1" and config["queue_max_records"] >= 16
    # write-only, and only there: no read, list or delete, nothing outside the versions' prefixes
    assert policy["Statement"] == [{"Sid": "WriteQualitySamples", "Effect": "Allow", "Action": ["s3:PutObject"],
                                    "Resource": sorted(f"arn:aws:s3:::{bucket}/{base}assist/{v}/*" for v in versions)}]
    assert json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    (assoc,) = [a for a in rec.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
                if a.inputs["serviceAccount"] == "quality-recorder"]
    assert assoc.inputs["namespace"] == "llm-serving" and assoc.inputs["region"] == "us-east-1"
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "quality-recorder"
    (c,) = pod["containers"]
    assert c["image"] == image and c["args"] == ["--config", "/etc/quality-recorder/config.json"]
    assert c["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["runAsUser"] == 10001
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"] == "1Gi"
    assert dep["spec"]["replicas"] >= 2
    svc = objs[("Service", "quality-recorder")]
    assert svc["spec"]["selector"] == dep["spec"]["template"]["metadata"]["labels"]
    monitor = objs[("PodMonitor", "quality-recorder")]
    assert monitor["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"
    assert validate_objects(rec.kubernetes_objects()) == []


def test_the_gateway_samples_the_stacks_share_and_posts_to_the_recorder(prod):
    rec, objs = prod
    rollout, _ = stack_rollout()
    cfg = gateway_cfg(objs)
    fraction = rollout["quality_sampling"]["sample_fraction"]
    (line,) = [ln for ln in cfg.splitlines() if "lua.llm_quality " in ln]
    assert line.split()[2:5] == ["assist", rollout["incumbent_version"], rollout["candidate"]["version"]]
    # the per-request draws are native, in millionths: the user's exchange and its shadow mirror independently
    ppm = round(fraction * 1_000_000)
    for var in ("q_user", "q_mirror"):
        assert f"http-request set-var(txn.{var}) int(1) if METH_POST {{ rand(1000000) -m int lt {ppm} }}" in cfg
    assert f"server-template recorder 1 {RECORDER_DNS} " in cfg and "frontend quality_records" in cfg
    assert "bind 127.0.0.1:9180" in cfg  # loopback only: nothing outside the pod can post records
    assert "lua.llm_quality_metrics if { path /metrics/quality }" in cfg
    # the action runs before the shadow's, so a mirror can be chosen for sampling too
    assert cfg.index("lua.llm_quality ") < cfg.index("lua.llm_shadow ")
    monitor = objs[("PodMonitor", "gateway-haproxy")]
    assert {e["path"] for e in monitor["spec"]["podMetricsEndpoints"]} == {"/metrics", "/metrics/quality"}
    assert sum("lua.llm_quality " in ln for ln in cfg.splitlines()) == 1  # autocomplete and guard do not sample


def test_a_rollback_narrows_sampling_and_the_role_to_the_incumbent():
    def roll_back(eps):
        eps["assist"]["rollout"]["stage"] = "rolled_back"

    rec, objs = run_prod(edit=roll_back)
    rollout, _ = stack_rollout()
    _, config, _, policy = recorder_parts(rec, objs)
    # a new config is a new ConfigMap (created before the old one goes), not the old name replaced delete-first
    names = {n for (kind, n) in objs if kind == "ConfigMap" and n.startswith("quality-recorder-")}
    before = {n for (kind, n) in run_prod()[1] if kind == "ConfigMap" and n.startswith("quality-recorder-")}
    assert names and before and names.isdisjoint(before)
    assert list(config["versions"]["assist"]) == [rollout["incumbent_version"]]
    assert policy["Statement"][0]["Resource"] == [
        f"arn:aws:s3:::acme-llm-evals/prod/assist/{rollout['incumbent_version']}/*"]
    (line,) = [ln for ln in gateway_cfg(objs).splitlines() if "lua.llm_quality " in ln]
    assert line.split()[3:5] == [rollout["incumbent_version"], "-"]  # no candidate route is left
    assert "set-var(txn.q_mirror)" not in gateway_cfg(objs)  # nor a mirror to sample


def test_without_sampling_nothing_is_declared_and_without_an_image_the_error_names_the_key():
    def no_sampling(eps):
        eps["assist"]["rollout"].pop("quality_sampling")

    rec, objs = run_prod(edit=no_sampling)
    assert ("Deployment", "quality-recorder") not in objs and not [
        r for r in rec.of_type("aws:iam/role:Role") if r.name == "quality-role"]
    assert "lua.llm_quality" not in gateway_cfg(objs) and "quality_records" not in gateway_cfg(objs)
    stack, config = read_stack_config(PROD)
    config = {k: v for k, v in config.items() if k != "llm-serving:qualityRecorderImage"}
    with pytest.raises(Exception, match=r"llm-serving:qualityRecorderImage is not set; build recorder/Dockerfile"):
        run_program(stack, {**config, "llm-serving:planningDate": "2026-12-02"})


def test_the_sink_going_blind_alerts_and_a_healthy_feed_does_not(prod, tmp_path):
    """promtool (Prometheus 2.42) replays the counters as the gateway and the recorder export them, with the
    namespace the PodMonitors add: sampled for an hour with nothing written fires after `for` (30 m); the
    same with writes, or with no traffic at all, never fires."""
    import subprocess

    import yaml

    from tests.prometheus_support import require_binary, write_rule_file

    promtool = require_binary("promtool")
    _, objs = prod
    rule = objs[("PrometheusRule", "quality-recorder")]
    write_rule_file(tmp_path / "rules.yml", rule["spec"]["groups"])
    check = subprocess.run([promtool, "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    ns = 'namespace="llm-serving"'
    gw = f'llm_gateway_quality_sampled_total{{{ns},pod="gw-1",endpoint="assist",version="assist-2026-10"}}'
    dropped = f'llm_gateway_quality_dropped_total{{{ns},pod="gw-1",endpoint="assist",reason="post_failed"}}'
    written = f'llm_quality_records_written_total{{{ns},pod="rec-1",endpoint="assist",version="assist-2026-10"}}'
    firing = [{"exp_labels": {"severity": "warning"},
               "exp_annotations": rule["spec"]["groups"][0]["rules"][0]["annotations"]}]
    cases = [
        # the sink is down: the recorder accepts (gateway counts them sampled), writes nothing
        {"interval": "1m", "input_series": [{"series": gw, "values": "0+2x120"}, {"series": written, "values": "0x120"}],
         "alert_rule_test": [{"eval_time": "30m", "alertname": "QualitySamplingBlind", "exp_alerts": []},
                             {"eval_time": "32m", "alertname": "QualitySamplingBlind", "exp_alerts": firing}]},
        # the recorder is down: only the gateway's drops move, the recorder exports nothing at all
        {"interval": "1m", "input_series": [{"series": dropped, "values": "0+2x120"}],
         "alert_rule_test": [{"eval_time": "32m", "alertname": "QualitySamplingBlind", "exp_alerts": firing}]},
        # healthy: written follows sampled; and a quiet endpoint (nothing sampled) is not blind
        {"interval": "1m", "input_series": [{"series": gw, "values": "0+2x120"}, {"series": written, "values": "0+2x120"}],
         "alert_rule_test": [{"eval_time": "100m", "alertname": "QualitySamplingBlind", "exp_alerts": []}]},
        {"interval": "1m", "input_series": [{"series": gw, "values": "5x120"}, {"series": written, "values": "5x120"}],
         "alert_rule_test": [{"eval_time": "100m", "alertname": "QualitySamplingBlind", "exp_alerts": []}]},
    ]
    (tmp_path / "test.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m",
                                                       "tests": cases}, sort_keys=False))
    out = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
