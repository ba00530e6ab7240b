"""Planning for LLM serving: cost inputs -> topology spec. Pure: never imports pulumi or modal.

Reading a spec is cheap: `import topology.spec` loads pydantic and the spec, not the planner or numpy. The
planner's names below load on first access (PEP 562 module __getattr__)."""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# name -> submodule that defines it; imported on first access
_LAZY = {
    "GPU_KINDS": "catalog",
    "MigLayoutError": "catalog",
    "validate_mig_layout": "catalog",
    "CostInputs": "inputs",
    "EndpointInputs": "inputs",
    "InputError": "loading",
    "load_inputs": "loading",
    "load_spec_or_inputs": "loading",
    "PlanningError": "plan",
    "SPEC_VERSION": "spec",
    "TopologySpec": "spec",
}

__all__ = sorted([*_LAZY, "plan"])

if TYPE_CHECKING:
    from .catalog import GPU_KINDS, MigLayoutError, validate_mig_layout
    from .inputs import CostInputs, EndpointInputs
    from .loading import InputError, load_inputs, load_spec_or_inputs
    from .plan import PlanningError, plan
    from .spec import SPEC_VERSION, TopologySpec


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'topology' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"plan"})


class _TopologyModule(types.ModuleType):
    """`topology.plan` names the planner function, as it did before the planner became a package.

    The import system binds a loaded subpackage on its parent (`topology.plan = <package>`); a data descriptor
    on the module's class outranks that binding, so `from topology import plan` is the function whichever
    of the two is imported first. The package itself is `sys.modules["topology.plan"]`."""

    @property
    def plan(self):  # type: ignore[override]
        from .plan import plan

        return plan

    @plan.setter
    def plan(self, value: Any) -> None:
        """Ignore the import system binding the subpackage here: `topology.plan` stays the function."""


sys.modules[__name__].__class__ = _TopologyModule
