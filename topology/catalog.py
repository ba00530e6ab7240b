"""GPU kinds, their MIG profiles and the instance types that carry them — typed data, passed to the planner.

MIG tables follow NVIDIA's mig-parted / GPU operator v26.7 profiles (see README "Sources"). Instance vCPUs
and memory are AWS's published figures (EC2 accelerated-computing specifications, as listed in the ROSA
compute-types docs and torchx's AWS named resources): they size the vLLM pods' CPU and memory. A profile
`Ng.Mgb` takes N of the GPU's 7 compute slices and some of its 8 memory slices; a layout is valid only
if, on each GPU, compute slices sum to ≤ 7, memory slices to ≤ 8, every profile exists for that GPU and
no profile exceeds its instance limit.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

COMPUTE_SLICES_PER_GPU = 7
MEMORY_SLICES_PER_GPU = 8


class MigProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Profile name, e.g. '3g.40gb'.")
    compute_slices: int = Field(ge=1, le=7, description="Compute (GPC) slices out of 7.")
    memory_slices: int = Field(ge=1, le=8, description="Memory slices out of 8.")
    memory_gb: float = Field(gt=0, description="Memory of the slice, GB.")
    max_instances_per_gpu: int = Field(ge=1, le=7, description="Most instances of this profile one GPU holds.")


class InstanceType(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="EC2 instance type.")
    gpus_per_node: int = Field(ge=1, description="GPUs per node.")
    local_nvme_gb: int = Field(ge=0, description="Instance-store NVMe for a node-local weight cache, GB (0: none).")
    vcpus: int = Field(ge=1, description="vCPUs of the instance (AWS's published figure).")
    memory_gib: int = Field(ge=1, description="Host memory of the instance, GiB (AWS's published figure).")


class GpuKind(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Catalog name, e.g. 'H100-80GB'.")
    memory_gb: float = Field(gt=0, description="HBM per GPU, GB.")
    memory_bandwidth_tb_per_s: float = Field(gt=0, description="HBM bandwidth, TB/s.")
    modal_gpu: str = Field(description="The `gpu=` string Modal uses for this kind.")
    mig_profiles: tuple[MigProfile, ...] = Field(default=(), description="MIG profiles; empty when MIG is unsupported.")
    instance_types: tuple[InstanceType, ...] = Field(description="Instance types carrying this GPU, smallest first.")

    def profile(self, name: str) -> MigProfile | None:
        for p in self.mig_profiles:
            if p.name == name:
                return p
        return None


def _profiles(table: list[tuple[str, int, int, float, int]]) -> tuple[MigProfile, ...]:
    return tuple(
        MigProfile(name=n, compute_slices=c, memory_slices=m, memory_gb=g, max_instances_per_gpu=k)
        for n, c, m, g, k in table
    )


_A100_H100_80 = [
    ("1g.10gb", 1, 1, 10, 7),
    ("1g.10gb+me", 1, 1, 10, 1),
    ("1g.20gb", 1, 2, 20, 4),
    ("2g.20gb", 2, 2, 20, 3),
    ("3g.40gb", 3, 4, 40, 2),
    ("4g.40gb", 4, 4, 40, 1),
    ("7g.80gb", 7, 8, 80, 1),
]

GPU_KINDS: dict[str, GpuKind] = {
    g.name: g
    for g in [
        GpuKind(
            name="H100-80GB",
            memory_gb=80,
            memory_bandwidth_tb_per_s=3.35,
            modal_gpu="H100",
            mig_profiles=_profiles(_A100_H100_80),
            instance_types=(
                InstanceType(name="p5.4xlarge", gpus_per_node=1, local_nvme_gb=3800, vcpus=16, memory_gib=256),
                InstanceType(name="p5.48xlarge", gpus_per_node=8, local_nvme_gb=30400, vcpus=192, memory_gib=2048),
            ),
        ),
        GpuKind(
            name="H200-141GB",
            memory_gb=141,
            memory_bandwidth_tb_per_s=4.8,
            modal_gpu="H200",
            mig_profiles=_profiles(
                [
                    ("1g.18gb", 1, 1, 18, 7),
                    ("1g.18gb+me", 1, 1, 18, 1),
                    ("1g.35gb", 1, 2, 35, 4),
                    ("2g.35gb", 2, 2, 35, 3),
                    ("3g.71gb", 3, 4, 71, 2),
                    ("4g.71gb", 4, 4, 71, 1),
                    ("7g.141gb", 7, 8, 141, 1),
                ]
            ),
            instance_types=(InstanceType(name="p5en.48xlarge", gpus_per_node=8, local_nvme_gb=30400, vcpus=192, memory_gib=2048),),
        ),
        GpuKind(
            name="A100-80GB",
            memory_gb=80,
            memory_bandwidth_tb_per_s=2.0,
            modal_gpu="A100-80GB",
            mig_profiles=_profiles(_A100_H100_80),
            instance_types=(InstanceType(name="p4de.24xlarge", gpus_per_node=8, local_nvme_gb=8000, vcpus=96, memory_gib=1152),),
        ),
        GpuKind(
            name="A100-40GB",
            memory_gb=40,
            memory_bandwidth_tb_per_s=1.555,
            modal_gpu="A100-40GB",
            mig_profiles=_profiles(
                [
                    ("1g.5gb", 1, 1, 5, 7),
                    ("1g.5gb+me", 1, 1, 5, 1),
                    ("1g.10gb", 1, 2, 10, 4),
                    ("2g.10gb", 2, 2, 10, 3),
                    ("3g.20gb", 3, 4, 20, 2),
                    ("4g.20gb", 4, 4, 20, 1),
                    ("7g.40gb", 7, 8, 40, 1),
                ]
            ),
            instance_types=(InstanceType(name="p4d.24xlarge", gpus_per_node=8, local_nvme_gb=8000, vcpus=96, memory_gib=1152),),
        ),
        GpuKind(
            name="L40S-48GB",
            memory_gb=48,
            memory_bandwidth_tb_per_s=0.864,
            modal_gpu="L40S",
            mig_profiles=(),
            instance_types=(
                InstanceType(name="g6e.xlarge", gpus_per_node=1, local_nvme_gb=250, vcpus=4, memory_gib=32),
                InstanceType(name="g6e.12xlarge", gpus_per_node=4, local_nvme_gb=3800, vcpus=48, memory_gib=384),
                InstanceType(name="g6e.48xlarge", gpus_per_node=8, local_nvme_gb=7600, vcpus=192, memory_gib=1536),
            ),
        ),
    ]
}


class MigLayoutError(ValueError):
    """A MIG layout the GPU cannot hold; the message names the GPU, the profiles and the slice counts."""


def validate_mig_layout(gpu_kind: str, devices: Mapping[str, int], catalog: Mapping[str, GpuKind] = GPU_KINDS) -> None:
    """Raise MigLayoutError unless `devices` (profile -> instances per GPU) fits one GPU of `gpu_kind`."""
    kind = catalog.get(gpu_kind)
    if kind is None:
        raise MigLayoutError(f"MIG layout for unknown GPU kind {gpu_kind!r}; known: {sorted(catalog)}")
    if not kind.mig_profiles:
        raise MigLayoutError(f"{gpu_kind} does not support MIG; layout {dict(devices)} cannot be applied")
    if not devices:
        raise MigLayoutError(f"empty MIG layout for {gpu_kind}")
    unknown = [p for p in devices if kind.profile(p) is None]
    if unknown:
        raise MigLayoutError(
            f"{gpu_kind} has no MIG profile {', '.join(unknown)}; its profiles are "
            f"{', '.join(p.name for p in kind.mig_profiles)}"
        )
    compute = memory = 0
    for name, count in devices.items():
        prof = kind.profile(name)
        if prof is None:  # unreachable: unknown profiles were reported above
            continue
        if not isinstance(count, int) or count < 1:
            raise MigLayoutError(f"{gpu_kind} layout asks for {count!r} × {name}; counts must be whole numbers ≥ 1")
        if count > prof.max_instances_per_gpu:
            raise MigLayoutError(
                f"{gpu_kind} holds at most {prof.max_instances_per_gpu} × {name}; layout asks for {count}"
            )
        compute += prof.compute_slices * count
        memory += prof.memory_slices * count
    described = " + ".join(f"{n}:{c}" for n, c in devices.items())
    if compute > COMPUTE_SLICES_PER_GPU or memory > MEMORY_SLICES_PER_GPU:
        raise MigLayoutError(
            f"{gpu_kind} layout {described} needs {compute} compute slices (max {COMPUTE_SLICES_PER_GPU}) and "
            f"{memory} memory slices (max {MEMORY_SLICES_PER_GPU})"
        )


def smallest_instance(kind: GpuKind, gpus_needed_per_replica: int) -> InstanceType:
    """The smallest instance type that holds one replica: small nodes waste fewest paid-for GPUs."""
    for it in kind.instance_types:
        if it.gpus_per_node >= gpus_needed_per_replica:
            return it
    return kind.instance_types[-1]
