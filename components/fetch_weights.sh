#!/bin/sh
# Init container of a vLLM floor replica: copy one model revision from the region-local weight cache
# (S3, through the VPC gateway endpoint) to the node's NVMe, once per node. Never a model hub.
#   WEIGHTS_URI      s3://<regional bucket>/<model prefix>/
#   LOCAL_DIR        node-local copy the engine serves from
#   START_JITTER_S   random delay before pulling, so a scale-up step does not hit the shared path at once
#   STALE_LOCK_MIN   a copy lock older than this was left by a killed pod and is taken over
set -eu
done_marker="$LOCAL_DIR/.complete"
if [ -f "$done_marker" ]; then
  echo "weights already on this node: $LOCAL_DIR"
  exit 0
fi

n=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
delay=$((n % (START_JITTER_S + 1)))
echo "start jitter: sleeping ${delay}s of at most ${START_JITTER_S}s"
sleep "$delay"

# replicas sharing a node share one copy: the first takes the lock, the others wait for its marker
mkdir -p "$(dirname "$LOCAL_DIR")"
lock="$LOCAL_DIR.lock"
while ! mkdir "$lock" 2>/dev/null; do
  if [ -f "$done_marker" ]; then
    echo "weights copied by a neighbour: $LOCAL_DIR"
    exit 0
  fi
  since=$(cat "$lock/since" 2>/dev/null || echo 0)
  if [ "$since" -gt 0 ] && [ $(( $(date +%s) - since )) -gt $((STALE_LOCK_MIN * 60)) ]; then
    echo "taking over a stale copy lock"
    rm -rf "$lock"
  fi
  sleep 5
done
trap 'rm -rf "$lock"' EXIT
date +%s > "$lock/since"
if [ -f "$done_marker" ]; then
  exit 0
fi

aws s3 sync --only-show-errors --no-progress "$WEIGHTS_URI" "$LOCAL_DIR"
if [ -z "$(ls -A "$LOCAL_DIR")" ]; then
  echo "no weights under $WEIGHTS_URI: has replication from the source bucket run?" >&2
  exit 1
fi
touch "$done_marker"
echo "weights copied: $WEIGHTS_URI -> $LOCAL_DIR"
