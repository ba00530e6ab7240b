"""`python -m topology preflight STACK`: check, read-only, what `pulumi up` assumes and cannot fix itself.

Each check reads only (STS, EKS, S3, EC2 describe calls; `kubectl get`; Modal environment listing) and says,
when it fails, what is missing and the command that fixes it. Exit status 0: `up` can proceed; 1: a
blocking check failed; 2: the stack file itself is wrong. Warnings (what cannot be verified before a
deploy) never block.

The AWS, Kubernetes and Modal clients are injected (`Clients`), so tests run the same checks against moto
(AWS) and fakes (Kubernetes, Modal).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

import yaml

from topology.spec import TopologySpec

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MONITORING_CRDS = ("podmonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com")
MODAL_AUTH_SECRET = "modal-proxy-auth"
MODAL_AUTH_KEYS = ("modal-key", "modal-secret")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str | None = None
    blocking: bool = True

    def line(self) -> str:
        mark = "ok  " if self.ok else ("FAIL" if self.blocking else "warn")
        text = f"[{mark}] {self.name}: {self.detail}"
        if not self.ok and self.fix:
            text += f"\n       fix: {self.fix}"
        return text


class KubeClient(Protocol):
    def crd_names(self) -> set[str]: ...
    def pod_count(self, namespace: str, labels: dict[str, str]) -> int | None: ...  # None: cannot list
    def secret_keys(self, namespace: str, name: str) -> set[str] | None: ...  # None: no such Secret
    def service_ready(self, namespace: str, service: str, port: int, path: str) -> bool: ...


class ModalClient(Protocol):
    def environments(self) -> list[str]: ...  # raises ModalAuthError when the token is missing or refused
    def gpu_snapshots_enabled(self) -> bool | None: ...  # None: cannot be known before a deploy


class ModalAuthError(Exception):
    pass


@dataclass
class Clients:
    aws: Callable[[str, str | None], Any]  # (service, region) -> boto3 client
    kube: KubeClient
    modal: ModalClient


@dataclass
class StackUnderCheck:
    name: str
    config: dict[str, Any]
    spec: TopologySpec
    settings: Any  # components.stack_settings.StackSettings

    @property
    def aws_region(self) -> str | None:
        return self.config.get("aws:region")


def load_stack(stack_file: Path) -> StackUnderCheck:
    from components.quality_recorder import sampled_endpoints
    from components.stack_settings import SETTINGS_KEYS, gateway_ports, stack_settings
    from policies.recorded import plain_text_credentials
    from topology.loading import InputError, inputs_from_document
    from topology.plan import plan

    from topology.reading import read_document

    doc = read_document(stack_file)  # bounded like every stack read (size, depth, aliases, recursive aliases)
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        raise InputError(f"{stack_file}: not a Pulumi stack file (no top-level 'config' mapping)")
    config = doc["config"]
    # the whole document, as plan and render read it: the config keys checked (no key that is not text, none of
    # this project's misspelt), the inputs found and unwrapped
    spec = plan(inputs_from_document(doc, str(stack_file), PROJECT_ROOT))
    project = next(k.split(":")[0] for k in config if str(k).endswith(":inputs"))
    settings = stack_settings({k: config.get(f"{project}:{k}") for k in SETTINGS_KEYS}, f"{stack_file}")
    # what the program refuses before declaring anything, so preflight never says `up` can proceed where the
    # program would stop at once (found by this stop's fuzz: 140 stack files render refused passed preflight)
    gateway_ports(settings, spec)
    for full_key in plain_text_credentials(config):  # the policy pack's list of credential keys
        if full_key.startswith(f"{project}:"):  # the providers' own (aws:*) are the pack's to judge
            key = full_key.removeprefix(f"{project}:")
            raise InputError(f"{stack_file}: config {full_key} is stored in plain text; it holds credentials: "
                             f"`pulumi config rm {key}` then `pulumi config set --secret {key} ...`")
    sampled = sampled_endpoints(spec)
    if sampled and settings.quality_recorder_image is None:
        raise InputError(f"{stack_file}: endpoints {[e.name for e in sampled]} sample quality "
                         f"(rollout.quality_sampling) but {project}:qualityRecorderImage is not set")
    name = Path(stack_file).name.removeprefix("Pulumi.").removesuffix(".yaml")
    return StackUnderCheck(name, config, spec, settings)


# --- the checks --------------------------------------------------------------------------------------


def _aws_code(e: Exception) -> str | None:
    """The AWS error code of a botocore ClientError (None for any other exception)."""
    return getattr(e, "response", {}).get("Error", {}).get("Code") if hasattr(e, "response") else None


def _aws_error(e: Exception) -> str:
    code = _aws_code(e)
    return f"{code}: {e}" if code else str(e)


def check_aws(st: StackUnderCheck, c: Clients) -> list[Check]:
    out = []
    region = st.aws_region
    want = st.spec.cluster_region
    if region is None:
        out.append(Check("aws region", False, "the stack sets no aws:region (the AWS provider refuses to configure)",
                         f"pulumi config set aws:region {want} -s {st.name}"))
    elif region != want:
        out.append(Check("aws region", False, f"aws:region is {region}, the inputs' cluster_region is {want}",
                         f"pulumi config set aws:region {want} -s {st.name}"))
    else:
        out.append(Check("aws region", True, region))
    try:
        who = c.aws("sts", want).get_caller_identity()
        out.append(Check("aws credentials", True, f"account {who['Account']} as {who['Arn']}"))
    except Exception as e:  # noqa: BLE001 - any failure here means: no usable credentials
        out.append(Check("aws credentials", False, f"no usable AWS credentials ({_aws_error(e)})",
                         "aws sso login (or export AWS_PROFILE / AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"))
    return out


def _principal(arn: str) -> tuple[str, str, str] | None:
    """(account, kind, name) of an IAM user or role ARN, or of the STS ARN a caller gets (`assumed-role/<role>/<session>`
    is the role; a user's ARN may read `sts` or `iam`); None for anything else."""
    m = re.fullmatch(r"arn:aws[a-z-]*:(?:iam|sts)::(\d{12}):(user|role|assumed-role)/(.+)", arn)
    if not m:
        return None
    account, kind, rest = m.groups()
    if kind == "assumed-role":
        return account, "role", rest.split("/", 1)[0]
    return account, kind, rest.rsplit("/", 1)[-1]  # a role's or user's path is not part of its identity here


def check_cluster_admins(st: StackUnderCheck, c: Clients) -> list[Check]:
    """Who runs this first `up` creates the cluster, and EKS gives the creator an access entry of its own
    (bootstrapClusterCreatorAdminPermissions): listing that principal in adminPrincipalArns too fails the `up`
    with ResourceInUseException."""
    s = st.settings.cluster
    try:
        caller = c.aws("sts", st.spec.cluster_region).get_caller_identity()["Arn"]
    except Exception:  # noqa: BLE001 - reported by the credentials check
        return []
    me = _principal(caller)
    listed = [a for a in s.admin_principal_arns if me is not None and _principal(a) == me]
    if listed:
        return [Check("cluster admins", False,
                      f"{caller} will create the cluster, and EKS gives its creator an access entry; {listed[0]} in "
                      "cluster.adminPrincipalArns would be a second one for the same principal (ResourceInUseException)",
                      f"remove {listed[0]} from llm-serving:cluster.adminPrincipalArns (or run the first up as another principal)")]
    n = len(s.admin_principal_arns)
    return [Check("cluster admins", True, f"{caller} will create the cluster and be its admin; "
                                          f"{n} more admin(s) through access entries" if n else
                                          f"{caller} will create the cluster and be its only admin "
                                          "(set cluster.adminPrincipalArns for CI or the team)")]


def check_cluster(st: StackUnderCheck, c: Clients) -> list[Check]:
    s, region = st.settings.cluster, st.spec.cluster_region
    eks = c.aws("eks", region)
    if s.mode == "create":
        try:
            eks.describe_cluster(name=s.name)
            return [Check("cluster", False, f"mode create, but an EKS cluster {s.name} already exists in {region}",
                          "pick another llm-serving:cluster.name, or use it: llm-serving:cluster.mode existing")]
        except eks.exceptions.ResourceNotFoundException:
            return [Check("cluster", True, f"{s.name} will be created (with the eks-pod-identity-agent add-on)"),
                    *check_cluster_admins(st, c)]
    name = s.name
    if name is None:
        return [Check("cluster", True, "name comes from the stack reference (checked by `pulumi up`)", blocking=False)]
    out = []
    try:
        cl = eks.describe_cluster(name=name)["cluster"]
    except eks.exceptions.ResourceNotFoundException:
        return [Check("cluster", False, f"no EKS cluster {name} in {region}",
                      "check llm-serving:cluster.name, or create it: llm-serving:cluster.mode create")]
    status, version = cl.get("status"), cl.get("version")
    out.append(Check("cluster", status == "ACTIVE", f"{name}: {status}, Kubernetes {version}",
                     f"wait until `aws eks describe-cluster --name {name} --region {region}` says ACTIVE"))
    out.append(Check("kubernetes version", version == s.kubernetes_version,
                     f"cluster runs {version}; the stack pins {s.kubernetes_version} (Cluster Autoscaler's image follows it)",
                     f"pulumi config set --path 'cluster.kubernetesVersion' {version} -s {st.name}"))
    try:
        addon = eks.describe_addon(clusterName=name, addonName="eks-pod-identity-agent")["addon"]
        out.append(Check("pod identity agent", addon.get("status") == "ACTIVE",
                         f"eks-pod-identity-agent {addon.get('addonVersion')}: {addon.get('status')}",
                         f"aws eks describe-addon --cluster-name {name} --addon-name eks-pod-identity-agent --region {region}"))
    except eks.exceptions.ResourceNotFoundException:
        out.append(Check("pod identity agent", False,
                         "the eks-pod-identity-agent add-on is not installed: weight readers and the node autoscaler get no AWS credentials",
                         f"aws eks create-addon --cluster-name {name} --addon-name eks-pod-identity-agent --region {region}"))
    if st.spec.node_pools:
        out.append(check_node_group_reads(eks, name, region))
    if st.settings.network_policy.enabled:
        out.append(check_network_policy_enforced(eks, name, region))
    return out


def check_node_group_reads(eks, name: str, region: str) -> Check:
    """Each `up` reads the GPU pools' current sizes (components/gpu_node_pool.py desired_size: ListNodegroups, then
    DescribeNodegroup), so a change of a pool's bounds leaves the autoscaler's nodes running: without the
    permission the program stops at that read."""
    from botocore.exceptions import ClientError  # the AWS clients' own package (preflight's AWS calls need it)

    try:
        groups = eks.list_nodegroups(clusterName=name).get("nodegroups", [])
    except ClientError as e:
        return Check("node group reads", False, f"eks:ListNodegroups on {name} refused ({_aws_error(e)}): each `up` "
                     "reads the GPU pools' current sizes", "allow eks:ListNodegroups and eks:DescribeNodegroup on the "
                     "cluster to the principal that runs `pulumi up`")
    return Check("node group reads", True, f"{len(groups)} node group(s) listed: each `up` keeps the GPU pools' "
                 "current sizes")


def check_network_policy_enforced(eks, name: str, region: str) -> Check:
    """Whether the cluster enforces the engines' and the recorder's NetworkPolicies: the VPC CNI add-on with
    `enableNetworkPolicy` "true" (its configuration values, JSON or YAML). Not blocking: without it `up` works
    and the policies are inert, so any pod in the cluster reaches the engines."""
    try:
        addon = eks.describe_addon(clusterName=name, addonName="vpc-cni")["addon"]
    except eks.exceptions.ResourceNotFoundException:
        return Check("network policy", False, "vpc-cni is not an EKS add-on of this cluster: preflight cannot tell "
                     "whether its CNI enforces NetworkPolicies (Calico and Cilium do; the self-managed VPC CNI does "
                     "with enableNetworkPolicy)", "check the cluster's CNI; until it enforces them any pod reaches "
                     "the engines", blocking=False)
    head = f"vpc-cni {addon.get('addonVersion')}"
    try:
        values = yaml.safe_load(addon.get("configurationValues") or "") or {}
    except yaml.YAMLError:
        values = None
    if not isinstance(values, dict):
        return Check("network policy", False, f"{head}: its configuration values could "
                     "not be read as JSON or YAML", f"aws eks describe-addon --cluster-name {name} --addon-name vpc-cni "
                     f"--region {region} --query addon.configurationValues", blocking=False)
    on = str(values.get("enableNetworkPolicy", "")).lower() == "true"
    if not on:
        # UpdateAddon takes the whole set of configuration values: the platform's own (prefix delegation, custom
        # networking) go along, or the update would drop them
        merged = json.dumps({**values, "enableNetworkPolicy": "true"}, sort_keys=True)
        return Check("network policy", False, f"{head}: enableNetworkPolicy off: the "
                     "NetworkPolicies are inert", f"aws eks update-addon --cluster-name {name} --addon-name vpc-cni "
                     f"--region {region} --configuration-values '{merged}' --resolve-conflicts PRESERVE", blocking=False)
    env = values.get("env") if isinstance(values.get("env"), dict) else {}
    if str(env.get("NETWORK_POLICY_ENFORCING_MODE", "standard")).lower() == "strict":
        # strict mode (vpc-cni v1.17.1+): a pod no policy selects gets no traffic at all, and the stack declares
        # policies for the engines and the recorder only
        return Check("network policy", False, f"{head}: NetworkPolicies enforced in "
                     "strict mode: pods that no policy selects (the gateway, KEDA, the operators) get no traffic "
                     "unless the platform's own policies admit them", "add policies admitting the gateway's clients "
                     "and the operators' traffic, or run the agent in standard mode", blocking=False)
    return Check("network policy", True, f"{head}: enableNetworkPolicy on: the engines "
                 "admit the gateway and their scrapers only", blocking=False)


def check_monitoring(st: StackUnderCheck, c: Clients) -> list[Check]:
    if st.settings.installs_monitoring:
        return [Check("prometheus operator", True, "installed by this stack (kube-prometheus-stack)")]
    out = []
    missing = [n for n in MONITORING_CRDS if n not in c.kube.crd_names()]
    out.append(Check("prometheus operator CRDs", not missing,
                     f"missing {missing}" if missing else "PodMonitor and PrometheusRule defined",
                     "helm install kube-prometheus-stack prometheus-community/kube-prometheus-stack --version 88.5.3 "
                     "-n monitoring --create-namespace (or llm-serving:monitoring install)"))
    url = urlparse(st.settings.prometheus_url)
    parts = (url.hostname or "").split(".")
    if len(parts) >= 3 and parts[2] == "svc":
        svc, ns, port = parts[0], parts[1], url.port or 80
        ready = c.kube.service_ready(ns, svc, port, "/-/ready")
        out.append(Check("prometheus url", ready, f"{st.settings.prometheus_url} {'answers' if ready else 'does not answer'} /-/ready",
                         f"kubectl -n {ns} get svc {svc}; set llm-serving:prometheusUrl to the Prometheus KEDA should query"))
    else:
        out.append(Check("prometheus url", False, f"{st.settings.prometheus_url} is not an in-cluster Service address; "
                         "preflight cannot reach it", "check it from a pod in the cluster", blocking=False))
    if st.settings.network_policy.enabled:
        out += check_scrapers(st, c)
    return out


def check_scrapers(st: StackUnderCheck, c: Clients) -> list[Check]:
    """The pods the engines' NetworkPolicies admit to their metrics port exist: a selector that matches no pod
    shuts the scraping Prometheus out, and KEDA's queue trigger and every engine alert then read nothing."""
    out = []
    for s in st.settings.metrics_scrapers:
        if s.cidr is not None:  # an address range (a managed scraper): no pod to look for
            out.append(Check("metrics scrapers", True, f"connections from {s.cidr} are admitted to the metrics port "
                             "(an address range: preflight cannot see what connects from it)", blocking=False))
            continue
        sel = ",".join(f"{k}={v}" for k, v in sorted(s.pod_labels.items()))
        n = c.kube.pod_count(s.namespace, dict(s.pod_labels))
        fix = ("kubectl get pods -A -l app.kubernetes.io/name=prometheus (or the scraping agent's labels); set "
               "llm-serving:networkPolicy.scrapers to [{namespace: <its namespace>, podLabels: {<label>: <value>}}]")
        if n is None:
            out.append(Check("metrics scrapers", False, f"cannot list pods in {s.namespace} ({sel})", fix, blocking=False))
        else:
            out.append(Check("metrics scrapers", n > 0, f"{n} pod(s) in {s.namespace} match {sel}: the engines admit "
                             "them to their metrics port" if n else f"no pod in {s.namespace} matches {sel}: the "
                             "engines' NetworkPolicies would shut the scraping Prometheus out (KEDA's queue trigger "
                             "and the engine alerts read nothing)", fix))
    return out


def _manifest(s3, bucket: str, prefix: str) -> str | None:
    try:
        return s3.get_object(Bucket=bucket, Key=prefix + "SHA256SUMS")["Body"].read().decode()
    except s3.exceptions.NoSuchKey:
        return None


def check_weights(st: StackUnderCheck, c: Clients) -> list[Check]:
    if not st.spec.weight_caches:
        return []
    out = []
    source, region = st.spec.weight_caches[0].source_bucket, st.spec.weight_caches[0].source_region
    s3 = c.aws("s3", region)
    try:
        s3.head_bucket(Bucket=source)
        versioning = s3.get_bucket_versioning(Bucket=source).get("Status")
    except Exception as e:  # noqa: BLE001
        return [Check("source bucket", False, f"s3://{source} cannot be read ({_aws_error(e)})",
                      f"aws s3 ls s3://{source}/ --region {region}  (name and credentials)")]
    out.append(Check("source bucket", versioning == "Enabled", f"s3://{source}, versioning {versioning or 'off'}",
                     f"aws s3api put-bucket-versioning --bucket {source} --versioning-configuration Status=Enabled "
                     "(replication needs it)"))
    # S3 replication copies objects encrypted with SSE-KMS only when the rule selects them (SourceSelectionCriteria
    # SseKmsEncryptedObjects) and names a replica key; the weight caches' rules do neither, so a KMS-encrypted
    # registry's new revisions and adapters would never reach the caches (the seed's first copy hides it)
    algorithms: list[str] | None = None
    try:
        rules = s3.get_bucket_encryption(Bucket=source)["ServerSideEncryptionConfiguration"]["Rules"]
        algorithms = [str(r.get("ApplyServerSideEncryptionByDefault", {}).get("SSEAlgorithm", "")) for r in rules]
    except Exception as e:  # noqa: BLE001 — no default encryption configured reads as an error on some APIs
        if _aws_code(e) == "ServerSideEncryptionConfigurationNotFoundError":
            algorithms = []
        else:
            out.append(Check("source encryption", False, f"s3://{source}: default encryption cannot be read ({_aws_error(e)})",
                             "give the role s3:GetEncryptionConfiguration on the source bucket", blocking=False))
    if algorithms is not None:
        kms = [a for a in algorithms if a.startswith("aws:kms")]
        detail = (f"s3://{source}: default encryption {kms[0]}: replication skips KMS-encrypted objects unless its rules "
                  "select them, so new revisions would never reach the weight caches" if kms else
                  f"s3://{source}: default encryption {algorithms[0] if algorithms else 'none'}")
        out.append(Check("source encryption", not kms, detail,
                         "store the weights with SSE-S3 (AES256) in the source bucket; KMS-encrypted replication "
                         "(SseKmsEncryptedObjects, a replica key, kms grants) is not declared by this project"))
    for e in st.spec.endpoints:
        prefix = e.engine.weights_uri_suffix
        text = _manifest(s3, source, prefix)
        if text is None:
            out.append(Check(f"weights {e.name}", False, f"no SHA256SUMS under s3://{source}/{prefix}",
                             f"(cd <weights dir> && find . -type f ! -name SHA256SUMS -printf '%P\\n' | sort | xargs sha256sum > SHA256SUMS) "
                             f"&& aws s3 cp SHA256SUMS s3://{source}/{prefix}SHA256SUMS"))
            continue
        files = [line.partition("  ")[2] for line in text.splitlines() if line.strip()]
        out.append(Check(f"weights {e.name}", True, f"{e.model_name}@{e.model_revision[:8]}: SHA256SUMS lists {len(files)} files"))
        lora = e.engine.lora
        if lora is not None and lora.enable_lora:
            adapters = {f.split("/")[1] for f in files if f.startswith(lora.adapters_subdir + "/") and f.count("/") >= 2}
            out.append(Check(f"adapters {e.name}", bool(adapters),
                             f"{len(adapters)} adapter folders under {lora.adapters_subdir}/ in SHA256SUMS",
                             f"publish the adapters under s3://{source}/{prefix}{lora.adapters_subdir}/<name>/ and list them in SHA256SUMS"))
    # the owner's replication rules name other stacks' caches: S3 refuses a rule whose bucket does not exist
    if st.settings.weight_replication and st.settings.owns_replication(st.name):
        from components.stack_settings import replication_destinations

        own = {w.bucket_name for w in st.spec.weight_caches}
        for cache in replication_destinations(st.settings, st.name, st.spec, PROJECT_ROOT):
            if cache.bucket_name in own:
                continue
            try:
                c.aws("s3", cache.region).head_bucket(Bucket=cache.bucket_name)
                out.append(Check(f"replication destination {cache.bucket_name}", True, "exists"))
            except Exception:  # noqa: BLE001
                out.append(Check(f"replication destination {cache.bucket_name}", False,
                                 "another stack's weight cache, named in this stack's replication rules, does not exist yet",
                                 "pulumi up on that stack first (or drop it from llm-serving:weightReplication.destinationStacks)"))
    ep = st.settings.s3_gateway_endpoint
    if ep is not None and ep.existing_id:
        cache = st.spec.weight_caches[0]
        try:
            found = c.aws("ec2", cache.region).describe_vpc_endpoints(VpcEndpointIds=[ep.existing_id])["VpcEndpoints"]
        except Exception:  # noqa: BLE001
            found = []
        good = [v for v in found if v.get("VpcId") == cache.vpc_id and v.get("ServiceName", "").endswith(".s3")]
        out.append(Check("s3 gateway endpoint", bool(good), f"{ep.existing_id} {'is' if good else 'is not'} an S3 endpoint of {cache.vpc_id}",
                         f"aws ec2 describe-vpc-endpoints --filters Name=vpc-id,Values={cache.vpc_id} --region {cache.region}; "
                         "set llm-serving:s3GatewayEndpoint.existingId to its id"))
    return out


def check_quality_sink(st: StackUnderCheck, c: Clients) -> list[Check]:
    """Each quality-sampling sink bucket exists and is in the cluster's region: sampled prompts are customer
    data, and the recorder writes them with the cluster region's S3 client (components/quality_recorder.py)."""
    want = st.spec.cluster_region
    buckets = sorted({uri.removeprefix("s3://").partition("/")[0] for e in st.spec.endpoints
                      if e.rollout is not None and e.rollout.quality_sampling is not None
                      for uri in e.rollout.quality_sampling.prefixes.values()})
    out = []
    for b in buckets:
        try:
            loc = c.aws("s3", want).get_bucket_location(Bucket=b).get("LocationConstraint")
        except Exception as e:  # noqa: BLE001
            out.append(Check(f"quality sink {b}", False, f"s3://{b} cannot be read ({_aws_error(e)})",
                             f"create the evaluation sink in the cluster's region: aws s3api create-bucket --bucket {b} "
                             f"--region {want}" + ("" if want == "us-east-1" else
                                                   f" --create-bucket-configuration LocationConstraint={want}")))
            continue
        region = {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}.get(loc, loc)  # S3's legacy spellings
        out.append(Check(f"quality sink {b}", region == want,
                         f"s3://{b} is in {region}" + ("" if region == want else
                                                        f", the cluster in {want}: sampled prompts would leave the region"),
                         f"name a sink bucket in {want} (rollout.quality_sampling.sink_uri)"))
        key = _customer_kms_key(c.aws("s3", want), b)
        if key is not None:
            # the recorder's role may s3:PutObject and nothing else (components/quality_recorder.py): a put into a
            # bucket whose default encryption is a customer-managed key needs kms:GenerateDataKey on it, and without
            # it every sample is dropped (the QualitySamplingBlind alert fires hours later)
            out.append(Check(f"quality sink {b} encryption", False,
                             f"s3://{b} encrypts with the customer-managed KMS key {key}: the quality recorder's role "
                             "has s3:PutObject only, so every sampled record would be refused",
                             f"allow the recorder's role kms:GenerateDataKey on {key} (its key policy), or name a sink "
                             "encrypted with SSE-S3 or the AWS-managed aws/s3 key"))
    return out


def _customer_kms_key(s3, bucket: str) -> str | None:
    """The customer-managed KMS key a bucket's default encryption uses, or None (SSE-S3, the AWS-managed aws/s3 key,
    or nothing readable: the region check above reports a bucket it cannot read)."""
    try:
        rules = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    except Exception:  # noqa: BLE001 - no configuration (SSE-S3 by default since 2023) or not readable
        return None
    for rule in rules:
        default = rule.get("ApplyServerSideEncryptionByDefault", {})
        if default.get("SSEAlgorithm") in ("aws:kms", "aws:kms:dsse"):
            key = default.get("KMSMasterKeyID") or ""
            if key and not key.endswith("alias/aws/s3"):
                return key
    return None


def check_modal(st: StackUnderCheck, c: Clients) -> list[Check]:
    bursts = [e.burst for e in st.spec.endpoints if e.burst is not None]
    if not bursts:
        return []
    out = []
    try:
        envs = c.modal.environments()
    except ModalAuthError as e:
        return [Check("modal token", False, f"no usable Modal token ({e})",
                      f"modal token new, then pulumi config set --secret modalTokenId … / modalTokenSecret … -s {st.name}")]
    out.append(Check("modal token", True, "accepted"))
    env = st.spec.environment
    out.append(Check("modal environment", env in envs, f"environment {env!r} {'exists' if env in envs else 'is missing'}",
                     f"modal environment create {env}"))
    if any(b.enable_gpu_snapshot for b in bursts):
        enabled = c.modal.gpu_snapshots_enabled()
        if enabled is None:
            out.append(Check("gpu snapshots", False, "GPU memory snapshots (alpha) cannot be verified before a deploy",
                             "confirm the workspace has GPU snapshots, or set serverless.gpu_snapshots: false", blocking=False))
        else:
            out.append(Check("gpu snapshots", enabled, "enabled for the workspace" if enabled else "not enabled for the workspace",
                             "ask Modal to enable GPU snapshots for the workspace, or set serverless.gpu_snapshots: false"))
    return out


def required_secrets(spec: TopologySpec) -> dict[str, set[str]]:
    """Secret name → keys the gateway reads (tenants' API keys and cache salts; the Modal proxy auth)."""
    out: dict[str, set[str]] = {}
    for e in spec.endpoints:
        if e.tier == "managed_api":
            continue
        keys = {t.api_key_secret_key for t in e.gateway.tenants} | {
            t.cache_salt_secret_key for t in e.gateway.tenants if t.cache_salt_secret_key}
        if keys:
            out[f"{e.name}-gateway-tenants"] = keys
    if any(e.burst is not None and e.tier != "managed_api" for e in spec.endpoints):
        out[MODAL_AUTH_SECRET] = set(MODAL_AUTH_KEYS)
    return out


def check_secrets(st: StackUnderCheck, c: Clients) -> list[Check]:
    ns = st.settings.namespace
    out = []
    for name, keys in sorted(required_secrets(st.spec).items()):
        have = c.kube.secret_keys(ns, name)
        missing = sorted(keys - (have or set()))
        literals = " ".join(f"--from-literal={k}=…" for k in missing)
        out.append(Check(f"secret {name}", not missing,
                         "present" if not missing else (f"missing keys {missing}" if have is not None else f"no Secret {ns}/{name}"),
                         f"kubectl -n {ns} create secret generic {name} {literals}" if have is None else
                         f"kubectl -n {ns} patch secret {name} --type merge -p '{{\"stringData\": {{…{', '.join(missing)}…}}}}'"))
    return out


def _refused(name: str, check: Callable[[StackUnderCheck, Clients], list[Check]], st: StackUnderCheck,
             clients: Clients) -> list[Check]:
    """The check's own results, or — when AWS refuses one of its calls for a reason the check does not model (a
    role without eks:DescribeCluster, s3:GetObject on part of a bucket, kms:Decrypt) — a failed check naming the
    error, so the report still comes out with every other check in it."""
    from botocore.exceptions import ClientError  # the AWS clients' own package (preflight's AWS calls need it)

    try:
        return check(st, clients)
    except ClientError as e:
        return [Check(name, False, f"AWS refused a call this check makes: {_aws_error(e)}",
                      "give the role running preflight (and `pulumi up`) that permission, then run preflight again")]


def run_checks(st: StackUnderCheck, clients: Clients) -> list[Check]:
    checks = check_aws(st, clients)
    if not checks[-1].ok:  # no credentials: the AWS checks below would all say the same; Modal's need none of AWS
        return checks + check_modal(st, clients)
    checks += _refused("cluster", check_cluster, st, clients)
    cluster_usable = st.settings.cluster.mode == "existing" and all(
        ch.ok for ch in checks if ch.name == "cluster")
    if cluster_usable:
        checks += check_monitoring(st, clients)
        checks += check_secrets(st, clients)
    elif st.settings.cluster.mode == "create" and required_secrets(st.spec):
        ns = st.settings.namespace
        needed = sorted(required_secrets(st.spec).items())
        checks.append(Check("gateway secrets", False, f"the cluster does not exist yet: once `pulumi up` has created it, "
                            f"the gateway waits for {[n for n, _ in needed]} in {ns}",
                            "; ".join(f"kubectl -n {ns} create secret generic {name} "
                                      + " ".join(f"--from-literal={k}=…" for k in sorted(keys)) for name, keys in needed)
                            + " (values: README, Before your first up)",
                            blocking=False))
    checks += _refused('weights', check_weights, st, clients)
    checks += _refused('quality sink', check_quality_sink, st, clients)
    checks += check_modal(st, clients)
    return checks


# --- the real clients ---------------------------------------------------------------------------------


class KubectlClient:
    """kubectl with the ambient kubeconfig (`aws eks update-kubeconfig --name CLUSTER` first); reads only."""

    def _get(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=60)

    def crd_names(self) -> set[str]:
        r = self._get("get", "crd", "-o", "jsonpath={.items[*].metadata.name}")
        return set(r.stdout.split()) if r.returncode == 0 else set()

    def secret_keys(self, namespace: str, name: str) -> set[str] | None:
        r = self._get("-n", namespace, "get", "secret", name, "-o", "json")
        if r.returncode != 0:
            return None
        return set((json.loads(r.stdout).get("data") or {}).keys())

    def pod_count(self, namespace: str, labels: dict[str, str]) -> int | None:
        r = self._get("-n", namespace, "get", "pods", "-l", ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
                      "-o", "name")
        return len(r.stdout.split()) if r.returncode == 0 else None

    def service_ready(self, namespace: str, service: str, port: int, path: str) -> bool:
        return self._get("get", "--raw", f"/api/v1/namespaces/{namespace}/services/http:{service}:{port}/proxy{path}").returncode == 0


class ModalSdkClient:
    def environments(self) -> list[str]:
        import modal

        try:
            return [e.name for e in modal.Environment.objects.list()]
        except modal.exception.AuthError as e:
            raise ModalAuthError(str(e)) from None

    def gpu_snapshots_enabled(self) -> bool | None:
        return None  # the client has no workspace-feature query; a deploy is the first to know


def real_clients() -> Clients:
    import boto3

    return Clients(aws=lambda service, region: boto3.client(service, region_name=region),
                   kube=KubectlClient(), modal=ModalSdkClient())


def report(checks: Iterable[Check]) -> tuple[str, int]:
    checks = list(checks)
    lines = [ch.line() for ch in checks]
    blocking = [ch for ch in checks if not ch.ok and ch.blocking]
    lines.append(f"\n{len(checks)} checks, {len(blocking)} blocking failure(s): "
                 + ("`pulumi up` can proceed" if not blocking else "fix them before `pulumi up`"))
    return "\n".join(lines), 1 if blocking else 0


def cli_main(args, clients: Clients | None = None) -> int:
    """`python -m topology preflight STACK` (topology/cli.py dispatches here)."""
    path = Path(args.stack)
    if not path.exists() and (PROJECT_ROOT / "stacks" / f"Pulumi.{args.stack}.yaml").exists():
        path = PROJECT_ROOT / "stacks" / f"Pulumi.{args.stack}.yaml"
    if not path.exists():
        from topology.loading import InputError

        known = sorted(f.name.removeprefix("Pulumi.").removesuffix(".yaml") for f in (PROJECT_ROOT / "stacks").glob("Pulumi.*.yaml"))
        raise InputError(f"{args.stack}: no such stack file, and no stacks/Pulumi.{args.stack}.yaml; the stacks here: "
                         f"{', '.join(known)} (or give a stack file's path)")
    st = load_stack(path)
    text, status = report(run_checks(st, clients or real_clients()))
    print(f"preflight {st.name} ({path}):\n{text}")
    return status


if __name__ == "__main__":  # pragma: no cover
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("stack")
    sys.exit(cli_main(p.parse_args()))
