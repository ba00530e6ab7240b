"""Planning for LLM serving: cost inputs -> topology spec. Pure: never imports pulumi or modal."""

from .catalog import GPU_KINDS, MigLayoutError, validate_mig_layout
from .inputs import CostInputs, EndpointInputs
from .loading import InputError, load_inputs, load_spec_or_inputs
from .plan import PlanningError, plan
from .spec import SPEC_VERSION, TopologySpec

__all__ = [
    "GPU_KINDS",
    "SPEC_VERSION",
    "CostInputs",
    "EndpointInputs",
    "InputError",
    "MigLayoutError",
    "PlanningError",
    "TopologySpec",
    "load_inputs",
    "load_spec_or_inputs",
    "plan",
    "validate_mig_layout",
]
