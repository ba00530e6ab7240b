#!/bin/sh
# Init container of a vLLM floor replica: copy one model revision from the region-local weight cache
# (S3, through the VPC gateway endpoint) to the node's NVMe, once per node. Never a model hub.
#   WEIGHTS_URI      s3://<regional bucket>/<model prefix>/
#   LOCAL_DIR        node-local copy the engine serves from (its --model path)
#   START_JITTER_S   random delay before pulling, so a scale-up step does not hit the shared path at once
#   STALE_LOCK_S     a copy lock whose heartbeat is older than this was left by a killed pod and is taken over
#   LOCK_WAIT_MAX_S  longest a replica waits for a neighbour's copy before failing (the kubelet retries it)
#   LORA_DIR         optional: the folder vLLM's filesystem LoRA resolver reads (made, empty when the revision ships
#                    no adapters: the resolver refuses to start without it and S3 has no empty folders)
#   LORA_SRC         optional, with LORA_DIR: the revision's adapters as copied (<LOCAL_DIR>/<adapters subdir>)
#   ADAPTERS_URI     optional, with LORA_SRC: their S3 prefix, copied again at every start (adapters are added to
#                    a revision over time; the weights are copied once)
#   LOCK_POLL_S      optional: seconds between lock checks and heartbeats (default 5)
#
# The resolver loads an adapter only when its adapter_config.json names, as base_model_name_or_path, exactly the
# engine's model (vllm/plugins/lora_resolvers/filesystem_resolver.py; the engine's model is this local path,
# serving_models.py resolve_lora, 0.11.0): a trained adapter names its hub id. So LORA_DIR holds, per adapter,
# hard links to its files and a copy of its adapter_config.json naming LOCAL_DIR; the copy in LORA_SRC is kept
# as published.
#
# PID 1 of its container: a signal without a handler is ignored there, so TERM (a pod deleted during the jitter,
# the lock wait or the copy) is trapped, and every wait runs in the background so the trap runs at once.
set -eu
trap 'exit 143' TERM INT
poll_s="${LOCK_POLL_S:-5}"
done_marker="$LOCAL_DIR/.complete"

pause() {  # sleep, interruptible by TERM
  sleep "$1" &
  wait $! || true
}

require_credentials() {
  if [ -z "${AWS_CONTAINER_CREDENTIALS_FULL_URI:-}${AWS_WEB_IDENTITY_TOKEN_FILE:-}${AWS_ACCESS_KEY_ID:-}" ]; then
    echo "no AWS credentials in this pod's environment: EKS Pod Identity adds them when a pod is created, and a pod" \
      "created before its service account's association took effect never gets them. Delete the pod; its" \
      "ReplicaSet makes a new one." >&2
    exit 1
  fi
}

s3_sync() {  # aws s3 sync SRC DEST, interruptible by TERM
  aws s3 sync --only-show-errors --no-progress "$1" "$2" &
  wait $!
}

refresh_adapters() {
  if [ -n "${ADAPTERS_URI:-}" ] && [ -n "${LORA_SRC:-}" ]; then
    mkdir -p "$LORA_SRC"
    s3_sync "$ADAPTERS_URI" "$LORA_SRC"
  fi
}

# LORA_DIR/<name>: hard links to LORA_SRC/<name>'s files, adapter_config.json naming LOCAL_DIR as the base model.
# Each adapter is built beside its place and renamed into it, so an engine resolving it meanwhile finds the old
# one or the new one.
lora_view() {
  [ -n "${LORA_DIR:-}" ] || return 0
  mkdir -p "$LORA_DIR"
  [ -n "${LORA_SRC:-}" ] && [ -d "$LORA_SRC" ] || return 0
  for src in "$LORA_SRC"/*; do
    [ -f "$src/adapter_config.json" ] || continue
    name=$(basename "$src")
    tmp="$LORA_DIR/.$name.tmp.$$"
    rm -rf "$tmp"
    cp -al "$src" "$tmp"
    rm -f "$tmp/adapter_config.json"  # a link to the published file: written anew, not through the link
    base=$(sed -n 's/.*"base_model_name_or_path"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$src/adapter_config.json")
    sed 's|"base_model_name_or_path"[[:space:]]*:[[:space:]]*"[^"]*"|"base_model_name_or_path": "'"$LOCAL_DIR"'"|' \
      "$src/adapter_config.json" > "$tmp/adapter_config.json"
    if ! grep -q '"base_model_name_or_path"' "$tmp/adapter_config.json"; then
      echo "adapter $name: adapter_config.json has no base_model_name_or_path; skipped (vLLM would not load it)" >&2
      rm -rf "$tmp"
      continue
    fi
    old="$LORA_DIR/.$name.old.$$"
    if [ -e "$LORA_DIR/$name" ]; then mv -T "$LORA_DIR/$name" "$old" 2>/dev/null || true; fi
    mv -T "$tmp" "$LORA_DIR/$name" || rm -rf "$tmp"  # a neighbour placed it first: theirs is the same
    rm -rf "$old"
    echo "adapter $name: served on base $LOCAL_DIR (published for ${base:-?})"
  done
}

# Every file the revision's manifest lists is here (S3 objects appear whole, and the sync renames each file into
# place when it is complete, so a missing file is the only way a copy is partial: a cache still filling, a
# replication under way). The manifest itself is written last into a cache the project seeds.
check_complete() {
  if [ ! -f "$LOCAL_DIR/SHA256SUMS" ]; then
    echo "no SHA256SUMS under $WEIGHTS_URI: has the weight cache been seeded (or replication from the source run)?" >&2
    exit 1
  fi
  missing=0
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in
      ''|\\*) continue ;;  # an escaped name (sha256sum's leading backslash): not checked here
    esac
    f=${line#* }
    f=${f# }
    f=${f#\*}
    if [ ! -e "$LOCAL_DIR/$f" ]; then
      [ "$missing" -lt 5 ] && echo "missing from the copy: $f" >&2
      missing=$((missing + 1))
    fi
  done < "$LOCAL_DIR/SHA256SUMS"
  if [ "$missing" -gt 0 ]; then
    echo "$missing file(s) SHA256SUMS lists are not under $WEIGHTS_URI yet: the cache is still filling; the kubelet retries" >&2
    exit 1
  fi
}

if [ -f "$done_marker" ]; then
  echo "weights already on this node: $LOCAL_DIR"
  if [ -n "${ADAPTERS_URI:-}" ]; then require_credentials; fi
  refresh_adapters
  lora_view
  exit 0
fi
require_credentials

n=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
delay=$((n % (START_JITTER_S + 1)))
echo "start jitter: sleeping ${delay}s of at most ${START_JITTER_S}s"
pause "$delay"

# Replicas sharing a node share one copy: the first takes the lock (mkdir is atomic), the others wait for
# its marker. The holder refreshes a heartbeat file while it copies, written aside and renamed into place so a
# reader never sees it empty. A holder killed before its first heartbeat leaves a lock with no heartbeat: the
# lock folder's own mtime then dates it, so such a lock goes stale like any other instead of being waited on
# forever.
mkdir -p "$(dirname "$LOCAL_DIR")"
lock="$LOCAL_DIR.lock"

beat() {
  date +%s > "$lock/.heartbeat.$$" && mv -f "$lock/.heartbeat.$$" "$lock/heartbeat"
}

lock_age_s() {
  t=$(cat "$lock/heartbeat" 2>/dev/null || true)
  case "$t" in
    ''|*[!0-9]*) t=$(stat -c %Y "$lock" 2>/dev/null || date +%s) ;;  # no heartbeat yet: the lock's mtime
  esac
  echo $(( $(date +%s) - t ))
}

waited_s=0
while ! mkdir "$lock" 2>/dev/null; do
  if [ -f "$done_marker" ]; then
    echo "weights copied by a neighbour: $LOCAL_DIR"
    refresh_adapters
    lora_view
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
  pause "$poll_s"
  waited_s=$((waited_s + poll_s))
done

beat
( while sleep "$poll_s"; do beat 2>/dev/null || exit 0; done ) >/dev/null 2>&1 &
heartbeat_pid=$!
trap 'kill "$heartbeat_pid" 2>/dev/null || true; rm -rf "$lock"' EXIT
if [ -f "$done_marker" ]; then
  refresh_adapters
  lora_view
  exit 0
fi

s3_sync "$WEIGHTS_URI" "$LOCAL_DIR"
if [ -z "$(ls -A "$LOCAL_DIR" 2>/dev/null)" ]; then
  echo "no weights under $WEIGHTS_URI: has replication from the source bucket run?" >&2
  exit 1
fi
check_complete
touch "$done_marker"
echo "weights copied: $WEIGHTS_URI -> $LOCAL_DIR"
lora_view
