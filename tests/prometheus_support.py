"""Real Prometheus parts for the tests: promtool, a Prometheus server on 127.0.0.1, and the rule groups the
program renders (recorded under Pulumi's mocks).

Debian's `prometheus` package (2.42, bookworm) ships both binaries; `python3 dev.py test` installs it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from tests.gateway_harness import free_port, wait_for_port

SCRAPE_INTERVAL_S = 1


def require_binary(name: str) -> str:
    """Fail under CI (the package must be installed there), skip elsewhere, with the reason."""
    import pytest

    path = shutil.which(name)
    if path is None:
        msg = f"{name} not installed (apt-get install -y prometheus); these tests run Prometheus's own tools"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@functools.lru_cache(maxsize=None)
def recorded(stack_file: Path):
    """The program's recorded mock run for a stack file, once per test session (several files read it)."""
    from offline.mockrun import run_stack_file

    return run_stack_file(stack_file)


def rendered_rule_groups(stack_file: Path) -> dict[str, dict]:
    """{endpoint: rule group} of every PrometheusRule the program declares for this stack file."""
    rec = recorded(Path(stack_file).resolve())
    out = {}
    for obj in rec.kubernetes_objects():
        if obj["kind"] == "PrometheusRule" and "serving.llm/endpoint" in obj["metadata"]["labels"]:
            (group,) = obj["spec"]["groups"]  # the endpoints' serving alerts (the quality recorder's: its own test)
            out[obj["metadata"]["labels"]["serving.llm/endpoint"]] = group
    return out


def operator_relabel_configs(relabelings: list[dict]) -> list[dict]:
    """A monitor's `relabelings`/`metricRelabelings` as the Prometheus config the operator writes for them:
    prometheus-operator v0.93.0 pkg/prometheus/promcfg.go generateRelabelConfig() — camelCase to snake_case,
    only the fields that are set, in its order, the action lower-cased."""
    fields = (("sourceLabels", "source_labels"), ("separator", "separator"), ("targetLabel", "target_label"),
              ("regex", "regex"), ("modulus", "modulus"), ("replacement", "replacement"), ("action", "action"))
    known = {camel for camel, _ in fields}
    out = []
    for rc in relabelings:
        unknown = set(rc) - known
        if unknown:
            raise ValueError(f"relabel config fields the operator does not translate: {sorted(unknown)}")
        # separator and replacement are pointers there (written when set, even empty); the rest when non-zero
        out.append({snake: rc[camel].lower() if camel == "action" else rc[camel] for camel, snake in fields
                    if (rc.get(camel) is not None if camel in ("separator", "replacement") else rc.get(camel))})
    return out


def operator_pod_target_labels(monitor_spec: dict, pod_labels: dict[str, str]) -> dict[str, str]:
    """The target labels a PodMonitor's `podTargetLabels` put on a pod's series, as prometheus-operator writes them
    (read at v0.93.0; the chart pins v0.93.1, and the file is the same up to 2026's head;
    pkg/prometheus/promcfg.go generatePodMonitorConfig): per entry l, source
    `__meta_kubernetes_pod_label_<sanitizeLabelName(l)>`, regex `(.+)` (an absent or empty pod label adds
    nothing), target `sanitizeLabelName(l)` — every character outside [a-zA-Z0-9_] replaced by '_' (written here
    from the operator's rule, not from the project's function, so the two are checked against each other)."""
    out = {}
    for label in monitor_spec.get("podTargetLabels", []):
        value = pod_labels.get(label, "")
        if value:
            out[re.sub(r"[^a-zA-Z0-9_]", "_", label)] = value
    return out


def write_rule_file(path: Path, groups: list[dict]) -> Path:
    """A Prometheus rule file: the PrometheusRule's `spec` is exactly this document (the operator copies it)."""
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False, width=10_000))
    return path


class PrometheusServer:
    """`prometheus` on 127.0.0.1 (free port), temp storage, fixed scrape interval; `stop()` always reaps it.

    `scrape_targets`: [(job, "127.0.0.1:port", {label: value})] — the extra labels stand in for what the
    PodMonitor's relabelling adds in the cluster (namespace, pod, the track label). `job_settings`: {job: extra
    scrape-config fields} (e.g. `metrics_path`, `metric_relabel_configs`) for every target of that job."""

    def __init__(self, workdir: Path, scrape_targets: list[tuple[str, str, dict[str, str]]] = (),
                 storage: Path | None = None, retention: str = "15d", job_settings: dict[str, dict] | None = None):
        binary = require_binary("prometheus")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"},
            "scrape_configs": [
                {"job_name": f"{job}-{i}", "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                 "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
                 "static_configs": [{"targets": [address], "labels": labels}], **(job_settings or {}).get(job, {})}
                for i, (job, address, labels) in enumerate(scrape_targets)
            ],
        }
        cfg = workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self._log = open(self.log_path, "w")
        data = storage or workdir / "data"
        self.proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={data}",
             f"--storage.tsdb.retention.time={retention}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--web.enable-lifecycle"],
            stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_for_port(self.port, timeout_s=20)
            self._wait_ready(timeout_s=20)
        except (TimeoutError, RuntimeError):
            self.stop()
            raise RuntimeError(f"prometheus did not start:\n{self.log_path.read_text()}")

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError("prometheus not ready")

    def query(self, promql: str, at_s: float | None = None) -> list[dict]:
        params = {"query": promql}
        if at_s is not None:
            params["time"] = f"{at_s:.3f}"
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def scalar(self, promql: str) -> float | None:
        """The single sample of an instant query (None when the result is empty)."""
        result = self.query(promql)
        if not result:
            return None
        (sample,) = result
        return float(sample["value"][1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()
