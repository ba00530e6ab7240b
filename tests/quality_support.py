"""Test parts for quality sampling: the recorder as its own process, S3 sinks that are up, slow or down,
and the rendered gateway on 127.0.0.1 with a sampling share chosen by the test."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from components.gateway_config import StaticServers, render_gateway_config
from components.quality_recorder import recorder_config
from tests.gateway_harness import HaproxyProcess, free_port, lua_path, pod_ca_dir, wait_for_port
from tests.moto_support import FAKE_CREDENTIALS
from tests.test_gateway import secret_env
from topology.spec import CanarySpec, ShadowSpec

ROOT = Path(__file__).resolve().parents[1]


class DelayingProxy:
    """A TCP proxy to `target` that holds each block the client sends for `delay_s` before passing it on: a real
    S3 API (moto behind it) that answers every request, slowly."""

    def __init__(self, target: str, delay_s: float):
        self.target, self.delay_s = target, delay_s
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            t = threading.Thread(target=self._serve, args=(c,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, c: socket.socket):
        import select

        host, port = self.target.removeprefix("http://").rsplit(":", 1)
        try:
            up = socket.create_connection((host, int(port)), timeout=5)
        except OSError:
            c.close()
            return
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([c, up], [], [], 0.2)
                for src in ready:
                    data = src.recv(65536)
                    if not data:
                        return
                    if src is c:
                        time.sleep(self.delay_s)  # every request waits before the sink sees it
                        up.sendall(data)
                    else:
                        c.sendall(data)
        except OSError:
            return
        finally:
            c.close()
            up.close()

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=2)
        for t in self._threads:
            t.join(timeout=2)
        self.sock.close()


class RecorderProcess:
    """`python -m recorder.app` in its own process, as in its pod, writing to `sink_url` (an S3 API)."""

    def __init__(self, spec, workdir: Path, sink_url: str, **limits):
        self.port = free_port()
        cfg = recorder_config(spec, region="us-east-1", port=self.port, pod_name="test-recorder")
        cfg.update({"batch_max_age_s": 0.2, "upload_timeout_s": 1.0, **limits})
        self.config = cfg
        path = workdir / "recorder.json"
        path.write_text(json.dumps(cfg))
        self.log_path = workdir / "recorder.log"
        self._log = open(self.log_path, "w")
        env = {**os.environ, **FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": sink_url, "PYTHONPATH": str(ROOT)}
        env.pop("AWS_PROFILE", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "recorder.app", "--config", str(path),
                                      "--host", "127.0.0.1"], env=env, cwd=ROOT, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        try:
            wait_for_port(self.port, timeout_s=20)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"recorder did not start:\n{self.log_path.read_text()}")
        self.address = f"127.0.0.1:{self.port}"

    def metrics(self) -> dict[tuple[str, tuple], float]:
        text = urllib.request.urlopen(f"http://{self.address}/metrics", timeout=5).read().decode()
        return parse_prometheus(text)

    def queue_empty(self, metrics: dict) -> bool:
        return total(metrics, "llm_quality_queue_records") == 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()


def parse_prometheus(text: str) -> dict[tuple[str, tuple], float]:
    """{(metric name, sorted label pairs): value} from the text exposition format."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        if "{" in name_labels:
            name, rest = name_labels.split("{", 1)
            pairs = tuple(sorted(tuple(p.split("=", 1)) for p in rest.rstrip("}").split(",") if p))
            pairs = tuple((k, v.strip('"')) for k, v in pairs)
        else:
            name, pairs = name_labels, ()
        out[(name, pairs)] = float(value)
    return out


def total(metrics: dict, name: str, **labels) -> float:
    return sum(v for (n, pairs), v in metrics.items()
               if n == name and all((k, str(val)) in pairs for k, val in labels.items()))


def sampled_spec(spec, fraction: float, *, canary_percent: float | None = None, shadow_percent: float | None = None,
                 overflow: int = 50):
    """The prod spec with test-sized gateway timeouts and the given sampling share on assist (the input model
    caps it at 5%; the tests sample more so a few hundred requests measure it)."""
    eps = []
    for e in spec.endpoints:
        update = {"first_byte_timeout_s": 2, "inter_chunk_timeout_s": 1, "sse_heartbeat_s": 0.5}
        ep_update = {}
        if e.name == "assist":
            r = e.rollout
            canary = (CanarySpec(percent=canary_percent, revision=r.candidate.weights_revision, hash_key="user",
                                 weights_uri_suffix="models/assist/cand/", replicas=1, version=r.candidate.version,
                                 full_at_inflight_per_replica=50)
                      if canary_percent is not None else None)
            shadow = (ShadowSpec(percent=shadow_percent, version=r.candidate.version, max_inflight=50, replicas=1)
                      if shadow_percent is not None else None)
            update |= {"overflow_inflight_per_replica": overflow, "canary": canary, "shadow": shadow}
            q = r.quality_sampling.model_copy(update={"sample_fraction": fraction})
            ep_update["rollout"] = r.model_copy(update={"quality_sampling": q})
        eps.append(e.model_copy(update={"gateway": e.gateway.model_copy(update=update), **ep_update}))
    return spec.model_copy(update={"endpoints": tuple(eps)})


class SampledGateway:
    """The rendered gateway on 127.0.0.1: assist's floor, burst and candidate are fake upstreams."""

    def __init__(self, spec, workdir: Path, ups: dict, recorder_address: str):
        self.port = free_port()
        self.stats_port = free_port()
        ports = {"assist": self.port, "autocomplete": free_port(), "guard": free_port()}
        dead = f"127.0.0.1:{free_port()}"
        rendered = render_gateway_config(
            spec,
            burst_urls={"assist": f"http://{ups['burst'].address}", "autocomplete": f"http://{dead}"},
            floor_servers={"assist": StaticServers((ups["floor1"].address, ups["floor2"].address)),
                           "autocomplete": StaticServers((dead,)), "guard": StaticServers((dead,))},
            canary_servers={"assist": StaticServers((ups["candidate"].address,))},
            binds={k: f"127.0.0.1:{p}" for k, p in ports.items()},
            shadow_binds={"assist": f"127.0.0.1:{free_port()}"},
            stats_bind=f"127.0.0.1:{self.stats_port}",
            lua_path=lua_path(workdir), ca_path=str(pod_ca_dir(workdir / "ca")),
            health_check_interval_ms=60000, max_connections=2000,
            quality_servers=StaticServers((recorder_address,)), quality_bind=f"127.0.0.1:{free_port()}",
        )
        env = secret_env()
        self.cfg = rendered.files["haproxy.cfg"]
        self.proc = HaproxyProcess(rendered, workdir, env, list(ports.values()))

    def quality_metrics(self) -> dict:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.stats_port}/metrics/quality", timeout=5).read().decode()
        return parse_prometheus(text)

    def stop(self):
        self.proc.stop()


def sink_records(s3, bucket: str, prefix: str = "") -> list[tuple[str, dict]]:
    """(object key, record) for every record line under the prefix."""
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read().decode()
            out += [(obj["Key"], json.loads(line)) for line in body.splitlines() if line]
    return out


def wait_until(pred, timeout_s: float = 10.0, step_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step_s)
    return pred()
