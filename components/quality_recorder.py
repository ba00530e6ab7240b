"""QualityRecorder: writes the gateway's sampled exchanges into the evaluation sink, per model version.

Issue #16 item 6 (the doctrine's "quality drift needs its own detector"): the gateway samples a share of
production exchanges per model version (`rollout.quality_sampling.sample_fraction`) and posts each, after
the user got all of it, to this service (recorder/app.py). It runs off the user's path as its own
Deployment: a Service the gateway's loopback `quality_records` frontend forwards to, a ServiceAccount bound
by EKS Pod Identity to a role that may only `s3:PutObject` under the exact per-version prefixes the spec
names (`quality_sampling.prefixes`: <sink_uri><endpoint>/<version>/), the config those prefixes come from,
and a PodMonitor for its counters (received, written, dropped by reason).

The sink bucket belongs to the evaluation pipeline and is named in the stack (`sink_uri`); keep it in the
cluster's region (the recorder's S3 client uses that region), so customers' prompts stay in the region.
The image is built from recorder/Dockerfile and named by the stack's `qualityRecorderImage`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
from pulumi_aws import eks, iam

from topology.spec import EndpointSpec, TopologySpec

from ._common import TYPE_PREFIX, child, restricted_security_context
from .gateway_config import QUALITY_MAX_CAPTURE_BYTES, gated_endpoints, quality_capture_bytes, quality_sampling
from .network_policy import Admitted, ingress_policy_spec

RECORDER_NAME = "quality-recorder"
RECORDER_PORT = 8080
RECORDER_UID = 10001  # the image's USER (recorder/Dockerfile), numeric so the kubelet can check runAsNonRoot
WRITER_POLICY_NAME = "write-quality-prefixes"
CONFIG_DIR = "/etc/quality-recorder"
QUEUE_BUDGET_BYTES = 256 << 20  # worst-case exchanges waiting in memory (each up to max_exchange_bytes)
BATCH_MAX_RECORDS = 50
BATCH_MAX_AGE_S = 30.0
UPLOAD_TIMEOUT_S = 10.0

_POD_IDENTITY_ASSUME = json.dumps({
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"},
                   "Action": ["sts:AssumeRole", "sts:TagSession"]}],
}, sort_keys=True)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/prefix/ -> (bucket, "prefix/")."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    return bucket, key


def sampled_endpoints(spec: TopologySpec) -> list[EndpointSpec]:
    """Gated endpoints whose rollout samples quality (managed_api endpoints are not behind the gateway)."""
    return [e for e in gated_endpoints(spec) if quality_sampling(e) is not None]


def _identity(e: EndpointSpec, version: str) -> dict[str, str]:
    r = e.rollout
    v = r.incumbent if version == r.incumbent.version else r.candidate
    return {"identity_sha256": v.identity_sha256, "weights_revision": v.weights_revision,
            "engine_image": v.engine_image, "engine_settings_sha256": v.engine_settings_sha256}


def max_exchange_bytes(spec: TopologySpec) -> int:
    """The largest post the gateway can send: a whole request body and a full capture, plus header room."""
    eps = sampled_endpoints(spec)
    if not eps:
        return QUALITY_MAX_CAPTURE_BYTES
    return max(e.gateway.max_request_body_bytes + quality_capture_bytes(e) for e in eps) + 65536


def recorder_config(spec: TopologySpec, *, region: str, port: int = RECORDER_PORT,
                    pod_name: str = RECORDER_NAME) -> dict[str, Any]:
    """The recorder's JSON config, from the spec alone: each sampled version's bucket, prefix and identity."""
    versions: dict[str, dict[str, dict[str, Any]]] = {}
    for e in sampled_endpoints(spec):
        for version, uri in e.rollout.quality_sampling.prefixes.items():
            bucket, prefix = split_s3_uri(uri)
            versions.setdefault(e.name, {})[version] = {"bucket": bucket, "prefix": prefix,
                                                        "identity": _identity(e, version)}
    biggest = max_exchange_bytes(spec)
    return {
        "region": region, "port": port, "pod_name": pod_name, "versions": versions,
        "batch_max_records": BATCH_MAX_RECORDS, "batch_max_age_s": BATCH_MAX_AGE_S,
        "queue_max_records": max(16, QUEUE_BUDGET_BYTES // biggest), "max_exchange_bytes": biggest,
        "upload_timeout_s": UPLOAD_TIMEOUT_S,
    }


def writer_policy(config: Mapping[str, Any]) -> str:
    """Put objects under exactly the sampled versions' prefixes: no read, no list, no delete, nothing else."""
    arns = sorted({f"arn:aws:s3:::{v['bucket']}/{v['prefix']}*"
                   for versions in config["versions"].values() for v in versions.values()})
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Sid": "WriteQualitySamples", "Effect": "Allow", "Action": ["s3:PutObject"], "Resource": arns}],
    }, sort_keys=True)


BLIND_ALERT = "QualitySamplingBlind"
BLIND_WINDOW = "1h"
BLIND_FOR = "30m"


def quality_alert_group(namespace: str) -> dict[str, Any]:
    """The evaluation sink going blind: exchanges were sampled (the recorder accepted them, or the gateway
    dropped them) for an hour and nothing was written. Serving metrics stay healthy meanwhile, and so would
    the drift detector's dashboards, from stale samples. A counter that has never moved has no series (the
    gateway exports its counters once they move), hence `or vector(0)`."""
    sel = f'{{namespace="{namespace}"}}'

    def moved(metric: str) -> str:
        return f"(sum(increase({metric}{sel}[{BLIND_WINDOW}])) or vector(0))"

    expr = (f"({moved('llm_gateway_quality_sampled_total')} + {moved('llm_gateway_quality_dropped_total')}) > 0 "
            f"and {moved('llm_quality_records_written_total')} == 0")
    return {"name": "quality-sampling", "rules": [{
        "alert": BLIND_ALERT, "expr": expr, "for": BLIND_FOR,
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": f"No quality sample reached the evaluation sink in {BLIND_WINDOW} while exchanges were sampled",
            "description": "The gateway sampled exchanges but the recorder wrote none: see "
                           "llm_gateway_quality_dropped_total{reason} (recorder unreachable or its queue full) and "
                           "llm_quality_records_dropped_total{reason} (upload_failed: the sink bucket, its region, "
                           "the recorder's role). Output quality is not being watched.",
        },
    }]}


def recorder_service_dns(namespace: str) -> str:
    return f"{RECORDER_NAME}.{namespace}.svc.cluster.local"


@dataclass(frozen=True)
class QualityRecorderArgs:
    spec: TopologySpec
    namespace: str
    image: str  # built from recorder/Dockerfile (stack config `qualityRecorderImage`)
    cluster_name: pulumi.Input[str]
    region: str  # the cluster's region: the S3 client's, and the Pod Identity association's
    replicas: int = 2  # a restart or a drained node loses no sampling; each pod queues on its own
    cpu_request: str = "250m"
    # queue budget (QUEUE_BUDGET_BYTES) + open batches + Python; the limit is what a full queue can reach
    memory_request: str = "256Mi"
    memory_limit: str = "1Gi"
    monitor_labels: Mapping[str, str] = field(default_factory=dict)
    admitted: Admitted | None = None  # who may send records (a NetworkPolicy); None: any pod in the cluster


class QualityRecorder(pulumi.ComponentResource):
    service_dns: str
    port: int

    def __init__(self, name: str, args: QualityRecorderArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        if not sampled_endpoints(args.spec):
            raise ValueError("QualityRecorder: no endpoint of the spec samples quality (rollout.quality_sampling)")
        if args.replicas < 1:
            raise ValueError(f"QualityRecorder replicas must be >= 1, got {args.replicas}")
        if not args.image or ":" not in args.image.rsplit("/", 1)[-1] and "@" not in args.image:
            raise ValueError(f"QualityRecorder image {args.image!r} must carry a tag or digest (recorder/Dockerfile)")
        super().__init__(f"{TYPE_PREFIX}:QualityRecorder", name, None, opts)
        ns = args.namespace
        config = recorder_config(args.spec, region=args.region)
        config_text = json.dumps(config, indent=2, sort_keys=True)
        labels = {"app.kubernetes.io/name": RECORDER_NAME, "app.kubernetes.io/instance": name,
                  "app.kubernetes.io/component": "quality-sampling"}
        meta = {"name": RECORDER_NAME, "namespace": ns, "labels": labels}

        account = k8s.core.v1.ServiceAccount(f"{name}-service-account", metadata=meta, opts=child(self))
        sinks = sorted({f"s3://{v['bucket']}/{v['prefix']}" for vs in config["versions"].values() for v in vs.values()})
        role = iam.Role(f"{name}-role", description=f"put quality samples under {', '.join(sinks)}"[:1000],
                        assume_role_policy=_POD_IDENTITY_ASSUME, opts=child(self))
        iam.RolePolicy(f"{name}-role-policy", role=role.id, name=WRITER_POLICY_NAME, policy=writer_policy(config),
                       opts=child(self))
        # the role holds exactly this inline policy: one added out of band is removed on the next `up`
        iam.RolePoliciesExclusive(f"{name}-role-policies", role_name=role.name, policy_names=[WRITER_POLICY_NAME],
                                  opts=child(self))
        identity = eks.PodIdentityAssociation(
            f"{name}-pod-identity", cluster_name=args.cluster_name, region=args.region, namespace=ns,
            service_account=RECORDER_NAME, role_arn=role.arn, opts=child(self, depends_on=[account]),
        )
        # named by its content and immutable, as the gateway's: under one fixed name a new config replaced the
        # ConfigMap delete-first (pulumi-kubernetes replaces a ConfigMap's data), and a recorder pod restarting in
        # that gap could not mount it; now the new one exists before the pods roll onto it and the old one goes last
        config_sha = hashlib.sha256(config_text.encode()).hexdigest()
        config_map = k8s.core.v1.ConfigMap(f"{name}-config", metadata={**meta, "name": f"{RECORDER_NAME}-{config_sha[:10]}"},
                                           immutable=True, data={"config.json": config_text}, opts=child(self))
        probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3}
        deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata=meta,
            spec={
                "replicas": args.replicas,
                "selector": {"matchLabels": labels},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                "template": {
                    "metadata": {"labels": labels, "annotations": {
                        "serving.llm/config-sha256": config_sha[:16]}},
                    "spec": {
                        "serviceAccountName": RECORDER_NAME,
                        # a stopping pod uploads what it accepted, within one upload timeout
                        "terminationGracePeriodSeconds": int(UPLOAD_TIMEOUT_S) + 20,
                        "topologySpreadConstraints": [{
                            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": labels},
                        }],
                        "containers": [{
                            "name": "recorder",
                            "image": args.image,
                            "args": ["--config", f"{CONFIG_DIR}/config.json"],
                            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                    {"name": "AWS_REGION", "value": args.region}],
                            "ports": [{"name": "http", "containerPort": RECORDER_PORT, "protocol": "TCP"}],
                            "readinessProbe": probe,
                            "livenessProbe": {**probe, "failureThreshold": 6},
                            "resources": {
                                "requests": {"cpu": args.cpu_request, "memory": args.memory_request},
                                "limits": {"memory": args.memory_limit},
                            },
                            "securityContext": restricted_security_context(RECORDER_UID, RECORDER_UID),
                            "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                                             {"name": "tmp", "mountPath": "/tmp"}],
                        }],
                        "volumes": [{"name": "config", "configMap": {"name": config_map.metadata["name"]}},
                                    {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
                    },
                },
            },
            opts=child(self, depends_on=[identity]),
        )
        k8s.policy.v1.PodDisruptionBudget(f"{name}-pdb", metadata=meta,
                                          spec={"minAvailable": 1, "selector": {"matchLabels": labels}},
                                          opts=child(self))
        if args.admitted is not None:
            k8s.networking.v1.NetworkPolicy(f"{name}-network-policy", metadata=meta,
                                            spec=ingress_policy_spec(labels, RECORDER_PORT, args.admitted),
                                            opts=child(self))
        service = k8s.core.v1.Service(
            f"{name}-service", metadata=meta,
            spec={"type": "ClusterIP", "selector": labels,
                  "ports": [{"name": "http", "port": RECORDER_PORT, "targetPort": "http", "protocol": "TCP"}]},
            opts=child(self, depends_on=[deployment]),
        )
        k8s.apiextensions.CustomResource(
            f"{name}-pod-monitor", api_version="monitoring.coreos.com/v1", kind="PodMonitor",
            metadata={**meta, "labels": {**labels, **args.monitor_labels}},
            spec={"selector": {"matchLabels": labels},
                  "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "30s"}]},
            opts=child(self),
        )
        k8s.apiextensions.CustomResource(
            f"{name}-rules", api_version="monitoring.coreos.com/v1", kind="PrometheusRule",
            metadata={**meta, "labels": {**labels, **args.monitor_labels}},
            spec={"groups": [quality_alert_group(ns)]},
            opts=child(self),
        )
        self.service_dns = recorder_service_dns(ns)
        self.port = RECORDER_PORT
        self.register_outputs({
            "service_name": service.metadata["name"],
            "role_arn": role.arn,
            "sinks": sinks,
        })
