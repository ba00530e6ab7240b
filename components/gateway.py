"""Gateway: HAProxy in front of the floor replicas, overflowing to the Modal burst apps.

The configuration is rendered by components/gateway_config.py from the spec (the same text the
loopback tests run). This component only places it: a ConfigMap (haproxy.cfg + gateway.lua), a
Deployment of the official HAProxy image (pinned to the version the tests run), replicated with a
PDB and spread over nodes, and a Service with one port per gated endpoint. API keys, cache salts and
Modal's proxy-auth token reach HAProxy as environment variables from Kubernetes Secrets
(`secretKeyRef`), which HAProxy expands at start-up: they are never in the ConfigMap or the state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from topology.spec import TopologySpec

from ._common import TYPE_PREFIX, child, restricted_security_context
from .gateway_config import (
    CONFIG_FILE,
    ClientLimits,
    LUA_FILE,
    MODAL_KEY_ENV,
    MODAL_SECRET_ENV,
    STATS_PORT,
    HAPROXY_IMAGE,
    DnsServers,
    HaproxyImage,
    RenderedGateway,
    endpoint_ports,
    env_name,
    gated_endpoints,
    longest_request_s,
    needs_burst,
    needs_floor,
    quality_sampling,
    render_gateway_config,
)

CONFIG_DIR = "/usr/local/etc/haproxy"


def gateway_pod_labels(name: str) -> dict[str, str]:
    """The labels of the gateway's pods (Gateway `name`): what the engines' and the recorder's NetworkPolicies admit."""
    return {"app.kubernetes.io/name": "haproxy", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": "gateway"}


@dataclass(frozen=True)
class GatewayArgs:
    spec: TopologySpec
    namespace: str
    # endpoint -> DNS name of a *headless* Service of its floor pods (one A record per pod, so the
    # gateway counts in-flight per replica); dedicated_only and floor_plus_burst endpoints.
    floor_services: Mapping[str, str]
    # endpoint -> Modal web URL (ModalBurst output); floor_plus_burst and serverless_only endpoints.
    burst_urls: Mapping[str, pulumi.Input[str]]
    # endpoint -> headless Service of the canary revision's pods, when the spec has a canary.
    canary_services: Mapping[str, str] = field(default_factory=dict)
    # endpoint -> Secret holding its tenants' API keys and cache salts (keys named by TenantSpec)
    tenant_secret_names: Mapping[str, str] = field(default_factory=dict)
    modal_auth_secret_name: str = "modal-proxy-auth"  # keys: modal-key, modal-secret
    # Each pod enforces 1/replicas of the per-replica overflow threshold (it sees only its own
    # in-flight requests); change replicas, not a per-pod figure, to scale the gateway.
    replicas: int = 2
    # tag, numeric user and trust store together (gateway_config.HAPROXY_IMAGE, checked upstream)
    image: HaproxyImage = HAPROXY_IMAGE
    # per-client limits against slow-connection floods; `source` must say how client addresses reach the pods
    # ("src", "proxy_protocol" or "xff": see gateway_config.ClientLimits)
    client_limits: ClientLimits = ClientLimits()
    # False: `pulumi up` does not wait for the pods to be ready (pulumi.com/skipAwait), for a cluster created in the
    # same `up`, which holds none of the Secrets the pods read yet
    await_ready: bool = True
    # endpoint -> the port clients reach it on (stack_settings.gateway_ports: llm-serving:gateway.ports); None: by
    # position from 8080, which moves an endpoint's port when another is added or removed before it
    ports: Mapping[str, int] | None = None
    cpu_request: str = "1"  # HAProxy runs one thread (see gateway_config)
    memory_request: str = "512Mi"
    # HAProxy holds up to 2 buffers of tune.bufsize (~208 KiB for prod) per active stream; the
    # renderer's global maxconn (prod 4090: the endpoints' 4000 split between them, the loopback frontends' 40 and
    # the probes' 50) x 2 x 208 KiB ~ 1.6 GiB fits under this limit
    memory_limit: str = "2Gi"
    # labels the Prometheus operator selects PodMonitors by (the floors' burst-backlog trigger reads the
    # gateway's own exporter)
    monitor_labels: Mapping[str, str] = field(default_factory=dict)
    # "host:port" of the quality recorder's Service (QualityRecorder), when an endpoint samples quality
    quality_recorder: str | None = None


# seconds a stopping gateway pod keeps listening before HAProxy's soft-stop (the floor's PRESTOP_SLEEP_S)
GATEWAY_PRESTOP_SLEEP_S = 10
# A new gateway pod is sent no client before this: its address reaches the engines' and the recorder's
# NetworkPolicies (components/network_policy.py) only once the policy controller and each engine node's agent have
# programmed it (seconds; until then its connections to the engines are dropped), and a floor server whose first
# checks were dropped is DOWN until two checks pass (rise 2 × inter 2 s). Rolls take as long more per pod.
GATEWAY_READY_AFTER_S = 15

def tenant_secret_name(endpoint: str) -> str:
    return f"{endpoint}-gateway-tenants"


class Gateway(pulumi.ComponentResource):
    config_map_name: pulumi.Output[str]
    service_name: pulumi.Output[str]
    ports: dict[str, int]

    def __init__(self, name: str, args: GatewayArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        if args.replicas < 2:
            raise ValueError(f"Gateway replicas must be >= 2 (one may be drained), got {args.replicas}")
        eps = gated_endpoints(args.spec)
        for e in eps:
            if needs_floor(e) and e.name not in args.floor_services:
                raise ValueError(f"Gateway: endpoint {e.name!r} ({e.tier}) needs floor_services[{e.name!r}]")
            if needs_burst(e) and e.name not in args.burst_urls:
                raise ValueError(f"Gateway: endpoint {e.name!r} ({e.tier}) needs burst_urls[{e.name!r}]")
        super().__init__(f"{TYPE_PREFIX}:Gateway", name, None, opts)

        spec, ns = args.spec, args.namespace
        floor = {
            e.name: DnsServers(args.floor_services[e.name], e.engine.port, _slots(e))
            for e in eps if needs_floor(e)
        }
        canary = {e: DnsServers(host, args.spec.endpoint(e).engine.port, _slots(args.spec.endpoint(e)))
                  for e, host in args.canary_services.items()}
        burst_names = [e.name for e in eps if needs_burst(e)]
        urls = pulumi.Output.all(*[args.burst_urls[n] for n in burst_names])
        sampled = [e.name for e in eps if quality_sampling(e) is not None]
        quality = None
        if sampled:
            if not args.quality_recorder:
                raise ValueError(f"Gateway: endpoints {sampled} sample quality; quality_recorder (host:port) is required")
            host, _, port = args.quality_recorder.rpartition(":")
            quality = DnsServers(host, int(port), 1)  # a ClusterIP Service: one address, balanced by kube-proxy

        def render(values: list[str]) -> RenderedGateway:
            # ModalBurst's url is "" until a deploy printed its record: say so, and render a burst
            # backend without a server (JSON 503) rather than guess an address
            missing = [n for n, v in zip(burst_names, values) if not v]
            if missing:
                pulumi.log.warn(f"Gateway: no Modal URL for {missing}; their burst traffic gets 503 until deployed",
                                resource=self)
            urls = {n: (v or None) for n, v in zip(burst_names, values)}
            return render_gateway_config(spec, burst_urls=urls, floor_servers=floor,
                                         canary_servers=canary, lua_path=f"{CONFIG_DIR}/{LUA_FILE}",
                                         gateway_replicas=args.replicas, ca_path=args.image.ca_dir,
                                         client_limits=args.client_limits, quality_servers=quality,
                                         ports=args.ports)

        rendered = urls.apply(render)
        self.ports = endpoint_ports(spec, args.ports)
        secret_env = _secret_env(spec, floor, canary, burst_names, quality)

        app = f"{name}-haproxy"
        labels = gateway_pod_labels(name)
        meta = {"name": app, "namespace": ns, "labels": labels}

        config_hash = rendered.apply(
            lambda r: hashlib.sha256("".join(r.files[k] for k in sorted(r.files)).encode()).hexdigest()[:16])
        # named by its content and immutable: a new config is a new ConfigMap, created before the old one is
        # deleted (Pulumi's default for a replacement under another name) and mounted only by the new pods. Under
        # one fixed name, pulumi-kubernetes deleted and recreated it (its data is replaced, not patched, unless the
        # provider enables mutable ConfigMaps), and the kubelet wrote the new file into the old pods' volume: an old
        # pod restarting before the rollout reached it loaded the new config with its old environment
        config_map = k8s.core.v1.ConfigMap(
            f"{name}-config",
            metadata={**meta, "name": config_hash.apply(lambda h: f"{app}-{h[:10]}")},
            immutable=True,
            data=rendered.apply(lambda r: {CONFIG_FILE: r.files[CONFIG_FILE], LUA_FILE: r.files[LUA_FILE]}),
            opts=child(self),
        )

        env = []
        owners = _env_owners(eps)
        for var, key in sorted(secret_env.items()):
            if var in (MODAL_KEY_ENV, MODAL_SECRET_ENV):
                secret = args.modal_auth_secret_name
            else:
                endpoint = _endpoint_of(var, owners)
                secret = args.tenant_secret_names.get(endpoint, tenant_secret_name(endpoint))
            env.append({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})

        ports = [{"name": f"ep-{i}", "containerPort": p, "protocol": "TCP"}
                 for i, p in enumerate(self.ports.values())]
        ports.append({"name": "stats", "containerPort": STATS_PORT, "protocol": "TCP"})
        probe = {"httpGet": {"path": "/healthz", "port": "stats"}, "periodSeconds": 5, "failureThreshold": 3}

        deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata=meta if args.await_ready else {**meta, "annotations": {
                **meta.get("annotations", {}), "pulumi.com/skipAwait": "true"}},
            spec={
                "replicas": args.replicas,
                "selector": {"matchLabels": labels},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                "template": {
                    # a new config rolls the pods (HAProxy reads secrets and config at start-up)
                    "metadata": {"labels": labels, "annotations": {"serving.llm/config-sha256": config_hash}},
                    "spec": {
                        # streams in flight may finish when a pod is replaced (haproxy soft-stops
                        # on the image's STOPSIGNAL, SIGUSR1; hard-stop-after bounds it), after the preStop
                        "terminationGracePeriodSeconds": GATEWAY_PRESTOP_SLEEP_S + longest_request_s(spec) + 30,
                        "topologySpreadConstraints": [{
                            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": labels},
                        }],
                        "containers": [{
                            "name": "haproxy",
                            "image": args.image.tag,
                            "args": ["haproxy", "-W", "-db", "-f", f"{CONFIG_DIR}/{CONFIG_FILE}"],
                            "env": env,
                            "ports": ports,
                            "readinessProbe": {**probe, "initialDelaySeconds": GATEWAY_READY_AFTER_S},
                            "livenessProbe": {**probe, "failureThreshold": 6},
                            "resources": {
                                "requests": {"cpu": args.cpu_request, "memory": args.memory_request},
                                "limits": {"memory": args.memory_limit},
                            },
                            # the image's `USER haproxy` is a name: the kubelet refuses a non-root
                            # check it cannot verify ("image has non-numeric user"), so state the uid
                            "securityContext": restricted_security_context(args.image.uid, args.image.gid),
                            "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
                            # the stop signal (SIGUSR1, the image's STOPSIGNAL) makes HAProxy unbind its ports
                            # at once (doc/management.txt, "soft-stop"), while the kubelet removes the pod from
                            # the Service's endpoints at the same moment and kube-proxy / the load balancer
                            # take seconds to stop sending it connections: those would be refused. Keep
                            # listening until they have (the kubelet's own sleep: no binary in the image)
                            "lifecycle": {"preStop": {"sleep": {"seconds": GATEWAY_PRESTOP_SLEEP_S}}},
                        }],
                        "volumes": [{"name": "config", "configMap": {"name": config_map.metadata["name"]}}],
                    },
                },
            },
            opts=child(self),
        )
        k8s.policy.v1.PodDisruptionBudget(
            f"{name}-pdb",
            metadata=meta,
            spec={"minAvailable": 1, "selector": {"matchLabels": labels}},
            opts=child(self),
        )
        service = k8s.core.v1.Service(
            f"{name}-service",
            metadata=meta,
            spec={
                "type": "ClusterIP",
                "selector": labels,
                # a Service port's name is a DNS-1123 label, unique in the Service (kubernetes
                # pkg/apis/core/validation validateServicePort): the endpoint's name is one, whole (cutting it
                # to a container port's 15 made 'support-en' and 'support-de' alike, or ended it in '-')
                "ports": [{"name": ep, "port": p, "targetPort": p, "protocol": "TCP"}
                          for ep, p in self.ports.items()],
            },
            opts=child(self, depends_on=[deployment]),
        )
        k8s.apiextensions.CustomResource(
            f"{name}-pod-monitor",
            api_version="monitoring.coreos.com/v1",
            kind="PodMonitor",
            metadata={**meta, "labels": {**labels, **args.monitor_labels}},
            spec={
                "selector": {"matchLabels": labels},
                "podMetricsEndpoints": [{"port": "stats", "path": "/metrics", "interval": "15s"},
                                        # what the gateway sampled and dropped for the evaluation sink
                                        # its own `endpoint` label: the operator labels both jobs' targets by
                                        # the port name alone, so their `up` series would collide
                                        *([{"port": "stats", "path": "/metrics/quality", "interval": "30s",
                                            "relabelings": [{"targetLabel": "endpoint",
                                                             "replacement": "stats-quality"}]}]
                                          if sampled else [])],
            },
            opts=child(self),
        )
        self.config_map_name = config_map.metadata["name"]
        self.service_name = service.metadata["name"]
        self.register_outputs({
            "config_map_name": self.config_map_name,
            "service_name": self.service_name,
            "deployment_name": deployment.metadata["name"],
            "endpoint_ports": self.ports,
            "config_sha256": config_hash,
        })


def _slots(e) -> int:
    """Server slots for the floor: the most replicas the autoscaler may run."""
    if e.autoscaling is not None:
        return e.autoscaling.max_replicas
    return max(e.floor.replicas_by_hour) if e.floor.replicas_by_hour else 1


def _secret_env(spec: TopologySpec, floor, canary, burst_names: list[str], quality) -> dict[str, str]:
    # Secret references depend on the spec only, not on the URLs: render with stand-ins to list them.
    stand_in = {n: "https://burst.invalid" for n in burst_names}
    return render_gateway_config(spec, burst_urls=stand_in, floor_servers=floor, canary_servers=canary,
                                 gateway_replicas=2, quality_servers=quality).secret_env


def _env_owners(eps) -> dict[str, str]:
    """Each tenant secret's environment variable -> its endpoint (the first in order that names it)."""
    owners: dict[str, str] = {}
    for e in eps:
        for t in e.gateway.tenants:
            owners.setdefault(env_name(e.name, t.api_key_secret_key), e.name)
            if t.cache_salt_secret_key:
                owners.setdefault(env_name(e.name, t.cache_salt_secret_key), e.name)
    return owners


def _endpoint_of(var: str, owners: dict[str, str]) -> str:
    if var not in owners:
        raise KeyError(f"environment variable {var} belongs to no endpoint's tenants")
    return owners[var]
