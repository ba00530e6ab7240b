"""The policy rules over an offline recording (offline/mockrun.py): what `python -m topology render` enforces.

Under Pulumi's mocks the engine creates no default providers, so an AWS resource declared without an
explicit provider is checked against the default provider the stack's `aws:*` config would configure, as
`pulumi preview` would. Secrets stay marked in a recording, so the credential rule can see them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from topology.loading import is_secure_value

from .rules import (
    CLUSTER_KEY,
    MONITORING_KEY,
    platform_groups,
    CREDENTIAL_CONFIG_KEYS,
    PLATFORM_PROVIDES_KEY,
    Resource,
    StackContext,
    Violation,
    evaluate,
)


def plain_text_credentials(config: Mapping[str, Any], is_set=lambda key: True) -> tuple[str, ...]:
    """The credential keys (set for this run, where `is_set` says) that the stack file holds in plain text."""
    return tuple(k for k in CREDENTIAL_CONFIG_KEYS if is_set(k) and k in config and not is_secure_value(config[k]))


def stack_context(config: Mapping[str, Any]) -> StackContext:
    """What the stack file states: the platform's API groups and credentials kept in plain text."""
    provides = config.get(PLATFORM_PROVIDES_KEY) or ()
    if isinstance(provides, str):
        provides = [provides]
    return StackContext(
        platform_provides=platform_groups(provides, config.get(MONITORING_KEY), config.get(CLUSTER_KEY)),
        plain_credential_config_keys=plain_text_credentials(config),
    )


def default_aws_provider(config: Mapping[str, Any]) -> dict[str, Any]:
    """Inputs of the default AWS provider: the stack's `aws:*` config (secrets as the recording marks them)."""
    return {k.split(":", 1)[1]: ("[secret]" if is_secure_value(v) else v) for k, v in config.items() if k.startswith("aws:")}


def resources_of(recording: Any, config: Mapping[str, Any]) -> list[Resource]:
    by_urn = {r.urn: r for r in recording.resources}
    default_aws = default_aws_provider(config)
    out = []
    for r in recording.resources:
        provider_props, provider_urn = None, ""
        if r.type.startswith("aws:"):
            # a provider reference is "URN::id"; an empty one means the default provider
            explicit = by_urn.get(r.provider.rsplit("::", 1)[0]) if r.provider else None
            provider_props = explicit.inputs if explicit is not None else default_aws
            provider_urn = explicit.urn if explicit is not None else ""
        parent = by_urn.get(r.parent)
        out.append(Resource(type=r.type, name=r.name, urn=r.urn, props=r.inputs, protect=r.protect,
                            parent_type=parent.type if parent else "", parent_urn=r.parent, provider_props=provider_props, provider_urn=provider_urn,
                            secrets_marked=True))
    return out


def check_recording(recording: Any, config: Mapping[str, Any]) -> list[Violation]:
    return evaluate(resources_of(recording, config), stack_context(config))


def split(violations: Sequence[Violation]) -> tuple[list[Violation], list[Violation]]:
    """(mandatory, advisory)."""
    return [v for v in violations if v.level == "mandatory"], [v for v in violations if v.level == "advisory"]
