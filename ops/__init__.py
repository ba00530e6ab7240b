"""Operations that talk to the cloud (S3, EKS, Kubernetes, Modal): the weight seeding step and preflight.

Kept outside `topology/`, which must stay pure (no network, no clock).
"""
