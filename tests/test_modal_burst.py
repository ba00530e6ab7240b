"""The Modal burst app: built offline from each stack's spec, checked against the spec.

Checked twice: through the project-owned settings object (everything, including values Modal keeps
private: min/max/buffer containers, scaledown window, snapshot flags) and through Modal's public
`Function.info()` of the app module actually built from the spec (GPU, region, timeouts, concurrency,
volumes, proxy auth, schedule).
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modal_apps import settings as S
from modal_apps.deploy import DeploymentRecord, parse_record, superseded
from topology.spec import MinContainersWindow


def burst_endpoints(spec):
    return [e for e in spec.endpoints if e.burst is not None]


def import_burst(monkeypatch, config: S.BurstAppConfig):
    """Import modal_apps.burst afresh with `config` in the environment, as a deploy would."""
    for var in (S.ENV_SPEC_FILE, S.ENV_STACK, S.ENV_ENDPOINT):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(S.ENV_SPEC, config.to_json())
    sys.modules.pop("modal_apps.burst", None)
    return importlib.import_module("modal_apps.burst")


def parse_gpu(gpu: str) -> tuple[str, int]:
    kind, _, count = gpu.partition(":")
    return kind, int(count or 1)


def test_every_stack_has_something_to_check(planned_stacks):
    # prod: assist and autocomplete burst; dev: assist and guard (serverless_only).
    assert {name: [e.name for e in burst_endpoints(spec)] for name, (_, spec) in planned_stacks.items()} == {
        "dev": ["assist", "guard"],
        "prod": ["assist", "autocomplete"],
    }


def test_settings_object_equals_the_spec(stack):
    _, _, spec = stack
    for endpoint in burst_endpoints(spec):
        b, eng = endpoint.burst, endpoint.engine
        s = S.build_settings(S.BurstAppConfig.from_endpoint(endpoint))
        kw = s.cls_kwargs()
        assert kw["gpu"] == b.gpu and kw["region"] == b.region
        # the cores and memory the plan priced are what the container reserves (Modal bills max(reservation, use))
        assert (kw["cpu"], kw["memory"]) == (b.cpu_cores, b.memory_mib)
        assert (kw["min_containers"], kw["max_containers"], kw["buffer_containers"]) == (
            b.min_containers, b.max_containers, b.buffer_containers)
        assert kw["scaledown_window"] == b.scaledown_window_s
        assert kw["startup_timeout"] == b.startup_timeout_s and kw["timeout"] == b.timeout_s
        assert kw["enable_memory_snapshot"] is b.enable_memory_snapshot
        assert kw.get("experimental_options", {}).get("enable_gpu_snapshot", False) is b.enable_gpu_snapshot
        assert s.concurrent_kwargs() == {"max_inputs": b.max_inputs, "target_inputs": b.target_inputs}
        assert s.web_server_kwargs() == {
            "port": eng.port, "startup_timeout": b.startup_timeout_s, "requires_proxy_auth": True}
        assert s.image == eng.image and s.volume_name == b.volume_name
        assert s.min_containers_schedule == b.min_containers_schedule
        # Never a hub at boot.
        assert kw["env"]["HF_HUB_OFFLINE"] == "1" and kw["env"]["TRANSFORMERS_OFFLINE"] == "1"


def test_built_app_matches_the_spec_through_function_info(stack, monkeypatch):
    _, _, spec = stack
    for endpoint in burst_endpoints(spec):
        b = endpoint.burst
        burst = import_burst(monkeypatch, S.BurstAppConfig.from_endpoint(endpoint))
        assert burst.app.name == b.app_name
        info = burst.BurstServer().serve.info()
        assert info.gpus == [parse_gpu(b.gpu)]
        # Modal's own record of the reservation (what it bills at least): the cores and memory the plan priced
        assert (info.cpu, info.memory_mib) == (b.cpu_cores, b.memory_mib)
        assert info.nonpreemptible is False  # the list price the plan uses (non-preemptible bills more)
        assert info.regions == [b.region]
        assert info.startup_timeout == b.startup_timeout_s and info.timeout == b.timeout_s
        concurrency = info.concurrency_info
        assert (concurrency.max_inputs, concurrency.target_inputs) == (b.max_inputs, b.target_inputs)
        # Weights: the endpoint's volume, read-only, where the model path points.
        assert {p: (v.name, v.read_only) for p, v in info.volumes.items()} == {S.WEIGHTS_MOUNT: (b.volume_name, True)}
        assert burst.settings.model_path.startswith(S.WEIGHTS_MOUNT + "/")
        # Private: the web endpoint requires Modal proxy auth.
        assert info.method_names == ["serve"]
        assert info.method_details["serve"].unauthenticated is False
        # The container gets the config as env, so it never re-plans; and it is this endpoint's config.
        assert any(S.ENV_SPEC in s and "HF_HUB_OFFLINE" in s for s in info.secrets)
        shipped = S.load_config({S.ENV_SPEC: burst.settings.container_env[S.ENV_SPEC]})
        # all of it but what the plan reports about its price (left out so a price update redeploys nothing)
        assert shipped.burst == b.model_copy(update={"spike_warm_usd_per_month": 0.0, "usd_per_container_hour": 0.0})
        assert shipped.engine == endpoint.engine


def test_clock_following_minimum_is_scheduled_only_when_the_spec_asks(stack, monkeypatch):
    _, _, spec = stack
    for endpoint in burst_endpoints(spec):
        burst = import_burst(monkeypatch, S.BurstAppConfig.from_endpoint(endpoint))
        if endpoint.burst.min_containers_schedule:
            info = burst.follow_clock.info()
            assert info.schedule == f"Cron('{S.FOLLOW_CLOCK_CRON}', {endpoint.burst.schedule_timezone})"
            assert info.gpus == []  # a CPU-only function moves the GPU minimum
        else:
            assert not hasattr(burst.follow_clock, "info"), "no schedule in the spec: no scheduled function"


def test_floor_and_burst_run_the_same_engine(stack):
    _, _, spec = stack
    for endpoint in burst_endpoints(spec):
        s = S.build_settings(S.BurstAppConfig.from_endpoint(endpoint))
        floor_style = endpoint.engine.vllm_args("/models/X")
        burst_cmd = [a if a != s.model_path else "/models/X" for a in s.server_command]
        # Same engine flags in the same order; the only additions bind the port and enable sleep mode.
        assert burst_cmd[: len(floor_style)] == floor_style
        assert tuple(burst_cmd[len(floor_style):]) == S.SERVER_ONLY_FLAGS
        engine_flags = {a for a in floor_style if a.startswith("--")}
        assert not engine_flags & {a for a in S.SERVER_ONLY_FLAGS if a.startswith("--")}
        for flag, value in [("--served-model-name", endpoint.engine.served_model_name),
                            ("--max-model-len", str(endpoint.engine.max_model_len)),
                            ("--tensor-parallel-size", str(endpoint.engine.tensor_parallel_size))]:
            assert burst_cmd[burst_cmd.index(flag) + 1] == value
        # The model path is the weight cache's layout under the volume: same revision as the floor.
        assert s.model_path.endswith(endpoint.engine.weights_uri_suffix.strip("/"))
        assert endpoint.model_revision in s.model_path and s.model_revision == endpoint.model_revision


def test_burst_container_is_as_offline_as_the_floor_pods(stack):
    from components.floor_replicas import HUB_OFFLINE_ENV as FLOOR_ENV

    _, _, spec = stack
    for endpoint in burst_endpoints(spec):
        env = S.build_settings(S.BurstAppConfig.from_endpoint(endpoint)).container_env
        assert FLOOR_ENV.items() <= env.items()


def test_gpu_count_matches_tensor_parallel_size(stack):
    _, _, spec = stack
    for endpoint in burst_endpoints(spec):
        assert parse_gpu(endpoint.burst.gpu)[1] == endpoint.engine.tensor_parallel_size


# --- where the config comes from ------------------------------------------------------------------


def test_config_from_endpoint_json_file_and_stack(planned_stacks, tmp_path, root):
    _, spec = planned_stacks["prod"]
    expected = S.BurstAppConfig.from_endpoint(spec.endpoint("assist"))
    assert S.load_config({S.ENV_SPEC: spec.endpoint("assist").model_dump_json()}) == expected
    f = tmp_path / "spec.json"
    f.write_text(spec.to_json())
    assert S.load_config({S.ENV_SPEC_FILE: str(f), S.ENV_ENDPOINT: "assist"}) == expected
    from_stack = S.load_config({S.ENV_STACK: str(root / "stacks/Pulumi.prod.yaml"), S.ENV_ENDPOINT: "assist"})
    assert from_stack == expected


@pytest.mark.parametrize(
    "environ, needle",
    [
        ({}, "LLM_SERVING_BURST_SPEC"),
        ({S.ENV_SPEC: "{not json"}, "LLM_SERVING_BURST_SPEC is not valid JSON"),
        ({S.ENV_SPEC: json.dumps({"endpoint": "x"})}, "not a BurstAppConfig"),
        ({S.ENV_SPEC_FILE: "/nonexistent/spec.json"}, "cannot read"),
        ({S.ENV_STACK: "stacks/Pulumi.prod.yaml"}, "LLM_SERVING_ENDPOINT"),
    ],
)
def test_config_errors_name_the_variable(environ, needle):
    with pytest.raises(S.BurstConfigError, match=needle):
        S.load_config(environ)


def test_endpoint_without_burst_is_refused_with_its_tier(planned_stacks, root):
    stack = str(root / "stacks/Pulumi.prod.yaml")
    with pytest.raises(S.BurstConfigError, match="'dedicated_only' and no burst capacity"):
        S.load_config({S.ENV_STACK: stack, S.ENV_ENDPOINT: "guard"})
    with pytest.raises(S.BurstConfigError, match=r"not an endpoint .*\['assist', 'autocomplete'\]"):
        S.load_config({S.ENV_STACK: stack, S.ENV_ENDPOINT: "nope"})


def test_app_module_refuses_to_import_without_config(monkeypatch):
    for var in (S.ENV_SPEC, S.ENV_SPEC_FILE, S.ENV_STACK, S.ENV_ENDPOINT):
        monkeypatch.delenv(var, raising=False)
    sys.modules.pop("modal_apps.burst", None)
    with pytest.raises(S.BurstConfigError, match="has no config"):
        importlib.import_module("modal_apps.burst")


def test_inconsistent_snapshot_flags_are_refused(planned_stacks):
    _, spec = planned_stacks["prod"]
    config = S.BurstAppConfig.from_endpoint(spec.endpoint("assist"))
    bad = config.model_copy(update={"burst": config.burst.model_copy(update={"enable_memory_snapshot": False})})
    with pytest.raises(S.BurstConfigError, match="enable_gpu_snapshot=True needs burst.enable_memory_snapshot"):
        S.build_settings(bad)


# --- the weights the server agrees to serve -------------------------------------------------------


def test_server_refuses_missing_or_other_revision(planned_stacks, monkeypatch, tmp_path):
    _, spec = planned_stacks["dev"]
    endpoint = spec.endpoint("guard")
    burst = import_burst(monkeypatch, S.BurstAppConfig.from_endpoint(endpoint))
    with pytest.raises(RuntimeError, match="no .llm-serving/revision.json"):
        burst.check_weights_revision(tmp_path)
    marker = tmp_path / S.REVISION_MARKER
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"revision": "0" * 40}))
    with pytest.raises(RuntimeError, match=f"holds revision '{'0' * 40}'.*{endpoint.model_revision}"):
        burst.check_weights_revision(tmp_path)
    marker.write_text(json.dumps({"revision": endpoint.model_revision}))
    with pytest.raises(RuntimeError, match="is missing from volume"):
        burst.check_weights_revision(tmp_path)
    (tmp_path / endpoint.engine.weights_uri_suffix).mkdir(parents=True)
    burst.check_weights_revision(tmp_path)


# --- the clock-following minimum ------------------------------------------------------------------


def prod_assist_settings(planned_stacks):
    _, spec = planned_stacks["prod"]
    return S.build_settings(S.BurstAppConfig.from_endpoint(spec.endpoint("assist")))


def test_minimum_follows_the_windows(prod_unwarmed):
    """prod assist without the spike's warm minimum: one container warm in the burst's hours."""
    s = S.build_settings(S.BurstAppConfig.from_endpoint(prod_unwarmed[1].endpoint("assist")))
    first = s.min_containers_schedule[0]  # Monday 06:59 (07:00 rise minus lead) to Tuesday 01:00
    assert S.desired_min_containers(s, first.start_minute_of_week) == first.min_containers
    assert S.desired_min_containers(s, first.end_minute_of_week - 1) == first.min_containers
    # Lowered again after the window (one lookahead period later at most).
    assert S.desired_min_containers(s, first.end_minute_of_week) == s.min_containers == 0
    # Raised one period *before* the window starts: the cron may run up to a period late.
    assert S.desired_min_containers(s, first.start_minute_of_week - S.FOLLOW_CLOCK_PERIOD_MIN + 1) == 1
    assert S.desired_min_containers(s, first.start_minute_of_week - S.FOLLOW_CLOCK_PERIOD_MIN) == 0


def test_window_wrapping_past_sunday(prod_unwarmed):
    s = S.build_settings(S.BurstAppConfig.from_endpoint(prod_unwarmed[1].endpoint("assist")))
    wrap = [w for w in s.min_containers_schedule if w.end_minute_of_week < w.start_minute_of_week]
    assert wrap, "prod assist's last window wraps past Sunday midnight"
    w = wrap[0]
    for minute in (w.start_minute_of_week, S.MINUTES_PER_WEEK - 1, 0, w.end_minute_of_week - 1):
        assert S.desired_min_containers(s, minute, lookahead_min=1) == w.min_containers
    assert S.desired_min_containers(s, w.end_minute_of_week, lookahead_min=1) == 0


def test_the_deployed_minimum_holds_the_spikes_warm_containers_in_its_hours(planned_stacks):
    """prod assist keeps burst warm for its 3× spike in its 17 busiest hours (traffic.spike_warm_hours_fraction
    0.1), Fri 19:00 and 20:00 among them, at the 24-container cap (the spike needs 37:
    tests/test_admission_plan.py). What the deployed scheduled function sets (desired_min_containers, read from
    the app's own settings): 24 from a cold start ahead of 19:00 (18:59 with the cron's period of lookahead)
    until 21:00, then the one container the burst's hours keep warm; on Wed 14:00 (not one of those hours), 1."""
    s = prod_assist_settings(planned_stacks)
    fri = 4 * 1440
    assert S.desired_min_containers(s, fri + 20 * 60 + 10, lookahead_min=1) == 24
    assert S.desired_min_containers(s, fri + 18 * 60 + 59, lookahead_min=1) == 24
    assert S.desired_min_containers(s, fri + 21 * 60, lookahead_min=1) == 1
    assert S.desired_min_containers(s, 2 * 1440 + 14 * 60 + 10, lookahead_min=1) == 1
    assert s.max_containers == 24


def test_the_simulator_holds_the_minimum_the_deployed_function_sets_every_minute(planned_stacks):
    """The deployed scheduled function and the simulator read the same spec: for every minute of the week the
    simulator's burst minimum (simulator/engine.py) equals what desired_min_containers sets for that minute
    (without the cron's lookahead), for prod assist's windows of 1 and of the spike's 24."""
    import numpy as np

    from simulator.engine import EndpointSim

    inputs, spec = planned_stacks["prod"]
    ep = spec.endpoint("assist")
    sim = EndpointSim(inputs, next(e for e in inputs.endpoints if e.name == "assist"), ep, 0.0, 60.0,
                      np.random.default_rng(0))
    s = prod_assist_settings(planned_stacks)
    deployed = [S.desired_min_containers(s, m, lookahead_min=1) for m in range(S.MINUTES_PER_WEEK)]
    assert sim.b_min.tolist() == deployed
    assert max(deployed) == 24 and deployed.count(24) >= 17 * 60


def test_minute_of_week_uses_the_schedule_timezone():
    # Monday 2026-11-30 12:00 UTC is 07:00 in New York (EST, UTC-5); in July it is 08:00 (EDT).
    assert S.minute_of_week(dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc), "America/New_York") == 420
    assert S.minute_of_week(dt.datetime(2026, 7, 6, 12, 0, tzinfo=dt.timezone.utc), "America/New_York") == 480
    with pytest.raises(ValueError, match="aware datetime"):
        S.minute_of_week(dt.datetime(2026, 7, 6, 12, 0), "UTC")


windows = st.lists(
    st.builds(MinContainersWindow, start_minute_of_week=st.integers(0, 10079),
              end_minute_of_week=st.integers(0, 10079), min_containers=st.integers(1, 5)),
    max_size=4,
)


@given(windows=windows, base=st.integers(0, 2), minute=st.integers(0, 10079))
def test_minimum_is_the_highest_active_requirement(planned_stacks, windows, base, minute):
    s = prod_assist_settings(planned_stacks)
    s = S.BurstSettings(**{**s.__dict__, "min_containers": base, "min_containers_schedule": tuple(windows)})
    got = S.desired_min_containers(s, minute, lookahead_min=1)
    week = S.MINUTES_PER_WEEK  # independent oracle: offset from the start is shorter than the window
    active = [w.min_containers for w in windows
              if (minute - w.start_minute_of_week) % week < (w.end_minute_of_week - w.start_minute_of_week) % week]
    assert got == max([base, *active])
    assert S.desired_min_containers(s, minute) >= got  # lookahead only ever raises


# --- the deployment record the component exports ---------------------------------------------------


def test_deployment_record_round_trips_and_renames_stop_the_old_app():
    old = DeploymentRecord("llm-serving-prod-assist-burst", "prod", "https://x.modal.run", "a" * 64, 1)
    stdout = "building image...\n" + old.line() + "\n"
    assert parse_record(stdout) == old
    assert parse_record("no record here") is None and parse_record(None) is None
    same_app = DeploymentRecord(old.app_name, "prod", old.web_url, "b" * 64, 0)
    assert superseded(old, same_app) is None, "an update of the same app must never stop it"
    renamed = DeploymentRecord("llm-serving-prod-assist-burst-v2", "prod", None, "b" * 64, 0)
    assert superseded(old, renamed) == old
    assert superseded(None, renamed) is None


def test_burst_engine_environment_is_the_floors_including_the_lora_resolver(stack):
    _, _, spec = stack
    for endpoint in burst_endpoints(spec):
        s = S.build_settings(S.BurstAppConfig.from_endpoint(endpoint))
        assert endpoint.engine.vllm_env(s.model_path).items() <= s.container_env.items()
        if endpoint.engine.lora is not None:
            assert s.container_env["VLLM_LORA_RESOLVER_CACHE_DIR"].startswith(s.model_path + "/")
