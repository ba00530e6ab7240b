"""Stack settings that are not cost inputs: where the cluster is, where Prometheus answers, the namespace.

Read from the stack's config (keys other than `llm-serving:inputs`); every field has a default or a
clear error naming the key, the value and what is allowed. Secrets (a kubeconfig) are never read here:
they come from `pulumi config set --secret` and are passed through as Pulumi secrets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from topology.loading import InputError, format_validation_error
from topology.names import check_label_key, check_label_value

DEFAULT_PROMETHEUS_URL = "http://kube-prometheus-stack-prometheus.monitoring.svc.cluster.local:9090"


class _Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class StackReferenceSettings(_Settings):
    name: str = Field(min_length=1, description="Fully qualified stack, e.g. 'acme/platform/prod'.")
    cluster_name_output: str = Field("clusterName", alias="clusterNameOutput", description="Output holding the EKS cluster name.")
    node_role_arn_output: str = Field("nodeRoleArn", alias="nodeRoleArnOutput", description="Output holding the node IAM role ARN.")
    subnet_ids_output: str = Field("privateSubnetIds", alias="subnetIdsOutput", description="Output holding the node subnet IDs.")
    kubeconfig_output: str = Field("kubeconfig", alias="kubeconfigOutput", description="Output holding the kubeconfig (a secret).")


class ClusterSettings(_Settings):
    """`llm-serving:cluster`: use an existing EKS cluster or create a minimal one."""

    mode: Literal["existing", "create"] = Field(description="'existing': use a cluster; 'create': declare a minimal EKS cluster.")
    name: str | None = Field(None, min_length=1, max_length=100, description="EKS cluster name (required unless taken from a stack reference).")
    node_role_arn: str | None = Field(None, alias="nodeRoleArn", description="existing: IAM role the GPU node groups use.")
    subnet_ids: tuple[str, ...] = Field((), alias="subnetIds", description="Private subnets for node groups (create: also the control plane).")
    stack_reference: StackReferenceSettings | None = Field(
        None, alias="stackReference", description="existing: read name, node role, subnets and kubeconfig from this stack's outputs."
    )
    kubernetes_version: str = Field("1.33", alias="kubernetesVersion", description="create: EKS Kubernetes version.")
    system_instance_type: str = Field("m7i.xlarge", alias="systemInstanceType", description="create: instance type of the CPU node group for operators.")
    system_nodes: int = Field(2, ge=1, le=20, alias="systemNodes", description="create: CPU nodes for KEDA, the GPU operator, CoreDNS.")

    @model_validator(mode="after")
    def _complete(self) -> "ClusterSettings":
        if self.mode == "create":
            if self.stack_reference is not None:
                raise ValueError("stackReference is only for mode 'existing'")
            if not self.name:
                raise ValueError("mode 'create' needs name (the cluster to create)")
            if len(self.subnet_ids) < 2:
                raise ValueError(f"mode 'create' needs subnetIds in at least two availability zones; got {list(self.subnet_ids)}")
        elif self.stack_reference is None:
            missing = [k for k, v in (("name", self.name), ("nodeRoleArn", self.node_role_arn)) if not v]
            if not self.subnet_ids:
                missing.append("subnetIds")
            if missing:
                raise ValueError(f"mode 'existing' without stackReference needs {', '.join(missing)}")
        return self


class StackSettings(_Settings):
    cluster: ClusterSettings = Field(description="`llm-serving:cluster`.")
    namespace: str = Field(
        "llm-serving", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63,
        description="`llm-serving:namespace`: Kubernetes namespace of the serving workloads.",
    )
    prometheus_url: str = Field(
        DEFAULT_PROMETHEUS_URL, alias="prometheusUrl", pattern=r"^https?://",
        description="`llm-serving:prometheusUrl`: Prometheus KEDA queries for the queue metric.",
    )
    monitor_labels: dict[str, str] = Field(
        default_factory=lambda: {"release": "kube-prometheus-stack"}, alias="monitorLabels",
        description="`llm-serving:monitorLabels`: labels the Prometheus operator selects PodMonitors by.",
    )

    @field_validator("monitor_labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for k, x in v.items():  # they become metadata.labels of PodMonitors: Kubernetes label syntax
            check_label_key(k)
            check_label_value(x)
        return v


def stack_settings(config: Mapping[str, Any], source: str) -> StackSettings:
    """Settings from the non-input config keys (`cluster`, `namespace`, `prometheusUrl`, `monitorLabels`)."""
    if config.get("cluster") is None:
        raise InputError(
            f"{source}: missing config key 'cluster'; set it to {{mode: existing, name, nodeRoleArn, subnetIds}} "
            "or {mode: create, name, subnetIds} (see README)"
        )
    body = {k: v for k, v in config.items() if v is not None}
    try:
        return StackSettings.model_validate(body)
    except ValidationError as e:
        raise InputError(format_validation_error(e, source)) from None
