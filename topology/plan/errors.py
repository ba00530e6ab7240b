"""The planner's one error type."""


class PlanningError(ValueError):
    """The inputs are valid one by one but no plan can meet them; the message names the constraint."""
