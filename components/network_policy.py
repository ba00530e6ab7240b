"""Ingress NetworkPolicies for the serving pods: who may open a connection to a vLLM engine or the quality recorder.

Without one any pod in the cluster reaches an engine's port, and vLLM 0.11.0's `--api-key` guards only paths under
/v1 (`AuthenticationMiddleware` in entrypoints/openai/api_server.py): /invocations (chat and completions for
SageMaker), /tokenize, /pooling, /classify, /score and /scale_elastic_ep answer anyone, and with runtime LoRA
updating so do adapter loads. The recorder would take forged quality records from any pod. So each is selected by a
policy admitting, on its serving port only:

* the stack's gateway pods (same namespace: a podSelector alone), the only client of either;
* the pods that scrape `/metrics` on that same port (vLLM serves it there; a PodMonitor scrapes the pod directly):
  the Prometheus that KEDA's queue trigger and every engine alert read. A selector that misses it empties both,
  and VllmFloorNotServing pages (components/observability.py).

Readiness, liveness and startup probes come from the kubelet on the pod's node, which Kubernetes NetworkPolicy
always admits; the warm-up probe runs inside the engine's container. Policies are enforced only where the CNI
enforces them: on EKS, the VPC CNI add-on with `enableNetworkPolicy` (components/cluster.py sets it on a cluster
the stack creates; on an existing cluster it is the platform's setting).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .stack_settings import ScraperSettings

# set by the API server on every Namespace (Kubernetes ≥ 1.22): selects a namespace by its name
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def _peer(s: ScraperSettings) -> dict:
    """A NetworkPolicy peer for a scraper: its address range, or its pods."""
    if s.cidr is not None:
        return {"ipBlock": {"cidr": s.cidr}}
    # namespaceSelector and podSelector in one element: those pods in that namespace (both must match)
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: s.namespace}},
            "podSelector": {"matchLabels": dict(s.pod_labels or {})}}


@dataclass(frozen=True)
class Admitted:
    """The clients a serving pod admits: the gateway's pods (in the serving namespace) and the scrapers."""

    gateway_pod_labels: Mapping[str, str]
    scrapers: Sequence[ScraperSettings]  # StackSettings.metrics_scrapers


def ingress_policy_spec(pod_labels: Mapping[str, str], port: int, admitted: Admitted) -> dict:
    """A NetworkPolicy spec selecting the pods with `pod_labels` and admitting the gateway and the scrapers to
    `port` (TCP) alone: every other connection to those pods is refused."""
    if not admitted.scrapers:
        raise ValueError("a serving pod's NetworkPolicy needs the pods that scrape its metrics (none given)")
    ports = [{"port": int(port), "protocol": "TCP"}]
    return {
        "podSelector": {"matchLabels": dict(pod_labels)},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": dict(admitted.gateway_pod_labels)}}], "ports": ports},
            {"from": [_peer(s) for s in admitted.scrapers], "ports": ports},
        ],
    }
