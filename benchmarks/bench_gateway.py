"""Latency the gateway adds: streams through HAProxy (the rendered prod config) vs the upstream alone.

    .venv/bin/python -m benchmarks.bench_gateway [--concurrency 200] [--rounds 3]

Same fake upstreams (tests/fake_upstream.py) both ways: direct requests are spread round-robin over
the three fakes the gateway itself uses, so both paths load the upstreams alike. Reported per
percentile: time to the first SSE event and to the end of the stream, and gateway minus direct.
Everything runs on 127.0.0.1; client, proxy and upstreams share the machine's cores, so the
figures are an upper bound on what the proxy adds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.gateway_config import StaticServers, env_name, render_gateway_config  # noqa: E402
from tests.fake_upstream import FakeUpstream  # noqa: E402
from tests.gateway_harness import HaproxyProcess, free_port, haproxy_binary, stream_once  # noqa: E402
from topology import load_inputs, plan  # noqa: E402

KEY = "bench-key"
CHUNKS, INTERVAL_MS = 20, 25


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def burst_of(n: int, targets: list[tuple[int, dict[str, str]]]):
    payload = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    return await asyncio.gather(*[
        stream_once(port, payload, {**headers, "X-Request-Id": str(uuid.uuid4()), "X-Session-Id": f"s{i % 64}",
                                    "X-Fake-Chunks": str(CHUNKS), "X-Fake-Interval-Ms": str(INTERVAL_MS)},
                    timeout_s=60)
        for i, (port, headers) in enumerate(targets[j % len(targets)] for j in range(n))])


def run_interleaved(concurrency: int, rounds: int, direct_targets, gw_targets):
    """Alternate direct and gateway rounds, so drift in the machine's load hits both alike."""
    out = {name: {"first_ms": [], "total_ms": [], "lost": 0} for name in ("direct", "gateway")}
    for _ in range(rounds):
        for name, targets in (("direct", direct_targets), ("gateway", gw_targets)):
            for status, t_first, t_total, body in asyncio.run(burst_of(concurrency, targets)):
                if status != 200 or b"[DONE]" not in body or t_first is None:
                    out[name]["lost"] += 1
                    continue
                out[name]["first_ms"].append(t_first * 1000)
                out[name]["total_ms"].append(t_total * 1000)
    return out["direct"], out["gateway"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stack", default=str(ROOT / "stacks" / "Pulumi.prod.yaml"))
    a = ap.parse_args()
    if haproxy_binary() is None:
        print("haproxy not installed (apt-get install -y haproxy)", file=sys.stderr)
        return 2
    spec = plan(load_inputs(a.stack))
    ups = [FakeUpstream(n).start() for n in ("floor1", "floor2", "burst")]
    ports = {e.name: free_port() for e in spec.endpoints if e.tier != "managed_api"}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rendered = render_gateway_config(
            spec,
            burst_urls={"assist": f"http://{ups[2].address}", "autocomplete": f"http://{ups[2].address}"},
            floor_servers={e.name: StaticServers((ups[0].address, ups[1].address)) for e in spec.endpoints},
            binds={k: f"127.0.0.1:{p}" for k, p in ports.items()},
            stats_bind=f"127.0.0.1:{free_port()}", lua_path=str(work / "gateway.lua"), max_connections=4000,
        )
        env = {var: f"bench-{key}" for var, key in rendered.secret_env.items()}
        env[env_name("assist", "acme-api-key")] = KEY
        proc = HaproxyProcess(rendered, work, env, list(ports.values()))
        try:
            direct_targets = [(int(u.address.rsplit(":", 1)[1]), {}) for u in ups]
            gw_targets = [(ports["assist"], {"Authorization": f"Bearer {KEY}"})]
            rows = []
            for c in (1, a.concurrency):
                rounds = a.rounds if c > 1 else 60  # 60 sequential streams each way for the unloaded figure
                run_interleaved(c, 1, direct_targets, gw_targets)  # warm both paths
                rows.append((c, *run_interleaved(c, rounds, direct_targets, gw_targets)))
        finally:
            proc.stop()
            for u in ups:
                u.stop()
    print(f"stream: {CHUNKS} chunks x {INTERVAL_MS} ms; gateway = rendered {spec.environment} config, endpoint assist")
    print(f"{'conc':>5} {'metric':>9} {'pct':>4} {'direct ms':>10} {'gateway ms':>11} {'added ms':>9}")
    for c, direct, via in rows:
        for metric in ("first_ms", "total_ms"):
            for q in (50, 99):
                d, g = percentile(direct[metric], q), percentile(via[metric], q)
                print(f"{c:>5} {metric:>9} p{q:<3} {d:>10.2f} {g:>11.2f} {g - d:>9.2f}")
        n = len(via["first_ms"]) + via["lost"]
        print(f"{c:>5} requests via gateway: {n}, lost: {via['lost']}; direct lost: {direct['lost']}; "
              f"mean first-chunk added {statistics.mean(via['first_ms']) - statistics.mean(direct['first_ms']):.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
