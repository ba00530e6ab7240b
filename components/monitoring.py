"""Monitoring: kube-prometheus-stack by Helm, where the stack creates its cluster (`llm-serving:monitoring: install`).

The serving components declare PodMonitors and PrometheusRules (monitoring.coreos.com) and KEDA queries
Prometheus; on a cluster the stack creates nothing else provides the Prometheus Operator's CRDs or a
Prometheus. On a platform cluster (`monitoring: platform`, the default for `mode: existing`) the platform
runs them and `python -m topology preflight` checks the CRDs and the URL.

Release name `kube-prometheus-stack` in namespace `monitoring`: the chart then names the Prometheus
Service `kube-prometheus-stack-prometheus` (fullname = the release name when it contains the chart name),
which is the default `prometheusUrl`. Prometheus selects PodMonitors, ServiceMonitors and rules by the
stack's `monitorLabels`, set explicitly rather than through the chart's release-label default.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from ._common import TYPE_PREFIX, child
from .stack_settings import MONITORING_NAMESPACE

CHART_REPO = "https://prometheus-community.github.io/helm-charts"
CHART_VERSION = "88.5.3"  # prometheus-community/helm-charts charts/kube-prometheus-stack/Chart.yaml (operator v0.93.1)
RELEASE = "kube-prometheus-stack"
NAMESPACE = MONITORING_NAMESPACE  # where the engines' NetworkPolicies admit the installed Prometheus from
PROMETHEUS_URL = f"http://{RELEASE}-prometheus.{NAMESPACE}.svc.cluster.local:9090"
# API groups whose custom resources this release defines
PROVIDES_GROUPS = ("monitoring.coreos.com",)


def chart_values(monitor_labels: dict[str, str]) -> dict:
    selector = {"matchLabels": dict(sorted(monitor_labels.items()))}
    return {
        "crds": {"enabled": True},
        "prometheus": {"prometheusSpec": {
            "podMonitorSelector": selector,
            "serviceMonitorSelector": selector,
            "ruleSelector": selector,
            "retention": "15d",
        }},
    }


@dataclass(frozen=True)
class MonitoringArgs:
    monitor_labels: dict[str, str] = field(default_factory=lambda: {"release": RELEASE})


class Monitoring(pulumi.ComponentResource):
    release: k8s.helm.v3.Release
    prometheus_url: str = PROMETHEUS_URL

    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{TYPE_PREFIX}:Monitoring", name, None, opts)
        ns = k8s.core.v1.Namespace(f"{name}-namespace", metadata={"name": NAMESPACE}, opts=child(self))
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            name=RELEASE,
            chart="kube-prometheus-stack",
            version=CHART_VERSION,
            repository_opts={"repo": CHART_REPO},
            namespace=NAMESPACE,
            values=chart_values(args.monitor_labels),
            atomic=True,
            opts=child(self, depends_on=[ns]),
        )
        self.register_outputs({"release": self.release.name, "prometheusUrl": PROMETHEUS_URL})
