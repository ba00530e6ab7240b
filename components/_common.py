"""Small helpers shared by the components (names, labels, the GPU taint)."""

from __future__ import annotations

import pulumi

from topology.names import ENDPOINT_LABEL  # noqa: F401  (the pod label; its Prometheus name is in names.py)

TYPE_PREFIX = "serving:components"

# The node label the GPU operator's mig-manager reads to choose a mig-parted config (facts.md).
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
# The layout applied to MIG-capable GPUs that serve whole-GPU replicas: MIG off, one device per GPU.
MIG_DISABLED = "all-disabled"

CAPACITY_LABEL = "serving.llm/capacity"
GPU_TAINT_EFFECT_EKS = "NO_SCHEDULE"  # EKS API spelling of the taint effect
GPU_TAINT_EFFECT_K8S = "NoSchedule"  # Kubernetes spelling of the same effect


def child(parent: pulumi.Resource, **kwargs) -> pulumi.ResourceOptions:
    """Options for a child resource: parented to the component, inheriting its providers."""
    return pulumi.ResourceOptions(parent=parent, **kwargs)



def restricted_security_context(uid: int, gid: int) -> dict:
    """A container's securityContext for the project's own CPU services (gateway, quality recorder): a numeric
    non-root user (the kubelet cannot verify a named one), no privilege escalation, read-only root, no
    capabilities."""
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": gid, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
