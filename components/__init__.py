"""Pulumi components, one per file, each declaring a slice of the TopologySpec.

Import from the submodules you need (`from components.weight_cache import WeightCache`): each pulls in
only the `pulumi_aws` submodules it uses, which keeps `pulumi preview` start-up short.
"""

__all__ = [
    "cluster",
    "floor_replicas",
    "gpu_node_pool",
    "gpu_operator",
    "keda",
    "stack_settings",
    "weight_cache",
    "weight_replication",
]
