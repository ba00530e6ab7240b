"""Offline runs of the Pulumi program: under Pulumi's mocks, recording what it declares (no cloud, no CLI)."""
