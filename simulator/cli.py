"""`python -m topology simulate STACK …`: the simulator's options and what each run prints.

topology/cli.py parses the command line, loads and plans the stack, then calls `cli_main(args, inputs, spec)`.
"""

from __future__ import annotations

import argparse
import math
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
    # a drill's own options default to None here, so one given without its drill is refused (settle_drill_options)
    parser.add_argument("--spike-factor", type=float, default=None, help="spike drill: traffic multiplier (default 3)")
    parser.add_argument("--spike-minutes", type=float, default=None, help="spike drill: duration (default 10)")
    parser.add_argument("--spike-hour", type=int, default=None,
                        help="spike drill: hour of the week it lands in, Monday 00:00 = 0 (default: the busiest)")
    parser.add_argument("--abandon-fraction", type=float, default=None, help="disconnect drill: share abandoning (default 0.2)")
    parser.add_argument("--detect-minutes", type=float, default=None, help="rollback drill: minutes to detect (default 10)")


# each drill option: the drill it belongs to and its default
DRILL_OPTIONS = {"spike_factor": ("spike", 3.0), "spike_minutes": ("spike", 10.0), "spike_hour": ("spike", None),
                 "abandon_fraction": ("disconnect", 0.2), "detect_minutes": ("rollback", 10.0)}


def settle_drill_options(args: argparse.Namespace) -> None:
    """Refuse a drill's option given without that drill (it was silently ignored: `--spike-factor 0` on a plain
    week ran the week), then fill in the defaults of those not given. Once per parsed command line (a second call,
    e.g. cli_main's after the CLI's own check, finds it done)."""
    if getattr(args, "_drill_options_settled", False):
        return
    for opt, (drill, default) in DRILL_OPTIONS.items():
        v = getattr(args, opt, None)
        if v is not None and getattr(args, "drill", None) != drill:
            given = f"--drill {args.drill}" if getattr(args, "drill", None) else "no --drill"
            raise InputError(f"--{opt.replace('_', '-')} applies to --drill {drill} only ({given} given)")
        if v is None:
            setattr(args, opt, default)
    args._drill_options_settled = True


def parse_hours(text: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise InputError(f"--hours {text!r}: expected START:END in hours of the week, e.g. 6:12 or 0:168") from None
    if not (0 <= a < b <= HOURS_PER_WEEK * 4):
        raise InputError(f"--hours {text!r}: need 0 ≤ START < END ≤ 672 (up to four weeks)")
    return a, b


MAX_SIMULATED_REQUESTS = 1_000_000_000  # about 2-3 CPU-minutes at the simulator's 5-10 M requests per CPU-second


def expected_requests(inputs: CostInputs, endpoints: list[str] | None, start_h: float, end_h: float) -> dict[str, float]:
    """Requests each simulated endpoint's hourly profile brings in [start_h, end_h) (hours of the week, wrapping)."""
    out = {}
    for ep in inputs.endpoints:
        if endpoints and ep.name not in endpoints:
            continue
        rates = ep.traffic.hourly_mean_requests_per_s or []
        if not rates:
            continue
        total, h = 0.0, start_h
        while h < end_h:
            nxt = min(end_h, math.floor(h) + 1)
            total += rates[int(math.floor(h)) % len(rates)] * 3600.0 * (nxt - h)
            h = nxt
        out[ep.name] = total
    return out


def cli_main(args: argparse.Namespace, inputs: CostInputs, spec: TopologySpec) -> int:
    """Run what the parsed options ask for on a planned stack (the caller plans it: the simulator imports
    nothing of the planner)."""
    from topology.cli import skip_exit_collection

    skip_exit_collection()  # a one-shot process: no last collection at exit
    settle_drill_options(args)  # (done already when called through the CLI's checks)
    names = [e.name for e in spec.endpoints]
    for n in args.endpoint or []:
        if n not in names:
            raise InputError(f"--endpoint {n!r}: no such endpoint; {Path(args.stack).name} has {', '.join(names)}")
    start_h, end_h = parse_hours(args.hours)
    if args.drill is None:
        # before minutes of work: a profile at 10^6 req/s would replay billions of requests an hour
        counts = expected_requests(inputs, args.endpoint, start_h, end_h)
        if sum(counts.values()) > MAX_SIMULATED_REQUESTS:
            top = max(counts, key=counts.get)
            raise InputError(
                f"--hours {args.hours}: this run would replay about {sum(counts.values()):,.0f} requests (endpoint {top!r} "
                f"{counts[top]:,.0f}, from its traffic.hourly_mean_requests_per_s); the limit is "
                f"{MAX_SIMULATED_REQUESTS:,} (the simulator replays 5-10 M requests per CPU-second): simulate fewer "
                f"hours (--hours) or endpoints (--endpoint), or check the traffic input")
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
