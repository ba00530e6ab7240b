"""Import only the files of the provider SDKs that a program touches (the offline runner's start-up cost).

Each service package of the generated SDKs star-imports every resource file of its service in its
`__init__`: touching `pulumi_aws.ec2.LaunchTemplate` imports all 180 files of `pulumi_aws.ec2`, and the
typing-heavy class bodies make that most of a render's import time. `load_on_demand()` puts, in place of
each service package not yet imported, a package module that imports a name's own file when the name is
first read — the same file, so the same class as a full import gives — and binds that file's public names
as the package's `__init__` would. A name it cannot place by the generators' file naming runs the package's
own `__init__` in full, so every name a full import has stays reachable.

Only the offline runner (offline/mockrun.py) calls it; `pulumi up` imports the SDKs as usual.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import re
import sys
import types
from pathlib import Path

# the service packages the program reads names from (others load as usual)
PACKAGES = (
    "pulumi_aws.ec2", "pulumi_aws.eks", "pulumi_aws.iam", "pulumi_aws.s3",
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
