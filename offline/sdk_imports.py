"""Import only the files of the provider SDKs that a program touches (the offline runner's start-up cost).

Each service package of the generated SDKs star-imports every resource file of its service in its
`__init__`: touching `pulumi_aws.ec2.LaunchTemplate` imports all 180 files of `pulumi_aws.ec2`, and the
typing-heavy class bodies make that most of a render's import time. `load_on_demand()` puts, in place of
each service package not yet imported, a package module that imports a name's own file when the name is
first read — the same file, so the same class as a full import gives — and binds that file's public names
as the package's `__init__` would. A name it cannot place by the generators' file naming runs the package's
own `__init__` in full, so every name a full import has stays reachable.

`compile_annotations_lazily()` has the SDK files the runner imports compiled as if they began with `from
__future__ import annotations`: their class bodies and `def`s then keep each annotation as its text instead of
building its `typing` object (`pulumi.Input[Optional[Sequence[pulumi.Input['ContainerArgs']]]]`, three times a
property, thousands a file), which was most of the time importing them takes. The runtime reads the
annotations it needs through `typing.get_type_hints` with the class's module as globals, which evaluates the
text to the same types (the generated files name every type at module level: `_builtins.str`, `'ObjectMetaArgs'`).

Only the offline runner (offline/mockrun.py) calls them; `pulumi up` imports the SDKs as usual.
"""

from __future__ import annotations

import __future__
import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import marshal
import os
import re
import struct
import sys
import types
import typing
from pathlib import Path

# the service packages the program reads names from (others load as usual)
PACKAGES = (
    "pulumi_aws.autoscaling", "pulumi_aws.ec2", "pulumi_aws.eks", "pulumi_aws.iam", "pulumi_aws.s3",
    "pulumi_kubernetes.core.v1", "pulumi_kubernetes.apps.v1", "pulumi_kubernetes.policy.v1",
    "pulumi_kubernetes.helm.v3",
)
# files every service package has, holding its shared input/output types and enums
_SHARED_FILES = ("_enums", "_inputs", "outputs")
# a resource's args, a function's Output form and its result types
_SUFFIXES = ("_output", "InitArgs", "ArgsDict", "Args", "Result")


def _snake(name: str) -> str:
    """LaunchTemplate → launch_template (pulumi_aws names its files this way; pulumi_kubernetes by the class)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _files_for(name: str) -> list[str]:
    """The files that may define `name`: get_route_tables_output and GetRouteTablesResult in get_route_tables.py."""
    base = name.removeprefix("Awaitable")
    stems = [name, base] + [base[: -len(s)] for s in _SUFFIXES if base.endswith(s) and len(base) > len(s)]
    out: list[str] = []
    for stem in stems:
        for f in (stem, _snake(stem)):
            if f not in out:
                out.append(f)
    return out


class OnDemandPackage(types.ModuleType):
    """A service package whose files are imported when a name from them is first read."""

    def __setattr__(self, key: str, value: object) -> None:
        # the import system binds each file imported from this package under the file's name; the package's
        # __init__ would star-import it, so its public names are bound instead, and a class named like its
        # file (pulumi_kubernetes' ConfigMap.py) wins over the file, as in a full import
        if isinstance(value, types.ModuleType) and value.__name__ == f"{self.__name__}.{key}" and key != "outputs":
            public = getattr(value, "__all__", ())
            for n in public:
                super().__setattr__(n, getattr(value, n))
            if key in public:
                return
        super().__setattr__(key, value)

    def __getattr__(self, name: str):  # only called for a name not bound yet
        if name.startswith("__") or f"{self.__name__}.{name}" in sys.modules:
            # a file still being imported (a circular `from . import outputs`): the import system then takes
            # it from sys.modules, as for any package
            raise AttributeError(name)
        for stem in _files_for(name) + list(_SHARED_FILES):
            if name in self.__dict__:
                break
            if any((Path(p) / f"{stem}.py").is_file() for p in self.__path__):
                importlib.import_module(f"{self.__name__}.{stem}")
        if name not in self.__dict__:
            self._load_fully()
        if name in self.__dict__:
            return self.__dict__[name]
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def _load_fully(self) -> None:
        """What importing the package would have done: run its __init__ (files imported already are reused)."""
        if not self.__dict__.get("_loaded_fully"):
            self.__dict__["_loaded_fully"] = True
            self.__spec__.loader.exec_module(self)


def load_on_demand(packages: tuple[str, ...] = PACKAGES) -> None:
    """Turn each package of `packages` not imported yet (absent, or only the SDK's lazy placeholder) into an
    OnDemandPackage. The placeholder object itself is converted, so a module that already holds it (`from
    pulumi_aws import ec2` run earlier) sees the same package."""
    for full in packages:
        parent_name, _, child = full.rpartition(".")
        try:
            parent = importlib.import_module(parent_name)
        except ImportError:
            continue
        current = sys.modules.get(full)
        # type(), not isinstance(): reading any attribute of a lazy placeholder may load it in full
        if current is not None and (type(current) is types.ModuleType or issubclass(type(current), OnDemandPackage)):
            continue  # already imported in full, or already on demand
        # a fresh spec from the file system: the SDK's lazy placeholder wraps the loader in its own
        spec = importlib.machinery.PathFinder.find_spec(full, list(parent.__path__))
        if spec is None or spec.submodule_search_locations is None:
            continue
        module = current if current is not None else types.ModuleType(full)
        module.__class__ = OnDemandPackage  # from here on the placeholder's own loading hook is gone
        module.__spec__, module.__loader__, module.__file__ = spec, spec.loader, spec.origin
        module.__path__, module.__package__ = list(spec.submodule_search_locations), full
        sys.modules[full] = module
        setattr(parent, child, module)


# the SDK distributions whose files are compiled with annotations kept as text
LAZY_ANNOTATION_ROOTS = ("pulumi_aws", "pulumi_kubernetes")
# where that bytecode is kept: the project's cache folder, not the SDK's __pycache__ (which an installed SDK may
# not let us write, and where the interpreter's own .pyc files stay as they are)
CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache" / "sdk-bytecode" / sys.implementation.cache_tag


# how the cached code was compiled (the flags below): bumped when they change, so no older file is read as current
LOADER_VERSION = b"lazy-annotations-1\0"


def _cached_code(cache: Path, header: bytes) -> types.CodeType | None:
    """The code cached under `header`; None when the file is absent, unreadable, of another header or damaged
    (a body that is not code under a good header included): the caller compiles afresh."""
    try:
        data = cache.read_bytes()
        if data[: len(header)] != header:
            return None
        code = marshal.loads(memoryview(data)[len(header):])
    except (OSError, ValueError, EOFError, TypeError):
        return None
    return code if isinstance(code, types.CodeType) else None


class LazyAnnotationsLoader(importlib.machinery.SourceFileLoader):
    """A source file compiled with `from __future__ import annotations` in effect, its bytecode cached in
    CACHE_DIR (valid for the interpreter's magic number, the optimisation level and the source's path,
    modification time and size, as a timestamp .pyc is). Where none is cached and none may be written (the
    folder is read-only, or PYTHONDONTWRITEBYTECODE / -B forbids writing bytecode), the file's usual bytecode:
    compiling a 40 000-line file on every import would cost more than its annotations."""

    def get_code(self, fullname: str) -> types.CodeType:
        source_path = self.get_filename(fullname)
        st = os.stat(source_path)
        header = (importlib.util.MAGIC_NUMBER + LOADER_VERSION
                  + struct.pack("<qqb", st.st_mtime_ns, st.st_size, sys.flags.optimize)
                  + os.fsencode(source_path) + b"\0")
        cache = CACHE_DIR / f"{fullname}.{hashlib.sha256(os.fsencode(source_path)).hexdigest()[:16]}.pyc"
        code = _cached_code(cache, header)
        if code is not None:
            return code
        writable = False
        if not sys.dont_write_bytecode:
            try:
                CACHE_DIR.mkdir(parents=True, exist_ok=True)
                writable = os.access(CACHE_DIR, os.W_OK)
            except OSError:
                pass
        if not writable:
            return super().get_code(fullname)
        code = compile(self.get_data(source_path), source_path, "exec", dont_inherit=True,
                       flags=__future__.annotations.compiler_flag)
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(header + marshal.dumps(code))
            os.replace(tmp, cache)  # whole or not at all, if two runs write it at once
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return code

    def exec_module(self, module: types.ModuleType) -> None:
        with forward_refs_compiled_once():
            super().exec_module(module)


_COMPILED_FORWARD_REFS: dict[str, types.CodeType] = {}
# the annotation texts compiled in earlier processes, kept beside the SDK bytecode: a render compiles some 1 500
# distinct texts (≈ 25 µs each), the same ones every time; marshal reads them back in a few milliseconds
FORWARD_REFS_HEADER = importlib.util.MAGIC_NUMBER + b"forward-refs-1\0" + struct.pack("<b", sys.flags.optimize)
_forward_refs_state = {"loaded": False, "new": False}


def _forward_refs_file() -> Path:
    return CACHE_DIR / "forward-refs.marshal"


def _load_compiled_forward_refs() -> None:
    """The texts compiled in earlier processes, once per process; nothing when the file is absent, of another
    interpreter or damaged (each text is then compiled as before)."""
    _forward_refs_state["loaded"] = True
    cache = _forward_refs_file()
    try:
        data = cache.read_bytes()
        if data[: len(FORWARD_REFS_HEADER)] != FORWARD_REFS_HEADER:
            return
        known = marshal.loads(memoryview(data)[len(FORWARD_REFS_HEADER):])
    except (OSError, ValueError, EOFError, TypeError):
        return
    if isinstance(known, dict) and all(type(k) is str and type(v) is types.CodeType for k, v in known.items()):
        for text, code in known.items():
            _COMPILED_FORWARD_REFS.setdefault(text, code)


def _save_compiled_forward_refs() -> None:
    """Every text compiled so far, for later processes, when some are new and bytecode may be written (as for the
    SDK bytecode: not under PYTHONDONTWRITEBYTECODE / -B, nor into a folder that is not writable)."""
    if not _forward_refs_state["new"] or sys.dont_write_bytecode:
        return
    _forward_refs_state["new"] = False
    cache = _forward_refs_file()
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(FORWARD_REFS_HEADER + marshal.dumps(_COMPILED_FORWARD_REFS))
        os.replace(tmp, cache)  # whole or not at all, if two runs write it at once
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _compile_forward_ref(source, filename="<string>", mode="exec", *args, **kwargs):
    """`compile` as `typing.ForwardRef` calls it, remembered per annotation text (code objects are immutable)."""
    if args or kwargs or filename != "<string>" or mode != "eval" or type(source) is not str:
        return compile(source, filename, mode, *args, **kwargs)
    code = _COMPILED_FORWARD_REFS.get(source)
    if code is None:
        code = _COMPILED_FORWARD_REFS[source] = compile(source, filename, mode)
        _forward_refs_state["new"] = True
    return code


@contextlib.contextmanager
def forward_refs_compiled_once():
    """Each annotation text `typing` compiles into a ForwardRef is compiled once while this lasts (an SDK file
    runs; the offline runner runs a program), and once across processes where bytecode may be written. Kept
    as text, every field of the files' TypedDicts becomes a ForwardRef, which compiles its text: 3 700 times
    for the three largest files the program imports, of 720 distinct texts; and the runtime's `get_type_hints`
    turns each getter's annotation text into one."""
    if typing.__dict__.get("compile") is not None:  # an enclosing SDK import has it in place already
        yield
        return
    if not _forward_refs_state["loaded"]:
        _load_compiled_forward_refs()
    typing.compile = _compile_forward_ref  # typing looks `compile` up in its globals before the builtins
    try:
        yield
    finally:
        del typing.compile
        _save_compiled_forward_refs()


class LazyAnnotationsFinder:
    """Finds the SDKs' modules as the path finder does and gives their source files the loader above."""

    @staticmethod
    def find_spec(fullname: str, path=None, target=None):
        if fullname.partition(".")[0] not in LAZY_ANNOTATION_ROOTS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader:
            spec.loader = LazyAnnotationsLoader(spec.loader.name, spec.loader.path)
        return spec


def compile_annotations_lazily() -> None:
    """From here on this process imports the SDKs' files not yet imported with annotations kept as text."""
    if not any(isinstance(f, LazyAnnotationsFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, LazyAnnotationsFinder())
