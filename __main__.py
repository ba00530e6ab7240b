"""The Pulumi program: stack config → cost inputs → plan → components → exports. The only shell.

`pulumi up -s prod` on a machine with AWS credentials; `python -m topology render stacks/Pulumi.prod.yaml
--out DIR` runs this same file under Pulumi's mocks and writes what it would declare.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pulumi

from components.cluster import Cluster, ClusterArgs
from components.floor_replicas import FloorReplicas, FloorReplicasArgs, canary_weights_prefix, previous_weights_prefix
from components.gateway import Gateway, GatewayArgs
from components.gpu_node_pool import GpuNodePool, GpuNodePoolArgs
from components.gpu_operator import GpuOperator, GpuOperatorArgs
from components.keda import Keda
from components.modal_burst import ModalBurst, ModalBurstArgs, code_sha256, default_python, modal_token_env
from components.observability import Observability, ObservabilityArgs
from components.stack_settings import stack_settings
from components.weight_cache import WeightCache, WeightCacheArgs, WeightReader
from components.weight_replication import WeightReplication, WeightReplicationArgs
from topology.loading import inputs_from_document
from topology.plan import plan

PROJECT_ROOT = Path(__file__).resolve().parent
config = pulumi.Config()
source = f"stack {pulumi.get_stack()} config"

# ── inputs → spec ──────────────────────────────────────────────────────────────────────────────
inputs = inputs_from_document(config.require_object("inputs"), f"{source} {config.name}:inputs", PROJECT_ROOT)
# the planning date decides whether a promoted rollout still keeps its previous version warm: the clock is read
# here, in the shell, never in the planner; `pulumi config set planningDate YYYY-MM-DD` pins it (reviews, renders)
_planning_date = config.get("planningDate")
try:
    planning_date = dt.date.fromisoformat(_planning_date) if _planning_date else dt.datetime.now(dt.timezone.utc).date()
except ValueError:
    raise ValueError(f"{source} {config.name}:planningDate={_planning_date!r}: must be a date, YYYY-MM-DD") from None
spec = plan(inputs, planning_date=planning_date)
settings = stack_settings(
    {
        "cluster": config.get_object("cluster"),
        "namespace": config.get("namespace"),
        "prometheusUrl": config.get("prometheusUrl"),
        "monitorLabels": config.get_object("monitorLabels"),
    },
    source,
)

# ── cluster ────────────────────────────────────────────────────────────────────────────────────
cluster = Cluster(
    "cluster",
    ClusterArgs(
        settings=settings.cluster,
        region=spec.cluster_region,
        serving_namespace=settings.namespace,
        kubeconfig=config.get_secret("kubeconfig"),  # `pulumi config set --secret kubeconfig ...`; never plain
    ),
)
k8s_opts = pulumi.ResourceOptions(providers={"kubernetes": cluster.provider}, depends_on=[cluster])

# ── GPU node pools and the operator that partitions them ───────────────────────────────────────
node_pools = {
    p.name: GpuNodePool(
        f"pool-{p.name}",
        GpuNodePoolArgs(pool=p, cluster_name=cluster.name, node_role_arn=cluster.node_role_arn, subnet_ids=cluster.subnet_ids),
    )
    for p in spec.node_pools
}
gpu_operator = (
    GpuOperator("gpu-operator", GpuOperatorArgs(node_pools=spec.node_pools), opts=k8s_opts) if spec.node_pools else None
)

# ── region-local weight caches ─────────────────────────────────────────────────────────────────
floor_endpoints = [e for e in spec.endpoints if e.node_pools]
weight_caches = {}
for cache in spec.weight_caches:
    readers = [
        WeightReader(
            endpoint=e.name, namespace=settings.namespace, service_account=f"{e.name}-vllm",
            prefixes=tuple(p for p in (e.engine.weights_uri_suffix, canary_weights_prefix(e, cache),
                                       previous_weights_prefix(e, cache)) if p),
        )
        for e in floor_endpoints
        if cache.region == spec.cluster_region
    ]
    weight_caches[cache.region] = WeightCache(
        f"weights-{cache.region}",
        WeightCacheArgs(cache=cache, cluster_name=cluster.name, cluster_region=spec.cluster_region, readers=readers),
    )
if spec.weight_caches:
    WeightReplication(
        "weights-replication",
        WeightReplicationArgs(
            source_bucket=spec.weight_caches[0].source_bucket,
            source_region=spec.weight_caches[0].source_region,
            caches=spec.weight_caches,
        ),
        opts=pulumi.ResourceOptions(depends_on=[c.versioning for c in weight_caches.values()]),
    )

# ── floor replicas (dedicated pools), autoscaled by KEDA ───────────────────────────────────────
floors: dict[str, FloorReplicas] = {}
if floor_endpoints:
    keda = Keda("keda", opts=k8s_opts)
    for e in floor_endpoints:
        cache = spec.weight_cache(spec.cluster_region)
        pools = [p for p in spec.node_pools if p.name in e.node_pools]
        floors[e.name] = FloorReplicas(
            f"floor-{e.name}",
            FloorReplicasArgs(
                endpoint=e,
                node_pools=pools,
                weights_uri=cache.uri(e.engine.weights_uri_suffix),
                canary_weights_uri=cache.uri(canary) if (canary := canary_weights_prefix(e, cache)) else None,
                previous_weights_uri=cache.uri(prev) if (prev := previous_weights_prefix(e, cache)) else None,
                namespace=settings.namespace,
                prometheus_url=settings.prometheus_url,
                monitor_labels=settings.monitor_labels,
            ),
            opts=pulumi.ResourceOptions(
                providers={"kubernetes": cluster.provider},
                depends_on=[cluster, keda, weight_caches[spec.cluster_region].pod_identity[e.name],
                            *(node_pools[p.name] for p in pools), *([gpu_operator] if gpu_operator else [])],
            ),
        )

# ── alerts: the doctrine's vLLM alerts for each endpoint with floor replicas ────────────────────
if floor_endpoints:
    Observability(
        "observability",
        ObservabilityArgs(spec=spec, namespace=settings.namespace, monitor_labels=settings.monitor_labels),
        opts=k8s_opts,
    )

# ── burst capacity on Modal, and the gateway that overflows to it ─────────────────────────────
# Each endpoint with burst capacity gets its Modal app (deployed by a local command; token from secret
# config or the environment). The gateway sends each endpoint's traffic to its floor replicas while they
# have room and overflows to the burst URL; managed_api endpoints are called at the provider directly.
# what the deploy reads from this machine (the app's sources, the token, the interpreter), read once here
burst_endpoints = [e for e in spec.endpoints if e.burst is not None]
burst_code_sha256 = code_sha256() if burst_endpoints else ""
burst_token_env = modal_token_env() if burst_endpoints else {}
bursts = {
    e.name: ModalBurst(f"{e.name}-burst", ModalBurstArgs(
        endpoint=e, environment=spec.environment, python=default_python(), code_sha256=burst_code_sha256,
        token_env=burst_token_env,
    ))
    for e in burst_endpoints
}
gateway = None
if any(e.gated for e in spec.endpoints):
    gateway = Gateway(
        "gateway",
        GatewayArgs(
            spec=spec,
            namespace=settings.namespace,
            floor_services={n: f.pods_dns for n, f in floors.items()},
            canary_services={n: f.canary_pods_dns for n, f in floors.items() if f.canary_pods_dns},
            burst_urls={n: b.url for n, b in bursts.items()},
            monitor_labels=settings.monitor_labels,
        ),
        opts=k8s_opts,
    )

# ── exports ────────────────────────────────────────────────────────────────────────────────────
pulumi.export("spec", json.loads(spec.to_json()))
pulumi.export("specSha256", spec.sha256())
pulumi.export("costReport", {
    "pricesAsOf": spec.prices_as_of.isoformat(),
    "monthlyUsdTotal": spec.monthly_usd_total,
    "monthlyUsdByTier": spec.monthly_usd_by_tier,
    "endpoints": {
        e.name: {"tier": e.tier, "monthlyUsd": e.monthly_usd, "runnerUp": e.runner_up, "whyRunnerUpLost": e.why_runner_up_lost}
        for e in spec.endpoints
    },
    "warnings": list(spec.warnings),
})
pulumi.export("weightBuckets", {region: c.bucket_name for region, c in weight_caches.items()})
pulumi.export("weightUris", {
    e.name: {c.region: c.uri(e.engine.weights_uri_suffix) for c in spec.weight_caches if e.engine.weights_uri_suffix in c.model_prefixes}
    for e in spec.endpoints
})
pulumi.export("endpoints", {
    e.name: {"tier": e.tier, "servedModelName": e.engine.served_model_name,
             "floorService": floors[e.name].service_dns if e.name in floors else None,
             "floorPods": floors[e.name].pods_dns if e.name in floors else None,
             "canaryPods": floors[e.name].canary_pods_dns if e.name in floors else None,
             "previousPods": floors[e.name].previous_pods_dns if e.name in floors else None}
    for e in spec.endpoints
})
pulumi.export("burstUrls", {name: b.url for name, b in bursts.items()})
if gateway is not None:
    pulumi.export("gateway", {"service": gateway.service_name, "ports": gateway.ports})
pulumi.export("clusterName", cluster.name)
