"""Readiness probe of a vLLM floor replica: ready only after a real generation has succeeded.

Runs inside the vLLM container (`python3 warmup_probe.py`, stdlib only). Until the sentinel exists, each
run sends a synthetic /v1/completions request and succeeds only if the engine returned at least one
generated token; then it writes the sentinel and later runs just check /health. The sentinel lives in
the container's own filesystem, so a restarted engine starts un-warmed and must generate again.
Exit status 0 = ready, 1 = not ready (the reason goes to stderr, which the kubelet records in events).
"""

import json
import os
import sys
import urllib.error
import urllib.request

PROMPT = "Reply with one word: ready"


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def healthy(base: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def warm_up(base: str, model: str, max_tokens: int, timeout_s: float) -> tuple[bool, str]:
    """One greedy completion; True only when at least one token was generated."""
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            data = json.load(r)
    except (urllib.error.URLError, OSError, ValueError) as e:
        return False, f"warm-up request failed: {e}"
    tokens = (data.get("usage") or {}).get("completion_tokens") or 0
    if tokens < 1:
        return False, f"warm-up generated no tokens: {json.dumps(data)[:300]}"
    return True, f"warm-up generated {tokens} token(s)"


def main() -> int:
    base = f"http://127.0.0.1:{_env('WARMUP_PORT', '8000')}"
    sentinel = _env("WARMUP_SENTINEL", "/tmp/warmup-done")
    timeout_s = float(_env("WARMUP_TIMEOUT_S", "50"))
    if os.path.exists(sentinel):
        return 0 if healthy(base, min(timeout_s, 5.0)) else 1
    ok, message = warm_up(base, _env("WARMUP_MODEL", ""), int(_env("WARMUP_MAX_TOKENS", "1")), timeout_s)
    print(message, file=sys.stderr)
    if not ok:
        return 1
    with open(sentinel, "w") as f:
        f.write(message + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
