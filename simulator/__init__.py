"""The simulator: replay a week of traffic (synthetic or a real trace) through a TopologySpec and run the
failure drills. It reads the spec and the inputs (ground truth: engine rates, cold starts, prices, traffic)
and imports nothing of the planner, so it checks the plan's claims instead of re-running its code.

  engine.py    one endpoint's requests through its floor, gateway, autoscaler and burst tier
  traffic.py   synthetic weeks and trace replay
  simulate.py  runs over a window (`simulate_endpoint`, `simulate_week`), the plan check, summary and plot
  drills.py    the five failure drills (`run_drill`, `DRILLS`)
  format.py    text tables shared by reports and drills
  cli.py       `python -m topology simulate` options (`add_arguments`, `cli_main(args, inputs, spec)`)
"""

from .drills import DRILLS, run_drill
from .simulate import (
    COST_TOLERANCE_FRACTION,
    GOODPUT_TARGET,
    EndpointResult,
    PlanComparison,
    SimResult,
    compare_with_plan,
    format_plan_check,
    plan_check,
    simulate_endpoint,
    simulate_week,
    summary,
)

__all__ = [
    "COST_TOLERANCE_FRACTION", "DRILLS", "GOODPUT_TARGET", "EndpointResult", "PlanComparison", "SimResult",
    "compare_with_plan", "format_plan_check", "plan_check", "run_drill", "simulate_endpoint", "simulate_week",
    "summary",
]
