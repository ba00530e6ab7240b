#!/usr/bin/env python3
"""Project runner: sets up what it needs, then runs the job.

    python3 dev.py demo    # plan report, simulated week and offline render of the bundled prod stack (offline)
    python3 dev.py test    # the whole test suite (builds HAProxy 3.0 from Debian's source, installs prometheus, when it can)

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
# a fresh CI machine's mirror may drop a connection: apt retries each download (pip retries by itself)
APT_RETRIES = ("-o", "Acquire::Retries=3")


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **{"cwd": ROOT, **kw})


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


def debian_installed(packages: tuple[str, ...]) -> bool:
    if not shutil.which("dpkg-query"):
        return False
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Status}\\n", *packages], capture_output=True, text=True)
    return out.returncode == 0 and all(ln.endswith(" installed") for ln in out.stdout.splitlines())


def ensure_debian_package(present: bool, packages: tuple[str, ...], services: tuple[str, ...], why: str) -> None:
    """Install Debian's `packages` unless `present` and we are root; stop the services they start
    (the tests start their own processes on 127.0.0.1)."""
    if present:
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        run(["apt-get", *APT_RETRIES, "update", "-qq"], env=env)
        run(["apt-get", *APT_RETRIES, "install", "-y", "-qq", *packages], env=env)
        for service in services:
            subprocess.run(["service", service, "stop"], cwd=ROOT, check=False, capture_output=True)
    else:
        print(f"{' and '.join(packages)} not installed and this is not root: {why} will be skipped "
              f"(install Debian's {' '.join(packages)} to run them)", flush=True)


# The gateway runs HAProxy 3.0 (components/gateway_config.py HAPROXY_IMAGE). Debian bookworm carries only 2.6,
# so the tests build 3.0 from Debian trixie's source package (the upstream tarball Debian ships, checked against
# the hash below, which is also the one trixie's signed Sources index lists), with the image's build options
# (docker-library/haproxy 3.0/Dockerfile). About 70 s on 2 cores, once: the binary stays in .cache/.
HAPROXY_SOURCE = "haproxy"  # trixie main: 3.0.11-1+deb13u4
HAPROXY_VERSION = "3.0.11"
HAPROXY_TARBALL = f"haproxy_{HAPROXY_VERSION}.orig.tar.gz"
HAPROXY_TARBALL_SHA256 = "a133e2d550c5fd9a849b5c7ab17bb945bcdad209ca140d41f45ebf31943ae783"
HAPROXY_BINARY = ROOT / ".cache" / f"haproxy-{HAPROXY_VERSION}" / "haproxy"  # where the tests look
HAPROXY_BUILD_DEPS = ("make", "gcc", "libc6-dev", "liblua5.4-dev", "libpcre2-dev", "libssl-dev", "ca-certificates")
HAPROXY_MAKE_OPTS = ("TARGET=linux-glibc", "USE_GETADDRINFO=1", "USE_LUA=1", "LUA_INC=/usr/include/lua5.4",
                     "LUA_LIB_NAME=lua5.4", "USE_OPENSSL=1", "USE_PCRE2=1", "USE_PCRE2_JIT=1", "USE_PROMEX=1",
                     "USE_PTHREAD_EMULATION=1")


def ensure_haproxy() -> None:
    """The gateway tests run a real HAProxy 3.0 on 127.0.0.1 (tests/gateway_harness.py finds it in .cache/);
    ca-certificates: the tests verify TLS against the same CAs the gateway image carries."""
    if HAPROXY_BINARY.exists():
        return
    ensure_debian_package(debian_installed(HAPROXY_BUILD_DEPS), HAPROXY_BUILD_DEPS, (), "gateway tests")
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        print("not root: the gateway tests will run only if HAProxy 3.0 is on PATH", flush=True)
        return
    work = ROOT / ".cache" / "haproxy-src"
    lists = work / "lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    sources = work / "sources.list"
    sources.write_text("deb-src http://deb.debian.org/debian trixie main\n")
    apt = [*APT_RETRIES, "-o", f"Dir::Etc::SourceList={sources}", "-o", "Dir::Etc::SourceParts=/dev/null",
           "-o", f"Dir::State::Lists={lists}"]
    tarball = work / HAPROXY_TARBALL
    if not tarball.exists():
        run(["apt-get", *apt, "update", "-qq"])
        # only the upstream tarball is built; the mirror this was written against serves it but answers 404 for
        # the .dsc and Debian's patch tarball, so apt's exit status is not the test: the pinned hash below is
        print("+ apt-get source --download-only", HAPROXY_SOURCE, flush=True)
        got = subprocess.run(["apt-get", *apt, "source", "--download-only", "-qq", HAPROXY_SOURCE], cwd=work,
                             capture_output=True, text=True)
        if not tarball.exists():
            sys.exit(f"apt-get source {HAPROXY_SOURCE} (Debian trixie) did not fetch {HAPROXY_TARBALL}; the gateway "
                     f"tests need HAProxy 3.0. apt said:\n{got.stderr.strip()}")
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if digest != HAPROXY_TARBALL_SHA256:
        sys.exit(f"{tarball}: sha256 {digest}, expected {HAPROXY_TARBALL_SHA256}; remove it and retry")
    src = work / f"haproxy-{HAPROXY_VERSION}"
    shutil.rmtree(src, ignore_errors=True)  # what an interrupted run left
    run(["tar", "xzf", str(tarball), "-C", str(work)])
    run(["make", "-s", f"-j{os.cpu_count() or 2}", *HAPROXY_MAKE_OPTS], cwd=src, stdout=subprocess.DEVNULL)
    HAPROXY_BINARY.parent.mkdir(parents=True, exist_ok=True)
    partial = HAPROXY_BINARY.with_suffix(".partial")
    shutil.copy2(src / "haproxy", partial)
    os.replace(partial, HAPROXY_BINARY)  # a copy cut short never passes for a build
    shutil.rmtree(src)


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
