"""Run `__main__.py` for a stack under Pulumi's unit-test mocks and record every resource it registers.

The recording monitor keeps what `MockResourceArgs` leaves out — parent, dependencies, `protect`,
`ignoreChanges`, provider — so tests and the render can check options as well as inputs. Mock outputs
are derived from names only (no randomness), so two runs record identical resources.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import hashlib
import inspect
import datetime as dt
import json
import logging
import runpy
import sys
import typing
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from google.protobuf import struct_pb2
from pulumi import _types
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import resource as pulumi_runtime_resource
from pulumi.runtime import known_types, rpc, settings
from pulumi.runtime.proto import provider_pb2, resource_pb2, source_pb2

from .sdk_imports import compile_annotations_lazily, forward_refs_compiled_once, load_on_demand

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
    replace_on_changes: tuple[str, ...] = ()
    custom_timeouts: dict[str, str] = field(default_factory=dict)  # create / update / delete, as given
    retain_on_delete: bool = False

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


class _InlineLoop(asyncio.SelectorEventLoop):
    """An event loop whose default executor runs each call at once in the calling thread.

    The runtime sends every monitor call through the loop's default executor (`run_in_executor(None, ...)`), as it
    must for a gRPC monitor that blocks; the mock monitor answers in microseconds, and a hop to a worker thread
    and back per resource (the GIL handed over twice, the loop woken through its self-pipe) cost more than the
    answer. The answer comes back as a finished future: no wrapping of a thread's future, no wake-up."""

    def run_in_executor(self, executor, func, *args):  # noqa: ANN001, ANN201 (the loop's signature)
        if executor is not None:
            return super().run_in_executor(executor, func, *args)
        self._check_closed()
        future = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine, as a worker thread would
            future.set_exception(e)
        return future


# Wire forms the monitor cannot turn into a response without the runtime (a resource reference is
# rehydrated into a Resource, an asset or archive into its class): those calls take the runtime's own path.
_RUNTIME_ONLY_SIGS = (rpc._special_resource_sig.encode(), rpc._special_asset_sig.encode(),
                      rpc._special_archive_sig.encode(), rpc._special_output_value_sig.encode())


def _needs_runtime(message: Any) -> bool:
    return any(sig in message.SerializeToString() for sig in _RUNTIME_ONLY_SIGS)


# Wire forms only the runtime's deserializer reads right: any special value (a secret, and the runtime-only
# ones above) and the unknown-value sentinel. A message without them holds plain values only.
_SPECIAL_WIRE = (rpc._special_sig_key.encode(), rpc.UNKNOWN.encode())


def _canonical_plain(struct: struct_pb2.Struct) -> dict[str, Any]:
    """A message of plain values as the runtime reads it (`rpc.deserialize_properties`: a map entry whose value is
    null left out, a null in a list kept), made canonical (`_canonical`: keys sorted, whole numbers as ints) in
    one walk."""
    out = {}
    for k, v in sorted(struct.fields.items()):
        v = _canonical_value(v)
        if v is not None:
            out[k] = v
    return out


def _canonical_value(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        n = value.number_value
        return int(n) if n.is_integer() else n
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return _canonical_plain(value.struct_value)
    if kind == "list_value":
        return [_canonical_value(v) for v in value.list_value.values]
    if kind == "null_value":
        return None
    raise ValueError("Value not set")


_ABSENT = object()


def _struct(values: Mapping[str, Any]) -> struct_pb2.Struct:
    """What `rpc.serialize_properties` makes of plain values (dicts, lists, strings, numbers, booleans, None, a
    secret's wire dict), made without an event loop; top-level None values are left out as it leaves them out.
    Raises ValueError for anything else."""
    out = struct_pb2.Struct()
    out.update({k: v for k, v in values.items() if v is not None})
    return out


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """Pulumi's MockMonitor, recording, and answering in the calling thread.

    The base class answers through `_sync_await(rpc.serialize_properties(...))`, which needs its own event loop
    (it ran in an executor thread); with the program's loop running in this thread that would re-enter it. So
    RegisterResource, ReadResource and Invoke build their answers synchronously, with the same wire values
    (`_struct`), and hand the rare request holding a resource reference, asset or archive to the base class
    on a thread of its own, as before."""

    def __init__(self, mocks: pulumi_mocks.Mocks) -> None:
        super().__init__(mocks)
        self.recorded: list[RecordedResource] = []
        self._runtime_thread: concurrent.futures.ThreadPoolExecutor | None = None

    def _in_runtime_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._runtime_thread is None:
            self._runtime_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mock-monitor")
        return self._runtime_thread.submit(fn, *args).result()

    def close(self) -> None:
        if self._runtime_thread is not None:
            self._runtime_thread.shutdown()

    def _record(self, request: Any, urn: str, inputs: dict[str, Any], *, custom: bool, protect: bool,
                ignore_changes: tuple[str, ...], replace_on_changes: tuple[str, ...] = (),
                retain_on_delete: bool = False) -> None:
        t = getattr(request, "customTimeouts", None)
        timeouts = {k: getattr(t, k) for k in ("create", "update", "delete") if t is not None and getattr(t, k)}
        self.recorded.append(RecordedResource(
            type=request.type,
            name=request.name,
            urn=urn,
            parent=request.parent,
            custom=custom,
            protect=protect,
            provider=request.provider,
            dependencies=tuple(request.dependencies),
            ignore_changes=ignore_changes,
            inputs=inputs,
            replace_on_changes=replace_on_changes,
            custom_timeouts=timeouts,
            retain_on_delete=retain_on_delete,
        ))

    def _answer(self, values: Mapping[str, Any]) -> struct_pb2.Struct:
        try:
            return _struct(values)
        except ValueError:  # the mock answered with something other than plain values
            return self._in_runtime_thread(_serialize_in_own_loop, values)

    def RegisterResource(self, request):  # noqa: N802 (gRPC method name)
        if request.type == "pulumi:pulumi:Stack":
            return super().RegisterResource(request)
        wire = request.object.SerializeToString()
        if any(sig in wire for sig in _RUNTIME_ONLY_SIGS):
            response, inputs = self._in_runtime_thread(
                lambda: (super(RecordingMonitor, self).RegisterResource(request),
                         _canonical(rpc.deserialize_properties(request.object, keep_unknowns=False))))
        else:
            urn = self.make_urn(request.parent, request.type, request.name)
            if any(sig in wire for sig in _SPECIAL_WIRE):  # a secret or an unknown: the runtime's reading
                given = rpc.deserialize_properties(request.object)
                inputs = _canonical(given)  # before the mock sees them: a mock may change what it is given
            else:  # plain values: what that gives, canonical already (the mock is handed its own copy)
                inputs = _canonical_plain(request.object)
                given = dict(inputs)
            echo = dict(given)
            id_, state = self.mocks.new_resource(pulumi_mocks.MockResourceArgs(
                typ=request.type, name=request.name, inputs=given, provider=request.provider,
                resource_id=request.importId, custom=request.custom or False,
                transforms=pulumi_mocks._resolve_callbacks(request.transforms),
            ))
            # The answer holds what the mock added or replaced; for an input it hands back as given, the runtime
            # reads the value from its own request (rpc.resolve_outputs: an input the engine gave no final value
            # for keeps the value passed in), the same value an echo would carry, without building the echo.
            # The mocks change top-level entries only (ServingMocks adds ARNs, names, IDs).
            changed = {k: v for k, v in state.items() if echo.get(k, _ABSENT) is not v}
            response = resource_pb2.RegisterResourceResponse(urn=urn, id=id_, object=self._answer(changed))
            self.resources[urn] = pulumi_mocks.MockMonitor.ResourceRegistration(urn, id_, state)
        self._record(request, response.urn, inputs, custom=bool(request.custom), protect=bool(request.protect),
                     ignore_changes=tuple(request.ignoreChanges), replace_on_changes=tuple(request.replaceOnChanges),
                     retain_on_delete=bool(getattr(request, "retainOnDelete", False)))
        return response

    def ReadResource(self, request):  # noqa: N802 (gRPC method name)
        # reads of existing resources (StackReference, `get` calls) are part of what a program depends on
        if _needs_runtime(request.properties):
            response, inputs = self._in_runtime_thread(
                lambda: (super(RecordingMonitor, self).ReadResource(request),
                         _canonical(rpc.deserialize_properties(request.properties, keep_unknowns=False))))
        else:
            state = rpc.deserialize_properties(request.properties)
            inputs = _canonical(state)
            id_, state = self.mocks.new_resource(pulumi_mocks.MockResourceArgs(
                typ=request.type, name=request.name, inputs=state, provider=request.provider,
                resource_id=request.id,
            ))
            urn = self.make_urn(request.parent, request.type, request.name)
            response = resource_pb2.ReadResourceResponse(urn=urn, properties=self._answer(state))
            self.resources[urn] = pulumi_mocks.MockMonitor.ResourceRegistration(urn, id_, state)
        self._record(request, response.urn, inputs, custom=True, protect=False, ignore_changes=())
        return response

    def Invoke(self, request):  # noqa: N802 (gRPC method name)
        if request.tok == "pulumi:pulumi:getResource" or _needs_runtime(request.args):
            return self._in_runtime_thread(super().Invoke, request)
        answer = self.mocks.call(pulumi_mocks.MockCallArgs(
            token=request.tok, args=rpc.deserialize_properties(request.args), provider=request.provider))
        failures = None
        if not isinstance(answer, dict):
            answer, failures = answer[0], [provider_pb2.CheckFailure(property=p, reason=r) for p, r in answer[1]]
        return resource_pb2.ResourceInvokeResponse(failures=failures, **{"return": self._answer(answer)})


def _serialize_in_own_loop(values: Mapping[str, Any]) -> struct_pb2.Struct:
    """The runtime's serialization, on a thread with an event loop of its own (as the base monitor runs it)."""
    return pulumi_mocks._sync_await(rpc.serialize_properties(values, {}))


def _mock_id(type_: str, name: str) -> str:
    return f"{name}-{hashlib.sha256(f'{type_}/{name}'.encode()).hexdigest()[:8]}"


class ServingMocks(pulumi_mocks.Mocks):
    """Outputs the program reads back (ARNs, names, endpoints, IDs), derived from names only."""

    def __init__(self, stack_reference_outputs: Mapping[str, Any] | None = None,
                 node_groups: Mapping[str, int] | None = None) -> None:
        self.stack_reference_outputs = dict(stack_reference_outputs or {})
        # EKS node groups that exist already (a later `up`), by name: their current desired size
        self.node_groups = dict(node_groups or {})

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
        if args.token == "aws:eks/getCluster:getCluster":  # an existing cluster read for its endpoint and CA
            name = args.args.get("name", "cluster")
            return {"id": name, "name": name, "endpoint": f"https://{name}.gr7.us-east-1.eks.amazonaws.com",
                    "certificateAuthorities": [{"data": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="}],
                    "arn": f"arn:aws:eks:us-east-1:123456789012:cluster/{name}", "version": "1.35"}
        if args.token == "aws:eks/getNodeGroups:getNodeGroups":  # a fresh account has none
            return {"id": args.args.get("clusterName", "cluster"), "names": sorted(self.node_groups)}
        if args.token == "aws:eks/getNodeGroup:getNodeGroup":
            name = args.args["nodeGroupName"]
            if name not in self.node_groups:  # as EKS: DescribeNodegroup of a group that does not exist
                raise UnmockedInvokeError(f"no node group {name!r} (getNodeGroup of a group ListNodegroups did not list)")
            size = self.node_groups[name]
            return {"id": name, "nodeGroupName": name, "clusterName": args.args.get("clusterName"),
                    "scalingConfigs": [{"desiredSize": size, "minSize": 0, "maxSize": max(size, 1)}]}
        # a component that starts reading the cloud (a data source) must get an answer here, or the render fails loudly
        raise UnmockedInvokeError(f"the offline mocks answer no invoke {args.token!r}; add its answer to offline/mockrun.py")


def pulumi_config(config: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The stack file's config as the Pulumi CLI hands it to the program: scalars as their text (an unquoted
    `planningDate: 2026-12-02`, which YAML reads as a date, is the string '2026-12-02' to Pulumi; it ended the
    render in a JSON TypeError), objects as JSON, and a `{secure: ...}` value marked secret (the CLI decrypts it
    into a secret; the offline render cannot decrypt, so the program sees the encrypted form, but as a secret)."""
    from topology.loading import is_secure_value

    values, secret = {}, []
    for k, v in config.items():
        if isinstance(v, (dt.date, dt.datetime)):
            v = str(v)
        if is_secure_value(v):
            secret.append(k)
        values[k] = v if isinstance(v, str) else json.dumps(v, default=str)
    return values, secret


def read_stack_config(stack_file: str | Path) -> tuple[str, dict[str, Any]]:
    """(stack name, {"project:key": value}) from a `stacks/Pulumi.<stack>.yaml` file."""
    p = Path(stack_file)
    doc = yaml.load(p.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
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
def _replaced(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """`owner.name` replaced by `make(original)` while the program runs, restored afterwards; left alone when
    this Pulumi version has no such attribute."""
    original = getattr(owner, name, None)
    if original is None:
        yield
        return
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def _without_source_positions() -> Iterator[None]:
    """For every resource Pulumi walks the Python stack to send the engine its source position (a tenth of a
    mock run's CPU); the mock monitor discards it, so under mocks it sends an empty stack instead."""
    with _replaced(pulumi_runtime_resource, "_get_stack_trace", lambda _: source_pb2.StackTrace):
        yield


@contextlib.contextmanager
def _without_discarded_debug_log() -> Iterator[None]:
    """The runtime logs a debug line per step of every registration (thousands a program); the mock engine hands
    them to its logger at debug level, which drops them unless debug logging is on. While it is off, the
    lines are not built into log requests at all (checked at the start of the run: turn debug logging on
    first to see them)."""
    engine = settings.get_engine()
    logger = getattr(engine, "logger", None)
    if not isinstance(engine, pulumi_mocks.MockEngine) or logger is None or logger.isEnabledFor(logging.DEBUG):
        yield
        return
    with _replaced(pulumi.log, "debug", lambda _: lambda *args, **kwargs: None):
        yield


_PLAIN_SCALARS = (str, int, float, bool, type(None))


def _unknowns_in(val: Any, seen_ids: set[int]) -> bool:
    """`rpc.contains_unknowns`'s walk, step for step, as a module function (a plain scalar is never unknown and
    holds nothing)."""
    if type(val) in _PLAIN_SCALARS:
        return False
    if known_types.is_unknown(val):
        return True
    val_id = id(val)
    if val_id in seen_ids:
        return False
    seen_ids.add(val_id)
    if isinstance(val, dict):
        return any(_unknowns_in(val[k], seen_ids) for k in val)
    if isinstance(val, list):
        return any(_unknowns_in(x, seen_ids) for x in val)
    return False


def _contains_unknowns(val: Any) -> bool:
    return _unknowns_in(val, set())


@contextlib.contextmanager
def _acyclic_unknowns_check() -> Iterator[None]:
    """Pulumi's `rpc.contains_unknowns` (3.272.0) defines its recursive walk as a closure on every call: the closure
    refers to itself through its cell, so each call leaves a reference cycle (function, cell, the evaluated
    `set[int]` annotation) that only the cyclic collector frees. Every Output runs it (`_OutputData` and
    `future()`), some 60 000 times for 50 endpoints: most of the garbage the collector walks during a run.
    While the program runs, the same walk without the cycle answers instead (same answers: it is the walk as
    a module function)."""
    with _replaced(rpc, "contains_unknowns", lambda _: _contains_unknowns):
        yield


def _direct_create_urn(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_urn(name: Any, type_: Any, parent: Any = None, project: Any = None, stack: Any = None) -> Any:
        if type(name) is str and type(type_) is str and type(parent) is str and project is None and stack is None:
            return pulumi.Output.from_input(parent[0 : parent.rfind("::")] + "$" + type_ + "::" + name)
        return original(name, type_, parent, project, stack)

    return create_urn


@contextlib.contextmanager
def _direct_plain_urns() -> Iterator[None]:
    """Every registration computes, besides its request, the URN a monitor-less run would answer with
    (`mock_urn = await create_urn(name, ty, parent_urn).future()`, used only when there is no monitor; here one
    always answers): an Output of the parent's, `Output.all` over three and an `apply`, some 20 tasks and
    handles per resource. When name, type and parent are plain strings and no project or stack is given,
    the same string is computed directly (`create_urn`'s own formula) and handed back as a known Output;
    anything else (aliases with an Output name, a parent resource) goes to Pulumi's function. The requests
    the monitor records do not change."""
    with _replaced(pulumi_runtime_resource, "create_urn", _direct_create_urn):
        yield


def _remembering(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`fn` of a type, each type's answer kept after the first (a type that cannot be a dict key: asked every time)."""
    answers: dict[Any, Any] = {}

    def remembered(val: Any) -> Any:
        try:
            return answers[val]
        except KeyError:
            answers[val] = answer = fn(val)
            return answer
        except TypeError:  # unhashable
            return fn(val)

    return remembered


# the runtime's type unwrappers: Output[T], Input[T], InputType[T], Optional[T] → T; Optional[T] → T
_UNWRAPPERS = ("unwrap_type", "unwrap_optional_type")


@contextlib.contextmanager
def _remembered_type_unwrapping() -> Iterator[None]:
    """The runtime unwraps the declared type of every input value it serializes (`_types.unwrap_type`: Output[T],
    Input[T], Optional[T] → T, a dozen `typing` inspections each), 61 000 times for 50 endpoints (26 a resource),
    and the Optional[T] of every output value it reads back (`_types.unwrap_optional_type`), over the few hundred
    types the typed SDK classes declare. Each answer depends on the type alone (its `typing` form and whether
    its classes are input types, fixed when they are defined), so while the program runs each type's answer
    is kept after its first unwrapping."""
    with contextlib.ExitStack() as swaps:
        for name in _UNWRAPPERS:
            swaps.enter_context(_replaced(_types, name, _remembering))
        yield


def _return_hints_evaluated_once(original: Callable[[type], dict[str, Any]]) -> Callable[[type], dict[str, Any]]:
    """Pulumi's `_types._raw_return_hints` (3.272.0: each property getter's return annotation resolved by
    `typing.get_type_hints` with the class's globals — its MRO's modules' namespaces merged — and {"Output", "T"} as
    locals), step for step, except that a getter whose only annotation is a return annotation text is resolved
    once per (those modules, that text): the SDK files the runner compiles keep annotations as text, and their
    classes repeat the same few (1 190 getters of 570 distinct texts for the prod stack). The namespaces a text is
    resolved in are the same for every class with the same modules, and the names in them, once bound, stay."""
    evaluated: dict[tuple[tuple[str, ...], str], Any] = {}

    @functools.cache
    def raw_return_hints(cls: type) -> dict[str, Any]:
        localns = {"Output": pulumi.Output, "T": type(None)}
        modules = tuple(base.__module__ for base in reversed(cls.__mro__) if base.__module__ in sys.modules)
        globalns = None  # merged only when some text is new

        def resolved(fget: Any) -> Any:
            nonlocal globalns
            if globalns is None:
                globalns = _types._globals_for_cls(cls)
            return typing.get_type_hints(fget, globalns=globalns, localns=localns).get("return")

        hints: dict[str, Any] = {}
        for _, pulumi_name, prop in _types._py_properties(cls):
            annotations = getattr(prop.fget, "__annotations__", None)
            text = annotations.get("return") if type(annotations) is dict and len(annotations) == 1 else None
            if type(text) is str:
                key = (modules, text)
                if key not in evaluated:
                    evaluated[key] = resolved(prop.fget)
                return_hint = evaluated[key]
            else:
                return_hint = resolved(prop.fget)
            if return_hint is not None:
                hints[pulumi_name] = return_hint
        return hints

    return raw_return_hints


@contextlib.contextmanager
def _return_hints_resolved_once() -> Iterator[None]:
    """While the program runs, each (modules, annotation text) of the typed SDK classes' getters is resolved into
    its type once (see _return_hints_evaluated_once)."""
    with _replaced(_types, "_raw_return_hints", _return_hints_evaluated_once):
        yield


def run_function(
    fn: Callable[[], Any],
    *,
    stack: str = "test",
    config: Mapping[str, Any] | None = None,
    project: str = "llm-serving",
    stack_reference_outputs: Mapping[str, Any] | None = None,
    node_groups: Mapping[str, int] | None = None,
) -> Recording:
    """Run `fn` (which declares resources) under mocks and record it; exceptions propagate. node_groups: EKS node
    groups that exist already, by name, with their current desired size (a later `up`; none by default)."""
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.insert(0, str(PROJECT_ROOT))
    compile_annotations_lazily()  # the SDK files it imports skip building their annotations' typing objects
    load_on_demand()  # the program's SDK service packages import only the files it uses
    settings.ROOT.set(None)  # a fresh root stack: several programs may run in one process
    pulumi.runtime.set_all_config(*pulumi_config(config or {}))
    # the program runs on a loop of its own whose executor answers monitor calls inline (see _InlineLoop); the
    # thread's own loop, if any, is left as it was for other users of Pulumi's mocks in this process
    policy = asyncio.get_event_loop_policy()
    previous_loop = _current_loop(policy)
    policy.set_event_loop(_program_loop())
    monitor = RecordingMonitor(ServingMocks(stack_reference_outputs, node_groups))
    try:
        pulumi.runtime.set_mocks(monitor.mocks, project=project, stack=stack, preview=False, monitor=monitor)
        recording = Recording(stack=stack)

        @pulumi.runtime.test
        def _run():
            fn()
            stack_resource = settings.get_root_resource()
            return _resolved(dict(getattr(stack_resource, "outputs", {})), recording.outputs)

        with (_fewer_collections(), _without_source_positions(), _without_discarded_debug_log(),
              _acyclic_unknowns_check(), _direct_plain_urns(), _remembered_type_unwrapping(),
              _return_hints_resolved_once(), forward_refs_compiled_once()):
            _run()
    finally:
        monitor.close()
        policy.set_event_loop(previous_loop)
    recording.resources = sorted(monitor.recorded, key=lambda r: r.urn)
    return recording


_LOOP: asyncio.AbstractEventLoop | None = None


def _current_loop(policy: asyncio.AbstractEventLoopPolicy) -> asyncio.AbstractEventLoop | None:
    """The thread's event loop, as Pulumi's `_sync_await` would find it (made if none, up to Python 3.13)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: making one implicitly is deprecated
        try:
            return policy.get_event_loop()
        except RuntimeError:  # 3.14+: none is made
            return None


def _program_loop() -> asyncio.AbstractEventLoop:
    """One event loop for every program run in this process (as the thread's loop was before), with the
    inline executor."""
    global _LOOP
    if _LOOP is None or _LOOP.is_closed():
        _LOOP = _InlineLoop()
    return _LOOP


_PLAIN = (str, int, float, bool, type(None))  # values the walk of the exports keeps as they are


async def _resolved(outputs: dict[str, Any], into: dict[str, Any]) -> None:
    """The stack outputs with every Output in them awaited, canonical, into `into`.

    What `Output.all(**outputs)` gives, without lifting every plain value of the exports (the whole spec)
    into an Output of its own: a dict, list or tuple is walked, an Output or awaitable awaited and its value
    walked in turn, an input type (args class) rebuilt from its walked fields, anything else kept."""

    async def walk(value: Any) -> Any:
        if isinstance(value, _PLAIN):
            return value
        if isinstance(value, pulumi.Output):
            return await walk(await value.future(with_unknowns=True))
        # plain leaves kept as they are without a coroutine each (most of the exports are the spec's plain figures)
        if isinstance(value, dict):
            return {(k if isinstance(k, _PLAIN) else await walk(k)): (v if isinstance(v, _PLAIN) else await walk(v))
                    for k, v in value.items()}
        if isinstance(value, list):
            return [v if isinstance(v, _PLAIN) else await walk(v) for v in value]
        if isinstance(value, tuple):
            return tuple([v if isinstance(v, _PLAIN) else await walk(v) for v in value])
        if _types.is_input_type(type(value)):
            fields = {k: await walk(v) for k, v in value.__dict__.items()}
            return type(value)(**fields) if fields else type(value)()
        if inspect.isawaitable(value):
            return await walk(await value)
        return value

    into.update(_canonical(await walk(outputs)))


def run_program(
    stack: str,
    config: Mapping[str, Any],
    *,
    project: str = "llm-serving",
    program: Path = PROGRAM,
    stack_reference_outputs: Mapping[str, Any] | None = None,
    node_groups: Mapping[str, int] | None = None,
) -> Recording:
    """Run the Pulumi program once under mocks (preview=False, so every apply runs) and record it.

    `config` maps "project:key" to values as in a stack file; objects are passed as JSON like the CLI does.
    Errors raised by the program (bad config, an invalid MIG layout) propagate to the caller.
    """
    return run_function(
        lambda: runpy.run_path(str(program), run_name="__main__"),
        stack=stack, config=config, project=project, stack_reference_outputs=stack_reference_outputs,
        node_groups=node_groups,
    )


def run_stack_file(stack_file: str | Path, **kwargs: Any) -> Recording:
    stack, config = read_stack_config(stack_file)
    return run_program(stack, config, **kwargs)
