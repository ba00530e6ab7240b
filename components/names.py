"""Names more than one component (or the gateway config and a component) must agree on. Pure: no pulumi."""

from __future__ import annotations

from topology.names import (  # noqa: F401  (the inputs and calibrate use the same names)
    ENDPOINT_LABEL, ENDPOINT_METRIC_LABEL, TRACK_LABEL, TRACK_METRIC_LABEL, TRACK_STABLE, config_name,
    prometheus_label_name, promql_string,
)

TRACK_CANARY = "canary"  # a rollout candidate in shadow or canary
TRACK_PREVIOUS = "previous"  # the previous version kept warm after a promotion (N−1)
VERSION_LABEL = "serving.llm/model-version"  # pod label: the model version (weights + engine + settings) a pod runs
# the pod labels the floor PodMonitor copies onto every series it scrapes (podTargetLabels)
POD_TARGET_LABELS = (ENDPOINT_LABEL, TRACK_LABEL)


def engine_selector(namespace: str, endpoint: str, served_model_name: str, *, stable: bool = False,
                    extra: str = "") -> str:
    """The label selector of one endpoint's floor-pod (vLLM) series: namespace and endpoint (the label the
    PodMonitor copies from the pods: vLLM labels its series by served model name, which two endpoints may share),
    model_name kept for readability and as a check; `stable` keeps only the stable track, `extra` adds a matcher."""
    matchers = [f"namespace={promql_string(namespace)}", f"{ENDPOINT_METRIC_LABEL}={promql_string(endpoint)}",
                f"model_name={promql_string(served_model_name)}"]
    if stable:
        matchers.append(f"{TRACK_METRIC_LABEL}={promql_string(TRACK_STABLE)}")
    if extra:
        matchers.append(extra)
    return "{" + ",".join(matchers) + "}"


def floor_backend_name(endpoint: str) -> str:
    """The floor backend's name: the `proxy` label of its series in the gateway's /metrics (with admission
    control the floor's queue waits here, so the floor's autoscaler counts this backend's queue)."""
    return f"be_{config_name(endpoint)}_floor"


def burst_backend_name(endpoint: str) -> str:
    """The burst backend's name: the `proxy` label of its series in the gateway's /metrics (the floor's
    autoscaler watches `haproxy_backend_current_sessions` of this backend for burst backlog)."""
    return f"be_{config_name(endpoint)}_burst"
