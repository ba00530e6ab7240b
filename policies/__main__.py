"""Entry of the policy pack: `pulumi preview --policy-pack policies` runs this file.

Pulumi starts the pack with `python -m pulumi.policy <engine> .` in this folder, using the virtualenv named in
PulumiPolicy.yaml (the project's .venv), which puts only this folder on sys.path: the repository root is
added so the rules (policies/rules.py, which reads topology/catalog.py) import as they do in tests.
Constructing PolicyPack starts the analyzer's gRPC server and blocks, so nothing else may import this file.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from policies.pack import PACK_NAME, POLICIES  # noqa: E402

PolicyPack(
    name=PACK_NAME,
    policies=POLICIES,
    enforcement_level=EnforcementLevel.MANDATORY,  # each policy sets its own level; this is the fallback
    description="The serving doctrine and the deploy lessons of llm-serving (policies/rules.py).",
)
