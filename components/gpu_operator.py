"""GpuOperator: the NVIDIA GPU operator with the MIG manager, `mixed` strategy, and our own mig-parted config.

The mig-parted ConfigMap is generated from the spec's layouts; the node label `nvidia.com/mig.config`
(set by GpuNodePool) picks one per node. Every layout is validated against its GPU's profile table
before anything is declared: a bad geometry otherwise surfaces only as `nvidia.com/mig.config.state=failed`
on a node already paid for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s
import yaml

from topology.catalog import MigLayoutError, validate_mig_layout
from topology.spec import NodePoolSpec

from ._common import GPU_TAINT_EFFECT_K8S, MIG_DISABLED, TYPE_PREFIX, child

CHART = "gpu-operator"
CHART_REPO = "https://helm.ngc.nvidia.com/nvidia"
CHART_VERSION = "v26.7.0"  # the version whose default mig-parted config is in schemas/
MIG_CONFIG_MAP = "llm-serving-mig-parted-config"


def mig_parted_config(pools: Sequence[NodePoolSpec]) -> dict:
    """The mig-parted `config.yaml` for these pools: `all-disabled` plus each pool's layout, validated.

    Raises MigLayoutError (naming the pool, GPU, profiles and slice counts) for a layout the GPU cannot hold,
    or when two pools give one layout name different geometries (one label value must mean one geometry).
    """
    configs: dict[str, list[dict]] = {MIG_DISABLED: [{"devices": "all", "mig-enabled": False}]}
    seen: dict[str, tuple[str, dict[str, int]]] = {}
    for pool in sorted(pools, key=lambda p: p.name):
        layout = pool.mig_layout
        if layout is None:
            continue
        try:
            validate_mig_layout(pool.gpu_kind, layout.devices)
        except MigLayoutError as e:
            raise MigLayoutError(f"node pool {pool.name!r}, MIG layout {layout.name!r}: {e}") from None
        if layout.name == MIG_DISABLED:
            raise MigLayoutError(f"node pool {pool.name!r}: layout name {MIG_DISABLED!r} is reserved for MIG off")
        devices = dict(sorted(layout.devices.items()))
        if layout.name in seen and seen[layout.name][1] != devices:
            other = seen[layout.name][0]
            raise MigLayoutError(
                f"MIG layout name {layout.name!r} means {seen[layout.name][1]} in node pool {other!r} "
                f"but {devices} in node pool {pool.name!r}; give different geometries different names"
            )
        seen[layout.name] = (pool.name, devices)
        configs[layout.name] = [{"devices": "all", "mig-enabled": True, "mig-devices": devices}]
    return {"version": "v1", "mig-configs": dict(sorted(configs.items()))}


@dataclass(frozen=True)
class GpuOperatorArgs:
    node_pools: Sequence[NodePoolSpec]
    namespace: str = "gpu-operator"
    chart_version: str = CHART_VERSION


class GpuOperator(pulumi.ComponentResource):
    def __init__(self, name: str, args: GpuOperatorArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        config = mig_parted_config(args.node_pools)  # raises before the component registers anything
        super().__init__(f"{TYPE_PREFIX}:GpuOperator", name, None, opts)

        ns = k8s.core.v1.Namespace(f"{name}-namespace", metadata={"name": args.namespace}, opts=child(self))
        config_map = k8s.core.v1.ConfigMap(
            f"{name}-mig-parted-config",
            metadata={"name": MIG_CONFIG_MAP, "namespace": args.namespace},
            data={"config.yaml": yaml.safe_dump(config, sort_keys=True)},
            opts=child(self, depends_on=[ns]),
        )
        values = {
            # the AL2023 NVIDIA AMI ships the driver and the container toolkit
            "driver": {"enabled": False},
            "toolkit": {"enabled": False},
            "mig": {"strategy": "mixed"},  # pods ask for nvidia.com/mig-<profile>; pools may mix geometries
            "migManager": {
                "enabled": True,
                "config": {"create": False, "name": MIG_CONFIG_MAP, "default": MIG_DISABLED},
                # changing a node's geometry needs the GPUs idle; a reboot clears stuck clients
                "env": [{"name": "WITH_REBOOT", "value": "true"}],
            },
            "devicePlugin": {"enabled": True},
            # DCGM for dashboards only: GPU "utilisation" is never an autoscaling signal here
            "dcgmExporter": {"enabled": True},
            "daemonsets": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": GPU_TAINT_EFFECT_K8S}]},
        }
        release = k8s.helm.v3.Release(
            f"{name}-release",
            name="gpu-operator",
            chart=CHART,
            version=args.chart_version,
            repository_opts={"repo": CHART_REPO},
            namespace=args.namespace,
            values=values,
            atomic=True,
            opts=child(self, depends_on=[config_map]),
        )
        self.mig_config_names = sorted(config["mig-configs"])
        self.register_outputs({"release": release.name, "migConfigs": self.mig_config_names})
