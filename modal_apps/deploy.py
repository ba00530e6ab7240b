"""Deploy (or stop) one burst app; what the ModalBurst component runs from `pulumi up`.

    python -m modal_apps.deploy deploy --environment prod   # deploy, re-apply the minimum, print the URL
    python -m modal_apps.deploy stop                        # stop the app recorded by the last deploy

The config comes from the same variables as `modal deploy -m modal_apps.burst` (LLM_SERVING_BURST_SPEC,
...). `deploy` does three things `modal deploy` alone does not:
  1. re-applies the clock-following min_containers at once (a deploy resets autoscaler overrides);
  2. prints one JSON line, the deployment record (app, environment, URL), that the component exports;
  3. when the previous record (PULUMI_COMMAND_STDOUT, set by pulumi-command) names another app or
     environment, stops that one — after the new one is up, so a rename never leaves a gap.
`stop` reads the previous record and stops exactly that app (used on `pulumi destroy`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass

RECORD_PREFIX = "llm-serving-deployment: "
PREVIOUS_OUTPUT_ENV = "PULUMI_COMMAND_STDOUT"


@dataclass(frozen=True)
class DeploymentRecord:
    app_name: str
    environment: str
    web_url: str | None
    spec_sha256: str
    min_containers_applied: int | None

    def line(self) -> str:
        return RECORD_PREFIX + json.dumps(asdict(self), sort_keys=True)


def parse_record(stdout: str | None) -> DeploymentRecord | None:
    """The last deployment record in a command's stdout (None when there is none)."""
    for line in reversed((stdout or "").splitlines()):
        if line.startswith(RECORD_PREFIX):
            return DeploymentRecord(**json.loads(line[len(RECORD_PREFIX):]))
    return None


def superseded(previous: DeploymentRecord | None, current: DeploymentRecord) -> DeploymentRecord | None:
    """The previous app when it is a different app (renamed, or moved to another environment)."""
    if previous is None:
        return None
    if (previous.app_name, previous.environment) == (current.app_name, current.environment):
        return None  # the same app, updated in place: never stop it
    return previous


def stop_app(record: DeploymentRecord) -> None:
    import modal

    print(f"stopping {record.app_name} in environment {record.environment}", file=sys.stderr)
    try:
        app = modal.App.lookup(record.app_name, environment_name=record.environment)
    except modal.exception.NotFoundError:
        print(f"{record.app_name} is not deployed in {record.environment}: nothing to stop", file=sys.stderr)
        return
    app.stop()


def deploy(environment: str | None) -> DeploymentRecord:
    import modal

    from modal_apps import burst
    from modal_apps.settings import CLASS_NAME

    settings, config = burst.settings, burst.config
    env = environment or settings.environment
    with modal.enable_output():
        burst.app.deploy(name=settings.app_name, environment_name=env, tag=config.sha256()[:12])
    applied = burst.follow_clock.remote() if settings.follows_clock else None
    server = modal.Cls.from_name(settings.app_name, CLASS_NAME, environment_name=env)()
    record = DeploymentRecord(
        app_name=settings.app_name,
        environment=env,
        web_url=server.serve.get_web_url(),
        spec_sha256=config.sha256(),
        min_containers_applied=applied,
    )
    old = superseded(parse_record(os.environ.get(PREVIOUS_OUTPUT_ENV)), record)
    if old is not None:
        stop_app(old)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modal_apps.deploy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("deploy", help="deploy the burst app and print its deployment record")
    d.add_argument("--environment", help="Modal environment (default: the spec's burst.environment)")
    sub.add_parser("stop", help=f"stop the app named by the deployment record in ${PREVIOUS_OUTPUT_ENV}")
    args = parser.parse_args(argv)

    from modal_apps.settings import BurstConfigError

    if args.command == "deploy":
        try:
            record = deploy(args.environment)
        except BurstConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(record.line())
        return 0
    previous = parse_record(os.environ.get(PREVIOUS_OUTPUT_ENV))
    if previous is None:
        print(f"nothing to stop: no deployment record in ${PREVIOUS_OUTPUT_ENV}", file=sys.stderr)
        return 0
    stop_app(previous)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
