"""Run `__main__.py` for a stack under Pulumi's unit-test mocks and record every resource it registers.

The recording monitor keeps what `MockResourceArgs` leaves out — parent, dependencies, `protect`,
`ignoreChanges`, provider — so tests and the render can check options as well as inputs. Mock outputs
are derived from names only (no randomness), so two runs record identical resources.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import runpy
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import resource as pulumi_runtime_resource
from pulumi.runtime import rpc, settings
from pulumi.runtime.proto import source_pb2

from .sdk_imports import load_on_demand

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PROGRAM = PROJECT_ROOT / "__main__.py"
MOCK_ACCOUNT = "111122223333"
SECRET = "[secret]"


class UnmockedInvokeError(RuntimeError):
    """The program called a data source the offline mocks do not answer."""


@dataclass(frozen=True)
class RecordedResource:
    type: str
    name: str
    urn: str
    parent: str  # URN of the parent ("" for the stack)
    custom: bool
    protect: bool
    provider: str
    dependencies: tuple[str, ...]
    ignore_changes: tuple[str, ...]
    inputs: dict[str, Any]

    @property
    def is_kubernetes_object(self) -> bool:
        return self.custom and self.type.startswith("kubernetes:") and not self.type.startswith("kubernetes:helm.sh/")


@dataclass
class Recording:
    stack: str
    resources: list[RecordedResource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)

    def of_type(self, type_: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.type == type_]

    def by_urn(self, urn: str) -> RecordedResource | None:
        return next((r for r in self.resources if r.urn == urn), None)

    def kubernetes_objects(self) -> list[dict[str, Any]]:
        """The Kubernetes manifests (apiVersion, kind, metadata, ...) in a stable order."""
        objs = [{k: v for k, v in r.inputs.items() if not k.startswith("__")} for r in self.resources if r.is_kubernetes_object]
        return sorted(objs, key=lambda o: (o.get("kind", ""), o.get("metadata", {}).get("namespace", ""),
                                           o.get("metadata", {}).get("name", "")))


def _canonical(value: Any) -> Any:
    """Recorded values in a stable form: secrets replaced by a marker (they never reach a rendered file),
    map keys sorted (protobuf maps carry no order), and whole numbers as ints (the RPC layer sends every
    number as a double; Kubernetes fields such as `replicas` are integers)."""
    if isinstance(value, dict):
        if value.get(rpc._special_sig_key) == rpc._special_secret_sig:
            return SECRET
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class RecordingMonitor(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: pulumi_mocks.Mocks) -> None:
        super().__init__(mocks)
        self.recorded: list[RecordedResource] = []

    def RegisterResource(self, request):  # noqa: N802 (gRPC method name)
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            inputs = rpc.deserialize_properties(request.object, keep_unknowns=False)
            self.recorded.append(RecordedResource(
                type=request.type,
                name=request.name,
                urn=response.urn,
                parent=request.parent,
                custom=bool(request.custom),
                protect=bool(request.protect),
                provider=request.provider,
                dependencies=tuple(request.dependencies),
                ignore_changes=tuple(request.ignoreChanges),
                inputs=_canonical(inputs),
            ))
        return response


    def ReadResource(self, request):  # noqa: N802 (gRPC method name)
        # reads of existing resources (StackReference, `get` calls) are part of what a program depends on
        response = super().ReadResource(request)
        self.recorded.append(RecordedResource(
            type=request.type,
            name=request.name,
            urn=response.urn,
            parent=request.parent,
            custom=True,
            protect=False,
            provider=request.provider,
            dependencies=tuple(request.dependencies),
            ignore_changes=(),
            inputs=_canonical(rpc.deserialize_properties(request.properties, keep_unknowns=False)),
        ))
        return response


def _mock_id(type_: str, name: str) -> str:
    return f"{name}-{hashlib.sha256(f'{type_}/{name}'.encode()).hexdigest()[:8]}"


class ServingMocks(pulumi_mocks.Mocks):
    """Outputs the program reads back (ARNs, names, endpoints, IDs), derived from names only."""

    def __init__(self, stack_reference_outputs: Mapping[str, Any] | None = None) -> None:
        self.stack_reference_outputs = dict(stack_reference_outputs or {})

    def new_resource(self, args: pulumi_mocks.MockResourceArgs):
        state = dict(args.inputs)
        t, n = args.typ, args.name
        rid = _mock_id(t, n)
        region = state.get("region", "us-east-1")
        if t == "pulumi:pulumi:StackReference":
            return rid, {"name": state.get("name", n), "outputs": self.stack_reference_outputs, "secretOutputNames": []}
        if t == "aws:s3/bucket:Bucket":
            bucket = state.get("bucket", n)
            state.update(bucket=bucket, arn=f"arn:aws:s3:::{bucket}", region=region)
            return bucket, state
        if t == "aws:iam/role:Role":
            role = state.get("name") or rid
            state.update(name=role, arn=f"arn:aws:iam::{MOCK_ACCOUNT}:role/{role}")
        elif t == "aws:eks/cluster:Cluster":
            cname = state.get("name") or rid
            state.update(name=cname, arn=f"arn:aws:eks:{region}:{MOCK_ACCOUNT}:cluster/{cname}",
                         endpoint=f"https://{rid}.gr7.{region}.eks.amazonaws.com",
                         certificateAuthority={"data": "TU9DSy1DQQ=="})
        elif t == "aws:ec2/launchTemplate:LaunchTemplate":
            state.update(latestVersion=1, arn=f"arn:aws:ec2:{region}:{MOCK_ACCOUNT}:launch-template/{rid}")
        elif t == "aws:eks/nodeGroup:NodeGroup":
            state.setdefault("nodeGroupName", n)
            # EKS names the node group's Auto Scaling group eks-<node group>-<uuid>
            state.setdefault("resources", [{"autoscalingGroups": [{"name": f"eks-{state['nodeGroupName']}-{rid[-8:]}"}]}])
        elif t.startswith("aws:"):
            state.setdefault("arn", f"arn:aws:{t.split(':')[1].split('/')[0]}:{region}:{MOCK_ACCOUNT}:{rid}")
        return rid, state

    def call(self, args: pulumi_mocks.MockCallArgs):
        if args.token == "aws:ec2/getRouteTables:getRouteTables":
            vpc = args.args.get("vpcId", "vpc")
            return {"id": vpc, "ids": [f"rtb-{vpc[-6:]}-private-a", f"rtb-{vpc[-6:]}-private-b"]}
        # a component that starts reading the cloud (a data source) must get an answer here, or the render fails loudly
        raise UnmockedInvokeError(f"the offline mocks answer no invoke {args.token!r}; add its answer to offline/mockrun.py")


def read_stack_config(stack_file: str | Path) -> tuple[str, dict[str, Any]]:
    """(stack name, {"project:key": value}) from a `stacks/Pulumi.<stack>.yaml` file."""
    p = Path(stack_file)
    doc = yaml.safe_load(p.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        raise ValueError(f"{p}: not a Pulumi stack file (no top-level 'config' mapping)")
    name = p.name.removeprefix("Pulumi.").removesuffix(".yaml").removesuffix(".yml")
    return name, doc["config"]


GC_THRESHOLD = (50_000, 20, 1000)  # collections: gen 0 per 50 000 allocations (default 700), gen 1 per 20, gen 2 rarely


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Collect cyclic garbage rarely while a program runs. Importing the providers' SDKs and registering
    resources allocates hundreds of thousands of long-lived objects (classes, type hints, Outputs), and the
    default thresholds (700, 10, 10) then trigger full collections that re-walk all of them: a third of the
    render's CPU. What is already alive is frozen out of collections; nothing else changes (no finalizer
    of the program's has a visible effect), so the recording is the same."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


@contextlib.contextmanager
def _without_source_positions() -> Iterator[None]:
    """For every resource Pulumi walks the Python stack to send the engine its source position (a tenth of a
    mock run's CPU); the mock monitor discards it, so under mocks it sends an empty stack instead."""
    original = getattr(pulumi_runtime_resource, "_get_stack_trace", None)
    if original is None:  # a Pulumi version without it: nothing to skip
        yield
        return
    pulumi_runtime_resource._get_stack_trace = source_pb2.StackTrace
    try:
        yield
    finally:
        pulumi_runtime_resource._get_stack_trace = original


def run_function(
    fn: Callable[[], Any],
    *,
    stack: str = "test",
    config: Mapping[str, Any] | None = None,
    project: str = "llm-serving",
    stack_reference_outputs: Mapping[str, Any] | None = None,
) -> Recording:
    """Run `fn` (which declares resources) under mocks and record it; exceptions propagate."""
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.insert(0, str(PROJECT_ROOT))
    load_on_demand()  # the program's SDK service packages import only the files it uses
    settings.ROOT.set(None)  # a fresh root stack: several programs may run in one process
    pulumi.runtime.set_all_config(
        {k: v if isinstance(v, str) else json.dumps(v) for k, v in (config or {}).items()}
    )
    monitor = RecordingMonitor(ServingMocks(stack_reference_outputs))
    pulumi.runtime.set_mocks(monitor.mocks, project=project, stack=stack, preview=False, monitor=monitor)
    recording = Recording(stack=stack)

    @pulumi.runtime.test
    def _run():
        fn()
        stack_resource = settings.get_root_resource()
        outputs = dict(getattr(stack_resource, "outputs", {}))
        return pulumi.Output.all(**outputs).apply(lambda v: recording.outputs.update(_canonical(v)))

    with _fewer_collections(), _without_source_positions():
        _run()
    recording.resources = sorted(monitor.recorded, key=lambda r: r.urn)
    return recording


def run_program(
    stack: str,
    config: Mapping[str, Any],
    *,
    project: str = "llm-serving",
    program: Path = PROGRAM,
    stack_reference_outputs: Mapping[str, Any] | None = None,
) -> Recording:
    """Run the Pulumi program once under mocks (preview=False, so every apply runs) and record it.

    `config` maps "project:key" to values as in a stack file; objects are passed as JSON like the CLI does.
    Errors raised by the program (bad config, an invalid MIG layout) propagate to the caller.
    """
    return run_function(
        lambda: runpy.run_path(str(program), run_name="__main__"),
        stack=stack, config=config, project=project, stack_reference_outputs=stack_reference_outputs,
    )


def run_stack_file(stack_file: str | Path, **kwargs: Any) -> Recording:
    stack, config = read_stack_config(stack_file)
    return run_program(stack, config, **kwargs)
