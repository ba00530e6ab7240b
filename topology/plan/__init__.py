"""plan(inputs) -> TopologySpec: choose how each endpoint is served, and size it, with the arithmetic shown.

The planner is pure: no pulumi, no modal, no clock, no network, no files. Catalogs come in as arguments.

Outline for one endpoint:
1. Placements: each measured GPU kind as whole GPUs, and each MIG slice the model fits (weights + KV for
   at least one sequence at the product's maximum context). For each, replica capacity from the measured
   throughput, limited by the inter-token SLO, at the highest utilisation that keeps TTFT p99 within the
   SLO (M/M/c waiting on the replica's sequence slots) and never above 1/(1+headroom).
2. Load-duration curve: replicas needed in each of the 168 hours at the within-hour peak, cut into
   node-sized layers (nodes are what is paid for). The bottom nodes may be reserved (all hours,
   discounted); every other node runs on the clock in the hours where that beats letting serverless
   carry its share (an on/off schedule per node by dynamic programming: on-demand while running, the
   cold-start lead billed ahead of each start; serverless pays each layer's share of what the serverless
   model bills that hour, and a warm container where a restore is slower than the TTFT SLO).
3. Options — managed API, serverless only, dedicated only, floor + burst — each at its cheapest layer
   split, costed on the real profile with node packing and fixed platform costs, serverless by the
   containers the arrival process and Modal's routing keep alive (serverless.py); the cheapest feasible
   one wins and the report says why the runner-up lost.
4. The winner's floors (168 hours, windows starting a cold-start lead ahead of each rise), autoscaling
   (queue signal, thresholds from cold start and the steepest ramp, capped step), thundering-herd
   limits, engine flags, burst sizing and gateway settings.

Where each stage lives (each a function from typed inputs to typed outputs; the catalog is passed in):
  placement.py    1. placements, replica capacity, Erlang C (`placements`, `capacity_section`)
  demand.py       the hour-of-week demand (`demand_of`, `replicas_needed_by_hour`)
  timing.py       cold starts, the herd of weight loads, lead time, longest request
  schedule.py     2. node layers, per-node schedule DP, the floor schedule
  serverless.py      serverless containers alive and launches by hour (the derivation is its docstring)
  options.py      3. the four options costed, the platform share, the decision, the MIG decision
  economics.py    $/request, break-even duty cycles, serverless premium
  autoscaling.py  4. KEDA/HPA settings and the burst-backlog trigger
  nodepools.py       node pools and MIG layouts
  engine.py          vLLM settings and LoRA
  burst.py           the serverless tier's sizing
  gateway.py         the gateway's limits
  weights.py         the weight caches
  endpoint.py     one endpoint's spec from its sections
  builder.py      plan(): every endpoint, the shared fixed cost, the fleet's totals
"""

from .builder import plan
from .demand import Demand, demand_of, replicas_needed_by_hour
from .endpoint import EndpointPlan, build_endpoint_spec
from .errors import PlanningError
from .options import OptionEval, better, decide, evaluate_floor, options_for, prepare_endpoint, with_platform_share
from .placement import (
    ACTIVATION_OVERHEAD_GB_PER_GPU,
    GB_PER_MIB,
    GPU_MEMORY_UTILIZATION,
    Infeasible,
    Placement,
    erlang_c,
    p99_wait_s,
    placements,
    slo_utilisation,
)
from .schedule import (
    FloorChoice,
    NodeGroups,
    Prices,
    choose_floors,
    floor_windows,
    node_groups,
    schedule_dp,
)
from .serverless import ContainerHours, expected_containers, gamma_alpha_for_peak, service_time_s
from .timing import herd_limits, lead_time_s, longest_request_s, serverless_cold_start_s

__all__ = [
    "ACTIVATION_OVERHEAD_GB_PER_GPU", "GB_PER_MIB", "GPU_MEMORY_UTILIZATION",
    "Demand", "EndpointPlan", "FloorChoice", "Infeasible", "NodeGroups", "OptionEval", "Placement", "PlanningError",
    "Prices", "better", "build_endpoint_spec", "choose_floors", "decide", "demand_of", "erlang_c", "evaluate_floor",
    "floor_windows", "herd_limits", "lead_time_s", "longest_request_s", "node_groups", "options_for", "p99_wait_s",
    "placements", "plan", "prepare_endpoint", "replicas_needed_by_hour", "schedule_dp",
    "ContainerHours", "expected_containers", "gamma_alpha_for_peak", "service_time_s", "serverless_cold_start_s",
    "slo_utilisation", "with_platform_share",
]
