"""Check: every bundled stack renders byte-for-byte as it did at a git revision — for changes that only make the
program, the mock runner or the render faster. Not a test (it renders each stack twice, in fresh processes).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/render_identical.py [--ref main] [--keep DIR]

For each stacks/Pulumi.*.yaml of the working tree, `python -m topology render STACK --out DIR` runs once with the
working tree's code and once with REF's (a `git archive` of REF unpacked in a temporary folder, same interpreter,
same stack file), then the two output trees are compared file by file, with the exit status and the printed
report. Prints the first lines of each difference; exits 1 when anything differs, 0 when all are identical.
"""

from __future__ import annotations

import argparse
import difflib
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
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
