"""The rules of policies/rules.py as pulumi-policy objects (checked against pulumi-policy 1.21.0).

Importing this module builds the policy objects and nothing else; `policies/__main__.py` hands them to
`PolicyPack`, whose constructor starts the analyzer's gRPC server and blocks. Tests call each policy's
`validate(args, report_violation)` directly.

What the engine gives a pack, and how it maps onto a `rules.Resource`:
- ResourceValidationArgs: resource_type, props (inputs), urn, name, opts (protect, parent, ...), provider
  (a PolicyProviderResource with the provider's props: the default provider's are the stack's aws:* config);
- StackValidationArgs.resources: PolicyResource with the same fields plus parent and dependencies;
- props arrive with secrets already unwrapped, and values not known during preview raise UnknownValueError
  when read: they are replaced here by `rules.UNKNOWN` so a check sees a value it cannot match;
- the stack's config is readable (the engine passes it to the pack, and pulumi-policy loads it before each
  analysis), so the stated platform and the plain-text credential keys come from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import _is_unknown

from .recorded import plain_text_credentials
from .rules import (
    CLUSTER_KEY, MONITORING_KEY, PLATFORM_PROVIDES_KEY, RULES, UNKNOWN, Resource, Rule,
    StackContext, platform_groups,
)

PACK_NAME = "llm-serving-doctrine"
LEVELS = {"mandatory": EnforcementLevel.MANDATORY, "advisory": EnforcementLevel.ADVISORY}
# the advisories' thresholds, settable with `--policy-pack-config` (the engine validates against the schema)
CONFIG_SCHEMAS = {
    "morning-floor-before-demand-rise": PolicyConfigSchema(
        properties={"demandRiseLocalHour": {"type": "integer", "minimum": 0, "maximum": 23, "default": 7}}),
    "right-size-before-platform": PolicyConfigSchema(
        properties={"rightSizeBelowRequestsPerS": {"type": "number", "exclusiveMinimum": 0, "default": 3.0}}),
}


def _raw(value: Any) -> Any:
    try:
        return value["__target"]
    except (TypeError, KeyError, IndexError):
        return value


def unproxy(value: Any) -> Any:
    """pulumi-policy's unknown-checking proxies → plain dicts and lists, read through their raw target so
    that nothing raises; values unknown during preview → rules.UNKNOWN."""
    value = _raw(value)
    if isinstance(value, Mapping):
        return {k: unproxy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unproxy(v) for v in value]
    if isinstance(value, str) and _is_unknown(value):
        return UNKNOWN
    return value


def _config_value(key: str) -> Any:
    """A stack config value as the engine passed it (objects arrive as JSON text)."""
    import json

    import pulumi.runtime

    raw = pulumi.runtime.get_config(key)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


# The project the engine starts the pack in (pulumi-analyzer-policy-python runs it from policies/): its stack files.
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def stack_file_config(stack: str | None = None, root: Path | None = None) -> Mapping[str, Any] | None:
    """The `config:` of the stack's file (`<stackConfigDir>/Pulumi.<stack>.yaml`), as `pulumi config set --secret`
    leaves it (`{secure: …}` for a secret); None when the stack or its file is unknown."""
    import os

    import yaml

    stack = stack or os.environ.get("PULUMI_STACK")
    root = root or PROJECT_ROOT
    if not stack:
        return None
    try:
        project = yaml.safe_load((root / "Pulumi.yaml").read_text()) or {}
        config_dir = project.get("stackConfigDir", ".") if isinstance(project, Mapping) else "."
        doc = yaml.safe_load((root / config_dir / f"Pulumi.{stack.rsplit('/', 1)[-1]}.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    config = doc.get("config") if isinstance(doc, Mapping) else None
    return config if isinstance(config, Mapping) else None


def plain_credential_keys(is_set, stack_config: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The credential keys set for this run whose stack-file value is in plain text.

    The engine hands a policy pack every config value decrypted and does not say which were secrets (pulumi's
    analyzer plugin passes PULUMI_CONFIG only; pulumi-policy 1.21 keeps nothing of ConfigureStack but the tags),
    so `pulumi.runtime.is_config_secret` is False for every key there and the rule fired on every run. The stack
    file says what `pulumi config set --secret` (or pulumi/actions' config-map with `secret: true`) encrypted; a
    key set for this run but not in the file (or no file found) is not judged here: the offline render and
    preflight judge the file."""
    config = stack_file_config() if stack_config is None else stack_config
    if config is None:
        return ()
    return plain_text_credentials(config, is_set)


def stack_context_from_config(policy_config: Mapping[str, Any] | None = None) -> StackContext:
    """The stack's stated platform and credentials, read from the config the engine passed to the pack."""
    import pulumi.runtime

    raw = pulumi.runtime.get_config(PLATFORM_PROVIDES_KEY)
    provides: list[str] = []
    if raw:
        import json

        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        provides = [value] if isinstance(value, str) else value
    plain_keys = plain_credential_keys(lambda k: pulumi.runtime.get_config(k) is not None)
    cfg = dict(policy_config or {})
    return StackContext(
        platform_provides=platform_groups(provides, _config_value(MONITORING_KEY), _config_value(CLUSTER_KEY)),
        plain_credential_config_keys=plain_keys,
        demand_rise_local_hour=int(cfg.get("demandRiseLocalHour", 7)),
        right_size_below_requests_per_s=float(cfg.get("rightSizeBelowRequestsPerS", 3.0)),
    )


def resource_from_args(args: ResourceValidationArgs) -> Resource:
    provider = args.provider
    return Resource(
        type=args.resource_type, name=args.name, urn=args.urn, props=unproxy(args.props),
        protect=bool(args.opts.protect) if args.opts is not None else False,
        parent_urn=(args.opts.parent or "") if args.opts is not None else "",
        provider_props=unproxy(provider.props) if provider is not None else None,
        provider_urn=provider.urn if provider is not None else "",
    )


def resource_from_policy_resource(r: PolicyResource) -> Resource:
    provider = r.provider
    return Resource(
        type=r.resource_type, name=r.name, urn=r.urn, props=unproxy(r.props),
        protect=bool(r.opts.protect) if r.opts is not None else False,
        parent_type=r.parent.resource_type if r.parent is not None else "",
        parent_urn=r.parent.urn if r.parent is not None else "",
        provider_props=unproxy(provider.props) if provider is not None else None,
        provider_urn=provider.urn if provider is not None else "",
    )


def _resource_policy(rule: Rule) -> ResourceValidationPolicy:
    check = rule.resource_check
    assert check is not None

    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        for message in check(resource_from_args(args), stack_context_from_config(args.get_config())):
            report_violation(message, None)

    return ResourceValidationPolicy(name=rule.name, description=rule.description, validate=validate,
                                    enforcement_level=LEVELS[rule.level], config_schema=CONFIG_SCHEMAS.get(rule.name))


def _stack_policy(rule: Rule) -> StackValidationPolicy:
    check = rule.stack_check
    assert check is not None

    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources = [resource_from_policy_resource(r) for r in args.resources]
        for urn, message in check(resources, stack_context_from_config(args.get_config())):
            report_violation(message, urn or None)

    return StackValidationPolicy(name=rule.name, description=rule.description, validate=validate,
                                 enforcement_level=LEVELS[rule.level], config_schema=CONFIG_SCHEMAS.get(rule.name))


def build_policies() -> list[ResourceValidationPolicy | StackValidationPolicy]:
    """One pulumi-policy object per rule, in rule order, at the rule's level."""
    return [_resource_policy(r) if r.resource_check is not None else _stack_policy(r) for r in RULES]


POLICIES = build_policies()