"""The offline runner's recording monitor answers as Pulumi's own MockMonitor does, and records the stack outputs
as the program exported them.

The monitor answers in the program's thread without the runtime's serializer (offline/mockrun.py); the reference
here is Pulumi's stock MockMonitor, run the stock way (set_mocks, its executor threads), over the same program.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pytest
from pulumi.runtime import settings

from offline.mockrun import SECRET, ServingMocks, _canonical, run_function

# inputs of every wire shape: nested maps, lists holding None, ints and fractions, booleans, unicode, empties
SPEC: dict[str, Any] = {
    "replicas": 3, "ratio": 0.25, "flags": [True, False], "gaps": [None, 1, "x"], "empty": {}, "none": [],
    "nested": {"deeper": {"name": "gpu-ü", "port": 8000}},
}


class Thing(pulumi.CustomResource):
    """A resource with an output for each input and for what the mocks add to an AWS type (arn)."""

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("aws:test/thing:Thing", name, {**props, "arn": None}, opts)


def declare() -> dict[str, pulumi.Output]:
    """Resources with plain, secret, asset and parented inputs; what the program reads back from them."""
    plain = Thing("plain", {"spec": SPEC, "count": 7})
    secret = Thing("secret", {"token": pulumi.Output.secret("s3cr3t"), "keep": "x"})
    asset = Thing("asset", {"code": pulumi.StringAsset("print(1)")})
    child = Thing("child", {"of": plain.arn}, pulumi.ResourceOptions(parent=plain))
    return {
        "spec": plain.spec, "count": plain.count, "plainArn": plain.arn, "plainId": plain.id,
        "token": secret.token, "tokenIsSecret": pulumi.Output.from_input(secret.token.is_secret()),
        "arnIsSecret": pulumi.Output.from_input(secret.arn.is_secret()), "keep": secret.keep,
        "code": asset.code, "childOf": child.of, "childUrn": child.urn,
    }


def _readable(value: Any) -> Any:
    if isinstance(value, pulumi.StringAsset):
        return ("StringAsset", value.text)
    if isinstance(value, dict):
        return {k: _readable(v) for k, v in value.items()}
    return value


def _read_back_with_stock_monitor() -> dict[str, Any]:
    seen: dict[str, Any] = {}
    settings.ROOT.set(None)
    pulumi.runtime.set_mocks(ServingMocks(), project="llm-serving", stack="test", preview=False)

    @pulumi.runtime.test
    def run():
        return pulumi.Output.all(**declare()).apply(seen.update)

    run()
    return _canonical(seen)


def test_the_program_reads_back_what_pulumis_own_mock_monitor_gives_it():
    rec = run_function(lambda: pulumi.export("seen", declare()))
    ours = rec.outputs["seen"]
    assert _readable(ours) == _readable(_read_back_with_stock_monitor())
    # what that is, by hand: the inputs back (nested, None in lists, booleans, floats), the mock's ARN added,
    # the secret still a secret to the program, the asset an asset
    assert ours["spec"] == SPEC and ours["count"] == 7
    assert ours["plainArn"].startswith("arn:aws:test:us-east-1:111122223333:plain-")
    assert ours["childOf"] == ours["plainArn"]
    assert (ours["token"], ours["tokenIsSecret"], ours["arnIsSecret"]) == ("s3cr3t", True, False)
    assert _readable(ours["code"]) == ("StringAsset", "print(1)")
    # the recording: the secret masked, the parent's URN kept, whole numbers as integers
    by_name = {r.name: r for r in rec.resources}
    assert by_name["secret"].inputs == {"keep": "x", "token": SECRET}
    assert by_name["child"].parent == by_name["plain"].urn and by_name["child"].urn == ours["childUrn"]
    assert by_name["plain"].inputs["spec"] == SPEC and type(by_name["plain"].inputs["spec"]["replicas"]) is int


async def _later(value: Any) -> Any:
    return value


def test_stack_outputs_are_recorded_as_exported_with_every_output_resolved():
    def program() -> None:
        res = Thing("plain", {"name": "thing"})
        pulumi.export("plain", {"a": [1, 2.0, 2.5], "empty": {}, "none": None, "tuple": (1, "b")})
        pulumi.export("nested", {"arn": res.arn, "list": [res.name, {"deep": res.arn.apply(lambda a: a[:7])}]})
        pulumi.export("output", res.name)
        pulumi.export("awaited", pulumi.Output.from_input(_later({"name": res.name})))
        pulumi.export("secret", pulumi.Output.secret("s3cr3t"))

    rec = run_function(program)
    # as Output.all(**outputs) resolves them (a tuple stays a tuple), whole numbers as integers
    assert rec.outputs["plain"] == {"a": [1, 2, 2.5], "empty": {}, "none": None, "tuple": (1, "b")}
    assert rec.outputs["output"] == "thing"
    assert rec.outputs["awaited"] == {"name": "thing"}
    assert rec.outputs["nested"]["list"] == ["thing", {"deep": "arn:aws"}]
    assert rec.outputs["nested"]["arn"].startswith("arn:aws:test:us-east-1:111122223333:plain-")
    assert rec.outputs["secret"] == "s3cr3t"


def test_an_invoke_the_mocks_do_not_answer_fails_loudly():
    def program() -> None:
        pulumi.export("vpc", pulumi.runtime.invoke_output("aws:ec2/getVpc:getVpc", {"default": True}))

    with pytest.raises(Exception, match="the offline mocks answer no invoke 'aws:ec2/getVpc:getVpc'"):
        run_function(program)


def test_an_answered_invoke_reaches_the_program():
    def program() -> None:
        pulumi.export("tables", pulumi.runtime.invoke_output("aws:ec2/getRouteTables:getRouteTables",
                                                             {"vpcId": "vpc-0abc123456"}))

    rec = run_function(program)
    assert rec.outputs["tables"]["ids"] == ["rtb-123456-private-a", "rtb-123456-private-b"]


def test_the_runtimes_debug_lines_reach_the_log_only_when_debug_logging_is_on(caplog):
    """Under mocks the runtime's debug lines go to the root logger at debug level; the runner skips building
    them while that level is off, and must still deliver them when it is on."""
    import logging

    before = pulumi.log.debug
    with caplog.at_level(logging.DEBUG):
        run_function(lambda: Thing("plain", {"n": 1}))
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("plain" in m for m in debug), debug[:5]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        rec = run_function(lambda: Thing("plain", {"n": 1}))
    assert [r.inputs for r in rec.resources if r.name == "plain"] == [{"n": 1}]
    assert not [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert pulumi.log.debug is before  # restored after the run


def test_while_a_program_runs_pulumis_unknowns_check_answers_the_same_and_leaves_no_garbage():
    """Pulumi 3.272's `rpc.contains_unknowns` leaves a reference cycle per call (a closure that refers to itself);
    the runner answers with the same walk without one. Same answers, by hand: an Unknown anywhere in nested
    maps and lists is found, a self-containing list ends, plain values hold none."""
    import gc

    from pulumi.output import Unknown
    from pulumi.runtime import rpc

    looped: list[Any] = [1]
    looped.append(looped)
    cases = [("plain", SPEC, False), ("nested unknown", {"a": [1, {"b": Unknown()}]}, True),
             ("top unknown", Unknown(), True),
             ("self-containing list", looped, False), ("string", "x", False), ("none", None, False)]
    seen: dict[str, Any] = {}

    def program() -> None:
        seen["answers"] = {name: rpc.contains_unknowns(value) for name, value, _ in cases}
        gc.collect()
        for _ in range(100):
            rpc.contains_unknowns({"a": [1, {"b": "c"}]})
        seen["garbage"] = gc.collect()

    run_function(program)
    assert seen["answers"] == {name: expected for name, _, expected in cases}
    assert seen["garbage"] == 0


def test_the_runner_computes_a_plain_urn_as_pulumi_does():
    """The runner computes the URN of a name, type and parent URN given as strings itself: as Pulumi's
    `create_urn` gives it, and by hand (the parent's type chain, `$`, the type, `::`, the name)."""
    from pulumi.runtime import resource as runtime_resource

    pulumis = runtime_resource.create_urn
    cases = {
        "urn:pulumi:test::llm-serving::serving:components:GpuNodePool::pool-a":
            "urn:pulumi:test::llm-serving::serving:components:GpuNodePool$aws:autoscaling/tag:Tag::pool-a-tag",
        "urn:pulumi:test::llm-serving::pulumi:pulumi:Stack$serving:components:GpuNodePool::pool-a":
            "urn:pulumi:test::llm-serving::pulumi:pulumi:Stack$serving:components:GpuNodePool"
            "$aws:autoscaling/tag:Tag::pool-a-tag",
    }

    def program() -> None:
        assert runtime_resource.create_urn is not pulumis  # the runner's, while the program runs
        for i, parent in enumerate(cases):
            pulumi.export(f"ours{i}", runtime_resource.create_urn("pool-a-tag", "aws:autoscaling/tag:Tag", parent))
            pulumi.export(f"pulumis{i}", pulumis("pool-a-tag", "aws:autoscaling/tag:Tag", parent))

    rec = run_function(program)
    for i, expected in enumerate(cases.values()):
        assert rec.outputs[f"ours{i}"] == rec.outputs[f"pulumis{i}"] == expected
    assert runtime_resource.create_urn is pulumis  # restored after the run


def test_while_a_program_runs_each_declared_type_unwraps_as_pulumi_unwraps_it():
    """The runner remembers `_types.unwrap_type`'s answer for each type; asked again, it must answer what Pulumi's
    function answers, which by hand is the T inside Output[T], Input[T], InputType[T] and Optional[...], in the
    resolved forms the SDK classes' type hints take (Input[T] is Union[T, Awaitable[T], Output[T]], InputType[T]
    is Union[T, Mapping[str, Any]])."""
    from collections.abc import Awaitable, Mapping, Sequence
    from typing import Optional, Union

    from pulumi import _types

    pulumis = _types.unwrap_type

    @pulumi.input_type
    class PortArgs:
        def __init__(self, port: int) -> None:
            pulumi.set(self, "port", port)

        @property
        @pulumi.getter
        def port(self) -> int:
            return pulumi.get(self, "port")

    def inp(t: Any) -> Any:
        return Union[t, Awaitable[t], pulumi.Output[t]]  # noqa: UP007 (the form the SDKs declare)

    cases = {
        Optional[inp(str)]: str,  # noqa: UP007
        pulumi.Output[int]: int,
        inp(Sequence[inp(str)]): Sequence[inp(str)],
        Union[PortArgs, Mapping[str, Any]]: PortArgs,  # noqa: UP007
        Optional[inp(Union[PortArgs, Mapping[str, Any]])]: PortArgs,  # noqa: UP007
        dict[str, str]: dict[str, str],
    }
    seen: dict[str, Any] = {}

    pulumis_optional = _types.unwrap_optional_type
    # Optional[T] → T for a single T only: Optional[Input[str]] flattens into a four-member union, kept as it is
    optional_cases = {Optional[str]: str, Optional[dict[str, str]]: dict[str, str],  # noqa: UP007
                      Optional[inp(str)]: Optional[inp(str)], str: str}  # noqa: UP007

    def program() -> None:
        seen["ours"] = _types.unwrap_type is not pulumis and _types.unwrap_optional_type is not pulumis_optional
        seen["first"] = [_types.unwrap_type(t) for t in cases]
        seen["again"] = [_types.unwrap_type(t) for t in cases]
        seen["optional"] = [_types.unwrap_optional_type(t) for t in optional_cases]
        seen["optional again"] = [_types.unwrap_optional_type(t) for t in optional_cases]

    run_function(program)
    # the runner's while the program runs, restored after
    assert seen["ours"] and _types.unwrap_type is pulumis and _types.unwrap_optional_type is pulumis_optional
    assert seen["first"] == seen["again"] == [pulumis(t) for t in cases] == list(cases.values())
    assert (seen["optional"] == seen["optional again"] == [pulumis_optional(t) for t in optional_cases]
            == list(optional_cases.values()))


def test_the_monitor_records_a_plain_request_as_the_runtime_reads_it_made_canonical():
    """For a request of plain values the monitor reads the wire straight into the recorded form; it must be the
    runtime's reading (`rpc.deserialize_properties`) made canonical: null map entries left out, nulls in lists
    kept, keys sorted, whole numbers as ints, fractions kept."""
    from google.protobuf import struct_pb2
    from pulumi.runtime import rpc

    from offline.mockrun import _canonical_plain

    cases = [
        {"spec": SPEC, "count": 7.0, "nulls": {"a": None, "b": [None, {"c": None, "d": 1.5}]}, "top": None},
        {"z": {"y": [3.0, -0.5, 1e21, True, "8000"]}, "a": [], "m": {}},
        {"env": [{"name": "K", "value": "v"}], "text": "gpu-ü", "n": {}},
    ]
    for values in cases:
        message = struct_pb2.Struct()
        message.update(values)
        assert _canonical_plain(message) == _canonical(rpc.deserialize_properties(message))
    first = struct_pb2.Struct()
    first.update(cases[0])
    recorded = _canonical_plain(first)
    assert list(recorded) == ["count", "nulls", "spec"] and recorded["nulls"] == {"b": [None, {"d": 1.5}]}
    assert type(recorded["count"]) is int and type(recorded["spec"]["replicas"]) is int
