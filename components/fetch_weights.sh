#!/bin/sh
# Init container of a vLLM floor replica: copy one model revision from the region-local weight cache
# (S3, through the VPC gateway endpoint) to the node's NVMe, once per node. Never a model hub.
#   WEIGHTS_URI      s3://<regional bucket>/<model prefix>/
#   LOCAL_DIR        node-local copy the engine serves from
#   START_JITTER_S   random delay before pulling, so a scale-up step does not hit the shared path at once
#   STALE_LOCK_S     a copy lock whose heartbeat is older than this was left by a killed pod and is taken over
#   LOCK_WAIT_MAX_S  longest a replica waits for a neighbour's copy before failing (the kubelet retries it)
#   LORA_DIR         optional: folder vLLM's filesystem LoRA resolver reads; created (empty) when the revision
#                    ships no adapters, since the resolver refuses to start without it and S3 has no empty folders
#   LOCK_POLL_S      optional: seconds between lock checks and heartbeats (default 5)
set -eu
poll_s="${LOCK_POLL_S:-5}"
done_marker="$LOCAL_DIR/.complete"

ensure_lora_dir() {
  if [ -n "${LORA_DIR:-}" ]; then
    mkdir -p "$LORA_DIR"
  fi
}

if [ -f "$done_marker" ]; then
  echo "weights already on this node: $LOCAL_DIR"
  ensure_lora_dir
  exit 0
fi

n=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
delay=$((n % (START_JITTER_S + 1)))
echo "start jitter: sleeping ${delay}s of at most ${START_JITTER_S}s"
sleep "$delay"

# Replicas sharing a node share one copy: the first takes the lock (mkdir is atomic), the others wait for
# its marker. The holder refreshes a heartbeat file while it copies. A holder killed before its first
# heartbeat leaves a lock with no heartbeat: the lock folder's own mtime then dates it, so such a lock
# goes stale like any other instead of being waited on forever.
mkdir -p "$(dirname "$LOCAL_DIR")"
lock="$LOCAL_DIR.lock"

lock_age_s() {
  beat=$(cat "$lock/heartbeat" 2>/dev/null || true)
  case "$beat" in
    ''|*[!0-9]*) beat=$(stat -c %Y "$lock" 2>/dev/null || date +%s) ;;  # no (or torn) heartbeat: lock's mtime
  esac
  echo $(( $(date +%s) - beat ))
}

waited_s=0
while ! mkdir "$lock" 2>/dev/null; do
  if [ -f "$done_marker" ]; then
    echo "weights copied by a neighbour: $LOCAL_DIR"
    ensure_lora_dir
    exit 0
  fi
  age=$(lock_age_s)
  if [ "$age" -gt "$STALE_LOCK_S" ]; then
    echo "taking over a stale copy lock (no heartbeat for ${age}s, limit ${STALE_LOCK_S}s)"
    rm -rf "$lock"
    continue
  fi
  if [ "$waited_s" -ge "$LOCK_WAIT_MAX_S" ]; then
    echo "waited ${waited_s}s (LOCK_WAIT_MAX_S) for a neighbour's copy of $LOCAL_DIR; giving up so the kubelet retries" >&2
    exit 1
  fi
  sleep "$poll_s"
  waited_s=$((waited_s + poll_s))
done

date +%s > "$lock/heartbeat"
( while sleep "$poll_s"; do date +%s > "$lock/heartbeat" 2>/dev/null || exit 0; done ) >/dev/null 2>&1 &
heartbeat_pid=$!
trap 'kill "$heartbeat_pid" 2>/dev/null || true; rm -rf "$lock"' EXIT
if [ -f "$done_marker" ]; then
  ensure_lora_dir
  exit 0
fi

aws s3 sync --only-show-errors --no-progress "$WEIGHTS_URI" "$LOCAL_DIR"
if [ -z "$(ls -A "$LOCAL_DIR" 2>/dev/null)" ]; then
  echo "no weights under $WEIGHTS_URI: has replication from the source bucket run?" >&2
  exit 1
fi
ensure_lora_dir
touch "$done_marker"
echo "weights copied: $WEIGHTS_URI -> $LOCAL_DIR"
