"""The offline runner imports only the SDK files a program uses (offline/sdk_imports.py, issue #17). A name
must resolve to the very object a full import gives, every name of a full import must stay reachable, and a
program must record the same resources either way. The files it imports are compiled with annotations kept as
text: the runtime must resolve the same types from them, and the program record the same resources. Each check
runs in a fresh interpreter: in this test session the SDK packages may already be imported in full. A run several
tests compare against (the program recorded the default way; the SDK files compiled afresh into an empty cache)
runs once per module, and each test reads its output and works on its own copy of that cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str, timeout_s: float = 300) -> str:
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_name_resolves_to_its_own_file_and_the_rest_of_the_package_stays_unimported():
    out = run_python("""
import importlib, json, sys
from pulumi_aws import ec2 as taken_early  # a component imported before the runner starts holds this
from offline.sdk_imports import load_on_demand
load_on_demand()
import pulumi_aws, pulumi_kubernetes as k8s
ec2, v1 = pulumi_aws.ec2, k8s.core.v1
checks = {
    "same_package_for_early_importers": taken_early is ec2 and taken_early.VpcEndpoint.__name__ == "VpcEndpoint",
    "launch_template": ec2.LaunchTemplate is importlib.import_module("pulumi_aws.ec2.launch_template").LaunchTemplate,
    "args": ec2.LaunchTemplateArgs is importlib.import_module("pulumi_aws.ec2.launch_template").LaunchTemplateArgs,
    "function": callable(ec2.get_route_tables_output) and callable(ec2.get_route_tables),
    "configmap_is_the_class": isinstance(v1.ConfigMap, type) and v1.ConfigMap.__name__ == "ConfigMap",
    "outputs_is_the_module": ec2.outputs.__name__ == "pulumi_aws.ec2.outputs",
    "not_loaded_fully": not ec2.__dict__.get("_loaded_fully"),
    "ec2_files": sum(m.startswith("pulumi_aws.ec2.") for m in sys.modules),
}
print(json.dumps(checks))
""")
    checks = json.loads(out)
    assert checks.pop("ec2_files") < 10  # of the 180 files a full import of pulumi_aws.ec2 runs
    assert all(checks.values()), checks


@pytest.mark.parametrize("package", ["pulumi_aws.eks", "pulumi_kubernetes.policy.v1"])
def test_every_name_of_a_full_import_is_reachable_and_the_same(package):
    describe = """
import importlib, json, types
def what(v):
    if isinstance(v, types.ModuleType):
        return "module " + v.__name__
    return f"{getattr(v, '__module__', '')}.{getattr(v, '__qualname__', type(v).__name__)}"
"""
    full = json.loads(run_python(describe + """
pkg = importlib.import_module(%r)
pkg._utilities  # reading a name runs the SDK's lazy import in full
print(json.dumps({n: what(getattr(pkg, n)) for n in dir(pkg) if not n.startswith("__")}))
""" % package))
    on_demand = json.loads(run_python(describe + """
from offline.sdk_imports import load_on_demand
load_on_demand()
pkg = importlib.import_module(%r)
assert type(pkg).__name__ == "OnDemandPackage"
own = ("typing", "_builtins", "_utilities")  # what the package's __init__ itself imports
seen = {n: what(getattr(pkg, n)) for n in %r if n not in own}
placed = not pkg.__dict__.get("_loaded_fully")  # every file-defined name found by the file naming
seen.update({n: what(getattr(pkg, n)) for n in own})
print(json.dumps({"names": seen, "placed_by_file_name": placed}))
""" % (package, sorted(full))))
    assert len(full) > 10
    assert on_demand["placed_by_file_name"]
    assert on_demand["names"] == full


# the program recorded under the offline runner; %s is what runs before it
_RECORD = """
import json, sys, warnings
warnings.simplefilter("ignore")
%s
import offline.mockrun as mockrun
from offline.render import inventory
rec = mockrun.run_stack_file("stacks/Pulumi.prod.yaml")
from offline.sdk_imports import PACKAGES, OnDemandPackage
on_demand = [isinstance(sys.modules[p], OnDemandPackage) for p in PACKAGES]
assert all(on_demand) or not any(on_demand), on_demand
lazy = type(sys.modules["pulumi_kubernetes.core.v1._inputs"].__loader__).__name__ == "LazyAnnotationsLoader"
print(json.dumps({"inventory": inventory(rec), "objects": rec.kubernetes_objects(), "outputs": rec.outputs,
                  "on_demand": all(on_demand), "lazy": lazy}, sort_keys=True))
"""


@pytest.fixture(scope="module")
def default_recording(tmp_path_factory):
    """The program recorded as the runner records it by default (SDK packages on demand, their files compiled
    with annotations kept as text, into an empty cache): the reference both recording tests compare against."""
    cache = tmp_path_factory.mktemp("sdk-recording") / "cache"
    return json.loads(run_python(_RECORD % (_LAZY_SETUP % str(cache))))


def test_the_program_records_the_same_resources_as_with_full_imports(default_recording):
    full_imports = """
import importlib, types
import pulumi_aws, pulumi_kubernetes
from offline.sdk_imports import PACKAGES
for p in PACKAGES:
    importlib.import_module(p)._utilities  # reading a name runs the SDK's lazy import in full
assert all(type(sys.modules[p]) is types.ModuleType for p in PACKAGES)
"""
    on_demand = dict(default_recording)
    full = json.loads(run_python(_RECORD % full_imports))
    assert on_demand.pop("on_demand") and not full.pop("on_demand")
    on_demand.pop("lazy"), full.pop("lazy")  # the other test's concern
    assert on_demand == full


# --- SDK files compiled with annotations kept as text (offline/sdk_imports.compile_annotations_lazily) ---

_LAZY_SETUP = """
import json, sys, warnings
from pathlib import Path
warnings.simplefilter("ignore")
import offline.sdk_imports as sdk_imports
sdk_imports.CACHE_DIR = Path(%r)
"""

# input and output types the program's resources use, from both SDKs (nested args, enums, outputs)
_TYPED_CLASSES = """
import typing
from pulumi import _types
import pulumi_kubernetes.apps.v1 as apps
import pulumi_kubernetes.core.v1 as core
from pulumi_aws.ec2 import launch_template
from pulumi_aws.eks import node_group
classes = [apps.DeploymentSpecArgs, apps.Deployment, core.ContainerArgs, core.PodSpecArgs, core.ServiceSpecArgs,
           core.Service, launch_template.LaunchTemplateArgs, launch_template.LaunchTemplate,
           node_group.NodeGroupArgs, node_group.NodeGroup]
hints = {c.__qualname__: {k: repr(v) for k, v in sorted(_types._types_from_py_properties(c).items())}
         for c in classes}
init = core.ContainerArgs.__init__.__annotations__["image"]
"""


_COUNTED = """
compiled = []
def counting_compile(source, filename, mode, *args, **kwargs):  # the SDK files' and the annotation texts'
    if mode == "eval":  # an annotation text (the ForwardRef memo's miss)
        compiled.append(source)
    return compile(source, filename, mode, *args, **kwargs)
sdk_imports.compile = counting_compile
"""


@pytest.fixture(scope="module")
def first_compile(tmp_path_factory):
    """The typed classes imported with their SDK files compiled afresh into an empty cache (which the run fills:
    the files' bytecode and the annotation texts): (what the run printed, that cache). A test works on a copy
    (`cache_as_left_by`), file times kept, so what it changes or checks is its own."""
    cache = tmp_path_factory.mktemp("sdk-first-compile") / "cache"
    out = json.loads(run_python(_LAZY_SETUP % str(cache) + _COUNTED + """
sdk_imports.compile_annotations_lazily()
""" + _TYPED_CLASSES + """
loader = type(sys.modules[core.ContainerArgs.__module__].__loader__).__name__
print(json.dumps({"hints": hints, "text": isinstance(init, str), "loader": loader, "compiled": len(compiled),
                  "file": sys.modules[core.ContainerArgs.__module__].__file__}))
"""))
    return out, cache


def cache_as_left_by(first_compile, tmp_path) -> Path:
    """A copy of the cache the first compile wrote, its files' modification times kept (shutil.copy2)."""
    _out, cache = first_compile
    return Path(shutil.copytree(cache, tmp_path / "cache"))


def test_sdk_files_keep_annotations_as_text_and_resolve_to_the_types_a_plain_import_gives(tmp_path, first_compile):
    plain = json.loads(run_python(_LAZY_SETUP % str(tmp_path / "unused") + _TYPED_CLASSES + """
print(json.dumps({"hints": hints, "text": isinstance(init, str)}))
"""))
    lazy_code = _LAZY_SETUP % str(tmp_path / "cache") + """
sdk_imports.compile_annotations_lazily()
""" + _TYPED_CLASSES + """
loader = type(sys.modules[core.ContainerArgs.__module__].__loader__).__name__
print(json.dumps({"hints": hints, "text": isinstance(init, str), "loader": loader}))
"""
    first = first_compile[0]  # compiled the files and wrote their bytecode
    cache = cache_as_left_by(first_compile, tmp_path)
    cached = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    second = json.loads(run_python(lazy_code))  # reads that bytecode
    assert not plain["text"] and first["text"] and second["text"]
    assert first["loader"] == second["loader"] == "LazyAnnotationsLoader"
    assert any(n.startswith("pulumi_kubernetes.core.v1._inputs.") for n in cached)
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == cached  # not rewritten
    # the runtime resolves every property's type (nested args classes, Optional, Sequence, Mapping, enums) the same
    assert sum(len(h) for h in plain["hints"].values()) > 100
    assert first["hints"] == second["hints"] == plain["hints"]


def test_sdk_bytecode_is_not_written_when_bytecode_writing_is_off(tmp_path):
    out = json.loads(run_python(_LAZY_SETUP % str(tmp_path / "cache") + """
sys.dont_write_bytecode = True  # as PYTHONDONTWRITEBYTECODE or -B set it
sdk_imports.compile_annotations_lazily()
""" + _TYPED_CLASSES + """
print(json.dumps({"text": isinstance(init, str), "hints": len(hints)}))
"""))
    assert out == {"text": False, "hints": 10}  # the file's usual bytecode: annotations evaluated as before
    assert not (tmp_path / "cache").exists()


def test_the_program_records_the_same_resources_with_annotations_kept_as_text(tmp_path, default_recording):
    plain_setup = _LAZY_SETUP % str(tmp_path / "cache") + """
import offline.mockrun as mockrun
mockrun.compile_annotations_lazily = lambda: None
"""
    lazy = dict(default_recording)
    plain = json.loads(run_python(_RECORD % plain_setup))
    assert lazy.pop("lazy") and not plain.pop("lazy")
    assert lazy.pop("on_demand") and plain.pop("on_demand")  # both on demand: only the annotations differ
    assert lazy == plain


def test_forward_refs_are_compiled_once_while_it_lasts_and_typing_is_left_as_it_was():
    import typing

    from offline.sdk_imports import forward_refs_compiled_once

    text = "Optional[Sequence['ContainerArgs']]"
    with forward_refs_compiled_once():
        a, b = typing.ForwardRef(text), typing.ForwardRef(text)
        assert a.__forward_code__ is b.__forward_code__  # one compile of the text
        assert a == b and eval(a.__forward_code__, {"Optional": typing.Optional, "Sequence": typing.Sequence}) \
            == typing.Optional[typing.Sequence[typing.ForwardRef("ContainerArgs")]]
        with pytest.raises(SyntaxError):  # a bad annotation still fails as typing reports it
            typing.ForwardRef("Optional[")
    assert "compile" not in vars(typing)
    assert typing.ForwardRef(text).__forward_code__ is not typing.ForwardRef(text).__forward_code__
    with pytest.raises(RuntimeError), forward_refs_compiled_once():
        raise RuntimeError("the program failed")
    assert "compile" not in vars(typing)


def test_a_damaged_cached_file_under_a_good_header_is_compiled_afresh(tmp_path, first_compile):
    """A cached file whose header still matches but whose body is not code (a torn write the rename did not
    cover, a disk error) must not break every later render: it is compiled again and rewritten."""
    import marshal

    code = _LAZY_SETUP % str(tmp_path / "cache") + """
sdk_imports.compile_annotations_lazily()
""" + _TYPED_CLASSES + """
print(json.dumps({"hints": hints, "file": sys.modules[core.ContainerArgs.__module__].__file__}))
"""
    first = first_compile[0]
    src = os.fsencode(first["file"]) + b"\0"
    (cached,) = [p for p in cache_as_left_by(first_compile, tmp_path).iterdir()
                 if p.name.startswith("pulumi_kubernetes.core.v1._inputs.")]
    data = cached.read_bytes()
    cached.write_bytes(data[: data.index(src) + len(src)] + marshal.dumps(42))  # the header kept, the body not code
    second = json.loads(run_python(code))
    assert second["hints"] == first["hints"]
    assert cached.read_bytes() == data  # rewritten whole


# --- annotation texts compiled once across processes, return annotations resolved once per run ---


def test_annotation_texts_compiled_by_one_process_are_read_back_by_the_next(tmp_path, first_compile):
    cache_dir = tmp_path / "cache"
    code = _LAZY_SETUP % str(cache_dir) + _COUNTED + """
sdk_imports.compile_annotations_lazily()
""" + _TYPED_CLASSES + """
print(json.dumps({"hints": hints, "compiled": len(compiled)}))
"""
    first = first_compile[0]  # the run that compiled the texts into an empty cache
    cache_as_left_by(first_compile, tmp_path)
    saved = cache_dir / "forward-refs.marshal"
    written = saved.stat().st_mtime_ns
    second = json.loads(run_python(code))
    assert first["compiled"] > 300 and second["compiled"] == 0  # every text read back, none compiled again
    assert saved.stat().st_mtime_ns == written  # nothing new: not rewritten
    assert first["hints"] == second["hints"]
    # a file that is not a marshalled dict of code under a good header (a torn write, another writer's bug) is
    # ignored: the texts are compiled as before, and the file rewritten whole
    data = saved.read_bytes()
    header = data[: data.index(b"forward-refs-1\0") + len(b"forward-refs-1\0") + 1]
    saved.write_bytes(header + b"\x00garbage")
    third = json.loads(run_python(code))
    assert third["compiled"] == first["compiled"] and third["hints"] == first["hints"]
    assert saved.read_bytes() == data


def test_annotation_texts_are_not_written_when_bytecode_writing_is_off(tmp_path):
    out = json.loads(run_python(_LAZY_SETUP % str(tmp_path / "cache") + """
import marshal, types, typing
sys.dont_write_bytecode = True  # as PYTHONDONTWRITEBYTECODE or -B set it
with sdk_imports.forward_refs_compiled_once():
    typing.ForwardRef("Optional[Sequence['ContainerArgs']]")
print(json.dumps({"exists": (sdk_imports.CACHE_DIR / "forward-refs.marshal").exists()}))
"""))
    assert out == {"exists": False}


def test_return_annotations_resolved_once_per_text_give_what_pulumi_resolves_for_each_getter(tmp_path):
    out = json.loads(run_python(_LAZY_SETUP % str(tmp_path / "cache") + """
sdk_imports.compile_annotations_lazily()
import typing
from pulumi import _types
import pulumi_kubernetes.apps.v1._inputs as apps_inputs
import pulumi_kubernetes.apps.v1 as apps
import pulumi_kubernetes.core.v1 as core
from pulumi_aws.ec2 import launch_template
from offline.mockrun import _return_hints_evaluated_once
classes = [c for c in vars(apps_inputs).values() if isinstance(c, type) and _types.is_input_type(c)]
classes += [apps.Deployment, core.Service, core.ConfigMap, launch_template.LaunchTemplate,
            launch_template.LaunchTemplateArgs]
pulumi_way = {c: _types._raw_return_hints.__wrapped__(c) for c in classes}  # Pulumi's own, uncached
calls = []
plain_get_type_hints = typing.get_type_hints
typing.get_type_hints = lambda *a, **k: calls.append(1) or plain_get_type_hints(*a, **k)
once = _return_hints_evaluated_once(_types._raw_return_hints)
runner_way = {c: once(c) for c in classes}
print(json.dumps({"same": runner_way == pulumi_way, "getters": sum(len(h) for h in pulumi_way.values()),
                  "resolved": len(calls), "classes": len(classes)}))
"""))
    assert out["same"] and out["classes"] > 40
    assert out["resolved"] < out["getters"] / 2  # the repeated texts resolved once
