"""Cluster: an existing EKS cluster (explicit settings or a stack reference) or a minimal new one.

Whichever way, the component hands the rest of the program the same four things: the cluster name,
the node IAM role and subnets the GPU node groups join with, and a Kubernetes provider; it also owns
the serving namespace. A created cluster is deliberately minimal: control plane, a small CPU node group
for operators (KEDA, the GPU operator, CoreDNS) and the add-ons the serving pods rely on — among them
the EKS Pod Identity agent, without which the weight-cache reader roles cannot be assumed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s
from pulumi_aws import eks, iam

from ._common import TYPE_PREFIX, child
from .stack_settings import ClusterSettings

_EKS_ASSUME = json.dumps({
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "eks.amazonaws.com"},
                   "Action": ["sts:AssumeRole", "sts:TagSession"]}],
})
_EC2_ASSUME = json.dumps({
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
})
_CLUSTER_POLICIES = ("arn:aws:iam::aws:policy/AmazonEKSClusterPolicy",)
_NODE_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
)
# Add-ons a created cluster needs for serving: networking, DNS, and Pod Identity for the weight readers.
_ADDONS = ("vpc-cni", "kube-proxy", "coredns", "eks-pod-identity-agent")
# The VPC CNI enforces NetworkPolicies (the engines' and the recorder's, components/network_policy.py) only with
# its network policy agent turned on: the add-on's `enableNetworkPolicy`, a string (add-on ≥ v1.14.0-eksbuild.3,
# EKS ≥ 1.25; amazon-vpc-cni-k8s charts/aws-vpc-cni/values.yaml, EKS user guide "cni-network-policy-configure")
_ADDON_CONFIGURATION = {"vpc-cni": json.dumps({"enableNetworkPolicy": "true"})}


@dataclass(frozen=True)
class ClusterArgs:
    settings: ClusterSettings
    region: str
    serving_namespace: str
    kubeconfig: pulumi.Input[str] | None = None  # secret config; None: the stack reference's, or the ambient kubeconfig


def kubeconfig_for(cluster_name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig that authenticates with `aws eks get-token` (no long-lived token in state)."""
    return json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
        "current-context": cluster_name,
        "users": [{"name": cluster_name, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "aws",
            "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region],
        }}}],
    }, sort_keys=True)


def _ca_data(authorities) -> str:
    """The base64 CA bundle of an eks.get_cluster result (a list of objects, or of dicts under mocks)."""
    if not authorities:
        return ""
    first = authorities[0]
    return first["data"] if isinstance(first, dict) else first.data


class Cluster(pulumi.ComponentResource):
    name: pulumi.Output[str]
    node_role_arn: pulumi.Output[str]
    subnet_ids: pulumi.Output[list[str]]
    provider: k8s.Provider
    namespace: pulumi.Output[str]
    kubeconfig: pulumi.Input[str] | None

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{TYPE_PREFIX}:Cluster", name, None, opts)
        s = args.settings
        if s.mode == "create":
            kubeconfig = self._create(name, args)
        else:
            kubeconfig = self._existing(name, args)
        self.kubeconfig = kubeconfig  # what the Kubernetes provider is given (None: the ambient kubeconfig)

        self.provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=kubeconfig,
            enable_server_side_apply=True,
            # replaced only when the cluster is another one: a replaced provider replaces every object it
            # manages, and all of them are named, so each is deleted before its copy is created (an outage of
            # every floor). Without it a rotated CA, a new server address or a kubeconfig unknown at preview
            # (mode: create) would do that (pulumi-kubernetes provider.py: cluster_identifier)
            cluster_identifier=self.name,
            # On a platform's cluster the operator creates the serving namespace before the first `up` (for the
            # gateway's Secrets, which preflight requires), and the platform may already have keda or gpu-operator
            # namespaces: pulumi-kubernetes >= 4.29 refuses to create an object that exists (AlreadyExists;
            # CHANGELOG 4.29.0), so that `up` failed. Here such objects are adopted, as before 4.29. A cluster this
            # stack creates has none. (A NamespacePatch instead would change the resources' type: the existing
            # Namespace resources would be deleted at the end of the next `up`, and the namespace with everything
            # in it. With cluster_identifier set, this provider setting is an update, not a replacement.)
            upsert_existing_objects=args.settings.mode == "existing",
            opts=child(self),
        )
        ns = k8s.core.v1.Namespace(
            f"{name}-serving-namespace",
            metadata={"name": args.serving_namespace, "labels": {"app.kubernetes.io/part-of": "llm-serving"}},
            opts=child(self, provider=self.provider),
        )
        self.namespace = ns.metadata.apply(lambda m: m["name"])
        self.register_outputs({
            "name": self.name,
            "nodeRoleArn": self.node_role_arn,
            "subnetIds": self.subnet_ids,
            "namespace": self.namespace,
        })

    def _existing(self, name: str, args: ClusterArgs) -> pulumi.Input[str] | None:
        s = args.settings
        if s.stack_reference is None:
            self.name = pulumi.Output.from_input(s.name or "")
            self.node_role_arn = pulumi.Output.from_input(s.node_role_arn or "")
            self.subnet_ids = pulumi.Output.from_input(list(s.subnet_ids))
            if args.kubeconfig is not None:
                return args.kubeconfig
            # no kubeconfig given: one from the cluster's own endpoint and CA (`aws eks get-token` for the caller),
            # so a CI runner with AWS credentials and an access entry needs no kubeconfig of its own
            found = eks.get_cluster_output(name=s.name or "", region=args.region)
            return pulumi.Output.secret(pulumi.Output.all(found.name, found.endpoint, found.certificate_authorities).apply(
                lambda a: kubeconfig_for(a[0], a[1], _ca_data(a[2]), args.region)))
        ref = pulumi.StackReference(f"{name}-platform", stack_name=s.stack_reference.name, opts=child(self))
        r = s.stack_reference
        self.name = pulumi.Output.from_input(s.name) if s.name else ref.require_output(r.cluster_name_output)
        self.node_role_arn = (
            pulumi.Output.from_input(s.node_role_arn) if s.node_role_arn else ref.require_output(r.node_role_arn_output)
        )
        self.subnet_ids = (
            pulumi.Output.from_input(list(s.subnet_ids)) if s.subnet_ids else ref.require_output(r.subnet_ids_output)
        )
        if args.kubeconfig is not None:
            return args.kubeconfig
        return pulumi.Output.secret(ref.require_output(r.kubeconfig_output)).apply(
            lambda v: v if isinstance(v, str) else json.dumps(v, sort_keys=True)
        )

    def _create(self, name: str, args: ClusterArgs) -> pulumi.Output[str]:
        s = args.settings
        cluster_role = iam.Role(f"{name}-control-plane-role", assume_role_policy=_EKS_ASSUME, opts=child(self))
        attachments = [
            iam.RolePolicyAttachment(f"{name}-control-plane-{arn.rsplit('/', 1)[1]}", role=cluster_role.name,
                                     policy_arn=arn, opts=child(self))
            for arn in _CLUSTER_POLICIES
        ]
        cluster = eks.Cluster(
            f"{name}-eks",
            name=s.name,
            region=args.region,
            version=s.kubernetes_version,
            role_arn=cluster_role.arn,
            vpc_config={"subnet_ids": list(s.subnet_ids), "endpoint_private_access": True, "endpoint_public_access": True,
                        "public_access_cidrs": list(s.public_access_cidrs)},
            # API access entries, not the aws-auth ConfigMap: node roles and admins are IAM-managed.
            access_config={"authentication_mode": "API", "bootstrap_cluster_creator_admin_permissions": True},
            # a version past standard support is upgraded, not billed as extended support ($0.60 instead of $0.10 an
            # hour per cluster; EKS's default support type is EXTENDED)
            upgrade_policy={"support_type": s.support_type},
            opts=child(self, depends_on=attachments),
        )
        # the creator alone is admin (bootstrap above): the CI role and the platform team get access entries
        for i, arn in enumerate(s.admin_principal_arns):
            entry = eks.AccessEntry(f"{name}-admin-{i}", cluster_name=cluster.name, principal_arn=arn, region=args.region,
                                    type="STANDARD", opts=child(self))
            eks.AccessPolicyAssociation(
                f"{name}-admin-{i}-policy", cluster_name=cluster.name, principal_arn=arn, region=args.region,
                policy_arn="arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy",
                access_scope={"type": "cluster"}, opts=child(self, depends_on=[entry]),
            )
        node_role = iam.Role(f"{name}-node-role", assume_role_policy=_EC2_ASSUME, opts=child(self))
        node_attachments = [
            iam.RolePolicyAttachment(f"{name}-node-{arn.rsplit('/', 1)[1]}", role=node_role.name, policy_arn=arn,
                                     opts=child(self))
            for arn in _NODE_POLICIES
        ]
        system = eks.NodeGroup(
            f"{name}-system-nodes",
            cluster_name=cluster.name,
            region=args.region,
            node_role_arn=node_role.arn,
            subnet_ids=list(s.subnet_ids),
            ami_type="AL2023_x86_64_STANDARD",
            instance_types=[s.system_instance_type],
            capacity_type="ON_DEMAND",
            scaling_config={"min_size": s.system_nodes, "max_size": s.system_nodes, "desired_size": s.system_nodes},
            labels={"serving.llm/role": "system"},
            opts=child(self, depends_on=node_attachments),
        )
        for addon in _ADDONS:
            eks.Addon(
                f"{name}-addon-{addon}",
                cluster_name=cluster.name,
                region=args.region,
                addon_name=addon,
                # EKS installs self-managed vpc-cni, kube-proxy and coredns with the cluster: the managed add-on
                # takes them over instead of failing on a field they differ in
                resolve_conflicts_on_create="OVERWRITE",
                resolve_conflicts_on_update="OVERWRITE",
                configuration_values=_ADDON_CONFIGURATION.get(addon),
                # coredns needs nodes to schedule on before it reports healthy
                opts=child(self, depends_on=[system] if addon == "coredns" else []),
            )
        self.name = cluster.name
        self.node_role_arn = node_role.arn
        self.subnet_ids = pulumi.Output.from_input(list(s.subnet_ids))
        return pulumi.Output.secret(
            pulumi.Output.all(cluster.name, cluster.endpoint, cluster.certificate_authority).apply(
                lambda a: kubeconfig_for(a[0], a[1], a[2]["data"], args.region)
            )
        )
