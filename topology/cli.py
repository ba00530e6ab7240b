"""`python -m topology plan|diff|simulate|render`: the planner's command line.

Errors in the user's inputs print a clear message and exit 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .loading import InputError
from .plan import PlanningError


def _cmd_plan(args: argparse.Namespace) -> int:
    from . import report
    from .loading import load_inputs
    from .plan import plan

    inputs = load_inputs(args.file)
    spec = plan(inputs)
    if args.json:
        print(spec.to_json())
        return 0
    print(report.markdown(spec) if args.markdown else report.terminal(spec))
    if args.simulate:
        from simulator import format_plan_check, plan_check  # lazily: the simulator is a separate package

        rows = plan_check(inputs, spec, seed=args.seed, progress=not args.markdown and sys.stderr.isatty())
        print("\n" + ("#### Simulated week vs this plan" if args.markdown else "simulated week vs this plan:"))
        print(format_plan_check(rows, markdown=args.markdown))
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    from . import report

    text = report.diff_files(args.old, args.new, markdown=args.markdown)
    print(text)
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from simulator.cli import cli_main  # the simulator owns its options; it reads the spec, never the planner

    from .loading import load_inputs
    from .plan import plan

    inputs = load_inputs(args.stack)
    return cli_main(args, inputs, plan(inputs))


def _cmd_render(args: argparse.Namespace) -> int:
    import gc

    # a one-shot process that imports the providers' SDKs: full collections would re-walk their hundreds of
    # thousands of long-lived objects again and again (see offline.mockrun's _fewer_collections)
    gc.freeze()
    gc.set_threshold(50_000, 20, 1000)
    # rendering runs the Pulumi program under mocks: it imports pulumi, so it lives outside topology/
    from offline.render import cli_main

    return cli_main(args)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    # queries Prometheus over HTTP: the I/O lives outside topology/ (the pure part is topology/calibrate.py)
    from offline.calibrate_prometheus import cli_main

    return cli_main(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m topology", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    pp = sub.add_parser("plan", help="plan a stack file or inputs file and print the report")
    pp.add_argument("file", help="stacks/Pulumi.<env>.yaml or a plain YAML/JSON inputs file")
    g = pp.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="print the TopologySpec as JSON")
    g.add_argument("--markdown", action="store_true", help="print a PR-comment version of the report")
    pp.add_argument("--simulate", action="store_true",
                    help="also replay a synthetic week through the plan and show simulated SLO attainment and cost "
                    "next to the plan's (warns beyond the stated tolerance; about a minute for the prod stack)")
    pp.add_argument("--seed", type=int, default=0, help="seed of the simulated week (with --simulate)")
    pp.set_defaults(func=_cmd_plan)

    pd = sub.add_parser("diff", help="what changed between two inputs files or saved specs")
    pd.add_argument("old")
    pd.add_argument("new")
    pd.add_argument("--markdown", action="store_true")
    pd.set_defaults(func=_cmd_diff)

    ps = sub.add_parser("simulate", help="replay a week (or a trace) through a stack's plan; run failure drills")
    from simulator.cli import add_arguments

    add_arguments(ps)
    ps.set_defaults(func=_cmd_simulate)

    pr = sub.add_parser("render", help="run the Pulumi program under mocks; write Kubernetes YAML and an inventory")
    pr.add_argument("stack", help="stacks/Pulumi.<env>.yaml")
    pr.add_argument("--out", required=True, help="output folder")
    pr.set_defaults(func=_cmd_render)

    pc = sub.add_parser("calibrate", help="measure a week of production in Prometheus; write updated inputs, show the plan diff")
    pc.add_argument("stack", help="stacks/Pulumi.<env>.yaml (or a plain inputs file) to calibrate")
    src = pc.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus", help="Prometheus base URL, e.g. http://localhost:9090 (port-forwarded)")
    src.add_argument("--from-file", help="a results document saved earlier with --save-results")
    pc.add_argument("--since", default="7d", help="measurement window ending now (or at --until): 7d, 36h, 2w")
    pc.add_argument("--until", type=float, default=None, help="window end, unix seconds (default: now)")
    pc.add_argument("--namespace", default=None, help="serving namespace (default: the stack's llm-serving:namespace)")
    pc.add_argument("--save-results", default=None, help="also save the query results as JSON (replay with --from-file)")
    pc.add_argument("--out", required=True, help="where to write the calibrated inputs document (YAML)")
    pc.set_defaults(func=_cmd_calibrate)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (InputError, PlanningError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
