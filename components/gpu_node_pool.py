"""GpuNodePool: one EKS managed node group per node pool in the spec.

AL2023 NVIDIA AMI (driver and container toolkit baked in, and MIG geometry driven by the node label
`nvidia.com/mig.config` — Bottlerocket uses boot settings instead), the GPU taint so only GPU
workloads land here, and the instance store NVMe assembled as RAID0 by nodeadm so the node-local
weight cache (and the kubelet's ephemeral storage) lives on local disk, not on EBS.
"""

from __future__ import annotations

import base64
import hashlib
import textwrap
from dataclasses import dataclass

import pulumi
from pulumi_aws import autoscaling, ec2, eks

from topology.catalog import GPU_KINDS, validate_mig_layout
from topology.node_schedule import NodeMinimum, weekly_cron
from topology.spec import NodePoolSpec

from ._common import GPU_TAINT_EFFECT_EKS, MIG_CONFIG_LABEL, MIG_DISABLED, TYPE_PREFIX, child

AMI_TYPE = "AL2023_x86_64_NVIDIA"
CAPACITY_TYPE = "ON_DEMAND"  # "reserved" pools are on-demand instances under a savings plan
CA_GPU_LABEL = "k8s.amazonaws.com/accelerator"  # cluster-autoscaler/cloudprovider/aws GPULabel
# Where nodeadm mounts the RAID0 of instance-store volumes; the floor pods' weight cache lives under it.
NVME_MOUNT = "/mnt/k8s-disks/0"

_MIME_BOUNDARY = "LLMSERVING"


def node_user_data(local_nvme_gb: int) -> str | None:
    """nodeadm NodeConfig (MIME part EKS merges into its own) turning instance-store NVMe into RAID0."""
    if local_nvme_gb <= 0:
        return None
    node_config = textwrap.dedent("""\
        apiVersion: node.eks.aws/v1alpha1
        kind: NodeConfig
        spec:
          instance:
            localStorage:
              strategy: RAID0
        """)
    doc = (
        "MIME-Version: 1.0\n"
        f'Content-Type: multipart/mixed; boundary="{_MIME_BOUNDARY}"\n\n'
        f"--{_MIME_BOUNDARY}\n"
        "Content-Type: application/node.eks.aws\n\n"
        f"{node_config}\n"
        f"--{_MIME_BOUNDARY}--\n"
    )
    return base64.b64encode(doc.encode()).decode()


def node_group_physical_name(pool: NodePoolSpec) -> str:
    """The EKS node group's name: the pool's, and a digest of what EKS cannot change on a node group in place.

    The instance type, AMI type and capacity type force a new node group (terraform-provider-aws
    `eks/node_group.go`: ForceNew), and Pulumi creates the replacement before deleting the old one: under one
    fixed name EKS refuses the new group (ResourceInUseException), so a GPU kind or instance size change failed
    the `up`. With the digest in the name the new group is created next to the old, the floor's pods move as
    their Deployment rolls, and the old group is deleted last. The MIG layout is in the digest too: changed in
    place, EKS would relabel the running nodes and the MIG manager would repartition (and reboot) every node of
    the pool at once; a new group brings new nodes up in the new layout first. At most 40 + 10 + 9 = 59
    characters (EKS allows 63).
    """
    layout = pool.mig_layout.name if pool.mig_layout is not None else "whole"
    digest = hashlib.sha256(f"{pool.instance_type}|{AMI_TYPE}|{CAPACITY_TYPE}|{layout}".encode()).hexdigest()[:8]
    return f"{pool.name}-{digest}"


def node_labels(pool: NodePoolSpec) -> dict[str, str]:
    """The spec's labels, plus the mig-parted config the GPU operator applies on MIG-capable GPUs."""
    labels = dict(pool.labels)
    kind = GPU_KINDS.get(pool.gpu_kind)
    if pool.mig_layout is not None:
        labels[MIG_CONFIG_LABEL] = pool.mig_layout.name
    elif kind is not None and kind.mig_profiles:
        # a whole-GPU pool on a MIG-capable GPU: make "MIG off" explicit rather than inherit a node's past
        labels[MIG_CONFIG_LABEL] = MIG_DISABLED
    if pool.mig_layout is None:
        # Cluster Autoscaler's AWS GPU label: a new node whose device plugin has not yet advertised its GPUs
        # counts as still starting, not as a node the pending pod does not fit (which would add another).
        # Not on MIG pools: they never advertise nvidia.com/gpu, and would count as starting forever.
        labels[CA_GPU_LABEL] = pool.gpu_kind.lower()
    return dict(sorted(labels.items()))


def autoscaler_tags(pool: NodePoolSpec) -> dict[str, str]:
    """Cluster Autoscaler node-template hints so an empty (0-node) pool can still be chosen for a pending pod."""
    tags = {f"k8s.io/cluster-autoscaler/node-template/label/{k}": v for k, v in node_labels(pool).items()}
    tags[f"k8s.io/cluster-autoscaler/node-template/taint/{pool.taint_key}"] = "true:NoSchedule"
    if pool.mig_layout is not None:
        for profile, per_gpu in sorted(pool.mig_layout.devices.items()):
            tags[f"k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/mig-{profile}"] = str(
                per_gpu * pool.gpus_per_node
            )
        # the autoscaler counts the instance type's GPUs as nvidia.com/gpu; a MIG node (mixed strategy) has none
        tags["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] = "0"
    else:
        tags["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] = str(pool.gpus_per_node)
    return tags


@dataclass(frozen=True)
class GpuNodePoolArgs:
    pool: NodePoolSpec
    cluster_name: pulumi.Input[str]
    node_role_arn: pulumi.Input[str]
    subnet_ids: pulumi.Input[list[str]]
    root_volume_gb: int = 100  # OS and images; weights live on the instance-store NVMe where there is one
    tags: dict[str, str] | None = None
    # the pool's minimum on the clock (topology.node_schedule): Auto Scaling scheduled actions on its group
    minimums: tuple[NodeMinimum, ...] = ()
    # the cluster's node groups now (existing_node_groups, listed once for all pools); None: the pool lists them
    existing_groups: pulumi.Input[list[str]] | None = None


def existing_node_groups(cluster_name: pulumi.Input[str], region: str) -> pulumi.Output[list[str]]:
    """The names of the cluster's node groups as EKS lists them now (ListNodegroups): read once per `up` and shared
    by every pool's desired_size."""
    return eks.get_node_groups_output(cluster_name=cluster_name, region=region).names.apply(lambda n: list(n or []))


def desired_size(pool: NodePoolSpec, cluster_name: pulumi.Input[str],
                 existing: pulumi.Input[list[str]] | None = None) -> pulumi.Input[int]:
    """The desired size to declare for a pool's node group: its minimum for a group not created yet or a reserved
    pool (min = max: no size to own), else the group's current size as EKS reports it, within the new bounds.

    EKS takes the whole scaling config in one call (UpdateNodegroupConfig; min ≤ desired ≤ max), and the AWS
    provider sends the declared desired size with any change of the bounds (terraform-provider-aws
    `expandNodegroupScalingConfig`). Declaring the minimum and ignoring the field's changes did not keep the
    autoscaler's size: Pulumi fills an ignored field with the old *input* (pulumi step_generator.go
    `processIgnoreChanges`), the minimum, so any change of an on-demand pool's bounds (a rollout's previous version
    retired, a price or traffic change) set its desired size to its minimum, 0, and EKS emptied the pool under its
    floor replicas until the autoscaler brought nodes back (a node cold start: 540 s for assist). The group's own
    size is read each `up` (eks ListNodegroups, then DescribeNodegroup), clamped to the new bounds: a lower maximum
    takes the nodes above it, no other node goes."""
    if pool.min_nodes == pool.max_nodes:
        return pool.min_nodes
    name = node_group_physical_name(pool)

    def clamp(size) -> int:
        return min(max(int(size), pool.min_nodes), pool.max_nodes)

    def current(a) -> pulumi.Input[int]:
        cluster, names = a
        if name not in names:
            return pool.min_nodes  # the first `up` of this pool: created at its minimum
        live = eks.get_node_group_output(cluster_name=cluster, node_group_name=name, region=pool.region)
        return live.scaling_configs.apply(lambda sc: clamp(sc[0].desired_size) if sc else pool.min_nodes)

    if existing is None:
        existing = existing_node_groups(cluster_name, pool.region)
    return pulumi.Output.all(cluster_name, existing).apply(current)


class GpuNodePool(pulumi.ComponentResource):
    node_group_name: pulumi.Output[str]

    def __init__(self, name: str, args: GpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        pool = args.pool
        if pool.mig_layout is not None:
            # fail before declaring anything: a wrong geometry only shows up as mig.config.state=failed on a paid node
            validate_mig_layout(pool.gpu_kind, pool.mig_layout.devices)
        super().__init__(f"{TYPE_PREFIX}:GpuNodePool", name, None, opts)
        tags = {"serving.llm/node-pool": pool.name, **(args.tags or {})}

        # Savings-plan ("reserved") pools are ordinary on-demand instances billed at the committed rate; they
        # may use any open capacity reservation. On-demand burst pools must not eat those reservations.
        reservation = "open" if pool.capacity_type == "reserved" else "none"
        template = ec2.LaunchTemplate(
            f"{name}-launch-template",
            region=pool.region,
            description=f"GPU node pool {pool.name}: {pool.instance_type}, {pool.capacity_type}",
            update_default_version=True,
            user_data=node_user_data(pool.local_nvme_gb),
            block_device_mappings=[{
                "device_name": "/dev/xvda",
                "ebs": {"volume_size": args.root_volume_gb, "volume_type": "gp3", "encrypted": "true",
                        "delete_on_termination": "true"},
            }],
            capacity_reservation_specification={"capacity_reservation_preference": reservation},
            # IMDSv2 only, one hop: pods cannot borrow the node role; they use Pod Identity
            metadata_options={"http_tokens": "required", "http_put_response_hop_limit": 1, "http_endpoint": "enabled"},
            tag_specifications=[{"resource_type": "instance", "tags": tags}],
            tags=tags,
            opts=child(self),
        )
        group = eks.NodeGroup(
            f"{name}-node-group",
            cluster_name=args.cluster_name,
            node_group_name=node_group_physical_name(pool),
            region=pool.region,
            node_role_arn=args.node_role_arn,
            subnet_ids=args.subnet_ids,
            ami_type=AMI_TYPE,
            instance_types=[pool.instance_type],
            capacity_type=CAPACITY_TYPE,
            scaling_config={"min_size": pool.min_nodes, "max_size": pool.max_nodes,
                            "desired_size": desired_size(pool, args.cluster_name, args.existing_groups)},
            labels=node_labels(pool),
            taints=[{"key": pool.taint_key, "value": "true", "effect": GPU_TAINT_EFFECT_EKS}],
            launch_template={"id": template.id, "version": template.latest_version.apply(str)},
            update_config={"max_unavailable": 1},  # drain one GPU node at a time: replicas are few and expensive
            tags={**tags, **autoscaler_tags(pool)},
            # the node autoscaler owns the current size of a pool it may resize, Pulumi the bounds: the desired size
            # declared is the group's own (desired_size), so a change of the bounds leaves the running nodes be
            opts=child(self),
        )
        # Managed-node-group tags stay on the EKS node group: the autoscaler reads its discovery and
        # scale-from-zero tags from the Auto Scaling group, so they are written there, one Tag each.
        self.asg_name = group.resources.apply(lambda rs: rs[0].autoscaling_groups[0].name)
        cluster = pulumi.Output.from_input(args.cluster_name)
        asg_tags: dict[str, pulumi.Input[str]] = {**autoscaler_tags(pool), "k8s.io/cluster-autoscaler/enabled": "true"}
        for key, value in sorted(asg_tags.items()):
            autoscaling.Tag(
                f"{name}-asg-tag-{key.removeprefix('k8s.io/cluster-autoscaler/').replace('/', '_')}",
                autoscaling_group_name=self.asg_name,
                region=pool.region,
                tag={"key": key, "value": value, "propagate_at_launch": False},
                opts=child(self),
            )
        autoscaling.Tag(
            f"{name}-asg-tag-cluster",
            autoscaling_group_name=self.asg_name,
            region=pool.region,
            tag={"key": cluster.apply(lambda c: f"k8s.io/cluster-autoscaler/{c}"), "value": "owned",
                 "propagate_at_launch": False},
            opts=child(self),
        )
        # Node capacity on the clock: raise the group's minimum ahead of each floor window, lower it after.
        # Only the minimum changes (-1 keeps max and desired: the autoscaler owns desired; the group raises
        # desired to a higher minimum by itself).
        for m in args.minimums:
            if m.pool != pool.name:
                raise ValueError(f"node minimum for pool {m.pool!r} given to pool {pool.name!r}")
            autoscaling.Schedule(
                f"{name}-min-{m.minute_of_week}",
                scheduled_action_name=f"{pool.name}-min-{m.min_nodes}-at-{m.minute_of_week}",
                autoscaling_group_name=self.asg_name,
                region=pool.region,
                min_size=m.min_nodes,
                max_size=-1,
                desired_capacity=-1,
                recurrence=weekly_cron(m.minute_of_week),
                time_zone=m.timezone,
                opts=child(self),
            )
        self.node_group_name = group.node_group_name
        self.register_outputs({"nodeGroupName": self.node_group_name, "launchTemplateId": template.id,
                               "autoScalingGroupName": self.asg_name})
