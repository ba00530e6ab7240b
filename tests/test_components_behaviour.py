"""Behaviour of the pieces the floor pods run (warm-up probe, weight fetch) and of the components' guards:
invalid MIG layouts, wrapping floor windows, bad stack settings, the stack-reference cluster mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from components.floor_replicas import cron_triggers, minute_of_week_cron, scripts_configmap_name
from components.gpu_node_pool import GpuNodePool, GpuNodePoolArgs
from components.gpu_operator import GpuOperator, GpuOperatorArgs, mig_parted_config
from offline.mockrun import read_stack_config, run_function, run_program
from offline.validate import validate_objects
from pulumi_support import ROOT, cron_active, cron_minute_of_week, recording
from topology.catalog import MigLayoutError
from topology.loading import InputError
from topology.spec import FloorSchedule, FloorWindow, MigLayoutSpec

WARMUP = ROOT / "components" / "warmup_probe.py"
FETCH = ROOT / "components" / "fetch_weights.sh"


# ── the warm-up readiness probe against a fake vLLM server ─────────────────────────────────────


class _FakeEngine(BaseHTTPRequestHandler):
    completion_tokens = 1
    requests: list = []

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):  # noqa: N802
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, body))
        n = type(self).completion_tokens
        payload = json.dumps({"choices": [{"text": " ready" if n else ""}], "usage": {"completion_tokens": n}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def fake_engine():
    handler = type("Engine", (_FakeEngine,), {"requests": [], "completion_tokens": 1})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, handler
    server.shutdown()


def _probe(port: int, sentinel: Path, script: Path = WARMUP) -> subprocess.CompletedProcess:
    env = {**os.environ, "WARMUP_PORT": str(port), "WARMUP_MODEL": "llama-guard-3-1b", "WARMUP_MAX_TOKENS": "1",
           "WARMUP_SENTINEL": str(sentinel), "WARMUP_TIMEOUT_S": "5"}
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=30)


def test_probe_is_not_ready_until_a_generation_returns_a_token(fake_engine, tmp_path):
    server, engine = fake_engine
    sentinel = tmp_path / "warm"
    engine.completion_tokens = 0  # the engine answers /health but generates nothing
    r = _probe(server.server_port, sentinel)
    assert r.returncode == 1 and not sentinel.exists() and "no tokens" in r.stderr
    engine.completion_tokens = 1
    r = _probe(server.server_port, sentinel)
    assert r.returncode == 0 and sentinel.exists()
    path, body = engine.requests[-1]
    assert path == "/v1/completions" and body["model"] == "llama-guard-3-1b" and body["max_tokens"] >= 1
    n = len(engine.requests)
    assert _probe(server.server_port, sentinel).returncode == 0
    assert len(engine.requests) == n  # once warm, the probe only checks /health


def test_probe_fails_when_the_engine_is_down(tmp_path):
    r = _probe(1, tmp_path / "warm")  # nothing listens on port 1
    assert r.returncode == 1 and not (tmp_path / "warm").exists()


def _rendered_scripts(tmp_path: Path) -> dict[str, Path]:
    """The scripts as the rendered ConfigMap ships them to the pods, written out to run here."""
    (cm,) = [o for o in recording("prod").kubernetes_objects()
             if o["kind"] == "ConfigMap" and o["metadata"]["name"] == scripts_configmap_name("guard-vllm")]
    out = {}
    for key, text in cm["data"].items():
        (tmp_path / "rendered").mkdir(exist_ok=True)
        out[key] = tmp_path / "rendered" / key
        out[key].write_text(text)
    return out


def test_the_rendered_probe_script_holds_readiness_until_a_token(fake_engine, tmp_path):
    """What the pods run (the ConfigMap's copy, not the file in the repo) waits for a generated token."""
    server, engine = fake_engine
    script = _rendered_scripts(tmp_path)["warmup_probe.py"]
    engine.completion_tokens = 0
    assert _probe(server.server_port, tmp_path / "warm", script).returncode == 1
    engine.completion_tokens = 1
    assert _probe(server.server_port, tmp_path / "warm", script).returncode == 0 and (tmp_path / "warm").exists()
    assert engine.requests[-1][0] == "/v1/completions"


def test_the_rendered_fetch_script_copies_the_weights_once(tmp_path):
    source = tmp_path / "bucket"
    source.mkdir()
    (source / "model.safetensors").write_text("weights")
    script = _rendered_scripts(tmp_path)["fetch_weights.sh"]
    assert _fetch(tmp_path, source, script).returncode == 0
    assert (tmp_path / "nvme" / "models" / "m" / "rev" / "model.safetensors").read_text() == "weights"
    assert "already on this node" in _fetch(tmp_path, source, script).stdout


# ── the weight fetch init container, with a fake `aws` ─────────────────────────────────────────


def _fetch(tmp_path: Path, source: Path, script: Path = FETCH) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "aws-calls"
    fake_aws = bin_dir / "aws"
    # stands in for `aws s3 sync SRC DEST`: copies a local folder and logs the call
    fake_aws.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nmkdir -p "$6"\ncp -R {source}/. "$6"/\n')
    fake_aws.chmod(0o755)
    files = sorted(p.name for p in source.iterdir() if p.is_file() and p.name != "SHA256SUMS")
    if files:  # the manifest the seed writes last (tests/test_fetch_weights_lock.py covers a missing one)
        (source / "SHA256SUMS").write_text("".join(f"{'0' * 64}  {f}\n" for f in files))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "WEIGHTS_URI": "s3://cache/models/m/rev/",
           "LOCAL_DIR": str(tmp_path / "nvme" / "models" / "m" / "rev"), "START_JITTER_S": "0", "STALE_LOCK_S": "120",
           "LOCK_WAIT_MAX_S": "60", "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials"}
    return subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, text=True, timeout=30)


def test_fetch_copies_weights_once_per_node(tmp_path):
    source = tmp_path / "bucket"
    source.mkdir()
    (source / "model.safetensors").write_text("weights")
    r = _fetch(tmp_path, source)
    assert r.returncode == 0, r.stderr
    local = tmp_path / "nvme" / "models" / "m" / "rev"
    assert (local / "model.safetensors").read_text() == "weights" and (local / ".complete").exists()
    assert "s3 sync" in (tmp_path / "aws-calls").read_text() and "s3://cache/models/m/rev/" in (tmp_path / "aws-calls").read_text()
    r = _fetch(tmp_path, source)
    assert r.returncode == 0 and "already on this node" in r.stdout
    assert (tmp_path / "aws-calls").read_text().count("s3 sync") == 1
    assert not (tmp_path / "nvme" / "models" / "m" / "rev.lock").exists()


def test_fetch_fails_when_the_cache_holds_no_weights(tmp_path):
    source = tmp_path / "bucket"
    source.mkdir()
    r = _fetch(tmp_path, source)
    assert r.returncode == 1 and "replication" in r.stderr
    assert not (tmp_path / "nvme" / "models" / "m" / "rev" / ".complete").exists()


# ── MIG layouts the catalog rejects ────────────────────────────────────────────────────────────


def _bad_pool():
    from topology import load_inputs, plan

    spec = plan(load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml"))
    pool = next(p for p in spec.node_pools if p.mig_layout is not None)
    # the public blueprint's mistake: 8 compute slices on one GPU
    bad = MigLayoutSpec(name="mixed-bad", devices={"1g.10gb": 3, "2g.20gb": 1, "3g.40gb": 1})
    return pool.model_copy(update={"mig_layout": bad, "labels": {**pool.labels, "nvidia.com/mig.config": "mixed-bad"}})


def test_invalid_layout_fails_naming_gpu_profiles_and_slice_counts():
    pool = _bad_pool()
    with pytest.raises(MigLayoutError) as err:
        mig_parted_config([pool])
    msg = str(err.value)
    for part in (pool.name, "H100-80GB", "1g.10gb:3", "2g.20gb:1", "3g.40gb:1", "8 compute slices", "max 7"):
        assert part in msg


def test_invalid_layout_fails_before_anything_is_declared():
    pool = _bad_pool()
    for declare in (
        lambda: GpuOperator("gpu-operator", GpuOperatorArgs(node_pools=[pool])),
        lambda: GpuNodePool("pool", GpuNodePoolArgs(pool=pool, cluster_name="c", node_role_arn="arn", subnet_ids=["s"])),
    ):
        declared = []
        with pytest.raises(MigLayoutError, match="compute slices"):
            declared.append(run_function(declare))
        assert not declared


def test_one_layout_name_cannot_mean_two_geometries():
    pool = _bad_pool()
    a = pool.model_copy(update={"name": "a", "mig_layout": MigLayoutSpec(name="x", devices={"1g.10gb": 7})})
    b = pool.model_copy(update={"name": "b", "mig_layout": MigLayoutSpec(name="x", devices={"3g.40gb": 2})})
    with pytest.raises(MigLayoutError, match="give different geometries different names"):
        mig_parted_config([a, b])


# ── floor windows as cron triggers ─────────────────────────────────────────────────────────────


def test_cron_expressions_round_trip_every_minute_of_the_week():
    assert minute_of_week_cron(0) == "0 0 * * 1"  # Monday 00:00
    assert minute_of_week_cron(10079) == "59 23 * * 0"  # Sunday 23:59
    assert all(cron_minute_of_week(minute_of_week_cron(m)) == m for m in range(0, 10080, 7))


def test_a_window_wrapping_past_sunday_midnight_stays_active_across_it():
    floor = FloorSchedule(
        timezone="Europe/Berlin", replicas_by_hour=(1,) * 168, base_replicas=1, reserved_replicas=1, lead_time_s=600,
        windows=(FloorWindow(start_minute_of_week=10020, end_minute_of_week=60, replicas=3,
                             demand_rise_minute_of_week=10030),),
    )
    (t,) = cron_triggers(floor)
    m = t["metadata"]
    assert m == {"timezone": "Europe/Berlin", "start": "0 23 * * 0", "end": "0 1 * * 1", "desiredReplicas": "3"}
    start, end = cron_minute_of_week(m["start"]), cron_minute_of_week(m["end"])
    assert all(cron_active(start, end, x) for x in (10020, 10079, 0, 59))
    assert not any(cron_active(start, end, x) for x in (60, 5000, 10019))


# ── stack settings and cluster modes ───────────────────────────────────────────────────────────


def test_bad_cluster_setting_names_field_value_and_allowed():
    stack, config = read_stack_config(ROOT / "stacks" / "Pulumi.prod.yaml")
    config = {**config, "llm-serving:cluster": {"mode": "borrowed", "name": "x"}}
    with pytest.raises(InputError) as err:
        run_program(stack, config)
    assert "cluster.mode = 'borrowed'" in str(err.value) and "'existing' or 'create'" in str(err.value)


def test_missing_cluster_setting_is_a_clear_error():
    stack, config = read_stack_config(ROOT / "stacks" / "Pulumi.dev.yaml")
    config = {k: v for k, v in config.items() if k != "llm-serving:cluster"}
    with pytest.raises(InputError, match="missing config key 'cluster'"):
        run_program(stack, config)


def test_existing_cluster_from_a_stack_reference():
    stack, config = read_stack_config(ROOT / "stacks" / "Pulumi.prod.yaml")
    config = {**config, "llm-serving:cluster": {"mode": "existing", "stackReference": {"name": "acme/platform/prod"}}}
    outputs = {"clusterName": "platform-from-ref", "nodeRoleArn": "arn:aws:iam::1:role/gpu-nodes",
               "privateSubnetIds": ["subnet-a", "subnet-b"], "kubeconfig": "{}"}
    rec = run_program(stack, config, stack_reference_outputs=outputs)
    (ref,) = rec.of_type("pulumi:pulumi:StackReference")
    assert ref.inputs["name"] == "acme/platform/prod"
    groups = rec.of_type("aws:eks/nodeGroup:NodeGroup")
    assert groups and all(g.inputs["clusterName"] == "platform-from-ref" for g in groups)
    assert all(g.inputs["subnetIds"] == ["subnet-a", "subnet-b"] for g in groups)
    assert not rec.of_type("aws:eks/cluster:Cluster")
    (provider,) = rec.of_type("pulumi:providers:kubernetes")
    assert provider.inputs["kubeconfig"] == "[secret]"  # the kubeconfig never appears in a recording
    # replaced only when the cluster is another: a replaced provider replaces every (named) object it manages,
    # delete first; a rotated CA or a new server address in the kubeconfig is an update
    assert provider.inputs["clusterIdentifier"] == "platform-from-ref"


def test_a_created_cluster_identifies_its_kubernetes_provider_by_name():
    rec = recording("dev")
    (provider,) = rec.of_type("pulumi:providers:kubernetes")
    assert provider.inputs["clusterIdentifier"] == "llm-serving-dev"


def test_dev_creates_a_minimal_cluster_with_pod_identity():
    rec = recording("dev")
    (cluster,) = rec.of_type("aws:eks/cluster:Cluster")
    assert cluster.inputs["name"] == "llm-serving-dev"
    addons = {a.inputs["addonName"] for a in rec.of_type("aws:eks/addon:Addon")}
    assert "eks-pod-identity-agent" in addons


def test_program_loads_only_the_pulumi_aws_submodules_it_uses():
    # pulumi_aws has ~240 submodules; touching all of them costs ~20 s at every `pulumi preview`
    code = (
        "import sys, warnings; warnings.simplefilter('ignore')\n"
        "from offline.mockrun import run_stack_file\n"
        f"run_stack_file({str(ROOT / 'stacks' / 'Pulumi.prod.yaml')!r})\n"
        "print(' '.join(sorted(m.split('.')[1] for m in sys.modules if m.startswith('pulumi_aws.') and m.count('.') == 1\n"
        "      and type(sys.modules[m]).__name__ != '_LazyModule' and not m.split('.')[1].startswith(('_', 'get_')))))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    service_modules = set(r.stdout.split()) - {"arn_build", "arn_parse", "outputs", "provider", "trim_iam_role_path", "user_agent"}
    assert service_modules == {"autoscaling", "ec2", "eks", "iam", "s3"}  # autoscaling: node-template tags and scheduled actions on the groups


def test_a_media_extension_mig_slice_is_refused_with_its_name_before_anything_is_declared(planned_stacks):
    """`1g.10gb+me` is a valid mig-parted profile (the catalog has it), but `+` is not allowed in a Kubernetes
    resource name, so a floor on it would be a Deployment the API server rejects. The planner never picks one; a
    spec edited by hand to use one is refused naming the endpoint and the profile."""
    from components.floor_replicas import FloorReplicas, FloorReplicasArgs

    _, spec = planned_stacks["prod"]
    guard = spec.endpoint("guard")
    pools = [p for p in spec.node_pools if p.name in guard.node_pools]
    assert guard.capacity.mig_profile == "1g.10gb"
    me = "1g.10gb+me"
    pools = [p.model_copy(update={"mig_layout": p.mig_layout.model_copy(update={"devices": {me: 1}})}) for p in pools]
    guard = guard.model_copy(update={"capacity": guard.capacity.model_copy(update={"mig_profile": me})})
    declared = []
    with pytest.raises(ValueError, match=r"guard.*1g\.10gb\+me.*without '\+me'"):
        declared.append(run_function(lambda: FloorReplicas("guard", FloorReplicasArgs(
            endpoint=guard, node_pools=pools, weights_uri="s3://cache/models/guard/rev/", namespace="llm-serving",
            prometheus_url="http://prometheus:9090", previous_weights_uri="s3://cache/models/guard/previous/"))))
    assert not declared


def test_a_created_cluster_admits_its_admins_stays_in_standard_support_and_takes_over_the_bootstrap_addons():
    """EKS makes only the creating principal admin (bootstrapClusterCreatorAdminPermissions): the CI role and the
    platform team get access entries, or whoever did not create the cluster is refused by the Kubernetes provider.
    The support type is STANDARD (EKS's default EXTENDED bills $0.60 instead of $0.10 an hour once the version
    leaves standard support), and the managed add-ons overwrite the self-managed ones EKS installs at creation."""
    stack, config = read_stack_config(ROOT / "stacks" / "Pulumi.dev.yaml")
    rec = run_program(stack, config)
    (cluster,) = rec.of_type("aws:eks/cluster:Cluster")
    assert cluster.inputs["version"] == "1.35"
    assert cluster.inputs["upgradePolicy"] == {"supportType": "STANDARD"}
    assert cluster.inputs["vpcConfig"]["publicAccessCidrs"] == ["0.0.0.0/0"]
    admins = config["llm-serving:cluster"]["adminPrincipalArns"]
    entries = {e.inputs["principalArn"]: e for e in rec.of_type("aws:eks/accessEntry:AccessEntry")}
    assert sorted(entries) == sorted(admins)
    policies = {p.inputs["principalArn"]: p.inputs for p in rec.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")}
    assert sorted(policies) == sorted(admins)
    for arn, p in policies.items():
        assert p["policyArn"] == "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
        assert p["accessScope"] == {"type": "cluster"} and p["clusterName"] == cluster.inputs["name"]
    for addon in rec.of_type("aws:eks/addon:Addon"):
        assert addon.inputs["resolveConflictsOnCreate"] == "OVERWRITE"


@pytest.mark.parametrize(("field", "value", "message"), [
    ("adminPrincipalArns", ["github-actions"], "adminPrincipalArns must be IAM role or user ARNs"),
    ("adminPrincipalArns", ["arn:aws:iam::123:role/x"], "adminPrincipalArns must be IAM role or user ARNs"),
    ("publicAccessCidrs", [], "publicAccessCidrs is empty"),
])
def test_bad_cluster_access_settings_are_named(field, value, message):
    stack, config = read_stack_config(ROOT / "stacks" / "Pulumi.dev.yaml")
    config = {**config, "llm-serving:cluster": {**config["llm-serving:cluster"], field: value}}
    with pytest.raises(InputError, match=message):
        run_program(stack, config)


def test_an_existing_cluster_without_a_kubeconfig_is_reached_through_its_own_endpoint():
    """A CI runner has AWS credentials but no kubeconfig: the provider's kubeconfig is built from the cluster's
    endpoint and CA (eks.get_cluster) with `aws eks get-token`, instead of falling back to an ambient kubeconfig
    the runner does not have (the provider then called the cluster unreachable)."""
    import json

    import pulumi

    from components.cluster import Cluster, ClusterArgs
    from components.stack_settings import ClusterSettings

    got = []

    def declare():
        settings = ClusterSettings.model_validate({"mode": "existing", "name": "platform-prod", "nodeRoleArn":
                                                   "arn:aws:iam::123456789012:role/gpu-nodes", "subnetIds": ["subnet-a"]})
        c = Cluster("cluster", ClusterArgs(settings=settings, region="us-east-1", serving_namespace="llm-serving"))
        pulumi.Output.secret(c.kubeconfig).apply(got.append)

    run_function(declare)
    (kubeconfig,) = got
    doc = json.loads(kubeconfig)
    (entry,) = doc["clusters"]
    assert entry["name"] == "platform-prod" and entry["cluster"]["server"].startswith("https://platform-prod.")
    assert entry["cluster"]["certificate-authority-data"]
    (user,) = doc["users"]
    assert user["user"]["exec"]["args"] == ["eks", "get-token", "--cluster-name", "platform-prod", "--region", "us-east-1"]


def test_a_cluster_already_in_extended_support_can_keep_it():
    """EKS does not let a cluster leave extended support: one created at the old default 1.33 pins the version and
    EXTENDED until it runs a version in standard support."""
    stack, config = read_stack_config(ROOT / "stacks" / "Pulumi.dev.yaml")
    config = {**config, "llm-serving:cluster": {**config["llm-serving:cluster"], "kubernetesVersion": "1.33",
                                                "supportType": "EXTENDED"}}
    (cluster,) = run_program(stack, config).of_type("aws:eks/cluster:Cluster")
    assert cluster.inputs["version"] == "1.33" and cluster.inputs["upgradePolicy"] == {"supportType": "EXTENDED"}


def _gateway_objects(rec):
    (dep,) = [r for r in rec.of_type("kubernetes:apps/v1:Deployment") if r.name == "gateway-deployment"]
    (cm,) = [r for r in rec.of_type("kubernetes:core/v1:ConfigMap") if r.name.startswith("gateway-") and "haproxy.cfg" in r.inputs.get("data", {})]
    return dep, cm


def test_the_gateway_in_a_cluster_created_by_the_same_up_is_not_awaited():
    """A cluster the stack creates holds none of the Secrets the gateway's pods read (tenant keys, Modal proxy auth)
    until they are created after the `up`: pulumi-kubernetes would wait 10 minutes for pods that cannot start and
    fail the first `up`. There the gateway is not awaited (its pods start once the Secrets exist); on an existing
    cluster, where preflight checks the Secrets, it is."""
    dev_dep, _ = _gateway_objects(run_program(*read_stack_config(ROOT / "stacks" / "Pulumi.dev.yaml")))
    prod_dep, _ = _gateway_objects(run_program(*read_stack_config(ROOT / "stacks" / "Pulumi.prod.yaml")))
    assert dev_dep.inputs["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    assert "pulumi.com/skipAwait" not in prod_dep.inputs["metadata"].get("annotations", {})


@pytest.mark.parametrize(("source", "expect"), [("src", "track-sc0 src"), ("proxy_protocol", "accept-proxy")])
def test_the_gateways_client_source_is_a_stack_setting(source, expect):
    """Behind a proxy that hides client addresses every client is one source, and the per-source caps would cap all
    traffic: `llm-serving:gateway.clientSource` says how client addresses reach the pods."""
    stack, config = read_stack_config(ROOT / "stacks" / "Pulumi.prod.yaml")
    gateway = config["llm-serving:gateway"]
    _, cm = _gateway_objects(run_program(stack, {**config, "llm-serving:gateway": {**gateway, "clientSource": source}}))
    assert expect in cm.inputs["data"]["haproxy.cfg"]
    with pytest.raises(InputError, match=r"gateway.clientSource.*'src', 'proxy_protocol' or 'xff'"):
        run_program(stack, {**config, "llm-serving:gateway": {**gateway, "clientSource": "forwarded"}})


def test_the_gateways_two_scrape_endpoints_label_their_targets_apart():
    """prometheus-operator labels every target of a PodMonitor endpoint by the port name alone (promcfg.go, v0.93):
    two endpoints on one port would give two `up` series with the same labels."""
    rec = run_program(*read_stack_config(ROOT / "stacks" / "Pulumi.prod.yaml"))
    (pm,) = [r for r in rec.of_type("kubernetes:monitoring.coreos.com/v1:PodMonitor") if r.name == "gateway-pod-monitor"]
    endpoints = pm.inputs["spec"]["podMetricsEndpoints"]
    assert len(endpoints) == 2
    labels = [next((x["replacement"] for x in e.get("relabelings", []) if x["targetLabel"] == "endpoint"), e["port"])
              for e in endpoints]
    assert len(set(labels)) == 2, labels
