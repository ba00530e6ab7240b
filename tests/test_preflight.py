"""`python -m topology preflight STACK` (issue #11 item 6) against moto (STS, S3, EKS, EC2 on 127.0.0.1) and fakes
for the Kubernetes and Modal clients.

moto's EKS has clusters but no add-on API: `describe_addon` is answered by a thin layer over moto's EKS
client that raises the real client's ResourceNotFoundException for an add-on not installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from botocore.exceptions import ClientError

from ops import preflight as P
from tests.moto_support import client  # the fixtures moto_endpoint and aws_env: conftest.py

ROOT = Path(__file__).resolve().parent.parent


class EksWithAddons:
    def __init__(self, real, addons: dict[str, dict]):
        self._real, self._addons = real, addons

    def describe_addon(self, clusterName, addonName):  # noqa: N803 (boto3's names)
        if addonName not in self._addons:
            raise self._real.exceptions.ResourceNotFoundException(
                {"Error": {"Code": "ResourceNotFoundException", "Message": f"No addon: {addonName}"}}, "DescribeAddon")
        return {"addon": {"addonName": addonName, **self._addons[addonName]}}

    def __getattr__(self, name):
        return getattr(self._real, name)


class FakeKube:
    def __init__(self, crds=(), secrets=None, ready=(), pods=None):
        self.crds, self.secrets, self.ready = set(crds), dict(secrets or {}), set(ready)
        self.pods = dict(pods or {})  # namespace -> [labels of each pod]

    def pod_count(self, namespace, labels):
        return sum(all(p.get(k) == v for k, v in labels.items()) for p in self.pods.get(namespace, []))

    def crd_names(self):
        return self.crds

    def secret_keys(self, namespace, name):
        return self.secrets.get((namespace, name))

    def service_ready(self, namespace, service, port, path):
        return (namespace, service, port, path) in self.ready


class FakeModal:
    def __init__(self, envs=("prod",), token_ok=True, snapshots=True):
        self.envs, self.token_ok, self.snapshots = list(envs), token_ok, snapshots

    def environments(self):
        if not self.token_ok:
            raise P.ModalAuthError("Token missing. Could not authenticate client.")
        return self.envs

    def gpu_snapshots_enabled(self):
        return self.snapshots


def manifest(files):
    return "".join(f"{hashlib.sha256(d).hexdigest()}  {r}\n" for r, d in sorted(files.items())).encode()


@pytest.fixture
def world(aws_env, moto_endpoint, tmp_path):
    """An account where prod's `up` can proceed: returns (stack file, clients, kube, modal, addons, s3)."""
    s3, eks, ec2 = (client(s, moto_endpoint) for s in ("s3", "eks", "ec2"))
    run = tmp_path.name[-12:].lower().replace("_", "-")
    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.prod.yaml").read_text())
    cfg = doc["config"]
    # names unique per test (one moto server per session)
    cfg["llm-serving:cluster"]["name"] = f"platform-{run}"
    cfg["llm-serving:inputs"]["weights_source_bucket"] = source = f"registry-{run}"
    cfg["llm-serving:inputs"]["project"] = f"llm-{run}"
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    endpoint = ec2.create_vpc_endpoint(VpcId=vpc, ServiceName="com.amazonaws.us-east-1.s3", VpcEndpointType="Gateway")
    cfg["llm-serving:inputs"]["regions"][0]["vpc_id"] = vpc
    cfg["llm-serving:s3GatewayEndpoint"]["existingId"] = endpoint["VpcEndpoint"]["VpcEndpointId"]
    cfg["llm-serving:weightReplication"]["destinationStacks"] = ["prod"]
    assist = next(e for e in cfg["llm-serving:inputs"]["endpoints"] if e["name"] == "assist")
    assist["rollout"]["quality_sampling"]["sink_uri"] = f"s3://evals-{run}/prod/"  # the evaluation sink
    stack_file = tmp_path / "Pulumi.prod.yaml"
    stack_file.write_text(yaml.safe_dump(doc))
    st = P.load_stack(stack_file)

    eks.create_cluster(name=st.settings.cluster.name, version="1.33", roleArn="arn:aws:iam::123456789012:role/eks",
                       resourcesVpcConfig={"subnetIds": ["subnet-1"]})
    addons = {"eks-pod-identity-agent": {"status": "ACTIVE", "addonVersion": "v1.3.8-eksbuild.2"},
              "vpc-cni": {"status": "ACTIVE", "addonVersion": "v1.20.4-eksbuild.2",
                          "configurationValues": '{"enableNetworkPolicy": "true"}'}}
    s3.create_bucket(Bucket=source)
    s3.create_bucket(Bucket=f"evals-{run}")
    s3.put_bucket_versioning(Bucket=source, VersioningConfiguration={"Status": "Enabled"})
    for e in st.spec.endpoints:
        files = {"config.json": b"{}"}
        if e.engine.lora is not None:
            files[f"{e.engine.lora.adapters_subdir}/acme-support/adapter_model.safetensors"] = b"lora"
        s3.put_object(Bucket=source, Key=e.engine.weights_uri_suffix + "SHA256SUMS", Body=manifest(files))
    ns = st.settings.namespace
    secrets = {(ns, name): set(keys) for name, keys in P.required_secrets(st.spec).items()}
    kube = FakeKube(crds=P.MONITORING_CRDS, secrets=secrets,
                    ready={("monitoring", "kube-prometheus-stack-prometheus", 9090, "/-/ready")},
                    pods={"monitoring": [{"app.kubernetes.io/name": "prometheus", "prometheus": "kube-prometheus-stack-prometheus"},
                                         {"app.kubernetes.io/name": "alertmanager"}]})
    modal = FakeModal(envs=["main", "prod"])

    def aws(service, region):
        c = client(service, moto_endpoint, region or "us-east-1")
        return EksWithAddons(c, addons) if service == "eks" else c

    return stack_file, P.Clients(aws=aws, kube=kube, modal=modal), kube, modal, addons, s3


def run(stack_file, clients):
    st = P.load_stack(stack_file)
    checks = P.run_checks(st, clients)
    text, status = P.report(checks)
    return {c.name: c for c in checks}, text, status


def test_a_ready_account_passes_every_check(world):
    stack_file, clients, *_ = world
    checks, text, status = run(stack_file, clients)
    assert status == 0, text
    assert all(c.ok for c in checks.values()), text
    assert {"aws region", "aws credentials", "cluster", "kubernetes version", "pod identity agent", "network policy",
            "metrics scrapers", "node group reads",
            "prometheus operator CRDs", "prometheus url", "source bucket", "weights assist", "adapters assist",
            "weights autocomplete", "weights guard", "s3 gateway endpoint", "modal token", "modal environment",
            "gpu snapshots", "secret assist-gateway-tenants", "secret modal-proxy-auth"} <= set(checks)
    assert "`pulumi up` can proceed" in text


def test_each_missing_piece_is_named_with_the_command_that_fixes_it(world):
    stack_file, clients, kube, modal, addons, s3 = world
    st = P.load_stack(stack_file)
    addons.clear()
    kube.crds.clear()
    kube.ready.clear()
    ns = st.settings.namespace
    kube.secrets[(ns, "assist-gateway-tenants")] = {"acme-api-key"}
    del kube.secrets[(ns, P.MODAL_AUTH_SECRET)]
    modal.envs = ["main"]
    modal.snapshots = False
    s3.delete_object(Bucket=st.spec.weight_caches[0].source_bucket,
                     Key=st.spec.endpoint("autocomplete").engine.weights_uri_suffix + "SHA256SUMS")

    checks, text, status = run(stack_file, clients)
    assert status == 1
    failed = {n: c for n, c in checks.items() if not c.ok}
    assert set(failed) == {"pod identity agent", "network policy", "prometheus operator CRDs", "prometheus url", "weights autocomplete",
                           "secret assist-gateway-tenants", "secret modal-proxy-auth", "modal environment", "gpu snapshots"}
    cluster = st.settings.cluster.name
    assert failed["pod identity agent"].fix == (
        f"aws eks create-addon --cluster-name {cluster} --addon-name eks-pod-identity-agent --region us-east-1")
    assert "helm install kube-prometheus-stack" in failed["prometheus operator CRDs"].fix
    assert "no SHA256SUMS under s3://" in failed["weights autocomplete"].detail
    assert "aws s3 cp SHA256SUMS" in failed["weights autocomplete"].fix
    assert "globex-api-key" in failed["secret assist-gateway-tenants"].detail
    assert failed["secret modal-proxy-auth"].fix.startswith(f"kubectl -n {ns} create secret generic modal-proxy-auth")
    assert failed["modal environment"].fix == "modal environment create prod"
    for c in failed.values():
        assert f"[{'FAIL' if c.blocking else 'warn'}] {c.name}: {c.detail}\n       fix: {c.fix}" in text
    assert not failed["network policy"].blocking and "8 blocking failure(s)" in text


def test_without_credentials_or_token_nothing_else_is_asked(world):
    stack_file, clients, _kube, modal, *_ = world

    def refused(service, region):
        if service == "sts":
            raise ClientError({"Error": {"Code": "InvalidClientTokenId", "Message": "invalid token"}}, "GetCallerIdentity")
        return clients.aws(service, region)

    checks, text, status = run(stack_file, P.Clients(aws=refused, kube=clients.kube, modal=clients.modal))
    # the Modal checks need nothing of AWS: they are reported too, so a second problem shows in the same run
    assert status == 1 and list(checks)[:2] == ["aws region", "aws credentials"]
    assert set(checks) - {"aws region", "aws credentials"} <= {"modal token", "modal environment", "gpu snapshots"}
    assert "modal token" in checks
    assert "InvalidClientTokenId" in checks["aws credentials"].detail and "aws sso login" in checks["aws credentials"].fix

    modal.token_ok = False
    checks, text, status = run(stack_file, clients)
    assert status == 1 and not checks["modal token"].ok and "modal token new" in checks["modal token"].fix
    assert "modal environment" not in checks


def test_a_stack_without_a_region_or_with_another_cluster_version_is_told_how_to_fix_it(world):
    stack_file, clients, *_ = world
    doc = yaml.safe_load(stack_file.read_text())
    del doc["config"]["aws:region"]
    doc["config"]["llm-serving:cluster"]["kubernetesVersion"] = "1.34"
    stack_file.write_text(yaml.safe_dump(doc))
    checks, _text, status = run(stack_file, clients)
    assert status == 1
    assert checks["aws region"].fix == "pulumi config set aws:region us-east-1 -s prod"
    assert "cluster runs 1.33" in checks["kubernetes version"].detail
    assert checks["kubernetes version"].fix == "pulumi config set --path 'cluster.kubernetesVersion' 1.33 -s prod"


def test_the_owner_needs_the_other_stacks_caches_to_exist(world):
    stack_file, clients, *_, s3 = world
    if "acme-model-registry" not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket="acme-model-registry")
    doc = yaml.safe_load(stack_file.read_text())
    doc["config"]["llm-serving:weightReplication"]["destinationStacks"] = ["dev", "prod"]
    doc["config"]["llm-serving:inputs"]["weights_source_bucket"] = "acme-model-registry"  # the one dev names
    stack_file.write_text(yaml.safe_dump(doc))
    checks, _text, status = run(stack_file, clients)
    bad = checks["replication destination llm-serving-dev-weights-us-east-1"]
    assert status == 1 and not bad.ok and "pulumi up on that stack first" in bad.fix


def test_the_cli_dispatches_and_a_broken_stack_file_exits_2_without_a_traceback(tmp_path):
    bad = tmp_path / "Pulumi.x.yaml"
    bad.write_text("config: {llm-serving:cluster: {mode: existing}}\n")
    r = subprocess.run([sys.executable, "-m", "topology", "preflight", str(bad)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "Traceback" not in r.stderr and "inputs" in r.stderr


def test_the_real_modal_client_without_a_token_reports_it_as_a_missing_token(tmp_path):
    """The modal client itself (no fake): with no token it fails at once, before any network call."""
    code = ("from ops.preflight import ModalSdkClient, ModalAuthError\n"
            "try:\n    ModalSdkClient().environments()\nexcept ModalAuthError as e:\n    print('auth:', e)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODAL_")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT), MODAL_CONFIG_PATH=str(tmp_path / ".modal.toml"))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and r.stdout.startswith("auth:"), r.stdout + r.stderr


def test_a_stack_that_creates_its_cluster_checks_the_name_is_free_and_defers_the_secrets(world, tmp_path):
    _stack_file, clients, kube, *_ = world
    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    doc["config"]["llm-serving:cluster"]["name"] = f"dev-{tmp_path.name[-10:].lower().replace('_', '-')}"
    dev = tmp_path / "dev" / "Pulumi.dev.yaml"
    dev.parent.mkdir()
    dev.write_text(yaml.safe_dump(doc))
    checks, _text, _status = run(dev, clients)
    assert checks["cluster"].ok and "will be created" in checks["cluster"].detail
    assert checks["cluster admins"].ok and "1 more admin(s)" in checks["cluster admins"].detail
    assert "prometheus operator CRDs" not in checks  # dev installs kube-prometheus-stack itself
    deferred = checks["gateway secrets"]
    assert not deferred.ok and not deferred.blocking and "modal-proxy-auth" in deferred.detail

    # the same name already taken: `up` would fail creating it
    clients.aws("eks", "us-east-1").create_cluster(
        name=doc["config"]["llm-serving:cluster"]["name"], version="1.33",
        roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={"subnetIds": ["subnet-1"]})
    checks, _text, status = run(dev, clients)
    assert status == 1 and not checks["cluster"].ok and "already exists" in checks["cluster"].detail


def test_preflight_reads_a_stack_file_with_the_same_bounds_as_plan(tmp_path):
    """A recursive YAML alias under a key the planner never reads: preflight read the file with plain
    yaml.safe_load, which builds the cycle without complaint, where every other command refuses it."""
    from topology.loading import InputError

    text = (ROOT / "stacks" / "Pulumi.prod.yaml").read_text() + "\nnotes: &lp [*lp]\n"
    f = tmp_path / "Pulumi.prod.yaml"
    f.write_text(text)
    with pytest.raises(InputError, match="recursive alias"):
        P.load_stack(f)


def test_the_owner_reads_its_destination_stacks_with_the_same_bounds(tmp_path):
    """The owner plans every destination stack to name its bucket: that file went through libyaml with no bounds,
    so a recursive alias in it was built into the owner's program; now it is refused, naming the file."""
    from components.stack_settings import replication_destinations, stack_settings
    from topology import load_inputs, plan
    from topology.loading import InputError

    (tmp_path / "stacks").mkdir()
    dev = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()
    (tmp_path / "stacks" / "Pulumi.dev.yaml").write_text(dev)
    bad = (ROOT / "stacks" / "Pulumi.prod.yaml").read_text() + "\nnotes: &lp [*lp]\n"
    (tmp_path / "stacks" / "Pulumi.prod.yaml").write_text(bad)
    doc = yaml.safe_load(dev)
    doc["config"]["llm-serving:weightReplication"]["destinationStacks"] = ["prod"]
    settings = stack_settings({k.split(":", 1)[1]: v for k, v in doc["config"].items()
                               if k.startswith("llm-serving:") and k != "llm-serving:inputs"}, "dev")
    spec = plan(load_inputs(ROOT / "stacks" / "Pulumi.dev.yaml"))
    with pytest.raises(InputError, match=r"Pulumi\.prod\.yaml.*recursive alias"):
        replication_destinations(settings, "dev", spec, tmp_path)


def test_the_principal_that_creates_the_cluster_is_not_listed_as_an_admin_too(world, tmp_path):
    """EKS gives the cluster's creator an access entry (bootstrapClusterCreatorAdminPermissions): the same principal in
    adminPrincipalArns would be a second entry, which fails the first `up` with ResourceInUseException. The caller
    running preflight is who the first `up` runs as."""
    _stack_file, clients, *_ = world
    who = clients.aws("sts", "us-east-1").get_caller_identity()["Arn"]  # moto: arn:aws:sts::123456789012:user/moto
    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    doc["config"]["llm-serving:cluster"]["name"] = f"dev-{tmp_path.name[-10:].lower().replace('_', '-')}"
    doc["config"]["llm-serving:cluster"]["adminPrincipalArns"] = [
        "arn:aws:iam::123456789012:role/github-actions-llm-serving", "arn:aws:iam::123456789012:user/moto"]
    dev = tmp_path / "dev" / "Pulumi.dev.yaml"
    dev.parent.mkdir()
    dev.write_text(yaml.safe_dump(doc))
    checks, _text, status = run(dev, clients)
    assert status == 1 and not checks["cluster admins"].ok, checks["cluster admins"]
    assert who in checks["cluster admins"].detail and "ResourceInUseException" in checks["cluster admins"].detail
    assert "remove arn:aws:iam::123456789012:user/moto" in checks["cluster admins"].fix
    assert P._principal("arn:aws:sts::123456789012:assumed-role/ci-deploy/gh-run-42") == ("123456789012", "role", "ci-deploy")
    assert P._principal("arn:aws:iam::123456789012:role/team/ci-deploy") == ("123456789012", "role", "ci-deploy")


def test_an_aws_refusal_a_check_does_not_model_is_reported_not_raised(world):
    """A role without eks:DescribeCluster (EKS answers AccessDeniedException, a botocore ClientError no check
    catches by name) made preflight die with a traceback and no report; now that check fails naming the error
    and every other check is still reported. (moto grants every call, so the refusal is EKS's own error shape,
    raised by a wrapper.)"""
    from botocore.exceptions import ClientError

    stack_file, clients, *_ = world

    class Refusing:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            if name == "describe_cluster":
                def refuse(**kw):
                    raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "not authorized: "
                                                 "eks:DescribeCluster"}}, "DescribeCluster")
                return refuse
            return getattr(self.inner, name)

    aws = clients.aws
    refusing = P.Clients(aws=lambda s, r: Refusing(aws(s, r)) if s == "eks" else aws(s, r),
                         kube=clients.kube, modal=clients.modal)
    checks, text, status = run(stack_file, refusing)
    assert status != 0
    assert not checks["cluster"].ok and "AccessDeniedException" in checks["cluster"].detail
    assert "weights assist" in checks and checks["weights assist"].ok  # the rest of the report is there


def test_a_kms_encrypted_source_bucket_is_refused_before_replication_silently_skips_it(world):
    """S3 replicates SSE-KMS objects only when the rule selects them and names a replica key; the weight caches'
    rules do neither, so a registry bucket encrypted with KMS by default got its first copy by the seed and then
    never another revision or adapter. Preflight reads the source bucket's default encryption (moto's S3 API)."""
    stack_file, clients, kube, modal, addons, s3 = world
    checks, text, status = run(stack_file, clients)
    assert checks["source encryption"].ok
    source = P.load_stack(stack_file).spec.weight_caches[0].source_bucket
    s3.put_bucket_encryption(Bucket=source, ServerSideEncryptionConfiguration={"Rules": [
        {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": "alias/registry"}}]})
    checks, text, status = run(stack_file, clients)
    assert status != 0 and not checks["source encryption"].ok
    assert "aws:kms" in checks["source encryption"].detail and "replication skips" in checks["source encryption"].detail


def test_an_unknown_stack_name_lists_the_stacks_there(capsys):
    """`preflight staging` said only 'cannot read (no such file)'; it names the stacks it can check."""
    from topology.cli import main

    assert main(["preflight", "staging"]) == 2
    err = capsys.readouterr().err
    assert "staging: no such stack file" in err and "dev, prod" in err


@pytest.mark.parametrize("values, on", [
    ('{"enableNetworkPolicy": "true"}', True),
    ("enableNetworkPolicy: 'true'\nenv:\n  ENABLE_PREFIX_DELEGATION: 'true'\n", True),  # the add-on takes YAML too
    ('{"enableNetworkPolicy": "false", "env": {"ENABLE_PREFIX_DELEGATION": "true"}}', False),
    ("", False),
])
def test_network_policies_that_the_cluster_would_not_enforce_are_a_warning(world, values, on):
    stack_file, clients, kube, modal, addons, s3 = world
    addons["vpc-cni"]["configurationValues"] = values
    checks, text, status = run(stack_file, clients)
    c = checks["network policy"]
    assert c.ok is on and not c.blocking and status == 0, text  # `up` works; the policies are inert
    if not on:
        assert "enableNetworkPolicy off: the NetworkPolicies are inert" in c.detail
        assert c.fix.startswith(f"aws eks update-addon --cluster-name {P.load_stack(stack_file).settings.cluster.name} "
                                "--addon-name vpc-cni")
        # UpdateAddon replaces the whole set of values: the platform's own go along
        sent = json.loads(c.fix.split("--configuration-values '")[1].split("'")[0])
        assert sent["enableNetworkPolicy"] == "true"
        assert ("env" in values) == (sent.get("env") == {"ENABLE_PREFIX_DELEGATION": "true"})
    del addons["vpc-cni"]  # a self-managed CNI: preflight cannot tell
    c = {x.name: x for x in P.run_checks(P.load_stack(stack_file), clients)}["network policy"]
    assert not c.ok and not c.blocking and "cannot tell" in c.detail


@pytest.mark.parametrize("values, detail", [
    ("{not yaml", "could not be read"),
    ('{"enableNetworkPolicy": "true", "env": {"NETWORK_POLICY_ENFORCING_MODE": "strict"}}', "strict mode"),
])
def test_unreadable_values_and_strict_mode_are_warnings(world, values, detail):
    stack_file, clients, kube, modal, addons, s3 = world
    addons["vpc-cni"]["configurationValues"] = values
    checks, text, status = run(stack_file, clients)
    c = checks["network policy"]
    assert not c.ok and not c.blocking and detail in c.detail and status == 0, text


def test_a_scraper_selector_that_matches_no_pod_stops_the_up(world):
    """The engines' policies admit the scrapers only: with none matching, KEDA's trigger would read nothing."""
    stack_file, clients, kube, *_ = world
    kube.pods["monitoring"] = [{"app.kubernetes.io/name": "prometheus-agent"}]  # a PrometheusAgent scrapes instead
    checks, text, status = run(stack_file, clients)
    c = checks["metrics scrapers"]
    assert status == 1 and not c.ok and c.blocking
    assert "no pod in monitoring matches app.kubernetes.io/name=prometheus" in c.detail
    assert "llm-serving:networkPolicy.scrapers" in c.fix


def test_a_principal_that_cannot_read_node_groups_is_stopped_before_the_up(world):
    """`up` reads each GPU pool's current size (a change of its bounds must not shrink it): ListNodegroups refused
    would stop the program at that read."""
    stack_file, clients, *_ = world

    class Refusing:
        def __init__(self, real):
            self._real = real

        def list_nodegroups(self, **kw):
            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "not authorized"}}, "ListNodegroups")

        def __getattr__(self, name):
            return getattr(self._real, name)

    def aws(service, region):
        c = clients.aws(service, region)
        return Refusing(c) if service == "eks" else c

    checks, text, status = run(stack_file, P.Clients(aws=aws, kube=clients.kube, modal=clients.modal))
    c = checks["node group reads"]
    assert status == 1 and not c.ok and c.blocking and "AccessDeniedException" in c.detail
    assert "eks:ListNodegroups and eks:DescribeNodegroup" in c.fix


def test_an_address_range_scraper_is_reported_not_looked_for(world, tmp_path):
    stack_file, clients, kube, *_ = world
    doc = yaml.safe_load(stack_file.read_text())
    doc["config"]["llm-serving:networkPolicy"] = {"scrapers": [{"cidr": "10.20.0.0/16"}]}
    stack_file.write_text(yaml.safe_dump(doc))
    kube.pods.clear()  # no scraper pod anywhere: the range is what is admitted
    checks, text, status = run(stack_file, clients)
    c = checks["metrics scrapers"]
    assert status == 0 and c.ok and "connections from 10.20.0.0/16 are admitted" in c.detail, text


def test_preflight_and_the_program_read_the_same_settings():
    """Preflight read seven of the settings keys the program reads, so a stack whose networkPolicy.scrapers made its
    external prometheusUrl valid was refused by preflight alone."""
    import re as _re

    from components.stack_settings import SETTINGS_KEYS, StackSettings

    program = (ROOT / "__main__.py").read_text()
    block = program[program.index("settings = stack_settings("):program.index("source,\n    )")]
    assert set(_re.findall(r'"(\w+)": config\.get', block)) == set(SETTINGS_KEYS)
    assert {f.alias or n for n, f in StackSettings.model_fields.items()} == set(SETTINGS_KEYS)


@pytest.mark.parametrize("change, expect", [
    (lambda c: c.update({"llm-serving:kubeconfig": "apiVersion: v1"}), "llm-serving:kubeconfig is stored in plain text"),
    (lambda c: c.update({"llm-serving:modalTokenId": "ak-1"}), "llm-serving:modalTokenId is stored in plain text"),
    (lambda c: c.pop("llm-serving:gateway"), "gateway.ports"),
    (lambda c: c.pop("llm-serving:qualityRecorderImage"), "qualityRecorderImage is not set"),
    (lambda c: c.update({"llm-serving:Namespace": "x"}), "did you mean llm-serving:namespace"),
])
def test_preflight_refuses_what_the_program_refuses(tmp_path, change, expect):
    """Preflight read the settings but not what the program checks before declaring anything: with credentials it
    could report `up` able to proceed for a stack the program stops at once (found by this stop's fuzz: 140 stack
    files render refused passed preflight's settings stage)."""
    from topology.errors import InputError

    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.prod.yaml").read_text())
    change(doc["config"])
    f = tmp_path / "Pulumi.prod.yaml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match=expect):
        P.load_stack(f)
