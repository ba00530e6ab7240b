"""The quality recorder service (issue #16 item 6): sampled production exchanges → the evaluation sink.

Runs as its own Deployment (components/quality_recorder.py), off the user's path; image built from
recorder/Dockerfile. `records.py` is pure (exchange → record), `app.py` the service.
"""
