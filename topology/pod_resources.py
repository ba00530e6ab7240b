"""CPU and memory of a vLLM floor replica's pod, cut from its node: pure arithmetic, typed in and out.

A pod that requests only GPUs is BestEffort: under node memory pressure the kubelet evicts it first. A floor
node carries only its endpoint's replicas (node selector and GPU taint) plus daemonsets, so each replica
gets an equal share of what the node can allocate to pods, with requests = limits (Guaranteed QoS).

What is kept back from the instance, per node, and why:
- The memory the node itself reports (the kubelet's capacity, MemTotal) is below the EC2 instance type's
  figure: the hypervisor, the firmware's reservations, the kernel's own memory and page tables (and on GPU nodes
  the driver's) come off it first. AWS publishes no per-type figure; Karpenter subtracts
  VM_MEMORY_OVERHEAD_FRACTION = 7.5 % of the EC2 figure before packing pods (its `vmMemoryOverheadPercent`
  default, aws/karpenter-provider-aws; issue #5161 on discovering it per type); a measured i4i.32xlarge's
  allocatable memory (after the kubelet's reserve) is 3.9 % below its EC2 figure (issue #6611). Pods sized to the EC2 figure do not fit: an equal share of it left
  autocomplete's one pod per p5.4xlarge 258,304 MiB against ≈ 251,000 MiB the node reports, Pending for good.
- kubeReserved, as the EKS AMI bootstrap sets it (awslabs/amazon-eks-ami bootstrap.sh):
  memory 11 MiB × max pods + 255 MiB; CPU 6 % of the first core, 1 % of the second, 0.5 % of the third and
  fourth, 0.25 % of every further core. Max pods is taken at the EKS max-pods calculator's caps (110 below
  30 vCPUs, 250 from 30), the most the node can be configured for, so the reserve is never under-counted.
- evictionHard memory.available = 100 MiB (same bootstrap): allocatable excludes it.
- Daemonsets on a GPU node: an allowance of DAEMONSET_CPU_MILLICORES and DAEMONSET_MEMORY_MIB for the VPC
  CNI, kube-proxy, the Pod Identity agent, a node exporter and the GPU operator's device plugin, feature
  discovery, DCGM exporter, MIG manager and validators. It is an allowance with room, not a sum of their
  charts' requests (several request nothing), sized so the sum of their usual requests fits under it.

What one replica needs at least (below it the share is not enough and the pod is Burstable, with a warning):
- CPU: one core for the API server, one for the engine core's scheduling loop, one per tensor-parallel
  worker beyond the first rank's (each a busy Python process): 1 + gpus_per_replica cores.
- Memory: the memory-backed /dev/shm NCCL uses between ranks (charged to the pod's memory cgroup, so it
  must fit inside the limit) plus ENGINE_HOST_MEMORY_MIB for the engine's own host memory (CUDA context,
  pinned buffers, tokenizer, LoRA adapters cached on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

from .catalog import GpuKind, InstanceType
from .spec import Derivation, PodResourcesSpec

MIB_PER_GIB = 1024
VM_MEMORY_OVERHEAD_FRACTION = 0.075  # of the EC2 figure, not reported by the node (module docstring)
EKS_MAX_PODS_SMALL, EKS_MAX_PODS_LARGE, EKS_MAX_PODS_VCPU_THRESHOLD = 110, 250, 30
KUBE_RESERVED_MIB_PER_POD, KUBE_RESERVED_BASE_MIB = 11, 255
EVICTION_HARD_MEMORY_MIB = 100
DAEMONSET_CPU_MILLICORES = 1000
DAEMONSET_MEMORY_MIB = 2 * MIB_PER_GIB
SHM_MIB = 16 * MIB_PER_GIB  # NCCL between tensor-parallel ranks (and vLLM's multiprocessing queues)
ENGINE_HOST_MEMORY_MIB = 8 * MIB_PER_GIB
CPU_STEP_MILLICORES = 100  # shares are rounded down to these steps, so they always fit
MEMORY_STEP_MIB = 256


def eks_max_pods_cap(vcpus: int) -> int:
    return EKS_MAX_PODS_SMALL if vcpus < EKS_MAX_PODS_VCPU_THRESHOLD else EKS_MAX_PODS_LARGE


def kube_reserved_cpu_millicores(vcpus: int) -> float:
    """EKS AMI: 6 % of core 1, 1 % of core 2, 0.5 % of cores 3–4, 0.25 % of the rest (in millicores)."""
    ranges = ((0, 1, 60.0), (1, 2, 10.0), (2, 4, 5.0), (4, vcpus, 2.5))  # (from core, to core, m per core)
    return sum(max(0, min(vcpus, hi) - lo) * per_core for lo, hi, per_core in ranges)


def kube_reserved_memory_mib(vcpus: int) -> int:
    return KUBE_RESERVED_MIB_PER_POD * eks_max_pods_cap(vcpus) + KUBE_RESERVED_BASE_MIB


@dataclass(frozen=True)
class NodeBudget:
    """What a node can give its replicas, after the kubelet's reserve, the eviction threshold and daemonsets."""

    allocatable_cpu_millicores: int
    allocatable_memory_mib: int
    for_replicas_cpu_millicores: int
    for_replicas_memory_mib: int


def node_memory_capacity_mib(instance: InstanceType) -> int:
    """The memory the node reports (its kubelet's capacity), taken as the EC2 figure less
    VM_MEMORY_OVERHEAD_FRACTION, rounded down to a MiB."""
    return int(instance.memory_gib * MIB_PER_GIB * (1.0 - VM_MEMORY_OVERHEAD_FRACTION))


def node_budget(instance: InstanceType) -> NodeBudget:
    cpu = int(instance.vcpus * 1000 - kube_reserved_cpu_millicores(instance.vcpus))  # floor: never over-promise
    mem = (node_memory_capacity_mib(instance) - kube_reserved_memory_mib(instance.vcpus)
           - EVICTION_HARD_MEMORY_MIB)
    return NodeBudget(cpu, mem, cpu - DAEMONSET_CPU_MILLICORES, mem - DAEMONSET_MEMORY_MIB)


def catalog_instance(kind: GpuKind, name: str) -> InstanceType:
    for it in kind.instance_types:
        if it.name == name:
            return it
    raise ValueError(f"{kind.name} has no instance type {name!r}; catalog: {[i.name for i in kind.instance_types]}")


def _round_down(x: float, step: int) -> int:
    return int(x // step) * step


def floor_pod_resources(
    instance: InstanceType, replicas_per_node: int, gpus_per_replica: int
) -> tuple[PodResourcesSpec, list[Derivation], list[str]]:
    """One replica's CPU and memory on `instance` shared by `replicas_per_node` replicas; the arithmetic; warnings."""
    if replicas_per_node < 1 or gpus_per_replica < 1:
        raise ValueError(f"replicas_per_node={replicas_per_node} and gpus_per_replica={gpus_per_replica} must be ≥ 1")
    budget = node_budget(instance)
    cpu_share = _round_down(budget.for_replicas_cpu_millicores / replicas_per_node, CPU_STEP_MILLICORES)
    mem_share = _round_down(budget.for_replicas_memory_mib / replicas_per_node, MEMORY_STEP_MIB)
    cpu_min = 1000 * (1 + gpus_per_replica)
    mem_min = SHM_MIB + ENGINE_HOST_MEMORY_MIB
    warnings: list[str] = []
    if cpu_share >= cpu_min and mem_share >= mem_min:
        qos = "Guaranteed"
        cpu_limit, mem_limit = cpu_share, mem_share
    else:
        # the even share is below what the engine needs: request the share (so the pods still schedule side by
        # side) and let the engine use up to its minimum; Burstable pods are evicted after BestEffort ones
        qos = "Burstable"
        cpu_limit, mem_limit = max(cpu_share, cpu_min), max(mem_share, mem_min)
        warnings.append(
            f"{instance.name} shared by {replicas_per_node} replicas leaves {cpu_share} m CPU and {mem_share} MiB per "
            f"replica, below the engine's minimum ({cpu_min} m, {mem_min} MiB): the pods are Burstable (requests = "
            "the share, limits = the minimum); fewer replicas per node would make them Guaranteed"
        )
    spec = PodResourcesSpec(
        instance_type=instance.name, replicas_per_node=replicas_per_node,
        cpu_request_millicores=cpu_share, cpu_limit_millicores=cpu_limit,
        memory_request_mib=mem_share, memory_limit_mib=mem_limit, shm_mib=SHM_MIB, qos_class=qos,
    )
    reserved_cpu = kube_reserved_cpu_millicores(instance.vcpus)
    derivs = [
        Derivation(
            figure="pod_cpu_request_millicores", value=cpu_share, unit="millicores",
            formula=(f"⌊({instance.vcpus} vCPU × 1000 − kubeReserved {reserved_cpu:g} m − daemonsets "
                     f"{DAEMONSET_CPU_MILLICORES} m) / {replicas_per_node} replicas per node⌋ to {CPU_STEP_MILLICORES} m"
                     f" = {cpu_share} m; engine minimum (1 + {gpus_per_replica} GPUs) × 1000 = {cpu_min} m; {qos}"),
            inputs=("catalog.instance_types.vcpus", "engine.gpus_per_replica"),
        ),
        Derivation(
            figure="pod_memory_request_mib", value=mem_share, unit="MiB",
            formula=(f"⌊({instance.memory_gib} GiB × 1024 × (1 − VM overhead {VM_MEMORY_OVERHEAD_FRACTION:g}) = "
                     f"{node_memory_capacity_mib(instance)} − kubeReserved (11 × {eks_max_pods_cap(instance.vcpus)} pods"
                     f" + 255 = {kube_reserved_memory_mib(instance.vcpus)}) − eviction {EVICTION_HARD_MEMORY_MIB} − "
                     f"daemonsets {DAEMONSET_MEMORY_MIB}) / {replicas_per_node} replicas per node⌋ to {MEMORY_STEP_MIB}"
                     f" MiB = {mem_share} MiB; engine minimum shm {SHM_MIB} + host {ENGINE_HOST_MEMORY_MIB} = "
                     f"{mem_min} MiB; {qos}"),
            inputs=("catalog.instance_types.memory_gib", "engine.gpus_per_replica"),
        ),
    ]
    return spec, derivs, warnings
