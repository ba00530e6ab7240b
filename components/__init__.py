"""Pulumi components, one per file, each declaring a slice of the TopologySpec.

Import from the submodules you need (`from components.weight_cache import WeightCache`): each pulls in
only the `pulumi_aws` submodules it uses, which keeps `pulumi preview` start-up short. Names several
components must agree on live in `components.names`.
"""
