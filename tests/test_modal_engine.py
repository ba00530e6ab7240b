"""The burst server's engine lifecycle, run against a fake vLLM that takes the real command line.

The fake parses the exact arguments the burst app would pass to `vllm serve` (port, served model name,
sleep mode), serves /health, /v1/completions, /sleep and /wake_up like vLLM's OpenAI server, and logs
every request, so the tests see the order the snapshot hooks drive it in.
"""

from __future__ import annotations

import importlib
import socket
import sys
import textwrap

import pytest

from modal_apps import settings as S

FAKE_VLLM = textwrap.dedent('''
    import http.server, json, os, sys
    args = sys.argv[1:]
    assert args[0] == "serve", args
    def flag(name):
        return args[args.index(name) + 1]
    port, served, log = int(flag("--port")), flag("--served-model-name"), os.environ["FAKE_VLLM_LOG"]
    sleep_mode = "--enable-sleep-mode" in args
    if os.environ.get("FAKE_VLLM_EXIT"):
        sys.exit(int(os.environ["FAKE_VLLM_EXIT"]))
    state = {"asleep": False}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def reply(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def record(self, body=None):
            with open(log, "a") as f:
                f.write(json.dumps([self.command, self.path, body]) + "\\n")
        def do_GET(self):
            self.record()
            if self.path == "/health" and not os.environ.get("FAKE_VLLM_NEVER_HEALTHY"):
                return self.reply(200, {})
            self.reply(503, {})
        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            self.record(body)
            if self.path.startswith("/sleep") or self.path == "/wake_up":
                if not sleep_mode:
                    return self.reply(404, {"error": "sleep mode is off"})
                state["asleep"] = self.path.startswith("/sleep")
                return self.reply(200, {})
            if self.path == "/v1/completions":
                if state["asleep"]:
                    return self.reply(503, {"error": "engine is sleeping"})
                if body.get("model") != served:
                    return self.reply(404, {"error": "model not found"})
                tokens = 0 if os.environ.get("FAKE_VLLM_NO_TOKENS") else body["max_tokens"]
                return self.reply(200, {"choices": [{"text": " ok" * tokens}] if tokens else [],
                                        "usage": {"completion_tokens": tokens}})
            self.reply(404, {})

    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
''')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def burst(planned_stacks, monkeypatch):
    endpoint = planned_stacks["prod"][1].endpoint("assist")
    for var in (S.ENV_SPEC_FILE, S.ENV_STACK, S.ENV_ENDPOINT):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(S.ENV_SPEC, S.BurstAppConfig.from_endpoint(endpoint).to_json())
    sys.modules.pop("modal_apps.burst", None)
    return importlib.import_module("modal_apps.burst")


@pytest.fixture
def engine(burst, tmp_path, monkeypatch):
    """The app's Engine on the app's own command line, with `vllm` swapped for the fake and a free port."""
    fake = tmp_path / "fake_vllm.py"
    fake.write_text(FAKE_VLLM)
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    port = free_port()
    command = list(burst.settings.server_command)
    assert command[0] == "vllm"
    command[command.index("--port") + 1] = str(port)
    e = burst.Engine((sys.executable, str(fake), *command[1:]), port,
                     burst.config.engine.served_model_name, startup_timeout_s=20)
    e.log = log
    yield e
    e.stop()


def requests_seen(engine) -> list[tuple[str, str]]:
    import json

    lines = engine.log.read_text().splitlines() if engine.log.exists() else []
    return [(m, p) for m, p, _ in map(json.loads, lines)]


def test_snapshot_lifecycle_warms_sleeps_and_wakes_in_order(engine):
    # snap=True hook: start, healthy, a real generation, then sleep for the snapshot.
    engine.start()
    engine.sleep()
    seen = requests_seen(engine)
    assert seen[-2:] == [("POST", "/v1/completions"), ("POST", "/sleep?level=1")]
    assert ("GET", "/health") in seen
    # While asleep the engine would not serve: the restore hook must wake it and generate again.
    with pytest.raises(Exception, match="503"):
        engine.warm_up()
    engine.wake()
    assert requests_seen(engine)[-4:] == [("POST", "/v1/completions"), ("POST", "/wake_up"),
                                          ("GET", "/health"), ("POST", "/v1/completions")]


def test_engine_that_exits_is_reported(engine, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_EXIT", "3")
    with pytest.raises(RuntimeError, match=r"vLLM is not running \(exit code 3\)"):
        engine.start()


def test_warm_up_without_tokens_is_not_ready(engine, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_NO_TOKENS", "1")
    with pytest.raises(RuntimeError, match="warm-up generation returned no tokens"):
        engine.start()


def test_never_healthy_times_out_with_the_spec_field_named(engine, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_NEVER_HEALTHY", "1")
    engine.startup_timeout_s = 1.5
    with pytest.raises(TimeoutError, match=r"not healthy within 2 s \(burst.startup_timeout_s\)"):
        engine.start()
