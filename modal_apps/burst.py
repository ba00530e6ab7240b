# # Burst capacity for an LLM endpoint, on Modal
#
# When the dedicated floor is full, the gateway sends the overflow here (and a `serverless_only`
# endpoint sends everything here). This app must start fast, cost nothing when idle, answer exactly
# like the floor, and be private. Everything it does is read from one endpoint of the topology spec:
# nothing below is a decision, only a translation of the spec into Modal.
#
# Deploy it alone, planning the stack locally:
#
#     LLM_SERVING_STACK=stacks/Pulumi.dev.yaml LLM_SERVING_ENDPOINT=assist \
#         modal deploy -m modal_apps.burst -e dev
#
# or let `pulumi up` deploy it (components/modal_burst.py ships the endpoint's spec in
# LLM_SERVING_BURST_SPEC and runs `python -m modal_apps.deploy`). Fill the weights volume first:
#
#     python -m modal_apps.weights sync --stack stacks/Pulumi.dev.yaml --endpoint assist
#
# ## The spec, and the Modal settings that follow from it
#
# `load_config` reads the endpoint's burst and engine spec from the environment (see
# modal_apps/settings.py for the variables) and fails with a message naming them when it cannot.
# `build_settings` is the one place where spec fields become Modal arguments; the tests check it.

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import modal

from modal_apps.settings import (
    CLASS_NAME,
    FOLLOW_CLOCK_CRON,
    REVISION_MARKER,
    build_settings,
    desired_min_containers,
    ensure_lora_resolver_dir,
    load_config,
    minute_of_week,
)

config = load_config()
settings = build_settings(config)

app = modal.App(settings.app_name)

# ## The container image: the floor's image, not a look-alike
#
# Responses must not depend on the tier, and an engine version bump is a model change. So the burst
# tier runs the very image the floor runs (`engine.image`, a pinned vLLM OpenAI server tag), with its
# entrypoint cleared so Modal can start Python in it. Modal runs the image's own interpreter (the one
# vLLM, pydantic and numpy are installed in) once it is reachable as `python`; no second Python is
# added. The planner's spec models travel with it (`topology` is pure Python) so the container can
# read the config it is handed.

image = (
    modal.Image.from_registry(settings.image)
    .entrypoint([])
    .dockerfile_commands(["RUN ln -sf $(which python3) /usr/local/bin/python"])
    .add_local_python_source("topology")
)

# ## The weights: a Modal Volume filled from the region-local cache, mounted read-only
#
# Never a model hub at boot (HF_HUB_OFFLINE=1 in the container's env, see settings). The volume holds
# the weight cache's layout (`models/<name>/<revision>/`) and a revision marker; it is filled by
# `python -m modal_apps.weights sync` from the bucket in the spec's `weights_region`. The server only
# reads it, so it is mounted read-only: nothing can be left uncommitted when the snapshot is taken.

weights = modal.Volume.from_name(settings.volume_name, version=2)
weights_readonly = weights.with_mount_options(read_only=True)


def check_weights_revision(root: Path = Path(settings.weights_mount)) -> None:
    """Refuse to serve weights of another revision than the floor's (or no weights at all)."""
    marker = root / REVISION_MARKER
    if not marker.exists():
        raise RuntimeError(
            f"volume {settings.volume_name!r} has no {REVISION_MARKER}: fill it first with "
            f"`python -m modal_apps.weights sync --endpoint {config.endpoint} ...`"
        )
    found = json.loads(marker.read_text())
    if found.get("revision") != settings.model_revision:
        raise RuntimeError(
            f"volume {settings.volume_name!r} holds revision {found.get('revision')!r}, the spec serves "
            f"{settings.model_revision!r}: re-run the weights sync with --force-revision"
        )
    if not (root / config.engine.weights_uri_suffix).is_dir():
        raise RuntimeError(f"{config.engine.weights_uri_suffix} is missing from volume {settings.volume_name!r}")


# ## The engine: the floor's command line, warmed before it counts as ready
#
# The server is a subprocess running the floor's exact command line (`engine.vllm_args`, plus flags
# that only change how it binds and sleeps). `Engine` starts it, waits for health, warms it with a real
# generation, and puts it to sleep and wakes it around the snapshot.


class Engine:
    def __init__(self, command: tuple[str, ...], port: int, served_model_name: str, startup_timeout_s: float):
        self.command = command
        self.base_url = f"http://127.0.0.1:{port}"
        self.served_model_name = served_model_name
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None

    def http(self, method: str, path: str, body: dict | None = None, timeout_s: float = 30.0) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.read()

    def start(self) -> None:
        print("starting:", " ".join(self.command), flush=True)
        self.process = subprocess.Popen(list(self.command))
        self.wait_ready()
        self.warm_up()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise RuntimeError(f"vLLM is not running (exit code {code}); see the container log above")
            try:
                self.http("GET", "/health", timeout_s=2)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        raise TimeoutError(f"vLLM was not healthy within {self.startup_timeout_s:.0f} s (burst.startup_timeout_s)")

    def warm_up(self) -> None:
        """A real generation: ready means the engine has produced tokens, not that a port is open."""
        body = {"model": self.served_model_name, "prompt": "Warm-up:", "max_tokens": 8, "temperature": 0}
        reply = json.loads(self.http("POST", "/v1/completions", body, timeout_s=self.startup_timeout_s))
        if not reply.get("choices") or reply.get("usage", {}).get("completion_tokens", 0) < 1:
            raise RuntimeError(f"warm-up generation returned no tokens: {reply}")

    def sleep(self) -> None:
        # Level 1 moves the weights to host memory and drops the KV cache: a smaller snapshot.
        self.http("POST", "/sleep?level=1", timeout_s=120)

    def wake(self) -> None:
        self.http("POST", "/wake_up", timeout_s=120)
        self.wait_ready()
        self.warm_up()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


# ## The server class
#
# GPU kind and count, region, container limits, scaledown window, timeouts and snapshot flags all come
# from `settings.cls_kwargs()`; the per-container concurrency from `settings.concurrent_kwargs()`.
#
# With GPU snapshots on, the engine is started, warmed and put to sleep in the `snap=True` hook: the
# snapshot then holds a loaded, compiled, warmed engine (vLLM boot of minutes becomes a restore of
# seconds). After each restore, the `snap=False` hook re-initialises it: reload the volume, wake the
# engine, wait for health, and generate once more before taking traffic. With memory snapshots but no
# GPU snapshots the GPU is not usable before the snapshot, so the engine starts after restore instead.
# With snapshots off there is no snapshot phase at all: Modal refuses a `snap=True` hook on a class
# without `enable_memory_snapshot` (InvalidError at build, modal 1.6 `App.cls`), so that class has one
# plain enter hook.

SNAPSHOTS_HOLD_ENGINE = settings.enable_memory_snapshot and settings.enable_gpu_snapshot


def new_engine() -> Engine:
    """The engine of this container, after checking the volume holds the floor's revision."""
    check_weights_revision()
    ensure_lora_resolver_dir(settings)
    return Engine(settings.server_command, settings.port, config.engine.served_model_name, settings.startup_timeout_s)


def stop_engine(server: object) -> None:
    engine = getattr(server, "engine", None)  # absent when start-up failed before creating it
    if engine is not None:
        engine.stop()


def reload_weights_after_restore() -> None:
    """Reload the weights volume after a snapshot restore. Modal refuses a reload while a file on the volume is
    open (modal 1.6.4 `Volume.reload`: RuntimeError, "Reloading will fail if there are open files for the volume");
    with the engine held in the snapshot, vLLM has read its weights and closed them, but if it (or a library under
    it) keeps one open, failing the hook would fail every restored container. The weights are in the engine either
    way: what a failed reload costs is the adapters published since the snapshot, until the next one."""
    try:
        weights_readonly.reload()
    except RuntimeError as e:
        print(f"burst: volume {settings.volume_name!r} not reloaded after the restore ({e}); serving the weights the "
              "engine holds, adapters published since the snapshot wait for the next one", file=sys.stderr, flush=True)


server_decorator = app.cls(image=image, volumes={settings.weights_mount: weights_readonly}, **settings.cls_kwargs())

if settings.enable_memory_snapshot:

    @server_decorator
    @modal.concurrent(**settings.concurrent_kwargs())
    class BurstServer:
        @modal.enter(snap=True)
        def start_before_snapshot(self) -> None:
            self.engine = new_engine()
            if SNAPSHOTS_HOLD_ENGINE:
                self.engine.start()
                self.engine.sleep()

        @modal.enter(snap=False)
        def start_after_restore(self) -> None:
            # field note: restores with volumes are reliable only after a reload — before the engine reads the
            # weights (memory snapshots alone) and before the adapters' folder is rebuilt (both)
            reload_weights_after_restore()
            if SNAPSHOTS_HOLD_ENGINE:
                # adapters published to the volume since the snapshot: the resolver reads its folder on each new
                # adapter's first request, so a folder rebuilt now serves them (and does not rely on /tmp
                # surviving the restore)
                ensure_lora_resolver_dir(settings)
                self.engine.wake()
            else:
                ensure_lora_resolver_dir(settings)
                self.engine.start()

        @modal.web_server(**settings.web_server_kwargs())
        def serve(self) -> None:
            """The OpenAI-compatible API on `settings.port`; callers need Modal-Key/Modal-Secret headers."""

        @modal.exit()
        def stop(self) -> None:
            stop_engine(self)

else:

    @server_decorator
    @modal.concurrent(**settings.concurrent_kwargs())
    class BurstServer:  # type: ignore[no-redef]  # the same server, without a snapshot phase
        @modal.enter()
        def start(self) -> None:
            self.engine = new_engine()
            self.engine.start()

        @modal.web_server(**settings.web_server_kwargs())
        def serve(self) -> None:
            """The OpenAI-compatible API on `settings.port`; callers need Modal-Key/Modal-Secret headers."""

        @modal.exit()
        def stop(self) -> None:
            stop_engine(self)


# ## A minimum that follows the clock
#
# Warm floors follow the clock, not the mean: when the spec lists `min_containers_schedule` windows
# (each starting a cold start ahead of the demand rise), a small scheduled function raises and lowers
# the server's `min_containers`. It runs every few minutes rather than at window edges, so it also
# re-applies the minimum after a deploy (a deploy resets autoscaler overrides); `modal_apps.deploy`
# calls it once right after deploying. Modal accepts one schedule per function, hence the period.

clock_image = (
    modal.Image.debian_slim(python_version="3.12")
    # The versions this project is tested with; the spec models need pydantic, YAML and numpy.
    .uv_pip_install("pydantic==2.14.4", "PyYAML==6.0.4", "numpy==2.4.6", "tzdata==2026.6")
    .add_local_python_source("topology")
)


def follow_clock() -> int:
    """Set the server's min_containers for the current clock time; returns the value set."""
    now = dt.datetime.now(dt.timezone.utc)
    wanted = desired_min_containers(settings, minute_of_week(now, settings.schedule_timezone))
    server = modal.Cls.from_name(settings.app_name, CLASS_NAME)()
    server.update_autoscaler(min_containers=wanted)
    print(f"{now.isoformat()}: min_containers={wanted}", flush=True)
    return wanted


if settings.follows_clock:
    follow_clock = app.function(
        image=clock_image,
        schedule=modal.Cron(FOLLOW_CLOCK_CRON, timezone=settings.schedule_timezone),
        env={k: v for k, v in settings.container_env.items() if k.startswith("LLM_SERVING")},
        timeout=120,
        max_containers=1,
    )(follow_clock)


# ## Smoke test
#
# `modal run -m modal_apps.burst` (with the same variables as the deploy) prints what the app was built
# with: the app, GPU, region and the exact vLLM command line, to compare with the floor's.


@app.local_entrypoint()
def main() -> None:
    print(json.dumps({"app": settings.app_name, "gpu": settings.gpu, "region": settings.region,
                      "model_path": settings.model_path, "command": settings.server_command}, indent=2))
