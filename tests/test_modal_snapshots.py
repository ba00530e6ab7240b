"""The burst app builds with the real modal client (no token) with snapshots on and off, and its engine
finds the folder vLLM's LoRA resolver needs.

Modal 1.6's `App.cls` raises InvalidError for a `@modal.enter(snap=True)` hook on a class without
`enable_memory_snapshot=True` (modal/app.py, 1.6.4); the app used to register that hook always.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

from modal_apps import settings as S


def _config(spec, memory: bool, gpu: bool) -> S.BurstAppConfig:
    ep = next(e for e in spec.endpoints if e.burst is not None)
    burst = ep.burst.model_copy(update={"enable_memory_snapshot": memory, "enable_gpu_snapshot": gpu})
    return S.BurstAppConfig.from_endpoint(ep.model_copy(update={"burst": burst}))


def _import_burst(monkeypatch, config: S.BurstAppConfig):
    for var in (S.ENV_SPEC_FILE, S.ENV_STACK, S.ENV_ENDPOINT):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(S.ENV_SPEC, config.to_json())
    sys.modules.pop("modal_apps.burst", None)
    return importlib.import_module("modal_apps.burst")


@pytest.mark.parametrize(("memory", "gpu"), [(True, True), (True, False), (False, False)],
                         ids=["gpu-snapshots", "memory-snapshots-only", "snapshots-off"])
def test_burst_app_builds_for_every_snapshot_setting(stack, monkeypatch, memory, gpu):
    _, _, spec = stack
    config = _config(spec, memory, gpu)
    burst = _import_burst(monkeypatch, config)  # the old app raised modal.exception.InvalidError here when off
    info = burst.BurstServer().serve.info()
    assert info.gpus and info.method_names == ["serve"]
    assert burst.settings.cls_kwargs()["enable_memory_snapshot"] is memory
    hooks = {k for k in vars(burst.BurstServer._get_user_cls()) if not k.startswith("_")} - {"serve", "stop"}
    if memory:
        assert hooks == {"start_before_snapshot", "start_after_restore"}
    else:
        assert hooks == {"start"}, "no snapshot phase when snapshots are off"
    assert burst.SNAPSHOTS_HOLD_ENGINE is (memory and gpu)


def test_the_planned_stacks_build_as_planned(stack, monkeypatch):
    # whatever the stack asks for (gpu_snapshots true or false), the app module builds
    _, _, spec = stack
    for ep in (e for e in spec.endpoints if e.burst is not None):
        burst = _import_burst(monkeypatch, S.BurstAppConfig.from_endpoint(ep))
        assert burst.app.name == ep.burst.app_name


def _vllm_resolver_accepts(path: str | None) -> bool:
    """vLLM's own start-up check (register_filesystem_resolver, vllm 0.10.0–0.13.0)."""
    return bool(path) and os.path.exists(path) and os.path.isdir(path)


def test_engine_gets_an_existing_lora_folder_when_the_volume_has_none(planned_stacks, tmp_path, monkeypatch):
    _, spec = planned_stacks["prod"]
    lora_eps = [e for e in spec.endpoints if e.burst is not None and e.engine.lora is not None and e.engine.lora.enable_lora]
    if not lora_eps:
        pytest.skip("no burst endpoint with LoRA in the prod stack")
    settings = S.build_settings(S.BurstAppConfig.from_endpoint(lora_eps[0]))
    wanted = settings.container_env[S.LORA_DIR_ENV]
    env = {S.LORA_DIR_ENV: wanted}  # what the container starts with: a folder on the read-only volume
    assert not _vllm_resolver_accepts(env[S.LORA_DIR_ENV])  # the revision was synced without adapters
    chosen = S.ensure_lora_resolver_dir(settings, env, empty_dir=str(tmp_path / "empty-lora"))
    assert _vllm_resolver_accepts(env[S.LORA_DIR_ENV]) and env[S.LORA_DIR_ENV] == chosen
    assert os.listdir(chosen) == []  # no adapter resolves, as on a floor node whose copy had none


def test_adapters_on_the_volume_resolve_on_the_engines_model_path(planned_stacks, tmp_path):
    """vLLM loads an adapter only when its config names the engine's model (here its path on the volume) as its
    base; a trained adapter names its hub id. The engine reads a folder outside the read-only volume, each adapter
    there linked to its files on the volume with a config naming the model path; the volume is left as it is."""
    import json

    from tests.vllm_lora_resolver import resolves

    _, spec = planned_stacks["prod"]
    ep = next((e for e in spec.endpoints if e.burst is not None and e.engine.lora is not None), None)
    if ep is None:
        pytest.skip("no burst endpoint with LoRA in the prod stack")
    settings = S.build_settings(S.BurstAppConfig.from_endpoint(ep))
    on_volume = tmp_path / "adapters"
    published = {"peft_type": "LORA", "base_model_name_or_path": "meta-llama/Llama-3.3-70B-Instruct", "r": 16}
    for name in ("tenant-a", "tenant-b"):
        (on_volume / name).mkdir(parents=True)
        (on_volume / name / "adapter_config.json").write_text(json.dumps(published))
        (on_volume / name / "adapter_model.safetensors").write_text(f"lora weights of {name}")
    (on_volume / "README.md").write_text("not an adapter")
    settings = settings.__class__(**{**settings.__dict__,
                                     "container_env": {**settings.container_env, S.LORA_DIR_ENV: str(on_volume)}})
    env: dict[str, str] = {}
    view = S.ensure_lora_resolver_dir(settings, env, empty_dir=str(tmp_path / "view"))
    assert env[S.LORA_DIR_ENV] == view == str(tmp_path / "view")
    for name in ("tenant-a", "tenant-b"):
        assert resolves(view, settings.model_path, name)
        assert not resolves(str(on_volume), settings.model_path, name)  # as published: a 404 for every request
        assert (tmp_path / "view" / name / "adapter_model.safetensors").read_text() == f"lora weights of {name}"
        assert json.loads((on_volume / name / "adapter_config.json").read_text()) == published
    assert sorted(os.listdir(view)) == ["tenant-a", "tenant-b"]


def test_new_engine_prepares_the_lora_folder_before_vllm_starts(planned_stacks, monkeypatch, tmp_path):
    _, spec = planned_stacks["prod"]
    ep = next((e for e in spec.endpoints if e.burst is not None and e.engine.lora is not None), None)
    if ep is None:
        pytest.skip("no burst endpoint with LoRA in the prod stack")
    burst = _import_burst(monkeypatch, S.BurstAppConfig.from_endpoint(ep))
    monkeypatch.setattr(burst, "check_weights_revision", lambda: None)
    monkeypatch.setattr(burst, "ensure_lora_resolver_dir",
                        lambda s: S.ensure_lora_resolver_dir(s, empty_dir=str(tmp_path / "lora")))
    monkeypatch.setenv(S.LORA_DIR_ENV, burst.settings.container_env[S.LORA_DIR_ENV])
    burst.new_engine()  # what both enter-hook variants call before starting vLLM
    assert _vllm_resolver_accepts(os.environ[S.LORA_DIR_ENV])


@pytest.mark.parametrize(("memory", "gpu"), [(True, True), (True, False)], ids=["gpu-snapshots", "memory-snapshots-only"])
def test_an_adapter_published_after_the_snapshot_resolves_after_a_restore(planned_stacks, monkeypatch, tmp_path,
                                                                           memory, gpu):
    """The resolver's folder is built before the snapshot; a restore rebuilds it from the reloaded volume, so an
    adapter published since then resolves on burst as it does on the floor (whose fetch rebuilds at every start)."""
    import json

    from tests.vllm_lora_resolver import resolves

    _, spec = planned_stacks["prod"]
    ep = next((e for e in spec.endpoints if e.burst is not None and e.engine.lora is not None), None)
    if ep is None:
        pytest.skip("no burst endpoint with LoRA in the prod stack")
    burst_cfg = ep.burst.model_copy(update={"enable_memory_snapshot": memory, "enable_gpu_snapshot": gpu})
    burst = _import_burst(monkeypatch, S.BurstAppConfig.from_endpoint(ep.model_copy(update={"burst": burst_cfg})))
    volume = tmp_path / "adapters"
    settings = burst.settings.__class__(**{**burst.settings.__dict__, "container_env": {
        **burst.settings.container_env, S.LORA_DIR_ENV: str(volume)}})
    view = tmp_path / "view"
    monkeypatch.setattr(burst, "check_weights_revision", lambda: None)
    monkeypatch.setattr(burst, "ensure_lora_resolver_dir",
                        lambda s: S.ensure_lora_resolver_dir(settings, {}, empty_dir=str(view)))
    monkeypatch.setattr(burst, "Engine", lambda *a, **k: FakeEngine())
    reloads = []
    monkeypatch.setattr(burst, "weights_readonly", type("V", (), {"reload": lambda self: reloads.append(1)})())

    def publish(name):
        (volume / name).mkdir(parents=True)
        (volume / name / "adapter_config.json").write_text(json.dumps(
            {"peft_type": "LORA", "base_model_name_or_path": "meta-llama/Llama-3.3-70B-Instruct"}))
        (volume / name / "adapter_model.safetensors").write_text("w")

    publish("tenant-a")
    server = burst.BurstServer._get_user_cls()()
    server.start_before_snapshot()
    publish("tenant-b")  # after the snapshot was taken
    server.start_after_restore()
    assert resolves(str(view), settings.model_path, "tenant-a") and resolves(str(view), settings.model_path, "tenant-b")
    assert server.engine.calls == (["start", "sleep", "wake"] if gpu else ["start"])
    # the volume is reloaded after every restore, before the engine reads it (memory snapshots alone) or the
    # adapters' folder is rebuilt
    assert reloads == [1]


@pytest.mark.parametrize(("memory", "gpu"), [(True, True), (True, False)], ids=["gpu-snapshots", "memory-snapshots-only"])
def test_a_restore_whose_volume_reload_is_refused_still_serves(planned_stacks, monkeypatch, capsys, memory, gpu):
    """Modal refuses a reload while a file on the volume is open (RuntimeError, modal 1.6.4 Volume.reload): the
    restored container serves with what it has and says so, instead of failing every cold start."""
    _, spec = planned_stacks["prod"]
    ep = next(e for e in spec.endpoints if e.burst is not None)
    burst_cfg = ep.burst.model_copy(update={"enable_memory_snapshot": memory, "enable_gpu_snapshot": gpu})
    burst = _import_burst(monkeypatch, S.BurstAppConfig.from_endpoint(ep.model_copy(update={"burst": burst_cfg})))
    monkeypatch.setattr(burst, "check_weights_revision", lambda: None)
    monkeypatch.setattr(burst, "ensure_lora_resolver_dir", lambda s: None)
    monkeypatch.setattr(burst, "Engine", lambda *a, **k: FakeEngine())

    def refuse(self):
        raise RuntimeError("there are open files preventing the operation")

    monkeypatch.setattr(burst, "weights_readonly", type("V", (), {"reload": refuse})())
    server = burst.BurstServer._get_user_cls()()
    server.start_before_snapshot()
    server.start_after_restore()
    assert server.engine.calls == (["start", "sleep", "wake"] if gpu else ["start"])
    err = capsys.readouterr().err
    assert "not reloaded after the restore" in err and "open files" in err


class FakeEngine:
    def __init__(self):
        self.calls = []

    def start(self):
        self.calls.append("start")

    def sleep(self):
        self.calls.append("sleep")

    def wake(self):
        self.calls.append("wake")


def test_gpu_snapshots_on_a_multi_gpu_container_are_flagged_with_what_a_boot_costs(planned_stacks):
    """Modal documents GPU memory snapshots as generally incompatible with multi-GPU code; prod assist's burst
    container has 2 GPUs (tensor parallel) with snapshots on: the plan says so, with what each launch costs if the
    restore falls back to a boot ((240 − 25) s × the container's price)."""
    inputs, spec = planned_stacks["prod"]
    warned = {e.name: [w for w in e.warnings if "multi-GPU" in w] for e in spec.endpoints}
    assist = spec.endpoint("assist")
    assert assist.burst.gpus_per_container == 2
    (w,) = warned["assist"]
    assert "215 s more" in w and f"${215 * assist.burst.usd_per_container_hour / 3600:,.2f} a launch" in w
    assert "serverless.gpu_snapshots: false" in w
    one_gpu = [e.name for e in spec.endpoints if e.burst is not None and e.burst.gpus_per_container == 1]
    assert one_gpu and all(not warned[n] for n in one_gpu)
