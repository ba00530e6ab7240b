"""Check: every bundled stack renders byte-for-byte as it did at a git revision — for changes that only make the
program, the mock runner or the render faster. Not a test (it renders each stack twice, in fresh processes).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/render_identical.py [--ref main] [--keep DIR]

For each stacks/Pulumi.*.yaml of the working tree, `python -m topology render STACK --out DIR` runs once with the
working tree's code and once with REF's (a `git archive` of REF unpacked in a temporary folder, same interpreter,
same stack file), then the two output trees are compared file by file, with the exit status and the printed
report. Prints the first lines of each difference; exits 1 when anything differs, 0 when all are identical.

`--copies 10,50` also runs the Pulumi program under mocks (offline/mockrun.py) for the prod stack with its
endpoint `assist` copied N times (benchmarks/bench_program.py's growth stacks), once per tree in a fresh
process, and compares every recorded resource (type, name, parent, options, inputs) and the stack outputs.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def render(code_root: Path, stack: Path, out: Path) -> tuple[int, str]:
    """(exit status, stdout) of one render of `stack` into `out` with the code under `code_root`."""
    proc = subprocess.run(
        # -P: the code from PYTHONPATH, not from the current folder, which stays the working tree's for both (the
        # program writes paths relative to it, such as the interpreter in the Modal deploy command)
        [sys.executable, "-P", "-W", "ignore", "-m", "topology", "render", str(stack), "--out", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(code_root)}, capture_output=True, text=True,
    )
    # the report names the output folder, which differs between the two runs
    return proc.returncode, proc.stdout.replace(str(out), "OUT")


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# run in a fresh interpreter with one tree's code first on the path: the recording of bench_program's growth stack
_PROGRAM_RECORD = """
import dataclasses, json, sys, warnings
warnings.simplefilter("ignore")
root, n = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, root)
import importlib.util
spec = importlib.util.spec_from_file_location("bench_program", sys.argv[3])
bp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bp)
stack, config = bp.read_stack_config(bp.PROD)
rec = bp.run_program(stack, bp.synthetic_config(config, "assist", n))
# dependencies are a set (their order follows string hashing, which differs between processes): sorted
resources = [{**dataclasses.asdict(r), "dependencies": sorted(r.dependencies)} for r in rec.resources]
json.dump({"resources": resources, "outputs": rec.outputs}, sys.stdout, sort_keys=True, default=repr)
"""


def program_record(code_root: Path, copies: int) -> tuple[int, str]:
    """(exit status, JSON of the recorded resources and outputs) of the growth stack with `copies` endpoints."""
    proc = subprocess.run(
        [sys.executable, "-P", "-c", _PROGRAM_RECORD, str(code_root), str(copies),
         str(ROOT / "benchmarks" / "bench_program.py")],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(code_root)}, capture_output=True, text=True,
    )
    return proc.returncode, proc.stdout if proc.returncode == 0 else proc.stderr[-2000:]


def differences(a: dict[str, bytes], b: dict[str, bytes], context_lines: int = 20) -> list[str]:
    out = []
    for rel in sorted(set(a) | set(b)):
        if rel not in a or rel not in b:
            out.append(f"{rel}: only in {'the ref' if rel in a else 'the working tree'}")
        elif a[rel] != b[rel]:
            diff = difflib.unified_diff(a[rel].decode(errors="replace").splitlines(),
                                        b[rel].decode(errors="replace").splitlines(), "ref/" + rel, "new/" + rel,
                                        lineterm="", n=1)
            out.append("\n".join(list(diff)[:context_lines]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main", help="git revision to compare against (default: main)")
    ap.add_argument("--keep", help="render into this folder (ref/<stack>, new/<stack>) and keep it")
    ap.add_argument("--copies", default="", help="also compare the program's recording for these growth-stack "
                    "sizes (comma-separated endpoint counts, e.g. 10,50)")
    args = ap.parse_args()
    stacks = sorted((ROOT / "stacks").glob("Pulumi.*.yaml"))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        ref_code = Path(tmp) / "ref-code"
        ref_code.mkdir()
        archive = subprocess.run(["git", "archive", args.ref], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(ref_code)], input=archive, check=True)
        failed = False
        for stack in stacks:
            name = stack.name.removeprefix("Pulumi.").removesuffix(".yaml")
            ref_out, new_out = work / "ref" / name, work / "new" / name
            for d in (ref_out, new_out):
                if d.exists():
                    raise SystemExit(f"--keep {args.keep}: {d} exists; name a new folder")
            ref_status, ref_report = render(ref_code, stack, ref_out)
            new_status, new_report = render(ROOT, stack, new_out)
            diffs = differences(tree(ref_out), tree(new_out))
            if ref_status != new_status:
                diffs.insert(0, f"exit status {ref_status} at {args.ref}, {new_status} now")
            if ref_report != new_report:
                diffs.insert(0, f"printed report differs:\n--- {args.ref}\n{ref_report}--- now\n{new_report}")
            n_files = len(tree(new_out))
            if diffs:
                failed = True
                print(f"{stack.name}: {len(diffs)} difference(s) from {args.ref}:")
                for d in diffs:
                    print(d)
            else:
                print(f"{stack.name}: identical to {args.ref} ({n_files} files, exit status {new_status})")
        for n in (int(x) for x in args.copies.split(",") if x.strip()):
            # the growth stack is built by the working tree's bench_program.py for both trees (same stack)
            (ref_status, ref_json), (new_status, new_json) = program_record(ref_code, n), program_record(ROOT, n)
            if ref_status or new_status:
                failed = True
                print(f"{n} copies of assist: program failed ({args.ref}: {ref_status}, now: {new_status}):\n"
                      f"{ref_json if ref_status else new_json}")
            elif ref_json != new_json:
                failed = True
                ref_doc, new_doc = json.loads(ref_json), json.loads(new_json)
                print(f"{n} copies of assist: the program's recording differs from {args.ref}:")
                print("\n".join(differences(
                    {k: json.dumps(ref_doc[k], indent=1, sort_keys=True).encode() for k in ref_doc},
                    {k: json.dumps(new_doc[k], indent=1, sort_keys=True).encode() for k in new_doc})))
            else:
                print(f"{n} copies of assist: the program's recording is identical to {args.ref} "
                      f"({len(json.loads(new_json)['resources'])} resources and the stack outputs)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
