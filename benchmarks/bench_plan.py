"""Plan time for one endpoint and for a fleet of 100 endpoints (medians on this machine; not a test).

    .venv/bin/python benchmarks/bench_plan.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topology import CostInputs, load_inputs, plan  # noqa: E402


def fleet(inputs: CostInputs, n: int) -> CostInputs:
    """n endpoints cycling through the stack's endpoints, traffic scaled so each decision differs."""
    eps = []
    for i in range(n):
        base = inputs.endpoints[i % len(inputs.endpoints)]
        k = 0.25 + (i % 10) * 0.25
        traffic = base.traffic.model_copy(update={"hourly_mean_requests_per_s": [x * k for x in base.traffic.hourly_mean_requests_per_s]})
        eps.append(base.model_copy(update={"name": f"{base.name[:30]}-{i}", "traffic": traffic,
                                           "max_dedicated_replicas": 200,
                                           "serverless": base.serverless.model_copy(update={"max_containers_cap": 200})}))
    return inputs.model_copy(update={"endpoints": eps})


def median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    prod = load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml")
    one = prod.model_copy(update={"endpoints": [prod.endpoints[0]]})
    hundred = fleet(prod, 100)
    plan(one)  # warm imports and caches
    t1 = median_s(lambda: plan(one), 21)
    t3 = median_s(lambda: plan(prod), 11)
    t100 = median_s(lambda: plan(hundred), 5)
    print(f"plan, 1 endpoint:     {t1 * 1000:7.1f} ms (median of 21; target < 50 ms)")
    print(f"plan, prod stack (3): {t3 * 1000:7.1f} ms (median of 11)")
    print(f"plan, 100 endpoints:  {t100 * 1000:7.1f} ms (median of 5; target < 2000 ms)")


if __name__ == "__main__":
    main()
