"""Policy pack enforcing the serving doctrine: rules (pure), pack (pulumi-policy objects), recorded (offline).

Importing this package never starts the policy server; only `policies/__main__.py` does.
"""
