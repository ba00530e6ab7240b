"""Stack settings that are not cost inputs: where the cluster is, where Prometheus answers, the namespace.

Read from the stack's config (keys other than `llm-serving:inputs`); every field has a default or a
clear error naming the key, the value and what is allowed. Secrets (a kubeconfig) are never read here:
they come from `pulumi config set --secret` and are passed through as Pulumi secrets.
"""

from __future__ import annotations

import ipaddress
import re

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from topology.errors import FieldsError
from topology.loading import InputError, _unwrap_value, closest_name, format_validation_error
from topology.names import check_dns_label, check_label_key, check_label_value
from topology.spec import TopologySpec, WeightCacheSpec

DEFAULT_PROMETHEUS_URL = "http://kube-prometheus-stack-prometheus.monitoring.svc.cluster.local:9090"


def _label_map(v: dict[str, str]) -> dict[str, str]:
    """v, every key and value in Kubernetes label syntax (ValueError naming the first that is not)."""
    for k, x in v.items():
        check_label_key(k)
        check_label_value(x)
    return v


def _shaped(v: str | None, pattern: str, what: str) -> str | None:
    """v if it is None or matches `pattern` whole; else the error saying what it is not."""
    if v is not None and not re.fullmatch(pattern, v):
        raise ValueError(f"{v[:80]!r} is not {what}")
    return v


def _each_once(v: tuple[str, ...], what: str) -> tuple[str, ...]:
    if len(set(v)) != len(v):
        raise ValueError(f"lists a {what} twice: {sorted({x for x in v if v.count(x) > 1})}")
    return v


class _Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class StackReferenceSettings(_Settings):
    name: str = Field(min_length=1, description="Fully qualified stack, e.g. 'acme/platform/prod'.")
    cluster_name_output: str = Field("clusterName", min_length=1, alias="clusterNameOutput", description="Output holding the EKS cluster name.")
    node_role_arn_output: str = Field("nodeRoleArn", min_length=1, alias="nodeRoleArnOutput", description="Output holding the node IAM role ARN.")
    subnet_ids_output: str = Field("privateSubnetIds", min_length=1, alias="subnetIdsOutput", description="Output holding the node subnet IDs.")
    kubeconfig_output: str = Field("kubeconfig", min_length=1, alias="kubeconfigOutput", description="Output holding the kubeconfig (a secret).")


class ClusterSettings(_Settings):
    """`llm-serving:cluster`: use an existing EKS cluster or create a minimal one."""

    mode: Literal["existing", "create"] = Field(description="'existing': use a cluster; 'create': declare a minimal EKS cluster.")
    name: str | None = Field(None, min_length=1, max_length=100, description="EKS cluster name (required unless taken from a stack reference).")
    node_role_arn: str | None = Field(None, alias="nodeRoleArn", description="existing: IAM role the GPU node groups use.")
    subnet_ids: tuple[str, ...] = Field((), alias="subnetIds", description="Private subnets for node groups (create: also the control plane).")
    stack_reference: StackReferenceSettings | None = Field(
        None, alias="stackReference", description="existing: read name, node role, subnets and kubeconfig from this stack's outputs."
    )
    kubernetes_version: str = Field(
        "1.35", alias="kubernetesVersion",
        description="The cluster's Kubernetes version: create: the version created (1.35 is the one in EKS standard "
        "support on 2026-12-04; 1.33's ended 2026-07-29, 1.34's 2026-12-02); existing: the version it runs. Cluster "
        "Autoscaler's image follows it and preflight checks it against the cluster.")
    support_type: Literal["STANDARD", "EXTENDED"] = Field(
        "STANDARD", alias="supportType",
        description="create: EKS support type. STANDARD: a version past standard support is upgraded by EKS; "
        "EXTENDED (EKS's own default) bills $0.60 instead of $0.10 an hour past it. A cluster already in extended "
        "support cannot leave it (EKS refuses): keep EXTENDED until it runs a version in standard support.")
    admin_principal_arns: tuple[str, ...] = Field(
        (), alias="adminPrincipalArns",
        description="create: IAM roles or users given cluster admin through EKS access entries besides the principal "
        "that creates the cluster — e.g. the CI role when engineers run the first `up`, or the engineers' role when CI "
        "does. EKS gives the creator an entry of its own: listing it too fails with ResourceInUseException.")
    public_access_cidrs: tuple[str, ...] = Field(
        ("0.0.0.0/0",), alias="publicAccessCidrs",
        description="create: CIDR blocks allowed to the cluster's public API endpoint (EKS's default: anywhere). "
        "Narrow it to the CI runners and the office.")
    system_instance_type: str = Field("m7i.xlarge", alias="systemInstanceType", description="create: instance type of the CPU node group for operators.")
    system_nodes: int = Field(2, ge=1, le=20, alias="systemNodes", description="create: CPU nodes for KEDA, the GPU operator, CoreDNS.")

    @field_validator("name")
    @classmethod
    def _eks_name(cls, v: str | None) -> str | None:
        # EKS CreateCluster: 1-100 characters, ^[0-9A-Za-z][A-Za-z0-9\-_]*$
        return _shaped(v, r"[0-9A-Za-z][A-Za-z0-9_-]{0,99}",
                       "an EKS cluster name: 1-100 of letters, digits, '-', '_', starting with a letter or digit")

    @field_validator("node_role_arn")
    @classmethod
    def _role_arn(cls, v: str | None) -> str | None:
        return _shaped(v, r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}",
                       "an IAM role ARN (arn:aws:iam::<12-digit account>:role/<name>)")

    @field_validator("subnet_ids")
    @classmethod
    def _subnets(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [x for x in v if not re.fullmatch(r"subnet-[0-9a-z]{1,40}", x)]
        if bad:
            raise ValueError(f"{bad[0][:80]!r} is not a subnet ID (subnet-<id>)")
        return _each_once(v, "subnet")

    @field_validator("kubernetes_version")
    @classmethod
    def _version(cls, v: str) -> str:
        from .node_autoscaler import IMAGE_TAGS  # the versions a Cluster Autoscaler image is pinned for

        if v not in IMAGE_TAGS:
            raise ValueError(f"allowed {', '.join(sorted(IMAGE_TAGS))} (a Cluster Autoscaler image is pinned for "
                             "each, components/node_autoscaler.py)")
        return v

    @field_validator("public_access_cidrs")
    @classmethod
    def _cidrs(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for c in v:
            try:
                net = ipaddress.ip_network(c, strict=False)
            except ValueError:
                raise ValueError(f"{c[:80]!r} is not a CIDR block (e.g. 203.0.113.0/24)") from None
            if net.version != 4:  # EKS's publicAccessCidrs are IPv4 blocks
                raise ValueError(f"{c!r}: EKS takes IPv4 CIDR blocks for the public endpoint")
        return _each_once(v, "block")

    @field_validator("system_instance_type")
    @classmethod
    def _instance_type(cls, v: str) -> str:
        return _shaped(v, r"[a-z][a-z0-9-]*\.[a-z0-9]+", "an EC2 instance type (e.g. m7i.xlarge)")

    @field_validator("admin_principal_arns")
    @classmethod
    def _admins_once(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _each_once(v, "principal")  # two access entries for one principal: ResourceInUseException at up

    @model_validator(mode="after")
    def _complete(self) -> "ClusterSettings":
        if self.mode == "create":
            if self.stack_reference is not None:
                raise ValueError("stackReference is only for mode 'existing'")
            if not self.name:
                raise ValueError("mode 'create' needs name (the cluster to create)")
            if len(self.subnet_ids) < 2:
                raise ValueError(f"mode 'create' needs subnetIds in at least two availability zones; got {list(self.subnet_ids)}")
            bad = [a for a in self.admin_principal_arns
                   if not re.fullmatch(r"arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+", a)]
            if bad:
                raise ValueError(f"adminPrincipalArns must be IAM role or user ARNs (arn:aws:iam::<account>:role/<name>); "
                                 f"got {bad}")
            if not self.public_access_cidrs:
                raise ValueError("publicAccessCidrs is empty: give the CIDR blocks that may reach the API endpoint")
            return self
        # settings of a cluster this stack creates: on an existing one nothing reads them, so they were ignored
        create_only = {"admin_principal_arns": "adminPrincipalArns", "public_access_cidrs": "publicAccessCidrs",
                       "system_instance_type": "systemInstanceType", "system_nodes": "systemNodes",
                       "support_type": "supportType"}
        given = sorted(create_only[f] for f in self.model_fields_set & set(create_only))
        if given:
            raise ValueError(f"{', '.join(given)} apply to mode 'create' only (the stack creates the cluster); "
                             "an existing cluster keeps its own: remove them")
        if self.stack_reference is None:
            missing = [k for k, v in (("name", self.name), ("nodeRoleArn", self.node_role_arn)) if not v]
            if not self.subnet_ids:
                missing.append("subnetIds")
            if missing:
                raise ValueError(f"mode 'existing' without stackReference needs {', '.join(missing)}")
        return self


class WeightReplicationSettings(_Settings):
    """`llm-serving:weightReplication`: which stack owns the source bucket's one replication configuration.

    S3 keeps one replication configuration per bucket; stacks sharing a source bucket would overwrite each
    other's rules (and `destroy` of one would delete them all). Exactly one stack, `ownerStack`, declares it,
    with a rule for every weight cache of every stack in `destinationStacks` (planned from their stack files).
    """

    owner_stack: str = Field(min_length=1, alias="ownerStack", description="The stack that declares the replication configuration.")
    destination_stacks: tuple[str, ...] = Field(
        (), alias="destinationStacks",
        description="Owner only: stacks (stacks/Pulumi.<name>.yaml) whose weight caches get a replication rule.",
    )

    @field_validator("owner_stack", "destination_stacks")
    @classmethod
    def _stack_names(cls, v):
        # a stack name (it names a file under stacks/: 10,000 characters ended in an OSError)
        for name in ([v] if isinstance(v, str) else v):
            _shaped(name, r"(?!\.\.?$)[A-Za-z0-9_.-]{1,100}", "a stack name: 1-100 of letters, digits, '-', '_', '.'")
        return v


class S3EndpointSettings(_Settings):
    """`llm-serving:s3GatewayEndpoint`: reuse the VPC's S3 gateway endpoint, or create one only when told.

    A route table carries the S3 prefix list to one gateway endpoint only: a second endpoint on the same
    route tables (another stack's, or the platform's) is refused by AWS.
    """

    existing_id: str | None = Field(None, alias="existingId", description="The VPC's S3 gateway endpoint.")

    @field_validator("existing_id")
    @classmethod
    def _endpoint_id(cls, v: str | None) -> str | None:
        return _shaped(v, r"vpce-[0-9a-f]+", "a VPC endpoint ID (vpce- and hex digits, e.g. vpce-0a1b2c3d)")
    create: bool = Field(False, description="Create one on all the VPC's route tables (only when the VPC has none).")

    @model_validator(mode="after")
    def _one(self) -> "S3EndpointSettings":
        if (self.existing_id is None) == (not self.create):
            raise ValueError("set exactly one of existingId (reuse the VPC's endpoint) or create: true")
        return self


class GatewaySettings(_Settings):
    """`llm-serving:gateway`: how clients reach the gateway, which its per-client limits key on, and the port each
    endpoint listens on."""

    ports: dict[str, Annotated[int, Field(strict=True)]] | None = Field(
        None, description="Endpoint name -> the port its clients reach it on (the gateway Service's port). Required "
        "once the gateway serves more than one endpoint: ports given by position moved when an endpoint was added or "
        "removed before another, and that endpoint's clients then reached a different model. Keep a port once "
        "clients use it; an endpoint that leaves the gateway (managed_api) may keep its entry.")

    @field_validator("ports")
    @classmethod
    def _ports(cls, v: dict[str, int] | None) -> dict[str, int] | None:
        if v is None:
            return v
        bad = {k: p for k, p in v.items() if not 1024 <= p <= 65535}
        if bad:
            raise ValueError(f"ports {bad}: each must be 1024–65535 (the gateway runs as a non-root user)")
        seen: dict[int, str] = {}
        for k, p in v.items():
            if p in seen:
                raise ValueError(f"port {p} is given to both {seen[p]!r} and {k!r}: each endpoint needs its own")
            seen[p] = k
        return v

    client_source: Literal["src", "proxy_protocol", "xff"] = Field(
        "src", alias="clientSource",
        description="What identifies a client for the per-client connection and request-rate limits: 'src', the TCP "
        "peer (clients in the cluster, or a load balancer that keeps client addresses: an NLB with IP targets and "
        "preserve_client_ip); 'proxy_protocol', the address a load balancer sends in the PROXY protocol; 'xff', the "
        "last X-Forwarded-For value a trusted proxy appends. Behind a proxy that hides client addresses, 'src' makes "
        "every client one: the per-source caps then cap all traffic.")


class ScraperSettings(_Settings):
    """What scrapes the engines' and the quality recorder's `/metrics`: pods (a Prometheus, an agent) by namespace and
    labels, or an address range (a scraper outside the cluster's pods, such as Amazon Managed Service for
    Prometheus's managed scraper, which connects from network interfaces in the cluster's subnets)."""

    namespace: str | None = Field(None, max_length=63,
                                  description="The namespace the scraping pods run in (with podLabels).")
    pod_labels: dict[str, str] | None = Field(
        None, alias="podLabels", min_length=1,
        description="Labels every scraping pod carries (a Prometheus Operator's Prometheus pods: "
        "`app.kubernetes.io/name: prometheus`).")
    cidr: str | None = Field(
        None, description="An address range the scraper connects from, instead of namespace and podLabels (the "
        "managed scraper's subnets). Not 0.0.0.0/0 or ::/0: that admits every address.")

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str | None) -> str | None:
        return v if v is None else check_dns_label(v)

    @field_validator("pod_labels")
    @classmethod
    def _labels(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        return v if v is None else _label_map(v)  # they become a NetworkPolicy's podSelector

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            net = ipaddress.ip_network(v, strict=False)
        except ValueError:
            raise ValueError(f"{v!r} is not an address range (e.g. 10.0.0.0/16)") from None
        if net.prefixlen == 0:
            raise ValueError(f"{v!r} admits every address: name the scraper's subnets")
        return str(net)

    @model_validator(mode="after")
    def _one_kind(self) -> "ScraperSettings":
        pods = self.namespace is not None or self.pod_labels is not None
        if self.cidr is not None and pods:
            raise FieldsError(("cidr", "namespace", "podLabels"),
                              "a scraper is either pods (namespace and podLabels) or an address range (cidr), not both")
        if self.cidr is None and (self.namespace is None or self.pod_labels is None):
            raise FieldsError(("namespace", "podLabels"),
                              "a scraper needs namespace and podLabels (its pods), or cidr (its address range)")
        return self


# The pods of a Prometheus Operator `Prometheus` resource carry this label, reserved by the operator (prometheus-
# operator v0.93 pkg/prometheus/server/operator.go makeSelectorLabels; kube-prometheus-stack 88.5.3 runs v0.93.1);
# the installed kube-prometheus-stack runs them in MONITORING_NAMESPACE (components/monitoring.py).
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus"}
MONITORING_NAMESPACE = "monitoring"
# An in-cluster Service URL: http(s)://[user@]<service>.<namespace>.svc[.cluster.local][:port][/path] (host names
# are case-blind; another cluster domain, or a host outside the cluster, is no Service the derivation can trust)
_SERVICE_URL = re.compile(r"https?://(?:[^@/]*@)?[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?\."
                          r"(?P<ns>[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)\.svc(?:\.cluster\.local)?\.?"
                          r"(?::(?P<port>\d{1,5}))?(?:/[^\s]*)?", re.IGNORECASE)


def _service_namespace(url: str) -> str | None:
    m = _SERVICE_URL.fullmatch(url)
    if m is None or (m["port"] is not None and not 0 < int(m["port"]) <= 65535):
        return None
    return m["ns"].lower()


class NetworkPolicySettings(_Settings):
    """`llm-serving:networkPolicy`: who may open a connection to the serving pods.

    vLLM's own API key covers only paths under /v1 (0.11.0 `AuthenticationMiddleware`): /invocations, /tokenize,
    /pooling, /score and, with runtime LoRA updates, loading adapters sit outside it. So the engines admit
    connections from the stack's gateway and from the pods that scrape their metrics, and the quality recorder
    from the gateway and those scrapers; nothing else in the cluster reaches them."""

    enabled: bool = Field(True, strict=True, description="Declare the NetworkPolicies (false: any pod in the cluster reaches the "
                          "engines and the recorder; only for a cluster whose mesh or CNI enforces its own).")
    scrapers: tuple[ScraperSettings, ...] | None = Field(
        None, min_length=1, description="The pods that scrape the engines' and the recorder's metrics. Default: with monitoring "
        "'install', the installed Prometheus (namespace monitoring); with 'platform', the Prometheus pods "
        "(app.kubernetes.io/name: prometheus) in the namespace of prometheusUrl's Service.")


class StackSettings(_Settings):
    cluster: ClusterSettings = Field(description="`llm-serving:cluster`.")
    gateway: GatewaySettings = Field(default_factory=GatewaySettings, description="`llm-serving:gateway`.")
    namespace: str = Field(
        "llm-serving", max_length=63,
        description="`llm-serving:namespace`: Kubernetes namespace of the serving workloads.",
    )
    prometheus_url: str = Field(
        DEFAULT_PROMETHEUS_URL, alias="prometheusUrl",
        description="`llm-serving:prometheusUrl`: Prometheus KEDA queries for the queue metric.",
    )
    monitor_labels: dict[str, str] = Field(
        default_factory=lambda: {"release": "kube-prometheus-stack"}, alias="monitorLabels",
        description="`llm-serving:monitorLabels`: labels the Prometheus operator selects PodMonitors by.",
    )
    weight_replication: WeightReplicationSettings | None = Field(
        None, alias="weightReplication",
        description="`llm-serving:weightReplication`: the owner of the source bucket's replication (None: this stack, alone).",
    )
    s3_gateway_endpoint: S3EndpointSettings | None = Field(
        None, alias="s3GatewayEndpoint",
        description="`llm-serving:s3GatewayEndpoint`: reuse or create the VPC's S3 gateway endpoint (None: neither).",
    )
    quality_recorder_image: str | None = Field(
        None, alias="qualityRecorderImage",
        description="`llm-serving:qualityRecorderImage`: the quality recorder's image, built from recorder/Dockerfile "
        "(tag or digest); required when an endpoint's rollout samples quality.",
    )
    network_policy: NetworkPolicySettings = Field(
        default_factory=NetworkPolicySettings, alias="networkPolicy",
        description="`llm-serving:networkPolicy`: the pods allowed to reach the engines and the quality recorder.")
    monitoring: Literal["install", "platform"] | None = Field(
        None,
        description="`llm-serving:monitoring`: 'install' kube-prometheus-stack (default when the stack creates the "
        "cluster) or 'platform' provides the Prometheus Operator and Prometheus (default for an existing cluster).",
    )

    @field_validator("prometheus_url")
    @classmethod
    def _url(cls, v: str) -> str:
        # KEDA's trigger queries it: `http://`, a port past 65535 or a space made a ScaledObject that never reads
        from urllib.parse import urlsplit

        bad = any(c.isspace() or ord(c) < 32 for c in v)
        try:
            u = urlsplit(v)
            bad = bad or not u.hostname or u.port == 0 or u.scheme not in ("http", "https")
        except ValueError:  # a port that is no number or past 65535, an unclosed [ipv6
            bad = True
        if bad:
            raise ValueError("not an http(s) URL with a host and a port in 1-65535 (e.g. "
                             "http://prometheus-operated.monitoring.svc:9090)")
        return v

    @field_validator("namespace")
    @classmethod
    def _not_a_system_namespace(cls, v: str) -> str:
        check_dns_label(v)  # a Kubernetes namespace name, said in words (the pattern's regex was shown before)
        # the program adopts an existing namespace on an existing cluster: `destroy` would then delete it
        if v in ("default", "kube-system", "kube-public", "kube-node-lease"):
            raise ValueError("a namespace of the cluster's own; give one for the serving workloads (the stack adopts "
                             "and, on destroy, deletes it)")
        return v

    @field_validator("quality_recorder_image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        # the reference grammar of distribution/reference: [host[:port]/]path[:tag][@digest], path components
        # lower-case; the kubelet refuses anything else (InvalidImageName) and the recorder never starts
        comp = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
        host = r"(?:(?:[A-Za-z0-9-]+\.[A-Za-z0-9.-]+|localhost|[A-Za-z0-9-]+:[0-9]+)(?::[0-9]+)?/)?"
        tag, digest = r":[\w][\w.-]{0,127}", r"@sha256:[0-9a-f]{64}"
        return _shaped(v, rf"{host}{comp}(?:/{comp})*(?:{tag}(?:{digest})?|{digest})",
                       "an image reference with a tag or digest ([registry/]name:tag or name@sha256:<64 hex>; name in "
                       "lower case)")

    @property
    def installs_monitoring(self) -> bool:
        return (self.monitoring or ("install" if self.cluster.mode == "create" else "platform")) == "install"

    @property
    def metrics_scrapers(self) -> tuple[ScraperSettings, ...]:
        """The pods the NetworkPolicies admit to the metrics ports: networkPolicy.scrapers, or the installed
        Prometheus, or the Prometheus pods in the namespace of prometheusUrl's Service (the validator refused the
        settings where none of these is known)."""
        if self.network_policy.scrapers is not None:
            return self.network_policy.scrapers
        ns = MONITORING_NAMESPACE if self.installs_monitoring else _service_namespace(self.prometheus_url)
        return (ScraperSettings(namespace=ns, pod_labels=PROMETHEUS_POD_LABELS),) if ns else ()

    def owns_replication(self, stack: str) -> bool:
        return self.weight_replication is None or self.weight_replication.owner_stack == stack

    @field_validator("monitor_labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return _label_map(v)  # they become metadata.labels of PodMonitors

    @model_validator(mode="after")
    def _labels_the_installed_prometheus_reads(self) -> "StackSettings":
        # The installed kube-prometheus-stack selects monitors and rules by these labels (components/monitoring.py),
        # and its own ServiceMonitors carry `release: <release>` (chart 88.5.3 templates/prometheus/prometheus.yaml:
        # a set selector replaces that default): other labels would stop it scraping kube-state-metrics, which
        # VllmFloorNotServing reads, and every node and kubelet metric, silently.
        default = {"release": "kube-prometheus-stack"}
        if self.installs_monitoring and self.monitor_labels != default:
            raise FieldsError(("monitorLabels", "monitoring"),
                f"monitorLabels {self.monitor_labels} with monitoring: install: the installed Prometheus would then "
                f"select only objects labelled so, and stop scraping the chart's own monitors (kube-state-metrics, "
                f"which the floor-not-serving alert reads); allowed: {default} (the default), or monitoring: platform "
                f"for a Prometheus that selects by other labels")
        return self

    @model_validator(mode="after")
    def _scrapers_known(self) -> "StackSettings":
        # a NetworkPolicy that shuts out the Prometheus scraping the engines empties KEDA's queue trigger and every
        # engine alert: the scrapers are named, or derived only from a Prometheus known to run in the cluster
        np = self.network_policy
        if np.enabled and not self.metrics_scrapers:
            raise FieldsError(("prometheusUrl", "networkPolicy.scrapers"), (
                f"prometheusUrl {self.prometheus_url!r} is not a Service in this cluster "
                "(http://<service>.<namespace>.svc[.cluster.local][:port]), so the NetworkPolicies cannot tell which "
                "pods scrape the engines' metrics: set networkPolicy.scrapers to [{namespace: <ns>, podLabels: "
                "{<label>: <value>}}] naming them (an agent or Prometheus in the cluster), or networkPolicy.enabled: "
                "false"))
        return self


def gateway_ports(settings: StackSettings, spec: TopologySpec) -> dict[str, int] | None:
    """The port each gated endpoint listens on, from llm-serving:gateway.ports (None: a lone endpoint, on 8080).
    Every gated endpoint must have one, none a port the gateway pod uses itself, and a name no endpoint has is a
    typo (InputError naming it)."""
    from .gateway_config import (GATEWAY_BASE_PORT, QUALITY_PORT, SHADOW_BASE_PORT, STATS_PORT, endpoint_ports,
                                 gated_endpoints, reserved_ports)

    gated = [e.name for e in gated_endpoints(spec)]
    ports = settings.gateway.ports
    if ports is None:
        if len(gated) <= 1:
            return None
        positional = "{" + ", ".join(f"{n}: {p}" for n, p in endpoint_ports(spec).items()) + "}"
        raise InputError(
            f"llm-serving:gateway.ports is not set and the gateway serves {len(gated)} endpoints ({', '.join(gated)}): "
            "give each its port, or adding or removing an endpoint before another moves that one's port and its "
            f"clients reach another model. Until now they listened by position: {positional} — set exactly what your "
            "clients use (`kubectl -n <namespace> get svc gateway-haproxy -o yaml` lists each endpoint's port), e.g. "
            f"llm-serving:gateway: {{ports: {positional}}}")
    names = {e.name for e in spec.endpoints}
    unknown = sorted(set(ports) - names)
    if unknown:
        hints = [f"{u[:80]!r}" + (f" (did you mean {c!r}?)" if (c := closest_name(u, sorted(names))) else "")
                 for u in unknown]
        raise InputError(f"llm-serving:gateway.ports names {', '.join(hints)}, not an endpoint of this stack "
                         f"(endpoints: {sorted(names)})")
    taken = reserved_ports(len(gated))
    missing = [n for n in gated if n not in ports]
    if missing:
        free = next(p for p in range(GATEWAY_BASE_PORT, 65536) if p not in ports.values() and p not in taken)
        raise InputError(f"llm-serving:gateway.ports has no port for {missing}, served by the gateway: add one each "
                         f"(a free one: {free}); the other endpoints keep theirs")
    clash = next(((n, p) for n, p in ports.items() if p in taken), None)
    if clash:
        n, p = clash
        raise InputError(f"llm-serving:gateway.ports gives {n!r} port {p}, which the gateway pod uses for {taken[p]} "
                         f"(it keeps {STATS_PORT} and {SHADOW_BASE_PORT}–{QUALITY_PORT}); choose another")
    return {n: ports[n] for n in gated}


# The config keys StackSettings reads (without the project prefix): the program (__main__.py) and preflight read
# these, so a setting added here reaches both (preflight once read seven of them, and refused a stack whose
# networkPolicy.scrapers made its external prometheusUrl valid)
SETTINGS_KEYS = ("cluster", "gateway", "namespace", "prometheusUrl", "monitorLabels", "weightReplication",
                 "s3GatewayEndpoint", "monitoring", "qualityRecorderImage", "networkPolicy")


def stack_settings(config: Mapping[str, Any], source: str) -> StackSettings:
    """Settings from the non-input config keys (`cluster`, `gateway`, `namespace`, `prometheusUrl`, `monitorLabels`,
    `weightReplication`, `s3GatewayEndpoint`, `monitoring`, `qualityRecorderImage`, `networkPolicy`)."""
    if config.get("cluster") is None:
        raise InputError(
            f"{source}: missing config key 'cluster'; set it to {{mode: existing, name, nodeRoleArn, subnetIds}} "
            "or {mode: create, name, subnetIds} (see README)"
        )
    # a value written {value: ...} (`pulumi config set --path`) is read as the value, as the inputs are
    body = {k: _unwrap_value(v) for k, v in config.items() if v is not None}
    try:
        return StackSettings.model_validate(body)
    except ValidationError as e:
        raise InputError(format_validation_error(e, source, StackSettings)) from None


def _stack_config(path: Path) -> dict[str, Any]:
    """Another stack file's `config` mapping ({} when it has none), through the bounded reader every stack file
    goes through (size, depth, alias bombs, recursive aliases, huge integers): libyaml's parser read it 28 ms
    faster but built whatever the file held."""
    from topology.reading import read_document

    loaded = read_document(path)
    doc = loaded.get("config") if isinstance(loaded, dict) else None
    return doc if isinstance(doc, dict) else {}


def _replication_of(path: Path) -> Any:
    """Another stack file's `<project>:weightReplication` value (None when it has none)."""
    return next((v for k, v in _stack_config(path).items() if str(k).endswith(":weightReplication")), None)


def check_replication_owner(settings: StackSettings, stack: str, project_root: Path) -> None:
    """A stack that does not own the replication configuration must be one of its owner's destinations: else no
    stack declares a rule for its caches, and new revisions never reach them (the stacks' `up`s all pass)."""
    wr = settings.weight_replication
    if wr is None:
        return
    if wr.owner_stack == stack:
        # another stack that owns the configuration too and serves this one: the two `up`s overwrite the bucket's
        # one replication configuration in turn
        for other_path in sorted((project_root / "stacks").glob("Pulumi.*.yaml")):
            other = other_path.name.removeprefix("Pulumi.").removesuffix(".yaml")
            if other == stack:
                continue
            theirs = _replication_of(other_path)
            if (isinstance(theirs, dict) and theirs.get("ownerStack") == other
                    and stack in (theirs.get("destinationStacks") or [])):
                raise InputError(f"llm-serving:weightReplication.ownerStack is {stack!r} (this stack), but {other!r} "
                                 f"owns the replication configuration too and lists {stack!r} among its "
                                 f"destinationStacks ({other_path}): S3 keeps one configuration a bucket, and each "
                                 f"stack's up would overwrite the other's; set ownerStack: {other}")
        return
    path = project_root / "stacks" / f"Pulumi.{wr.owner_stack}.yaml"
    if not path.exists():
        raise InputError(f"llm-serving:weightReplication.ownerStack names {wr.owner_stack!r}, but {path} does not "
                         "exist: name the stack that declares the source bucket's replication configuration")
    owner = _replication_of(path)
    if isinstance(owner, dict) and owner.get("ownerStack") != wr.owner_stack:
        # the named owner names another owner: no stack declares the configuration at all
        raise InputError(f"llm-serving:weightReplication.ownerStack is {wr.owner_stack!r}, but that stack's own "
                         f"ownerStack is {owner.get('ownerStack')!r} ({path}): no stack would declare the replication "
                         "configuration; name the stack that owns it")
    dests = owner.get("destinationStacks") if isinstance(owner, dict) else None
    if not isinstance(dests, list) or stack not in dests:
        raise InputError(f"llm-serving:weightReplication.ownerStack is {wr.owner_stack!r}, whose destinationStacks "
                         f"({dests!r} in {path}) do not list {stack!r}: no stack would replicate new weight revisions "
                         f"to this stack's caches; add {stack!r} there")


def replication_destinations(settings: StackSettings, stack: str, spec: TopologySpec, project_root: Path) -> tuple[WeightCacheSpec, ...]:
    """The weight caches the owner's replication configuration serves: its own, and those of every stack in
    `destinationStacks`, planned from their stack files (same source bucket only; each bucket once)."""
    from topology.loading import inputs_from_document
    from topology.plan import plan

    caches = {c.bucket_name: c for c in spec.weight_caches}
    wr = settings.weight_replication
    for other in (wr.destination_stacks if wr else ()):
        if other == stack:
            continue
        path = project_root / "stacks" / f"Pulumi.{other}.yaml"
        if not path.exists():
            raise InputError(f"llm-serving:weightReplication.destinationStacks names {other!r}, but {path} does not exist")
        doc = _stack_config(path)
        key = next((k for k in doc if k.endswith(":inputs")), None)
        if key is None:
            raise InputError(f"{path}: no '<project>:inputs' key to plan the weight caches of stack {other!r}")
        for c in plan(inputs_from_document(doc[key], f"{path} {key}", project_root)).weight_caches:
            if c.source_bucket == spec.weight_caches[0].source_bucket:
                caches.setdefault(c.bucket_name, c)
    return tuple(caches[b] for b in sorted(caches))
