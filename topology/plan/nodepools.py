"""The dedicated replicas' node pools (reserved and on-demand), with MIG layouts from the catalog."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..catalog import GpuKind, MigLayoutError, validate_mig_layout
from ..inputs import CostInputs, EndpointInputs
from ..spec import MigLayoutSpec, NodePoolSpec
from .errors import PlanningError
from .placement import Placement


def node_pools(
    inp: CostInputs, ep: EndpointInputs, pl: Placement, reserved_layers: int, max_rep: int,
    catalog: Mapping[str, GpuKind],
) -> list[NodePoolSpec]:
    """A reserved pool for the always-on nodes and an on-demand pool up to the autoscaler's cap; MIG nodes
    carry their mig-parted layout."""
    rpn = pl.replicas_per_node
    layout = None
    labels = {"serving.llm/endpoint": ep.name, "serving.llm/gpu": pl.gpu_kind}
    if pl.mig_profile:
        prof = catalog[pl.gpu_kind].profile(pl.mig_profile)
        devices = {pl.mig_profile: prof.max_instances_per_gpu if prof else 1}
        try:
            validate_mig_layout(pl.gpu_kind, devices, catalog)
        except MigLayoutError as e:  # the planner only emits catalog layouts; this guards catalog edits
            raise PlanningError(str(e)) from e
        layout = MigLayoutSpec(name=f"all-{pl.mig_profile}", devices=devices)
        labels["nvidia.com/mig.config"] = layout.name
    pools = []
    reserved_nodes = math.ceil(reserved_layers / rpn) if reserved_layers else 0
    common = dict(
        region=inp.cluster_region, gpu_kind=pl.gpu_kind, instance_type=pl.instance_type,
        gpus_per_node=pl.gpus_per_node, mig_layout=layout, local_nvme_gb=pl.local_nvme_gb,
    )
    if reserved_nodes:
        pools.append(NodePoolSpec(
            name=f"{ep.name}-reserved", capacity_type="reserved", min_nodes=reserved_nodes, max_nodes=reserved_nodes,
            labels={**labels, "serving.llm/capacity": "reserved"}, **common,
        ))
    od_max = math.ceil(max(0, max_rep - reserved_nodes * rpn) / rpn)
    if od_max:
        pools.append(NodePoolSpec(
            name=f"{ep.name}-on-demand", capacity_type="on_demand", min_nodes=0, max_nodes=od_max,
            labels={**labels, "serving.llm/capacity": "on-demand"}, **common,
        ))
    return pools
