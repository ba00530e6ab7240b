"""Latency the gateway adds to the first streamed chunk: the rendered prod config vs the upstream alone.

    .venv/bin/python -m benchmarks.bench_gateway [--rounds 5] [--quick] [--compare DIR] [--without FEATURES ...]

What runs (all on 127.0.0.1, bounded in count and time):
- upstreams and load generator: `sse_bench.c`, compiled here with cc (one epoll loop each, no
  per-event allocation): headers and the first chunk at once, then a chunk every INTERVAL_MS;
- three paths, interleaved round by round so drift in the machine's load hits all alike:
  `direct` (load generator -> upstream), `minimal` (a plain HAProxy config: one frontend, one
  backend, no Lua; the floor of what any proxy costs) and `gateway` (the rendered prod config,
  endpoint assist: auth, body gate, floor pick, stream watchdog; the floor takes its threshold and the
  rest overflows to the burst upstream);
- CPU placement: HAProxy alone on core 0 at SCHED_FIFO priority 50 (`taskset`, `chrt`, when root),
  upstreams and load generator on core 1 at nice -10, so other work on the machine preempts neither;
- loads: one stream at a time; 200 streams started together; 200 in flight steady (a new stream
  starts when one ends), with short and with long (200-chunk) streams;
- `--compare DIR`: a fourth path, `before`, the gateway rendered by another checkout of this project (e.g.
  `git worktree add /tmp/before main`), run side by side and interleaved with the others; with
  `--compare-haproxy PATH` that path runs under another haproxy binary (e.g. Debian's 2.6 at /usr/sbin/haproxy);
- `--without watch` (or `gate`, `pick`, `quality`, `shadow`, `lua`; several joined by `+`; the option
  repeats): a further path, this gateway with that feature's lines deleted from the rendered config (`watch`:
  the Lua filter never registers on the response, so no first-byte / inter-chunk limits and no heartbeats;
  `gate` also ends stamping and the stream watch, which follow from it; `lua`: every Lua line), to see what
  each feature costs. Not a configuration to run: only a measurement.
Reported: per load, the median over rounds of p50 and p99 time to first chunk on each path, and the
gateway's and the minimal proxy's addition over direct; streams lost on any path (must be 0); and the
HAProxy process's CPU time per stream (its run time from /proc/<pid>/schedstat across the round, divided
by the streams it carried), for the minimal proxy and the gateway: unlike latency, other jobs' load on the machine
barely moves it, so it is the figure to compare between versions. The 1-minute load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.gateway_config import CONFIG_FILE, LUA_FILE, RenderedGateway, env_name  # noqa: E402
from tests.gateway_harness import HaproxyProcess, free_port, haproxy_binary, no_recorder, pod_ca_dir  # noqa: E402
from topology import load_inputs, plan  # noqa: E402

KEY = "bench-key"
INTERVAL_MS = 10
PROXY_CORE, HARNESS_CORE = "0", "1"

# name, mode, concurrency, requests per round, chunks per stream
LOADS = [
    ("1 stream", "steady", 1, 50, 2),
    ("200 started together", "burst", 200, 200, 20),
    ("200 steady", "steady", 200, 1000, 20),
    ("200 steady, 200-chunk streams", "steady", 200, 400, 200),
]


def cpu_prefix(core: str) -> tuple[str, ...]:
    """HAProxy: its own core at real-time priority. The harness: the other core, niced up but not
    real-time (a real-time busy loop there would starve the machine)."""
    prefix: tuple[str, ...] = ("taskset", "-c", core) if shutil.which("taskset") and os.cpu_count() > 1 else ()
    if os.geteuid() == 0 and core == PROXY_CORE and shutil.which("chrt"):
        prefix += ("chrt", "-f", "50")
    elif os.geteuid() == 0:
        prefix += ("nice", "-n", "-10")
    return prefix


def cpu_seconds(pid: int) -> float:
    """CPU time of a process so far: the scheduler's run time in ns (/proc/<pid>/schedstat, user + system),
    else utime + stime from /proc/<pid>/stat (clock ticks: 10 ms, too coarse for one stream at a time)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def minimal_config(bind_port: int, upstream: str) -> str:
    return "\n".join([
        "global", "    nbthread 1", "    maxconn 4000",
        "defaults", "    mode http", "    option http-no-delay", "    timeout connect 3s",
        "    timeout client 60s", "    timeout server 60s",
        "frontend fe", f"    bind 127.0.0.1:{bind_port}", "    default_backend be",
        "backend be", f"    server s1 {upstream}", ""])


_RENDER_IN_TREE = """
import json, sys
from components.gateway_config import StaticServers, render_gateway_config
from topology import load_inputs, plan
a = json.loads(sys.argv[1])
r = render_gateway_config(plan(load_inputs(a["stack"])), quality_servers=StaticServers((a["recorder"],)),
    burst_urls=a["burst_urls"], floor_servers={k: StaticServers(tuple(v)) for k, v in a["floor"].items()},
    canary_servers={k: StaticServers(tuple(v)) for k, v in a["canary"].items()}, shadow_binds=a["shadow_binds"],
    binds=a["binds"], stats_bind=a["stats_bind"], lua_path=a["lua_path"], max_connections=4000, ca_path=a["ca_path"])
print(json.dumps({"files": r.files, "secret_env": r.secret_env}))
"""


# what `--without` deletes or rewrites in the rendered config ((regex, replacement) on lines) or replaces in the
# Lua (exact text). The floor pick is made by the gate for accepted POSTs (its last five arguments) and by the
# llm_pick_floor fetch for the rest: `pick` turns off both.
WITHOUT_CONFIG = {
    "gate": [(r"    http-request lua\.llm_gate .*\n", "")],
    "pick": [(r"    http-request set-var\(txn\.floor_server\) lua\.llm_pick_floor.*\n", ""),
             (r"(    http-request lua\.llm_gate(?: \S+){6})(?: \S+){5} if ", r"\1 - - - - - if ")],
    "quality": [(r"    http-request (lua\.llm_quality|set-var\(txn\.q_(user|mirror)\)) .*\n", "")],
    "shadow": [(r"    http-request lua\.llm_shadow .*\n", "")],
}
WITHOUT_CONFIG["lua"] = [rule for rules in WITHOUT_CONFIG.values() for rule in rules if rule[1] == ""] + [
    (r"    filter lua\.llm .*\n", "")]
WITHOUT_LUA = {"watch": ("  if self.active or self.q then filter.register_data_filter(self, txn.res) end\n", "")}


def without(rendered: RenderedGateway, features: str) -> RenderedGateway:
    cfg, lua = rendered.files[CONFIG_FILE], rendered.files[LUA_FILE]
    for f in features.split("+"):
        if f in WITHOUT_LUA:
            old, new = WITHOUT_LUA[f]
            if old not in lua:
                raise SystemExit(f"--without {f}: gateway_lua.py changed; update WITHOUT_LUA")
            lua = lua.replace(old, new)
        elif f in WITHOUT_CONFIG:
            n = 0
            for pattern, repl in WITHOUT_CONFIG[f]:
                cfg, k = re.subn(pattern, repl, cfg)
                n += k
            if n == 0:
                raise SystemExit(f"--without {f}: no such line in the rendered config; update WITHOUT_CONFIG")
        else:
            raise SystemExit(f"--without {f!r}: known are {sorted([*WITHOUT_CONFIG, *WITHOUT_LUA])}")
    return RenderedGateway(files={**rendered.files, CONFIG_FILE: cfg, LUA_FILE: lua}, secret_env=rendered.secret_env)


def render_gateway(tree: Path | None, stack: str, servers: dict[str, str], workdir: Path):
    """The prod gateway for the bench upstreams, rendered by this checkout (tree None) or another one;
    returns (RenderedGateway, ports by endpoint)."""
    spec = plan(load_inputs(stack))
    ports = {e.name: free_port() for e in spec.endpoints if e.tier != "managed_api"}
    args = {"stack": stack, "recorder": no_recorder().addresses[0],
            "burst_urls": {e: f"http://{servers['burst']}" for e in ("assist", "autocomplete")},
            "floor": {e.name: [servers["floor1"], servers["floor2"]] for e in spec.endpoints},
            # prod's assist is in shadow: 5% of its requests are also mirrored to a candidate upstream
            "canary": {e.name: [servers["candidate"]] for e in spec.endpoints},
            "shadow_binds": {k: f"127.0.0.1:{free_port()}" for k in ports},
            "binds": {k: f"127.0.0.1:{p}" for k, p in ports.items()}, "stats_bind": f"127.0.0.1:{free_port()}",
            "lua_path": str(workdir / "gateway.lua"), "ca_path": str(pod_ca_dir(workdir / "ca"))}
    root = tree or ROOT
    out = subprocess.run([sys.executable, "-c", _RENDER_IN_TREE, json.dumps(args)], cwd=root, capture_output=True,
                         text=True, timeout=300, check=True, env={**os.environ, "PYTHONPATH": str(root)}).stdout
    r = json.loads(out)
    return RenderedGateway(files=r["files"], secret_env=r["secret_env"]), ports


def run_load(tool: str, port: int, mode: str, conc: int, requests: int, headers: list[str]) -> tuple[list[float], int]:
    out = subprocess.run([*cpu_prefix(HARNESS_CORE), tool, "load", str(port), mode, str(conc), str(requests), "60",
                          *headers], capture_output=True, text=True, timeout=90, check=True).stdout
    ttft_ms, lost = [], 0
    for line in out.splitlines():
        ok, first_us, _ = line.split()
        if ok == "1":
            ttft_ms.append(int(first_us) / 1000)
        else:
            lost += 1
    return ttft_ms, lost


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 rounds, first two loads only (a smoke run)")
    ap.add_argument("--stack", default=str(ROOT / "stacks" / "Pulumi.prod.yaml"))
    ap.add_argument("--compare", metavar="DIR", help="another checkout of this project: its gateway runs as `before`")
    ap.add_argument("--compare-haproxy", metavar="PATH", help="the haproxy binary the `before` path runs under")
    ap.add_argument("--without", action="append", default=[], metavar="FEATURES",
                    help="a further gateway path without these features (watch, gate, pick, quality, shadow, lua; join with +)")
    a = ap.parse_args()
    binary = haproxy_binary()
    if binary is None or shutil.which("cc") is None:
        print("needs HAProxy 3.0 (python3 dev.py test builds it into .cache/) and a C compiler", file=sys.stderr)
        return 2
    rounds, loads = (2, LOADS[:2]) if a.quick else (a.rounds, LOADS)
    load_start = os.getloadavg()[0]
    results: dict[str, dict[str, list]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tool = str(work / "sse_bench")
        subprocess.run(["cc", "-O2", "-o", tool, str(ROOT / "benchmarks" / "sse_bench.c")], check=True, timeout=120)
        for name, mode, conc, requests, chunks in loads:
            servers, procs = {}, []
            try:
                for up in ("floor1", "floor2", "burst", "candidate", "direct", "minimal"):
                    port = free_port()
                    procs.append(subprocess.Popen([*cpu_prefix(HARNESS_CORE), tool, "serve", str(port), str(chunks),
                                                   str(INTERVAL_MS)]))
                    servers[up] = f"127.0.0.1:{port}"
                gws: dict[str, tuple[HaproxyProcess, int]] = {}
                for path, tree in (("gateway", None), *((("before", Path(a.compare)),) if a.compare else ()),
                                   *((f"without {w}", None) for w in a.without)):
                    gw_dir = work / f"{path.replace(' ', '-')}-{len(results)}"
                    gw_dir.mkdir()
                    rendered, ports = render_gateway(tree, a.stack, servers, gw_dir)
                    if path.startswith("without "):
                        rendered = without(rendered, path.split(" ", 1)[1])
                    env = {var: f"bench-{key}" for var, key in rendered.secret_env.items()}
                    env[env_name("assist", "acme-api-key")] = KEY
                    gws[path] = (HaproxyProcess(rendered, gw_dir, env, list(ports.values()), prefix=cpu_prefix(PROXY_CORE),
                                                binary=a.compare_haproxy if path == "before" else None),
                                 ports["assist"])
                min_dir = work / f"min-{len(results)}"
                min_dir.mkdir()
                min_port = free_port()
                (min_dir / "haproxy.cfg").write_text(minimal_config(min_port, servers["minimal"]))
                minimal = subprocess.Popen([*cpu_prefix(PROXY_CORE), binary, "-db", "-f", str(min_dir / "haproxy.cfg")])
                time.sleep(0.5)
                targets = {
                    "direct": (int(servers["direct"].rsplit(":", 1)[1]), []),
                    "minimal": (min_port, []),
                    **{path: (port, [f"Authorization: Bearer {KEY}"]) for path, (_, port) in gws.items()},
                }
                # taskset/chrt exec haproxy: the same pid
                pids = {"minimal": minimal.pid, **{path: gw.proc.pid for path, (gw, _) in gws.items()}}
                row = {path: {"p50": [], "p99": [], "lost": 0, "cpu_us": []} for path in targets}
                try:
                    for path, (port, hdrs) in targets.items():  # warm-up, not counted
                        run_load(tool, port, mode, conc, min(requests, 200), hdrs)
                    for _ in range(rounds):
                        for path, (port, hdrs) in targets.items():
                            cpu0 = cpu_seconds(pids[path]) if path in pids else 0.0
                            ttft, lost = run_load(tool, port, mode, conc, requests, hdrs)
                            if path in pids:
                                time.sleep(0.05)  # the last closes
                                row[path]["cpu_us"].append((cpu_seconds(pids[path]) - cpu0) * 1e6 / requests)
                            row[path]["p50"].append(percentile(ttft, 50))
                            row[path]["p99"].append(percentile(ttft, 99))
                            row[path]["lost"] += lost
                finally:
                    for gw, _ in gws.values():
                        gw.stop()
                    minimal.terminate()
                    minimal.wait(timeout=10)
                results[name] = row
            finally:
                for p in procs:
                    p.terminate()
                    p.wait(timeout=10)
    placement = " ".join(cpu_prefix(PROXY_CORE)) or "none (one core, not root)"
    load_end = os.getloadavg()[0]
    print(f"time to first chunk, ms: median over {rounds} interleaved rounds of each round's p50 / p99; "
          f"chunks every {INTERVAL_MS} ms; haproxy under `{placement}`; 1-min load average {load_start:.1f} at the "
          f"start, {load_end:.1f} at the end")
    paths = ["minimal", "gateway", *(["before"] if a.compare else []), *(f"without {w}" for w in a.without)]
    print(f"{'load':<30} {'direct':>15} " + " ".join(f"{p:>15} {'added ' + p:>17}" for p in paths)
          + "  lost  CPU us/stream " + " / ".join(paths))
    for name, row in results.items():
        med = {p: (statistics.median(v["p50"]), statistics.median(v["p99"])) for p, v in row.items()}
        d = med["direct"]
        cells = [f"{d[0]:.2f} / {d[1]:.2f}"] + [
            f"{med[p][0]:.2f} / {med[p][1]:.2f} {med[p][0] - d[0]:+.2f} / {med[p][1] - d[1]:+.2f}" for p in paths]
        lost = "/".join(str(row[p]["lost"]) for p in ("direct", *paths))
        cpu = " / ".join(f"{statistics.median(row[p]['cpu_us']):.0f}" for p in paths)
        print(f"{name:<30} " + "   ".join(cells) + f"  {lost}  {cpu}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
