"""`python -m topology simulate STACK …`: the simulator's options and what each run prints.

topology/cli.py parses the command line, loads and plans the stack, then calls `cli_main(args, inputs, spec)`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from topology.inputs import CostInputs
from topology.loading import InputError
from topology.spec import TopologySpec
from topology.timebase import HOURS_PER_WEEK

from .drills import DRILLS, run_drill
from .simulate import compare_with_plan, format_plan_check, plot_week, simulate_week, summary
from .traffic import load_trace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("Exit status: 0 when every endpoint meets its SLO (drills: always 0), 1 when one misses it, "
                     "2 on bad input. Drills run the window they need; --trace feeds them too.")
    parser.add_argument("stack", help="stacks/Pulumi.<env>.yaml (or an inputs file)")
    parser.add_argument("--trace", help="per-request (Azure CSV, Mooncake JSONL) or rate (ServeGen CSV) trace to replay")
    parser.add_argument("--drill", help=f"run a failure drill instead of the week: {', '.join(DRILLS)}")
    parser.add_argument("--plot", help="write a PNG of the week (demand, floor, burst, SLO attainment)")
    parser.add_argument("--markdown", action="store_true", help="print a PR-comment version")
    parser.add_argument("--endpoint", action="append", help="only this endpoint (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--hours", default=f"0:{HOURS_PER_WEEK}", help="window START:END in hours of the week, Monday 00:00 = 0")
    parser.add_argument("--raw-tokens", action="store_true", help="keep a trace's token counts (default: scale to the shape)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--spike-factor", type=float, default=3.0, help="spike drill: traffic multiplier (default 3)")
    parser.add_argument("--spike-minutes", type=float, default=10.0, help="spike drill: duration (default 10)")
    parser.add_argument("--spike-hour", type=int, default=None,
                        help="spike drill: hour of the week it lands in, Monday 00:00 = 0 (default: the busiest)")
    parser.add_argument("--abandon-fraction", type=float, default=0.2, help="disconnect drill: share abandoning (default 0.2)")
    parser.add_argument("--detect-minutes", type=float, default=10.0, help="rollback drill: minutes to detect (default 10)")


def parse_hours(text: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise InputError(f"--hours {text!r}: expected START:END in hours of the week, e.g. 6:12 or 0:168") from None
    if not (0 <= a < b <= HOURS_PER_WEEK * 4):
        raise InputError(f"--hours {text!r}: need 0 ≤ START < END ≤ 672 (up to four weeks)")
    return a, b


def cli_main(args: argparse.Namespace, inputs: CostInputs, spec: TopologySpec) -> int:
    """Run what the parsed options ask for on a planned stack (the caller plans it: the simulator imports
    nothing of the planner)."""
    from topology.cli import skip_exit_collection

    skip_exit_collection()  # a one-shot process: no last collection at exit
    names = [e.name for e in spec.endpoints]
    for n in args.endpoint or []:
        if n not in names:
            raise InputError(f"--endpoint {n!r}: no such endpoint; {Path(args.stack).name} has {', '.join(names)}")
    start_h, end_h = parse_hours(args.hours)
    trace = load_trace(args.trace) if args.trace else None
    if args.drill is not None:
        if args.drill not in DRILLS:
            raise InputError(f"--drill {args.drill!r}: unknown drill; allowed: {', '.join(DRILLS)}")
        text = run_drill(args.drill, inputs, spec, args, markdown=args.markdown, trace=trace)
        print(text)
        return 0
    res = simulate_week(inputs, spec, seed=args.seed, trace=trace, start_h=start_h, end_h=end_h,
                        endpoints=args.endpoint, raw_tokens=args.raw_tokens, progress=not args.no_progress)
    print(summary(res, markdown=args.markdown))
    if all(e.full_week for e in res.endpoints):
        print()
        print(format_plan_check([compare_with_plan(e, spec.endpoint(e.endpoint)) for e in res.endpoints],
                                markdown=args.markdown))
    if args.plot:
        p = plot_week(res, args.plot)
        print(f"\nplot: {p}")
    return 0 if all(e.meets_slo for e in res.endpoints) else 1
