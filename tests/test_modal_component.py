"""ModalBurst under Pulumi's mocks: the deploy Command it records, its secrets and its URL output."""

from __future__ import annotations

import json

import pulumi
import pytest
from google.protobuf import json_format
from pulumi.runtime.mocks import MockMonitor

from components.modal_burst import (APP_CODE_ENV, ModalBurst, ModalBurstArgs, ModalTokenError, code_sha256,
                                   modal_token_env)
from modal_apps.deploy import DeploymentRecord
from modal_apps.settings import ENV_SPEC, BurstAppConfig, BurstConfigError

PROJECT = "llm-serving"
SECRET_SIG = "4dabf18193072939515e22adb298388d"  # Pulumi's marker key of a secret value on the wire
URL = "https://acme-prod--llm-serving-prod-assist-burst-burstserver-serve.modal.run"


def unwrap(value):
    """The value inside a secret wrapper (the mock monitor passes secrets in their wire form)."""
    if isinstance(value, dict) and SECRET_SIG in value:
        return value["value"]
    return value


def plain_occurrences(value, needle: str) -> int:
    """How often `needle` appears in `value` *outside* any secret wrapper."""
    if isinstance(value, dict):
        if SECRET_SIG in value:
            return 0
        return sum(plain_occurrences(v, needle) for v in value.values())
    if isinstance(value, list):
        return sum(plain_occurrences(v, needle) for v in value)
    return int(isinstance(value, str) and needle in value)


class Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        state = dict(args.inputs)
        if args.typ == "command:local:Command":
            # What `python -m modal_apps.deploy deploy` prints: build logs, then the deployment record.
            spec = json.loads(unwrap(args.inputs["environment"])[ENV_SPEC])
            record = DeploymentRecord(spec["burst"]["app_name"], "prod", URL, "x" * 64, 1)
            state["stdout"] = "Building image...\n" + record.line()
            state["stderr"] = ""
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


class RecordingMonitor(MockMonitor):
    """Keeps each RegisterResource request: parent, options and the wire form of the inputs (secrets visible)."""

    def __init__(self, mocks):
        super().__init__(mocks)
        self.requests = []

    def RegisterResource(self, request):
        self.requests.append(request)
        return super().RegisterResource(request)

    def find(self, typ: str):
        return [r for r in self.requests if r.type == typ]


def run_program(program, config: dict[str, str] | None = None, secret_keys: list[str] | None = None):
    """Run `program` under fresh mocks; returns the monitor and what the program returned (resolved)."""
    pulumi.runtime.settings.ROOT.set(None)
    monitor = RecordingMonitor(Mocks())
    pulumi.runtime.set_mocks(Mocks(), project=PROJECT, stack="prod", preview=False, monitor=monitor)
    pulumi.runtime.set_all_config(config or {}, secret_keys or [])
    result = {}

    @pulumi.runtime.test
    def body():
        outputs = program()
        return pulumi.Output.all(**outputs).apply(result.update)

    body()
    return monitor, result


@pytest.fixture
def prod_assist(planned_stacks):
    return planned_stacks["prod"][1].endpoint("assist")


@pytest.fixture(autouse=True)
def no_ambient_token(monkeypatch):
    monkeypatch.delenv("MODAL_TOKEN_ID", raising=False)
    monkeypatch.delenv("MODAL_TOKEN_SECRET", raising=False)


SECRET_CONFIG = {f"{PROJECT}:modalTokenId": "ak-test", f"{PROJECT}:modalTokenSecret": "as-test"}


def deploy_assist(endpoint):
    def program():
        burst = ModalBurst("assist-burst", ModalBurstArgs(endpoint=endpoint, environment="prod", python="python",
                                                           code_sha256=code_sha256(), token_env=modal_token_env()))
        return {"url": burst.url, "app_name": burst.app_name}
    return program


def test_records_a_deploy_command_with_update_and_secret_token(prod_assist):
    monitor, out = run_program(deploy_assist(prod_assist), SECRET_CONFIG, list(SECRET_CONFIG))
    (component,) = monitor.find("serving:components:ModalBurst")
    (cmd,) = [c for c in monitor.find("command:local:Command") if c.name.endswith("-deploy")]
    assert cmd.name == "assist-burst-deploy"
    assert cmd.parent == monitor.make_urn(component.parent, component.type, component.name)
    inputs = json_format.MessageToDict(cmd.object)

    # Create and update run the same deploy; an update never deletes the running app.
    assert inputs["create"] == inputs["update"] == "python -m modal_apps.deploy deploy --environment prod"
    assert inputs["delete"] == "python -m modal_apps.deploy stop"
    assert inputs["addPreviousOutputInEnv"] is True
    assert cmd.deleteBeforeReplace is True

    # No triggers: pulumi-command registers every Command with replaceOnChanges ["triggers[*]"], so a changed
    # trigger replaced it — delete (stop the live app) then deploy — whatever its update said. The spec and the app
    # code's hash ride in the environment instead, whose change runs the update: the same spec redeploys nothing.
    config = BurstAppConfig.from_endpoint(prod_assist)
    assert "triggers" not in inputs and list(cmd.replaceOnChanges) == ["triggers[*]"]
    # and a stack deployed when it had triggers does not replace it for their removal (a one-time stop of the app)
    assert "triggers" in list(cmd.ignoreChanges)

    env = unwrap(inputs["environment"])
    assert env[APP_CODE_ENV] == code_sha256()
    # the config but the prices it reports (a price update redeploys nothing: test below)
    assert BurstAppConfig.model_validate_json(env[ENV_SPEC]) == config.model_copy(update={
        "burst": config.burst.model_copy(update={"spike_warm_usd_per_month": 0.0, "usd_per_container_hour": 0.0})})
    assert (unwrap(env["MODAL_TOKEN_ID"]), unwrap(env["MODAL_TOKEN_SECRET"])) == ("ak-test", "as-test")
    for value in ("ak-test", "as-test"):  # on the wire, the token exists only inside a Pulumi secret
        assert plain_occurrences(inputs, value) == 0 and value in json.dumps(inputs)

    assert out == {"url": URL, "app_name": "llm-serving-prod-assist-burst"}


def test_token_from_the_environment_is_a_secret_too(prod_assist, monkeypatch):
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-env")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-env")
    monitor, _ = run_program(deploy_assist(prod_assist))
    (cmd,) = [c for c in monitor.find("command:local:Command") if c.name.endswith("-deploy")]
    inputs = json_format.MessageToDict(cmd.object)
    env = unwrap(inputs["environment"])
    assert (unwrap(env["MODAL_TOKEN_ID"]), unwrap(env["MODAL_TOKEN_SECRET"])) == ("ak-env", "as-env")
    for value in ("ak-env", "as-env"):
        assert plain_occurrences(inputs, value) == 0 and value in json.dumps(inputs)


def test_token_in_plain_config_is_refused(prod_assist):
    with pytest.raises(ModalTokenError, match=r"llm-serving:modalTokenSecret is stored in plain text.*--secret"):
        run_program(deploy_assist(prod_assist), SECRET_CONFIG, [f"{PROJECT}:modalTokenId"])


def test_half_a_token_is_refused(prod_assist, monkeypatch):
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-env")
    with pytest.raises(ModalTokenError, match="MODAL_TOKEN_SECRET is missing"):
        run_program(deploy_assist(prod_assist))


def test_without_a_token_the_command_carries_none(prod_assist):
    monitor, out = run_program(deploy_assist(prod_assist))
    (cmd,) = [c for c in monitor.find("command:local:Command") if c.name.endswith("-deploy")]
    env = json_format.MessageToDict(cmd.object)["environment"]
    assert SECRET_SIG not in env, "nothing secret to hide: the spec stays readable in diffs"
    assert set(env) == {ENV_SPEC, APP_CODE_ENV}
    assert out["url"] == URL


def test_endpoint_without_burst_is_refused(planned_stacks):
    guard = planned_stacks["prod"][1].endpoint("guard")  # dedicated_only in prod
    with pytest.raises(BurstConfigError, match="guard.*dedicated_only"):
        run_program(deploy_assist(guard))


def test_each_burst_endpoint_of_each_stack_gets_its_own_app(stack):
    name, _, spec = stack
    endpoints = [e for e in spec.endpoints if e.burst is not None]

    def program():
        outs = {}
        for e in endpoints:
            b = ModalBurst(f"{e.name}-burst", ModalBurstArgs(endpoint=e, environment=name, python="python",
                                                            code_sha256=code_sha256(), token_env={}))
            outs[e.name] = b.app_name
        return outs

    monitor, out = run_program(program)
    commands = [c for c in monitor.find("command:local:Command") if c.name.endswith("-deploy")]
    assert sorted(c.name for c in commands) == sorted(f"{e.name}-burst-deploy" for e in endpoints)
    assert out == {e.name: e.burst.app_name for e in endpoints}
    assert len({json.dumps(json_format.MessageToDict(c.object)["environment"], sort_keys=True)
                for c in commands}) == len(endpoints)


def test_url_is_empty_not_an_error_before_any_deploy_output(prod_assist, monkeypatch):
    # A mock (or a provider) that returns no stdout yet: the URL output stays a string.
    monkeypatch.setattr(Mocks, "new_resource", lambda self, args: (f"{args.name}-id", dict(args.inputs)))
    _, out = run_program(deploy_assist(prod_assist))
    assert out["url"] == ""


def test_a_price_update_that_leaves_the_burst_as_it_was_redeploys_nothing(planned_stacks):
    """Modal's serverless price up 2%: prod assist's burst runs exactly as before (same containers, windows,
    engine) and only the reported prices (its spike-warm minimum, a container-hour) move. The deploy trigger and the config the
    app is shipped must not move with it: a redeploy restarts the app's containers (a wave of cold starts)."""
    from topology import plan

    inputs, spec = planned_stacks["prod"]
    pr = inputs.prices
    dearer = pr.model_copy(update={"serverless_usd_per_gpu_second": {
        k: v * 1.02 for k, v in pr.serverless_usd_per_gpu_second.items()}})
    before = BurstAppConfig.from_endpoint(spec.endpoint("assist"))
    after = BurstAppConfig.from_endpoint(plan(inputs.model_copy(update={"prices": dearer})).endpoint("assist"))
    assert after.burst.spike_warm_usd_per_month > before.burst.spike_warm_usd_per_month > 0
    assert after.burst.usd_per_container_hour > before.burst.usd_per_container_hour > 0
    report_only = {"spike_warm_usd_per_month", "usd_per_container_hour"}
    assert after.burst.model_dump(exclude=report_only) == before.burst.model_dump(exclude=report_only)
    assert after.sha256() == before.sha256() and after.to_json() == before.to_json()
    # what the app is shipped still reads back as its config
    assert BurstAppConfig.model_validate_json(before.to_json()).burst.max_containers == before.burst.max_containers
