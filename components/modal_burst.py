"""ModalBurst: one endpoint's Modal burst app, deployed from `pulumi up`.

First the endpoint's Modal Volume is created and filled from the region-local weight cache (a Command
running `python -m modal_apps.weights sync`, after the cache is seeded), then the app is deployed.
Modal has no Pulumi provider, so the deploy is a `pulumi_command.local.Command` running
`python -m modal_apps.deploy deploy` with the endpoint's burst config in LLM_SERVING_BURST_SPEC:

- the config and the hash of the app's code ride in the command's environment, so a spec or code change runs
  its `update` command: Modal rolls the new version in. Not in `triggers`: pulumi-command 1.2.1 registers every
  Command with `replace_on_changes=["triggers[*]"]` (pulumi_command/local/command.py; pulumi/pulumi-command#855),
  so a changed trigger replaced the Command — `delete` (stop the live app, killing its requests) and then a fresh
  deploy booting without a snapshot — whatever its `update` said;
- `delete` stops exactly the app the last deploy recorded (on `pulumi destroy`), and
  `delete_before_replace` makes a forced replacement stop-then-deploy rather than deploy-then-stop;
- the Modal token comes from Pulumi *secret* config (`modalTokenId`, `modalTokenSecret`) or from the
  environment (MODAL_TOKEN_ID / MODAL_TOKEN_SECRET), and is passed to the command as a secret. A token
  in plain config is refused. With neither, the modal client's own profile (~/.modal.toml) is used.

Output `url`: the burst endpoint's web URL, for the gateway (requests need Modal-Key/Modal-Secret).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_command as command

from modal_apps.deploy import parse_record
from modal_apps.settings import ENV_SPEC, BurstAppConfig
from topology.spec import EndpointSpec

from ._common import TYPE_PREFIX, child

APP_CODE_ENV = "LLM_SERVING_APP_CODE_SHA256"  # the app code's hash, in the deploy's environment: a change redeploys


@dataclass(frozen=True)
class ModalBurstArgs:
    endpoint: EndpointSpec
    """The endpoint whose `burst` spec is deployed; its tier must have burst capacity."""
    environment: str
    """Modal environment to deploy into (usually the stack's environment, e.g. 'prod')."""
    python: str
    """Interpreter that runs `-m modal_apps.deploy` (the program passes `default_python()`)."""
    code_sha256: str
    """Hash of the app's sources (`code_sha256()`): a change redeploys."""
    token_env: Mapping[str, pulumi.Output[str]]
    """MODAL_TOKEN_ID/SECRET as secret outputs (`modal_token_env()`); empty: the modal client's own profile."""
    weights_ready: tuple[pulumi.Resource, ...] = ()
    """What must finish before the volume is filled: the seeding of the weight cache it reads from."""


TOKEN_ID_KEY = "modalTokenId"
TOKEN_SECRET_KEY = "modalTokenSecret"
TOKEN_ENV = {TOKEN_ID_KEY: "MODAL_TOKEN_ID", TOKEN_SECRET_KEY: "MODAL_TOKEN_SECRET"}

# What the deployed app is built from besides the spec: a change to any of these must redeploy.
_ROOT = Path(__file__).resolve().parent.parent
APP_SOURCES = ("modal_apps/burst.py", "modal_apps/settings.py", "modal_apps/deploy.py", "topology/spec.py")


class ModalTokenError(ValueError):
    """The Modal token is configured in a way that would leak it."""


def code_sha256(root: Path = _ROOT) -> str:
    h = hashlib.sha256()
    for rel in APP_SOURCES:
        h.update(rel.encode() + b"\0" + (root / rel).read_bytes())
    return h.hexdigest()


def weights_code_sha256(root: Path = _ROOT) -> str:
    return hashlib.sha256((root / "modal_apps/weights.py").read_bytes()).hexdigest()


def default_python() -> str:
    # Relative to the project when possible: the command string, stored in state, then stays the
    # same across checkouts and machines instead of redeploying whenever the path differs.
    exe = Path(sys.executable)
    try:
        return str(exe.relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


def modal_token_env() -> dict[str, pulumi.Output[str]]:
    """MODAL_TOKEN_ID/SECRET as secret outputs, from secret config or the environment; {} if neither."""
    cfg = pulumi.Config()
    found: dict[str, pulumi.Output[str]] = {}
    for key, env_var in TOKEN_ENV.items():
        full_key = cfg.full_key(key)
        if cfg.get(key) is not None:
            if not pulumi.runtime.is_config_secret(full_key):
                raise ModalTokenError(
                    f"config {full_key} is stored in plain text; a Modal token must be a secret: "
                    f"`pulumi config rm {key}` then `pulumi config set --secret {key} <value>`"
                )
            found[env_var] = cfg.require_secret(key)
        elif os.environ.get(env_var):
            found[env_var] = pulumi.Output.secret(os.environ[env_var])
    if len(found) == 1:
        missing = (set(TOKEN_ENV.values()) - set(found)).pop()
        raise ModalTokenError(
            f"only half a Modal token is configured: {missing} is missing (set config "
            f"{TOKEN_ID_KEY}/{TOKEN_SECRET_KEY} with --secret, or both environment variables)"
        )
    return found


class ModalBurst(pulumi.ComponentResource):
    """Deploys one endpoint's Modal burst app and exports its URL."""

    url: pulumi.Output[str]
    app_name: pulumi.Output[str]
    deployment: command.local.Command
    weights: command.local.Command

    def __init__(self, name: str, args: ModalBurstArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{TYPE_PREFIX}:ModalBurst", name, None, opts)
        config = BurstAppConfig.from_endpoint(args.endpoint)  # refuses an endpoint without burst capacity
        python = shlex.quote(args.python)
        deploy = f"{python} -m modal_apps.deploy deploy --environment {shlex.quote(args.environment)}"
        token = dict(args.token_env)
        if not token:
            pulumi.log.warn(
                f"{name}: no Modal token in secret config ({TOKEN_ID_KEY}/{TOKEN_SECRET_KEY}) or the environment; "
                "the modal client's own profile will be used", resource=self)

        # The Volume is created (create_if_missing) and filled, checksummed against the prefix's SHA256SUMS,
        # before the app that mounts it is deployed. No delete: the volume keeps its weights.
        burst, engine = config.burst, config.engine
        sync = f"{python} -m modal_apps.weights sync --no-progress --environment {shlex.quote(args.environment)}"
        self.weights = command.local.Command(
            f"{name}-weights",
            create=sync,
            update=sync,
            triggers=[burst.volume_name, burst.weights_bucket, burst.weights_region, engine.weights_uri_suffix,
                      weights_code_sha256()],
            environment={ENV_SPEC: config.to_json(), **token},
            opts=child(self, depends_on=list(args.weights_ready)),
        )
        self.deployment = command.local.Command(
            f"{name}-deploy",
            create=deploy,
            update=deploy,
            delete=f"{python} -m modal_apps.deploy stop",
            # no triggers (module docstring): a change of environment is an update, which redeploys in place
            environment={ENV_SPEC: config.to_json(), APP_CODE_ENV: args.code_sha256, **token},
            add_previous_output_in_env=True,  # the deploy reads the previous record to stop a renamed app
            # a stack deployed with `triggers` on this Command keeps them in its state: removing them would itself be
            # a replacement (pulumi-command tags the property replaceOnChanges), stopping the live app once
            opts=child(self, delete_before_replace=True, depends_on=[self.weights], ignore_changes=["triggers"]),
        )
        # the deploy's stdout may come back secret (the Command takes the Modal token, a secret input, and its
        # outputs may inherit that); the record holds the app's name and web URL, which are not secrets (the URL is
        # useless without the proxy-auth token), and a secret URL would make the gateway's ConfigMap and every
        # preview of it read [secret]
        record = pulumi.Output.unsecret(self.deployment.stdout).apply(parse_record)
        self.url = record.apply(lambda r: (r.web_url or "") if r else "")
        self.app_name = pulumi.Output.from_input(config.burst.app_name)
        self.register_outputs({"url": self.url, "app_name": self.app_name})
