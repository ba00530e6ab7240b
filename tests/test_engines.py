"""Engine versions: the pinned vLLM image picks the flags the pods run with and the metric names read.

The references below were read in each release's wheel from PyPI (vllm/engine/arg_utils.py for the
request-logging default, vllm/v1/metrics/loggers.py for the series exported without
`--show-hidden-metrics-for-version`), written out by hand; they are not the project's table.
"""

from __future__ import annotations

import re

import pytest

from components.floor_replicas import scaled_object_spec
from components.observability import endpoint_alerts
from topology import PlanningError, load_inputs, plan
from topology.engines import ENGINE_RELEASES, EngineVersionError, image_vllm_version

# Metric families each release exports by default (the ones this project could read).
_COMMON = {
    "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:num_preemptions",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:request_prompt_tokens",
    "vllm:time_to_first_token_seconds",
}
EXPORTED = {
    "0.10.0": _COMMON | {"vllm:time_per_output_token_seconds", "vllm:gpu_cache_usage_perc"},
    "0.10.2": _COMMON | {"vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds",
                         "vllm:gpu_cache_usage_perc"},
    "0.11.0": _COMMON | {"vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds"},
    "0.12.0": _COMMON | {"vllm:inter_token_latency_seconds"},
    "0.13.0": _COMMON | {"vllm:inter_token_latency_seconds"},
}
# Does the release log every request unless told not to? (0.10.0: disable_log_requests=False; from 0.10.2
# enable_log_requests=False and --disable-log-requests is deprecated.)
LOGS_REQUESTS_BY_DEFAULT = {"0.10.0": True, "0.10.2": False, "0.11.0": False, "0.12.0": False, "0.13.0": False}
NS = "serving"


def test_every_supported_series_has_a_checked_release_in_the_references():
    checked = {r for row in ENGINE_RELEASES.values() for r in row.checked_releases}
    assert checked == set(EXPORTED) and sorted(ENGINE_RELEASES) == ["0.10", "0.11", "0.12", "0.13"]


def _plan_with(stack: str, image: str):
    inputs = load_inputs(f"stacks/Pulumi.{stack}.yaml")
    # another engine image is another model version: a rollout pinned to the bundled image's identity would
    # (rightly) refuse it, so the release tables are checked on the endpoints without their rollout
    eps = [e.model_copy(update={"engine_image": image, "rollout": None}) for e in inputs.endpoints]
    return plan(inputs.model_copy(update={"endpoints": eps}))


def _families(query: str) -> set[str]:
    return {re.sub(r"_(bucket|total|sum|count)$", "", m) for m in re.findall(r"vllm:[a-z_]+", query)}


@pytest.fixture(scope="module")
def planned_by_release(root):
    import os

    cwd = os.getcwd()
    os.chdir(root)
    try:
        return {v: _plan_with("prod", f"vllm/vllm-openai:v{v}") for v in EXPORTED}
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("release", sorted(EXPORTED))
def test_flags_match_the_release(planned_by_release, release):
    spec = planned_by_release[release]
    for ep in spec.endpoints:
        assert ep.engine.image == f"vllm/vllm-openai:v{release}" and ep.engine.vllm_version == release
        args = ep.engine.vllm_args("/models/m")
        # a quiet request log on every release: the flag where logging is on by default; never on a series
        # where it is deprecated for removal (0.10.2 accepts it as a deprecated no-op, so either is right)
        if LOGS_REQUESTS_BY_DEFAULT[release]:
            assert "--disable-log-requests" in args
        elif not release.startswith("0.10."):
            assert "--disable-log-requests" not in args
        assert "--enable-log-requests" not in args


@pytest.mark.parametrize("release", sorted(EXPORTED))
def test_alerts_and_autoscaler_read_only_metrics_the_release_exports(planned_by_release, release):
    spec = planned_by_release[release]
    read: set[str] = set()
    floors = [ep for ep in spec.endpoints if ep.node_pools]
    assert floors
    for ep in floors:
        for alert in endpoint_alerts(ep, NS).alerts:
            read |= _families(alert.query)
        for trigger in scaled_object_spec(ep, f"{ep.name}-vllm", NS, "http://prometheus:9090")["triggers"]:
            if trigger["type"] == "prometheus":
                read |= _families(trigger["metadata"]["query"])
    assert {"vllm:num_requests_waiting", "vllm:time_to_first_token_seconds", "vllm:kv_cache_usage_perc"} <= read
    missing = read - EXPORTED[release]
    assert not missing, f"vLLM {release} exports no {sorted(missing)}: those alerts would never fire"
    # the inter-token SLO alert reads the release's current name, not a deprecated one it still shows
    inter_token = {"vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"} & read
    assert inter_token == ({"vllm:time_per_output_token_seconds"} if release.startswith("0.10.")
                           else {"vllm:inter_token_latency_seconds"})


@pytest.mark.parametrize("release", sorted(EXPORTED))
def test_burst_tier_runs_the_floors_command_for_the_release(planned_by_release, release):
    from modal_apps import settings as S

    for ep in planned_by_release[release].endpoints:
        if ep.burst is None:
            continue
        s = S.build_settings(S.BurstAppConfig.from_endpoint(ep))
        assert list(s.engine_command) == ep.engine.vllm_args(s.model_path)
        assert s.image == ep.engine.image


@pytest.mark.parametrize(("image", "needle"), [
    ("vllm/vllm-openai:v0.9.2", "0.9.2"),
    ("vllm/vllm-openai:v0.14.0", "0.14.0"),
    ("vllm/vllm-openai:latest", "'latest'"),
    ("vllm/vllm-openai", "no version tag"),
    ("registry.local:5000/vllm/vllm-openai", "no version tag"),
])
def test_unsupported_or_unpinned_image_is_a_planning_error_naming_the_field(root, image, needle, monkeypatch):
    monkeypatch.chdir(root)
    with pytest.raises(PlanningError) as err:
        _plan_with("dev", image)
    msg = str(err.value)
    assert "engine_image" in msg and needle in msg
    assert "0.10.x, 0.11.x, 0.12.x, 0.13.x" in msg or "pin a vLLM release tag" in msg  # what is allowed


def test_image_version_parsing():
    assert image_vllm_version("vllm/vllm-openai:v0.11.0") == "0.11.0"
    assert image_vllm_version("vllm/vllm-openai:0.12.1") == "0.12.1"
    assert image_vllm_version("registry.local:5000/vllm/vllm-openai:v0.13.0@sha256:" + "a" * 64) == "0.13.0"
    with pytest.raises(EngineVersionError):
        image_vllm_version("vllm/vllm-openai@sha256:" + "a" * 64)
