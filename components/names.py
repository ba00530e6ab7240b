"""Names more than one component (or the gateway config and a component) must agree on. Pure: no pulumi."""

from __future__ import annotations

from topology.names import config_name  # noqa: F401  (the inputs check names with the same rule)

TRACK_LABEL = "serving.llm/track"  # pod label: the revision track a pod serves (TRACK_STABLE or TRACK_CANARY)
# the Prometheus label the PodMonitor copies TRACK_LABEL into (prometheus-operator sanitises the name)
TRACK_METRIC_LABEL = "serving_llm_track"
TRACK_STABLE = "stable"
TRACK_CANARY = "canary"  # a rollout candidate in shadow or canary
TRACK_PREVIOUS = "previous"  # the previous version kept warm after a promotion (N−1)
VERSION_LABEL = "serving.llm/model-version"  # pod label: the model version (weights + engine + settings) a pod runs


def floor_backend_name(endpoint: str) -> str:
    """The floor backend's name: the `proxy` label of its series in the gateway's /metrics (with admission
    control the floor's queue waits here, so the floor's autoscaler counts this backend's queue)."""
    return f"be_{config_name(endpoint)}_floor"


def burst_backend_name(endpoint: str) -> str:
    """The burst backend's name: the `proxy` label of its series in the gateway's /metrics (the floor's
    autoscaler watches `haproxy_backend_current_sessions` of this backend for burst backlog)."""
    return f"be_{config_name(endpoint)}_burst"
