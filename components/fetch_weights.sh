#!/bin/sh
# Init container of a vLLM floor replica: copy one model revision from the region-local weight cache
# (S3, through the VPC gateway endpoint) to the node's NVMe, once per node. Never a model hub.
#   WEIGHTS_URI      s3://<regional bucket>/<model prefix>/
#   LOCAL_DIR        node-local copy the engine serves from (its --model path)
#   START_JITTER_S   random delay before pulling, so a scale-up step does not hit the shared path at once
#   STALE_LOCK_S     a node lock (copy, adapters) whose heartbeat is older than this was left by a killed pod and is taken over
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

s3_sync() {  # aws s3 sync SRC DEST [options], interruptible by TERM
  aws s3 sync --only-show-errors --no-progress "$@" &
  wait $!
}

# Adapters are re-published under their names (retrained at the same rank: the same size). A download sets the
# local file's time to the object's, and by default sync skips a same-size file whose local time is not newer
# than the object's — so a re-published adapter never replaced the old copy on a node that had one (aws-cli
# 2.27.50 syncstrategy/base.py compare_time). --exact-timestamps skips it only when the times match exactly.
refresh_adapters() {
  if [ -n "${ADAPTERS_URI:-}" ] && [ -n "${LORA_SRC:-}" ]; then
    mkdir -p "$LORA_SRC"
    s3_sync "$ADAPTERS_URI" "$LORA_SRC" --exact-timestamps
  fi
}

# LORA_DIR/<name>: a link to a folder beside it holding hard links to LORA_SRC/<name>'s files and an
# adapter_config.json naming LOCAL_DIR as the base model. A rebuilt adapter gets a new folder and its link is
# replaced by a rename, so an engine resolving it meanwhile finds the old one or the new one; folders no link
# points at are removed after. Built under the node's adapters lock (adapters_phase): one pod at a time.
lora_view() {
  [ -n "${LORA_DIR:-}" ] || return 0
  mkdir -p "$LORA_DIR"
  [ -n "${LORA_SRC:-}" ] && [ -d "$LORA_SRC" ] || return 0
  stamp=$(date +%s%N)
  for src in "$LORA_SRC"/*; do
    [ -f "$src/adapter_config.json" ] || continue
    name=$(basename "$src")
    build=".$name.$stamp"
    cp -al "$src" "$LORA_DIR/$build"
    rm -f "$LORA_DIR/$build/adapter_config.json"  # a link to the published file: written anew, not through it
    base=$(sed -n 's/.*"base_model_name_or_path"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$src/adapter_config.json")
    sed 's|"base_model_name_or_path"[[:space:]]*:[[:space:]]*"[^"]*"|"base_model_name_or_path": "'"$LOCAL_DIR"'"|' \
      "$src/adapter_config.json" > "$LORA_DIR/$build/adapter_config.json"
    if ! grep -qF "\"base_model_name_or_path\": \"$LOCAL_DIR\"" "$LORA_DIR/$build/adapter_config.json"; then
      # no such key, or a value this line-by-line rewrite cannot read (null, on the next line, an escaped quote)
      echo "adapter $name: could not point adapter_config.json's base_model_name_or_path at $LOCAL_DIR; skipped" \
        "(vLLM loads an adapter only when it names the engine's model)" >&2
      rm -rf "${LORA_DIR:?}/$build"
      continue
    fi
    link="$LORA_DIR/.$name.$stamp.link"  # this build's own name: a link a killed pod left never blocks another
    ln -s "$build" "$link"
    if [ -d "$LORA_DIR/$name" ] && [ ! -L "$LORA_DIR/$name" ]; then rm -rf "${LORA_DIR:?}/$name"; fi
    mv -T "$link" "$LORA_DIR/$name"
    echo "adapter $name: served on base $LOCAL_DIR (published for ${base:-?})"
  done
  # builds no link points at any more, and links a killed pod left, once older than STALE_LOCK_S (a build still
  # being made by a pod that also took over a stale lock is younger: never removed under it)
  now=$(date +%s)
  for d in "$LORA_DIR"/.*; do
    b=$(basename "$d")
    [ "$b" != . ] && [ "$b" != .. ] || continue
    [ $((now - $(stat -c %Y "$d" 2>/dev/null || echo "$now"))) -gt "$STALE_LOCK_S" ] || continue
    if [ -L "$d" ]; then rm -f "$d"; continue; fi  # a .link never renamed into place
    [ -d "$d" ] || continue
    used=0
    for l in "$LORA_DIR"/*; do
      if [ -L "$l" ] && [ "$(readlink "$l")" = "$b" ]; then used=1; break; fi
    done
    [ "$used" = 1 ] || rm -rf "${LORA_DIR:?}/$b"
  done
}

# Node-local locks (the weights copy's, the adapters'): a folder taken with mkdir (atomic), its holder writing a
# heartbeat file into it while held, aside and renamed into place so a reader never sees it empty. A lock whose
# heartbeat is older than STALE_LOCK_S was left by a killed pod and is taken over; one killed before its first
# heartbeat is dated by the folder's own mtime, so it goes stale like any other instead of being waited on forever.
beat() {  # beat LOCK
  date +%s > "$1/.heartbeat.$$" && mv -f "$1/.heartbeat.$$" "$1/heartbeat"
}

lock_age_s() {  # lock_age_s LOCK
  t=$(cat "$1/heartbeat" 2>/dev/null || true)
  case "$t" in
    ''|*[!0-9]*) t=$(stat -c %Y "$1" 2>/dev/null || date +%s) ;;  # no heartbeat yet: the lock's mtime
  esac
  echo $(( $(date +%s) - t ))
}

# take_lock LOCK WHAT [MARKER]: waits for a live holder for at most LOCK_WAIT_MAX_S (then exits 1, the kubelet
# retries); returns 1 without the lock when MARKER appears meanwhile (the holder finished the work). Once taken,
# its heartbeat runs in the background ($beater) until release_lock.
take_lock() {
  waited_s=0
  while ! mkdir "$1" 2>/dev/null; do
    if [ -n "${3:-}" ] && [ -f "$3" ]; then return 1; fi
    age=$(lock_age_s "$1")
    if [ "$age" -gt "$STALE_LOCK_S" ]; then
      echo "taking over a stale $2 lock (no heartbeat for ${age}s, limit ${STALE_LOCK_S}s)"
      rm -rf "$1"
      continue
    fi
    if [ "$waited_s" -ge "$LOCK_WAIT_MAX_S" ]; then
      echo "waited ${waited_s}s (LOCK_WAIT_MAX_S) for a neighbour's $2 of $LOCAL_DIR; giving up so the kubelet retries" >&2
      exit 1
    fi
    pause "$poll_s"
    waited_s=$((waited_s + poll_s))
  done
  held="$1"
  beat "$held"
  ( while sleep "$poll_s"; do beat "$held" 2>/dev/null || exit 0; done ) >/dev/null 2>&1 &
  beater=$!
  trap release_lock EXIT
}

release_lock() {
  kill "$beater" 2>/dev/null || true
  rm -rf "$held"
  trap - EXIT
}

# The adapters' copy and the resolver's folder, one pod of the node at a time (pods starting together on a node
# would otherwise sync into one folder and build the same adapters at once).
adapters_phase() {
  [ -n "${LORA_DIR:-}" ] || return 0
  take_lock "$LOCAL_DIR.adapters.lock" adapters
  if [ "${1:-}" = refresh ]; then refresh_adapters; fi
  lora_view
  release_lock
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
  adapters_phase refresh
  exit 0
fi
require_credentials

n=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
delay=$((n % (START_JITTER_S + 1)))
echo "start jitter: sleeping ${delay}s of at most ${START_JITTER_S}s"
pause "$delay"

# Replicas sharing a node share one copy: the first takes the lock, the others wait for its marker.
mkdir -p "$(dirname "$LOCAL_DIR")"
if ! take_lock "$LOCAL_DIR.lock" copy "$done_marker"; then
  echo "weights copied by a neighbour: $LOCAL_DIR"
  adapters_phase refresh
  exit 0
fi
if [ -f "$done_marker" ]; then
  release_lock
  adapters_phase refresh
  exit 0
fi

s3_sync "$WEIGHTS_URI" "$LOCAL_DIR"
if [ -z "$(ls -A "$LOCAL_DIR" 2>/dev/null)" ]; then
  echo "no weights under $WEIGHTS_URI: has replication from the source bucket run?" >&2
  exit 1
fi
check_complete
# the copy on disk before the marker says so: aws-cli renames each file into place but never fsyncs, so after a
# hard reboot (instance store survives one) files could come back empty under a marker every pod trusts
sync -f "$LOCAL_DIR/SHA256SUMS"
touch "$done_marker"
sync -f "$done_marker"
echo "weights copied: $WEIGHTS_URI -> $LOCAL_DIR"
release_lock
adapters_phase
