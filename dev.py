#!/usr/bin/env python3
"""Project runner: sets up what it needs, then runs the job.

    python3 dev.py demo    # plan report, simulated week and offline render of the bundled prod stack (offline)
    python3 dev.py test    # the whole test suite (installs Debian's haproxy and prometheus for the tests when it can)

Both create ./.venv (Python 3.11+) and install the project with its test dependencies on first use, and
again whenever pyproject.toml changes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".installed-pyproject-sha256"
STACK = "stacks/Pulumi.prod.yaml"


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, **kw)


def ensure_venv() -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"Python 3.11+ is needed; this is {sys.version.split()[0]}")
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if PY.exists() and STAMP.exists() and STAMP.read_text() == want:
        return
    if not PY.exists():
        run([sys.executable, "-m", "venv", str(VENV)])
    run([str(PY), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    run([str(PY), "-m", "pip", "install", "--quiet", "-e", ".[dev]"])
    STAMP.write_text(want)


def ensure_debian_package(present: bool, packages: tuple[str, ...], services: tuple[str, ...], why: str) -> None:
    """Install Debian's `packages` unless `present` and we are root; stop the services they start
    (the tests start their own processes on 127.0.0.1)."""
    if present:
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        run(["apt-get", "update", "-qq"], env=env)
        run(["apt-get", "install", "-y", "-qq", *packages], env=env)
        for service in services:
            subprocess.run(["service", service, "stop"], cwd=ROOT, check=False, capture_output=True)
    else:
        print(f"{' and '.join(packages)} not installed and this is not root: {why} will be skipped "
              f"(install Debian's {' '.join(packages)} to run them)", flush=True)


def ensure_haproxy() -> None:
    """The gateway tests run a real HAProxy on 127.0.0.1 (the package's service listens on :80);
    ca-certificates: the tests verify TLS against the same CAs the gateway image carries."""
    present = bool(shutil.which("haproxy")) and Path("/usr/share/ca-certificates/mozilla").is_dir()
    ensure_debian_package(present, ("haproxy", "ca-certificates"), ("haproxy",), "gateway tests")


def ensure_prometheus() -> None:
    """The alert, trigger-query and calibrate tests run promtool and a real Prometheus on 127.0.0.1 (the package
    also starts a Prometheus on :9090 and a node exporter)."""
    ensure_debian_package(bool(shutil.which("promtool")), ("prometheus",), ("prometheus", "prometheus-node-exporter"),
                          "Prometheus tests")


def demo() -> int:
    out = ROOT / "out"
    out.mkdir(exist_ok=True)
    run([str(PY), "-m", "topology", "plan", STACK])
    run([str(PY), "-m", "topology", "render", STACK, "--out", str(out / "render")])
    # a full simulated week of the prod stack (~49 M requests, about a minute and a half on 2 cores);
    # exit status 1 means an endpoint missed its SLO — reported, not a crash of the demo
    cmd = [str(PY), "-m", "topology", "simulate", STACK, "--plot", str(out / "week.png")]
    print("+", " ".join(cmd), flush=True)
    status = subprocess.run(cmd, cwd=ROOT).returncode
    if status not in (0, 1):
        return status
    print(f"\nwrote {out / 'render'}/ (Kubernetes YAML, inventory.md) and {out / 'week.png'}", flush=True)
    return 0


def test(extra: list[str]) -> int:
    ensure_haproxy()
    ensure_prometheus()
    return subprocess.run([str(PY), "-m", "pytest", "-q", *extra], cwd=ROOT).returncode


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test"):
        print(__doc__)
        return 2
    ensure_venv()
    if argv[0] == "demo":
        return demo()
    return test(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
