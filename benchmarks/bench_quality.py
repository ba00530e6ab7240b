"""What quality sampling costs the user: the rendered prod gateway with assist sampling 0%, 1% and 100% of its streams.

    .venv/bin/python -m benchmarks.bench_quality [--rounds 5]

Same parts as bench_gateway.py (the compiled `sse_bench.c` upstreams and load generator; HAProxy on core 0,
the harness on core 1 when the machine allows), plus the recorder (`python -m recorder.app`) writing to a moto
S3 server, all on 127.0.0.1. Four gateways, interleaved round by round: `off` (share 0), `prod share 1%`
(prod's sample_fraction), `all` (share 1: every stream captured and posted to the recorder, which uploads to
moto; beyond 64 captures or 16 posts in flight the rest are dropped, counted) and `all, recorder down` (share 1,
nothing listens where the recorder should be). Reported per load: the median over rounds of p50 / p99 time to first chunk
and to the end of the stream, streams lost, and what the gateway counted (posted / dropped by reason).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_gateway import HARNESS_CORE, INTERVAL_MS, KEY, PROXY_CORE, cpu_prefix, percentile  # noqa: E402
from components.gateway_config import StaticServers, env_name, render_gateway_config  # noqa: E402
from tests.gateway_harness import HaproxyProcess, free_port, haproxy_binary, pod_ca_dir, wait_for_port  # noqa: E402
from tests.quality_support import RecorderProcess, parse_prometheus, sampled_spec, total  # noqa: E402
from topology import load_inputs, plan  # noqa: E402

LOADS = [("1 stream", "steady", 1, 50, 20), ("200 steady", "steady", 200, 1000, 20)]


def run_load(tool: str, port: int, mode: str, conc: int, requests: int) -> tuple[list[float], list[float], int]:
    out = subprocess.run([*cpu_prefix(HARNESS_CORE), tool, "load", str(port), mode, str(conc), str(requests), "60",
                          f"Authorization: Bearer {KEY}"], capture_output=True, text=True, timeout=120, check=True).stdout
    first, end, lost = [], [], 0
    for line in out.splitlines():
        ok, first_us, end_us = line.split()
        if ok == "1":
            first.append(int(first_us) / 1000)
            end.append(int(end_us) / 1000)
        else:
            lost += 1
    return first, end, lost


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, 20)
    url = f"http://127.0.0.1:{port}"
    import boto3

    boto3.client("s3", region_name="us-east-1", endpoint_url=url, aws_access_key_id="t",
                 aws_secret_access_key="t").create_bucket(Bucket="acme-llm-evals")
    return proc, url


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if haproxy_binary() is None or shutil.which("cc") is None:
        print("needs HAProxy 3.0 (python3 dev.py test builds it into .cache/) and a C compiler", file=sys.stderr)
        return 2
    base = plan(load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml"))
    moto, moto_url = start_moto()
    results = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            tool = str(work / "sse_bench")
            subprocess.run(["cc", "-O2", "-o", tool, str(ROOT / "benchmarks" / "sse_bench.c")], check=True, timeout=120)
            for name, mode, conc, requests, chunks in LOADS:
                procs, servers = [], {}
                for up in ("floor1", "floor2", "burst"):
                    port = free_port()
                    procs.append(subprocess.Popen([*cpu_prefix(HARNESS_CORE), tool, "serve", str(port), str(chunks),
                                                   str(INTERVAL_MS)]))
                    servers[up] = f"127.0.0.1:{port}"
                recorder = RecorderProcess(sampled_spec(base, 1.0), work, moto_url)
                gws, stats = {}, {}
                try:
                    for label, fraction, rec_addr in (("off", 0.0, recorder.address),
                                                      ("prod share 1%", 0.01, recorder.address),
                                                      ("all", 1.0, recorder.address),
                                                      ("all, recorder down", 1.0, f"127.0.0.1:{free_port()}")):
                        spec = sampled_spec(base, fraction)
                        # bench timings, not the tests' short gap limits
                        eps = tuple(e.model_copy(update={"gateway": e.gateway.model_copy(update={
                            "first_byte_timeout_s": 30, "inter_chunk_timeout_s": 10, "sse_heartbeat_s": 15,
                            "overflow_inflight_per_replica": 98})}) for e in spec.endpoints)
                        spec = spec.model_copy(update={"endpoints": eps})
                        d = work / f"gw-{len(results)}-{len(gws)}"
                        d.mkdir()
                        ports = {"assist": free_port(), "autocomplete": free_port(), "guard": free_port()}
                        stats[label] = free_port()
                        rendered = render_gateway_config(
                            spec, quality_servers=StaticServers((rec_addr,)), quality_bind=f"127.0.0.1:{free_port()}",
                            burst_urls={e: f"http://{servers['burst']}" for e in ("assist", "autocomplete")},
                            floor_servers={e: StaticServers((servers["floor1"], servers["floor2"])) for e in ports},
                            canary_servers={}, binds={k: f"127.0.0.1:{p}" for k, p in ports.items()},
                            stats_bind=f"127.0.0.1:{stats[label]}", lua_path=str(d / "gateway.lua"),
                            max_connections=4000, ca_path=str(pod_ca_dir(d / "ca")))
                        env = {var: f"bench-{key}" for var, key in rendered.secret_env.items()}
                        env[env_name("assist", "acme-api-key")] = KEY
                        gws[label] = (HaproxyProcess(rendered, d, env, list(ports.values()), prefix=cpu_prefix(PROXY_CORE)),
                                      ports["assist"])
                    row = {label: {"first": [], "end": [], "lost": 0} for label in gws}
                    for label, (_, port) in gws.items():  # warm-up
                        run_load(tool, port, mode, conc, min(requests, 100))
                    for _ in range(a.rounds):
                        for label, (_, port) in gws.items():
                            first, end, lost = run_load(tool, port, mode, conc, requests)
                            row[label]["first"].append((percentile(first, 50), percentile(first, 99)))
                            row[label]["end"].append((percentile(end, 50), percentile(end, 99)))
                            row[label]["lost"] += lost
                    time.sleep(1)
                    for label in gws:
                        m = parse_prometheus(urllib.request.urlopen(
                            f"http://127.0.0.1:{stats[label]}/metrics/quality", timeout=5).read().decode())
                        dropped = {r: total(m, "llm_gateway_quality_dropped_total", reason=r)
                                   for r in ("captures_full", "posts_full", "post_failed")}
                        row[label]["counted"] = (total(m, "llm_gateway_quality_sampled_total"), dropped)
                    results[name] = row
                finally:
                    for gw, _ in gws.values():
                        gw.stop()
                    recorder.stop()
                    for p in procs:
                        p.terminate()
                        p.wait(timeout=10)
    finally:
        moto.terminate()
        moto.wait(timeout=10)
    placement = " ".join(cpu_prefix(PROXY_CORE)) or "none"
    print(f"ms, median over {a.rounds} interleaved rounds of each round's p50 / p99; 20 chunks every {INTERVAL_MS} ms; "
          f"haproxy under `{placement}`")
    for name, row in results.items():
        print(f"{name}:")
        for label, r in row.items():
            f50, f99 = (statistics.median(x[i] for x in r["first"]) for i in (0, 1))
            e50, e99 = (statistics.median(x[i] for x in r["end"]) for i in (0, 1))
            posted, dropped = r["counted"]
            print(f"  {label:<20} first chunk {f50:7.2f} / {f99:7.2f}   end {e50:7.2f} / {e99:7.2f}   lost {r['lost']}"
                  f"   posted {posted:.0f}, dropped {', '.join(f'{k} {v:.0f}' for k, v in dropped.items())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
