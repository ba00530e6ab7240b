"""Modal apps: the burst server (burst.py), its settings (settings.py), its deploy step (deploy.py) and
the weights command (weights.py). Importing this package imports neither modal nor a config."""
