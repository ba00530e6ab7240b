"""NodeAutoscaler: Cluster Autoscaler (official Helm chart) so GPU pools at zero grow when pods are Pending.

Why Cluster Autoscaler and not Karpenter: the on-demand pools must grow from zero for pods asking for
MIG slices (`nvidia.com/mig-1g.10gb: 1`). Cluster Autoscaler's AWS provider builds the node it would add
from the Auto Scaling group's `k8s.io/cluster-autoscaler/node-template/resources/<name>` tags, any
extended resource included, so it knows an empty MIG pool offers 7 × `mig-1g.10gb` before a node exists;
Karpenter's AWS provider does not know extended resources before a node exists (only through its alpha
NodeOverlay). The node-template tags are written on the groups by GpuNodePool (managed-node-group tags do
not reach the Auto Scaling group).

The autoscaler finds the groups by the `k8s.io/cluster-autoscaler/enabled` and
`k8s.io/cluster-autoscaler/<cluster>` tags and gets AWS credentials from its own Pod Identity role: the
chart's "full features" policy, with the two mutating actions limited to groups tagged for this cluster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s
from pulumi_aws import eks, iam

from ._common import TYPE_PREFIX, child

CHART_REPO = "https://kubernetes.github.io/autoscaler"
CHART_VERSION = "9.59.0"  # kubernetes/autoscaler cluster-autoscaler/charts/cluster-autoscaler/Chart.yaml
# The autoscaler's minor version should match the cluster's (its docs); tags checked in kubernetes/autoscaler.
IMAGE_TAGS = {"1.33": "v1.33.6", "1.34": "v1.34.5", "1.35": "v1.35.2"}
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "cluster-autoscaler"

_POD_IDENTITY_ASSUME = json.dumps({
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"},
                   "Action": ["sts:AssumeRole", "sts:TagSession"]}],
}, sort_keys=True)


def discovery_tags(cluster_name: str) -> dict[str, str]:
    """The tags the chart's default autoDiscovery looks for on Auto Scaling groups."""
    return {"k8s.io/cluster-autoscaler/enabled": "true", f"k8s.io/cluster-autoscaler/{cluster_name}": "owned"}


AUTOSCALER_POLICY_NAME = "cluster-autoscaler"


def autoscaler_policy(cluster_name: str) -> str:
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "Describe", "Effect": "Allow", "Resource": "*", "Action": [
                "autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
                "autoscaling:DescribeLaunchConfigurations", "autoscaling:DescribeScalingActivities",
                "ec2:DescribeImages", "ec2:DescribeInstanceTypes", "ec2:DescribeLaunchTemplateVersions",
                "ec2:GetInstanceTypesFromInstanceRequirements", "eks:DescribeNodegroup"]},
            {"Sid": "ScaleThisClustersGroups", "Effect": "Allow", "Resource": "*",
             "Action": ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
             "Condition": {"StringEquals": {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster_name}": "owned"}}},
        ],
    }, sort_keys=True)


def chart_values(cluster_name: str, region: str, kubernetes_version: str) -> dict:
    if kubernetes_version not in IMAGE_TAGS:
        raise ValueError(f"no Cluster Autoscaler image pinned for Kubernetes {kubernetes_version}; "
                         f"pinned: {sorted(IMAGE_TAGS)} (components/node_autoscaler.py IMAGE_TAGS)")
    return {
        "cloudProvider": "aws",
        "awsRegion": region,
        "autoDiscovery": {"clusterName": cluster_name},
        "image": {"tag": IMAGE_TAGS[kubernetes_version]},
        "rbac": {"create": True, "serviceAccount": {"create": True, "name": SERVICE_ACCOUNT}},
        "extraArgs": {
            "expander": "least-waste",  # of the pools that fit a pod, the one leaving the fewest GPUs idle
            # floor pods keep weights on the node's NVMe (emptyDir/hostPath): that must not pin an idle node
            "skip-nodes-with-local-storage": "false",
            "balance-similar-node-groups": "false",  # reserved and on-demand pools differ on purpose
            "scale-down-unneeded-time": "10m",
        },
    }


@dataclass(frozen=True)
class NodeAutoscalerArgs:
    cluster_name: pulumi.Input[str]
    region: str
    kubernetes_version: str


class NodeAutoscaler(pulumi.ComponentResource):
    release: k8s.helm.v3.Release

    def __init__(self, name: str, args: NodeAutoscalerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{TYPE_PREFIX}:NodeAutoscaler", name, None, opts)
        cluster = pulumi.Output.from_input(args.cluster_name)
        role = iam.Role(f"{name}-role", description="Cluster Autoscaler: scale this cluster's node groups",
                        assume_role_policy=_POD_IDENTITY_ASSUME, opts=child(self))
        iam.RolePolicy(f"{name}-role-policy", role=role.name, name=AUTOSCALER_POLICY_NAME,
                       policy=cluster.apply(autoscaler_policy), opts=child(self))
        # the role holds exactly this inline policy: one added out of band is removed on the next `up`
        iam.RolePoliciesExclusive(f"{name}-role-policies", role_name=role.name, policy_names=[AUTOSCALER_POLICY_NAME],
                                  opts=child(self))
        identity = eks.PodIdentityAssociation(
            f"{name}-pod-identity", cluster_name=cluster, region=args.region, namespace=NAMESPACE,
            service_account=SERVICE_ACCOUNT, role_arn=role.arn, opts=child(self),
        )
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            name="cluster-autoscaler",
            chart="cluster-autoscaler",
            version=CHART_VERSION,
            repository_opts={"repo": CHART_REPO},
            namespace=NAMESPACE,
            values=cluster.apply(lambda c: chart_values(c, args.region, args.kubernetes_version)),
            atomic=True,
            opts=child(self, depends_on=[identity]),
        )
        self.register_outputs({"release": self.release.name, "roleArn": role.arn})
