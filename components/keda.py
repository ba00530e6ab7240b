"""Keda: the KEDA operator by Helm, so the floor replicas' ScaledObjects have a controller."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from ._common import TYPE_PREFIX, child

CHART_REPO = "https://kedacore.github.io/charts"
CHART_VERSION = "2.20.2"  # the release whose CRD schemas are in schemas/crd/


@dataclass(frozen=True)
class KedaArgs:
    namespace: str = "keda"
    chart_version: str = CHART_VERSION


class Keda(pulumi.ComponentResource):
    release: k8s.helm.v3.Release

    def __init__(self, name: str, args: KedaArgs | None = None, opts: pulumi.ResourceOptions | None = None) -> None:
        args = args or KedaArgs()
        super().__init__(f"{TYPE_PREFIX}:Keda", name, None, opts)
        ns = k8s.core.v1.Namespace(f"{name}-namespace", metadata={"name": args.namespace}, opts=child(self))
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            name="keda",
            chart="keda",
            version=args.chart_version,
            repository_opts={"repo": CHART_REPO},
            namespace=args.namespace,
            values={"crds": {"install": True}},
            atomic=True,
            opts=child(self, depends_on=[ns]),
        )
        self.register_outputs({"release": self.release.name, "namespace": args.namespace})
