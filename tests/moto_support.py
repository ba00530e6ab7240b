"""A real AWS API for tests: moto in server mode (`moto_server`) on 127.0.0.1 (a free port), once per session.

boto3 clients talk HTTP to it exactly as to AWS (paginators, ranged GETs, multipart uploads, EKS calls);
subprocesses reach it through AWS_ENDPOINT_URL, boto3's own variable.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import pytest

FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}


# `moto_server` with one constant computed once: on every request moto 5.x's server asks whether the host names a
# service by listing moto's own package folder (moto/backends.py list_of_moto_modules, called from
# moto_server/werkzeug_app.py get_backend_for_host: ~175 stat calls, about a fifth of an S3 request's server time),
# and that folder does not change while the server runs. Its per-request log is not kept (it went to /dev/null).
_SERVER = """
import logging, sys
import moto.backends as backends
modules = tuple(backends.list_of_moto_modules())
backends.list_of_moto_modules = lambda: modules
logging.getLogger("werkzeug").setLevel(logging.WARNING)  # the request lines are INFO
from moto.server import main
main(sys.argv[1:])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    """`moto_server` (as above) in its own process (its request handling then does not share this process's GIL with
    the boto3 clients under test), on 127.0.0.1 at a free port; stopped at the end of the session."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):  # ≤ 20 s to start
            if proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {proc.returncode}")
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"moto_server did not answer on {url}")
        yield url
    finally:
        # moto's SIGTERM handler exits the main thread, and the interpreter then waits for request threads still
        # holding a client's keep-alive connection (seconds at the session's end); nothing it holds is kept
        proc.terminate()
        try:
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def aws_env(moto_endpoint, monkeypatch):
    """Fake credentials and the moto endpoint in this process's environment (boto3 reads them)."""
    for k, v in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": moto_endpoint}


def client(service: str, endpoint: str, region: str = "us-east-1"):
    import boto3

    return boto3.client(service, region_name=region, endpoint_url=endpoint,
                        aws_access_key_id="testing", aws_secret_access_key="testing")
