"""`python -m topology plan|diff|simulate|render`: the planner's command line.

Errors in the user's inputs print a clear message and exit 2 — never a traceback. Every file and option is
checked before any long work starts (a bad --plot path fails before the week is simulated).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from .catalog import MigLayoutError
from .loading import InputError, InputNotice
from .plan import PlanningError

PLOT_SUFFIXES = ("", ".png", ".svg", ".pdf")
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug, not the user's input


def today() -> dt.date:
    """The one clock read, at the command line's edge: validation refuses prices dated in the future and
    warns when they are old. The planner itself reads no clock; this date is passed in."""
    return dt.datetime.now(dt.timezone.utc).date()  # UTC, as planningDate and the README's `date -u +%F`


def _warn_prices(inputs) -> None:
    from .inputs import prices_age_warning

    w = prices_age_warning(inputs.prices.prices_as_of, today())
    if w:
        print(f"warning: {w}", file=sys.stderr)


def planning_hint(message: str, inputs) -> str:
    """The input fields to change for a PlanningError (the planner names the constraint; this names the field)."""
    m = re.match(r"endpoint '?([^\s':]+)'?:", message)  # the planner quotes some names, not others
    names = [e.name for e in inputs.endpoints] if inputs is not None else []
    if not m or m.group(1) not in names:
        return ""
    ep = f"endpoints.{names.index(m.group(1))}"
    fields: list[str] = []
    rules = (
        ("mig profile", [f"{ep}.engine.mig.profile"]),
        ("no GPU or MIG slice", [f"{ep}.model.weights_gb", f"{ep}.model.precision", f"{ep}.engine",
                                 f"{ep}.slo", f"{ep}.shape.product_max_context_tokens"]),
        ("max_dedicated_replicas", [f"{ep}.max_dedicated_replicas", f"{ep}.traffic"]),
        ("max_containers_cap", [f"{ep}.serverless.max_containers_cap"]),
        ("allows no floor replicas", ["floor_replicas_allowed"]),
        ("no managed API", [f"{ep}.managed_api"]),
        ("API p99 TTFT", [f"{ep}.slo.ttft_p99_ms", f"{ep}.managed_api.measured_ttft_p99_ms"]),
        ("rollout needs dedicated replicas", [f"{ep}.rollout", f"{ep}.traffic", "floor_replicas_allowed"]),
    )
    for needle, fs in rules:
        if needle in message:
            fields += [f for f in fs if f not in fields]
    return f" [input fields to change: {', '.join(fields)}]" if fields else ""


def _plan(inputs, source: str):
    from .plan import plan

    try:
        return plan(inputs)
    except PlanningError as e:
        raise PlanningError(f"{source}: {e}{planning_hint(str(e), inputs)}") from None


def _cmd_plan(args: argparse.Namespace) -> int:
    from . import report
    from .loading import load_inputs

    if args.seed < 0:
        raise InputError(f"--seed {args.seed}: must be ≥ 0 (numpy seeds are non-negative integers)")
    inputs = load_inputs(args.file, today())
    _warn_prices(inputs)
    spec = _plan(inputs, args.file)
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
    from .loading import load_spec_or_inputs

    from .spec import TopologySpec

    sides = []
    for path in (args.old, args.new):  # validated (and dated) before the diff plans either side
        obj = load_spec_or_inputs(path, today())
        sides.append(obj if isinstance(obj, TopologySpec) else _plan(obj, path))
    print(report.format_diff(report.diff_specs(*sides), markdown=args.markdown))
    return 0


def check_simulate_args(args: argparse.Namespace) -> None:
    """Options checked before planning and simulating (minutes of work) so a typo fails at once."""
    from simulator.cli import settle_drill_options

    settle_drill_options(args)
    if args.seed < 0:
        raise InputError(f"--seed {args.seed}: must be ≥ 0 (numpy seeds are non-negative integers)")
    for opt in ("spike_factor", "spike_minutes", "abandon_fraction", "detect_minutes"):
        v = getattr(args, opt, None)
        if v is not None and not math.isfinite(v):
            raise InputError(f"--{opt.replace('_', '-')} {v!r}: not a number (NaN or infinity); give a finite value")
    if getattr(args, "detect_minutes", 10.0) < 0:
        raise InputError(f"--detect-minutes {args.detect_minutes:g}: must be ≥ 0")
    if args.plot is not None:
        check_writable_file(args.plot, "--plot", PLOT_SUFFIXES)


def check_writable_file(path: str, option: str, suffixes: Sequence[str] | None, kind: str = "image",
                        example: str = "week.png") -> None:
    """Refuse an output file that cannot be written, before any work: no name, a directory, a missing folder, an
    unwritable place, or a suffix not among `suffixes` ('' allows none; None: any suffix)."""
    p = Path(path)
    if not path or path.endswith(os.sep):
        raise InputError(f"{option} {path!r}: name a file, e.g. out/{example}")
    if suffixes is not None and p.suffix.lower() not in suffixes:
        allowed = ", ".join(s for s in suffixes if s) + (", or none" if "" in suffixes else "")
        raise InputError(f"{option} {path!r}: unknown {kind} type {p.suffix!r}; allowed: {allowed}")
    if p.is_dir():
        raise InputError(f"{option} {path!r}: is a directory; name a file in it, e.g. {p / example}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{option} {path!r}: folder {str(parent)!r} does not exist")
    # try it (os.access says yes to root even on /proc): append to an existing file, create and remove a new one
    existed = p.exists()
    try:
        with open(p, "ab" if existed else "xb"):
            pass
    except OSError as e:
        raise InputError(f"{option} {path!r}: not writable ({e.strerror})") from None
    if not existed:
        p.unlink()


def _cmd_simulate(args: argparse.Namespace) -> int:
    from simulator.cli import cli_main  # the simulator owns its options; it reads the spec, never the planner

    from .loading import load_inputs

    check_simulate_args(args)
    if args.trace:  # the cheap checks first
        from simulator.traffic import load_trace

        load_trace(args.trace)
    inputs = load_inputs(args.stack, today())  # dated and validated here
    _warn_prices(inputs)
    return cli_main(args, inputs, _plan(inputs, args.stack))


@functools.cache  # once per process
def skip_exit_collection() -> None:
    """Skip the interpreter's last cyclic collection at exit, for the one-shot commands (render, simulate).

    At exit the interpreter walks everything still alive once more — after a render the SDKs' classes and the
    recording (≈ 0.2 s of CPU), after a simulation numba's types and dispatchers and pydantic's schemas
    (≈ 0.35–0.45 s, a third of the 3 req/s week's process) — to free memory the operating system takes back
    anyway (Python does not promise finalizers at exit). What is alive then is frozen out of that collection by
    `gc.freeze` from an exit handler: after the command's own work, before the interpreter's teardown. The
    commands call it, not the library functions: a notebook or service keeps the interpreter's usual exit."""
    import atexit
    import gc

    atexit.register(gc.freeze)


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


def _cmd_preflight(args: argparse.Namespace) -> int:
    # talks to AWS, Kubernetes and Modal: it lives outside topology/, which stays pure
    from ops.preflight import cli_main

    return cli_main(args)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line; given the `command` about to run, only that one's options need its imports."""
    p = argparse.ArgumentParser(prog="python -m topology", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    pp = sub.add_parser("plan", help="plan a stack file or inputs file and print the report")
    pp.add_argument("file", help="stacks/Pulumi.<env>.yaml or a plain YAML/JSON inputs file")
    g = pp.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="print the TopologySpec as JSON")
    g.add_argument("--markdown", action="store_true", help="print a PR-comment version of the report")
    pp.add_argument("--simulate", action="store_true",
                    help="also replay a synthetic week through the plan and show simulated SLO attainment and cost "
                    "next to the plan's (warns beyond the stated tolerance; about 10 s for the prod stack)")
    pp.add_argument("--seed", type=int, default=0, help="seed of the simulated week (with --simulate)")
    pp.set_defaults(func=_cmd_plan)

    pd = sub.add_parser("diff", help="what changed between two inputs files or saved specs")
    pd.add_argument("old")
    pd.add_argument("new")
    pd.add_argument("--markdown", action="store_true")
    pd.set_defaults(func=_cmd_diff)

    ps = sub.add_parser("simulate", help="replay a week (or a trace) through a stack's plan; run failure drills")
    if command in (None, "simulate"):  # importing the simulator (numba) costs every other command 0.2 s
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

    pf = sub.add_parser("preflight", help="read-only checks of what `pulumi up` assumes (AWS, cluster, weights, Modal, Secrets)")
    pf.add_argument("stack", help="stacks/Pulumi.<env>.yaml or the stack name")
    pf.set_defaults(func=_cmd_preflight)
    return p


def _show_notice(show: Callable[..., None]) -> Callable[..., None]:
    """Notices about the inputs as one plain `warning:` line on stderr (no Python source line); others as before."""
    def shown(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 (warnings' signature)
        if issubclass(category, InputNotice):
            print(f"warning: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)
    return shown


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else None)
    args = parser.parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_notice(warnings.showwarning)
            warnings.simplefilter("default", InputNotice)  # once per message, whatever the caller's filters
            return int(args.func(args) or 0)
    except (InputError, PlanningError, MigLayoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - the last guard: one line, not a traceback (LLM_SERVING_TRACEBACK=1 shows it)
        if os.environ.get("LLM_SERVING_TRACEBACK"):
            raise
        print(f"error: internal error, please report it with the input that caused it: {type(e).__name__}: "
              f"{' '.join(str(e).split())[:300]} (LLM_SERVING_TRACEBACK=1 shows where)", file=sys.stderr)
        return EXIT_INTERNAL
