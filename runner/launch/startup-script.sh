#!/bin/bash
# tpu-runner bootstrap for Cloud TPU VMs.
#
# The runner renders the values block below from the job spec (runner/bootstrap.py) and passes the result as the
# node's `startup-script` metadata. Cloud TPU runs it as root on every worker (host) of the slice at boot. It pulls
# the job's image, runs it with the flags a TPU VM needs, records what happened in the run directory on Cloud
# Storage, and deletes the node when the job is over, so that the node never idles on the bill, even when the
# runner that submitted it is gone. It needs only bash, curl, base64 and docker, which every TPU VM image has.
#
# Every value in the block is single-quoted by the renderer: nothing from a spec is ever parsed as shell.
set -uo pipefail

# --- values (rendered by runner/bootstrap.py) ---
RUN_ID=''
RUN_DIR=''
IMAGE=''
PROJECT=''
ZONE=''
NODE=''
SELF_DELETE='tpu-node'
JOB_WORKERS='all'
NUM_WORKERS='1'
SLICES='1'
HOSTS='1'
DELETE_ON_EXIT='never'
DEADLINE='0'
CONTAINER='tpu-runner-job'
SAFETY_STOP='124'
STOP_S='87'
JOB_ENV_B64=''
SECRETS=''
# --- end values ---

# Endpoints: the real services on a TPU VM; the TPU API emulator points them at itself to rehearse a run.
METADATA_URL="${RUNNER_METADATA_URL:-http://metadata.google.internal/computeMetadata/v1}"
TPU_API="${RUNNER_TPU_API:-https://tpu.googleapis.com}"
COMPUTE_API="${RUNNER_COMPUTE_API:-https://compute.googleapis.com}"
STORAGE_API="${RUNNER_STORAGE_API:-https://storage.googleapis.com}"
WORKDIR="${TMPDIR:-/tmp}/tpu-runner/${RUN_ID}"
BUCKET="${RUN_DIR#gs://}"
BUCKET="${BUCKET%%/*}"
PREFIX="${RUN_DIR#gs://"${BUCKET}"}"
PREFIX="${PREFIX#/}"

log() { printf '[bootstrap] %s\n' "$*" >&2; }

# Percent-encode one string byte by byte (object names go into URLs).
urlencode() {
  local LC_ALL=C s="$1" out="" c i
  for ((i = 0; i < ${#s}; i++)); do
    c="${s:i:1}"
    case "$c" in
      [a-zA-Z0-9.~_-]) out+="$c" ;;
      *) out+=$(printf '%%%02X' "'$c") ;;
    esac
  done
  printf '%s' "$out"
}

# json_str VAR STRING: into VAR, STRING as a JSON string literal (quotes, backslashes and control characters
# escaped); set in this shell, like `now`.
json_str() {
  local s="$2"
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  s="${s//$'\n'/ }"
  s="${s//$'\r'/ }"
  s="${s//$'\t'/ }"
  printf -v "$1" '"%s"' "$s"
}

metadata() { curl -sf --retry 5 --retry-connrefused -H 'Metadata-Flavor: Google' "${METADATA_URL}/$1"; }

token() { metadata instance/service-accounts/default/token | sed -n 's/.*"access_token" *: *"\([^"]*\)".*/\1/p'; }

# put KEY FILE [QUERY]: upload a file to the run directory (Cloud Storage JSON API, simple upload); QUERY adds
# parameters such as a precondition.
PUT_OPTS=()  # more curl options for put: a bound where a wait would cost more than a lost upload
put() {
  curl -sf --retry 5 "${PUT_OPTS[@]}" -X POST -H "Authorization: Bearer $(token)" -H 'Content-Type: application/octet-stream' \
    --data-binary @"$2" \
    "${STORAGE_API}/upload/storage/v1/b/${BUCKET}/o?uploadType=media&name=$(urlencode "${PREFIX}/$1")${3:+&$3}" \
    >/dev/null
}

# get KEY FILE: download an object of the run directory; fails when there is none.
get() {
  curl -sf --retry 5 -o "$2" -H "Authorization: Bearer $(token)" \
    "${STORAGE_API}/storage/v1/b/${BUCKET}/o/$(urlencode "${PREFIX}/$1")?alt=media"
}

# exists KEY: 0 when the object is in the run directory, 1 when Cloud Storage says it is not (404), 2 when it
# would not say (5xx after the retries, no network). Only a 404 may be taken for "missing": taking any failed
# check for it would overwrite the job's own exit record.
exists() {
  local code
  code="$(curl -s --retry 5 -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $(token)" \
    "${STORAGE_API}/storage/v1/b/${BUCKET}/o/$(urlencode "${PREFIX}/$1")")"
  case "$code" in
    200) return 0 ;;
    404) return 1 ;;
    *) return 2 ;;
  esac
}

# now VAR: the VM's time into VAR, never empty (an event line without its time is not JSON): whole seconds, else
# bash's own clock, if date fails. Set in this shell, not printed into a $(...): a VM shutting down sends SIGTERM to
# every process on it, and a subshell dies of it where the script (it traps TERM) goes on with an empty time.
now() {
  local t
  t=$(date +%s.%N 2>/dev/null | cut -c1-14)
  [ -n "$t" ] || t=$(date +%s 2>/dev/null)
  printf -v "$1" '%s' "${t:-${EPOCHREALTIME%%.*}}"
}

# event NAME [JSON_FIELDS]: append to this worker's own event file and upload it (one writer per object).
event() {
  event_line "$@"
  put_events
}

# event_line NAME [FIELDS]: the event on this disk only; the next put_events (every event() does one) carries it.
event_line() {
  local at
  now at
  printf '{"time": %s, "source": "bootstrap-%s", "event": "%s"%s}\n' "$at" "$WORKER" "$1" "${2:+, $2}" \
    >>"${WORKDIR}/events.jsonl"
}

put_events() {
  put "events/bootstrap-${WORKER}.jsonl" "${WORKDIR}/events.jsonl" || log "could not upload events"
}

# write_exit STATE CODE MESSAGE: the exit record, when the container could not write its own. ifGenerationMatch=0:
# Cloud Storage refuses it if a record is there after all, so the job's own is never replaced.
write_exit() {
  local at error
  now at
  json_str error "$3"
  printf '{"worker": %s, "state": "%s", "exit_code": %s, "started_at": %s, "finished_at": %s, "error": %s, "tail": []}\n' \
    "$WORKER" "$1" "$2" "$STARTED" "$at" "$error" >"${WORKDIR}/exit.json"
  put "exit/worker-${WORKER}.json" "${WORKDIR}/exit.json" ifGenerationMatch=0 ||
    log "did not upload an exit record (one is there already, or Cloud Storage refused it)"
}

# others_exited: how many of the other workers' exit records the run directory holds, from one listing of exit/ (a
# page per 1,000 names), never one request per worker; fails when Cloud Storage would not answer.
others_exited() {
  local page token="" count=0 url
  url="${STORAGE_API}/storage/v1/b/${BUCKET}/o?prefix=$(urlencode "${PREFIX:+${PREFIX}/}exit/")"
  url+="&fields=items(name),nextPageToken"
  while :; do
    page="$(curl -sf --retry 5 -H "Authorization: Bearer $(token)" "${url}${token:+&pageToken=$(urlencode "$token")}")" ||
      return 1
    count=$((count + $(printf '%s' "$page" | grep -o '"name": *"[^"]*exit/worker-[0-9]*\.json"' |
      grep -vc "exit/worker-${WORKER}\.json\"\$")))
    token="$(printf '%s' "$page" | sed -n 's/.*"nextPageToken": *"\([^"]*\)".*/\1/p' | head -n 1)"
    [ -n "$token" ] || break
  done
  printf '%s' "$count"
}

# What this VM deletes when its job is over (SELF_DELETE): its Cloud TPU node, its Compute Engine instance, or its
# slice's managed instance group (whose VMs go with it; the group's template and workload policy bill nothing and
# cannot go while the group exists: the runner or `runner gc` deletes them).
self_url() {
  case "$SELF_DELETE" in
    compute-instance) printf '%s/compute/v1/projects/%s/zones/%s/instances/%s' "$COMPUTE_API" "$PROJECT" "$ZONE" "$NODE" ;;
    compute-group)
      printf '%s/compute/v1/projects/%s/zones/%s/instanceGroupManagers/%s' "$COMPUTE_API" "$PROJECT" "$ZONE" "$NODE" ;;
    *) printf '%s/v2/projects/%s/locations/%s/nodes/%s' "$TPU_API" "$PROJECT" "$ZONE" "$NODE" ;;
  esac
}

# finish CODE: the first host of each slice deletes its node when the policy says so (after every worker of every
# slice has an exit record: one listing says how many the others have, listed again every second while some are
# missing, up to 10 minutes). SAFETY_STOP (124) is a safety stop (max_runtime, a hang, the runner lost): the node
# goes even under on_success.
finish() {
  local rc="$1" delete="" since found others=$((NUM_WORKERS - 1))
  if [ "$HOST" = 0 ]; then
    case "$DELETE_ON_EXIT" in
      always) delete=1 ;;
      on_success) [ "$rc" = 0 ] || [ "$rc" = "$SAFETY_STOP" ] && delete=1 ;;
    esac
  fi
  if [ -n "$delete" ]; then
    if [ "$JOB_WORKERS" = all ] && [ "$NUM_WORKERS" -gt 1 ]; then
      since=$SECONDS
      while found="$(others_exited)" || found=0; [ "$found" -lt "$others" ] && [ $((SECONDS - since)) -lt 600 ]; do
        sleep 1
      done
    fi
    event delete_requested "\"exit_code\": ${rc}"
    curl -sf --retry 5 -X DELETE -H "Authorization: Bearer $(token)" "$(self_url)" >/dev/null ||
      log "could not delete ${NODE}; the runner or \`runner gc\` will"
  fi
  exit "$rc"
}

mkdir -p "$WORKDIR"
now STARTED
HOST="$(metadata instance/attributes/agent-worker-number || echo 0)"  # this host's number within its slice
WORKER="$HOST"
# tpu_env KEY: a value of the VM's tpu-env metadata (KEY: 'value' lines), as JAX's cloud_tpu_cluster reads it.
tpu_env() { printf '%s\n' "$TPU_ENV" | sed -n "s/^$1: *'\{0,1\}\([^']*\)'\{0,1\} *\$/\1/p" | head -n 1; }
if [ "$SLICES" -gt 1 ]; then
  # Multislice: Cloud TPU gives each VM its slice in tpu-env (MEGASCALE_SLICE_ID; JAX's MultisliceGceTpuCluster
  # numbers processes slice by slice the same way), and the worker id is global: slice s, host h -> s * HOSTS + h.
  TPU_ENV="$(metadata instance/attributes/tpu-env || true)"
  SLICE_ID="$(tpu_env MEGASCALE_SLICE_ID)"
  case "$SLICE_ID" in
    '' | *[!0-9]*)
      log "no MEGASCALE_SLICE_ID in this VM's tpu-env: it is not a slice of a multislice; the job cannot start"
      exit 2 ;;
  esac
  WORKER=$((SLICE_ID * HOSTS + HOST))
  NODE="$(metadata instance/attributes/instance-id || printf '%s' "$NODE")"  # each slice is a node of its own
fi
# A recreated node (after a preemption) starts with an empty disk: carry on the events of the earlier boots.
get "events/bootstrap-${WORKER}.jsonl" "${WORKDIR}/events.jsonl" || rm -f "${WORKDIR}/events.jsonl"
declare host_json
json_str host_json "$(hostname)"
event bootstrap_started "\"worker\": ${WORKER}, \"host\": ${host_json}"

if [ "$JOB_WORKERS" != all ] && [ "$WORKER" != "$JOB_WORKERS" ]; then
  log "worker ${WORKER} serves the TPU runtime; the job runs on worker ${JOB_WORKERS}"
  event idle_worker
  exit 0
fi

printf '%s' "$JOB_ENV_B64" | base64 -d >"${WORKDIR}/job.env"
# The supervisor's stop grace agrees with the container's: the platform's grace, less what this script needs after.
printf 'RUNNER_WORKER_ID=%s\nRUNNER_GRACE_S=%s\n' "$WORKER" "$STOP_S" >>"${WORKDIR}/job.env"
if [ "$SLICES" -gt 1 ]; then
  # What a multislice job needs to join the slices, as Cloud TPU sets it in tpu-env (JAX reads these names from the
  # environment first, then from tpu-env: jax/_src/clusters/cloud_tpu_cluster.py; the same four are what GKE
  # (cloud.google.com/kubernetes-engine/docs/how-to/tpu-multislice) and Ray's TPU support give every worker).
  for key in MEGASCALE_COORDINATOR_ADDRESS MEGASCALE_NUM_SLICES MEGASCALE_SLICE_ID MEGASCALE_PORT; do
    value="$(tpu_env "$key")"
    [ -n "$value" ] && printf '%s=%s\n' "$key" "$value" >>"${WORKDIR}/job.env"
  done
  printf 'RUNNER_TPU_NAME=%s\nRUNNER_HOSTS_PER_SLICE=%s\n' "$NODE" "$HOSTS" >>"${WORKDIR}/job.env"
fi

# --- secrets ------------------------------------------------------------------------------------------------
# Each line of SECRETS is "NAME AS VERSION": the job's variable, env or file, and a Secret Manager version. Each is
# read with this VM's own service account (its token from the metadata server, then Secret Manager's access over
# REST), its payload checked against its CRC32C, and kept only on a memory file system (tmpfs), readable by root
# and the job alone; the job gets it by a Docker env file or a read-only mount of the file (at the same path, which
# NAME then holds). No value goes into an event, a log line, an argument list or a disk; xtrace stays off here.
SECRETMANAGER_API="${RUNNER_SECRETMANAGER_API:-https://secretmanager.googleapis.com}"
SECRETS_DIR="${RUNNER_SECRETS_DIR:-/run/tpu-runner-secrets}/${RUN_ID}"
SECRET_ARGS=()

# crc32c FILE: the CRC32C (Castagnoli) of FILE's bytes, in decimal, as Secret Manager's payload.dataCrc32c.
crc32c() {
  local -a table
  local i j c crc=4294967295 byte
  for ((i = 0; i < 256; i++)); do
    c=$i
    for ((j = 0; j < 8; j++)); do
      if ((c & 1)); then c=$(((c >> 1) ^ 0x82F63B78)); else c=$((c >> 1)); fi
    done
    table[i]=$c
  done
  for byte in $(od -An -v -tu1 "$1"); do
    crc=$((table[(crc ^ byte) & 255] ^ (crc >> 8)))
  done
  printf '%s' $((crc ^ 4294967295))
}

secrets_forget() { rm -rf "$SECRETS_DIR"; }

# secret_failed NAME VERSION WHY: the job cannot start without its secret; say why (never a value), and end.
secret_failed() {
  local name_json version_json
  secrets_forget
  json_str name_json "$1"
  json_str version_json "$2"
  event secret_unreadable "\"secret\": ${name_json}, \"version\": ${version_json}"
  write_exit failed 78 "secret $1 ($2) could not be read on the VM: $3"
  finish 78
}

# fetch_secret NAME AS VERSION: one secret into SECRETS_DIR, and what hands it to the container.
fetch_secret() {
  local name="$1" as="$2" version="$3" code message data sum crc lines response="${SECRETS_DIR}/.response"
  local file="${SECRETS_DIR}/${name}" secret="${3#projects/*/secrets/}" project="${3#projects/}"
  secret="${secret%%/*}"
  project="${project%%/*}"
  code="$(curl -s --retry 5 -o "$response" -w '%{http_code}' -H @"${SECRETS_DIR}/.auth" \
    "${SECRETMANAGER_API}/v1/${version}:access")"
  if [ "$code" != 200 ]; then
    message="$(tr -d '\n' <"$response" 2>/dev/null | sed -n 's/.*"message" *: *"\([^"]*\)".*/\1/p')"
    rm -f "$response"
    [ "$code" = 403 ] && message="${message}; to grant it: gcloud secrets add-iam-policy-binding ${secret} \
--project ${project} --member=serviceAccount:${SECRETS_ACCOUNT} --role=roles/secretmanager.secretAccessor"
    secret_failed "$name" "$version" "HTTP ${code}: ${message:-no answer from Secret Manager}"
  fi
  data="$(tr -d ' \n' <"$response" | sed -n 's/.*"data":"\([A-Za-z0-9+\/=_-]*\)".*/\1/p' | tr '_-' '/+')"
  sum="$(tr -d ' \n' <"$response" | sed -n 's/.*"dataCrc32c":"\{0,1\}\([0-9]*\).*/\1/p')"
  rm -f "$response"
  printf '%s' "$data" | base64 -d >"$file" 2>/dev/null || secret_failed "$name" "$version" "its payload is not base64"
  crc="$(crc32c "$file")"
  [ -n "$sum" ] && [ "$crc" = "$sum" ] ||
    secret_failed "$name" "$version" "its payload does not match its CRC32C (damaged in transit): not used"
  if [ "$as" = file ]; then
    if [ -n "$SECRETS_GID" ]; then
      chgrp "$SECRETS_GID" "$file" && chmod 0440 "$file"
    fi
    SECRET_ARGS+=(-v "${file}:${file}:ro")
    printf '%s=%s\n' "$name" "$file" >>"${SECRETS_DIR}/env"
    return
  fi
  # An environment variable holds one line (the env file has one a line): a final line break is dropped.
  lines="$(tr -cd '\n' <"$file" | wc -c)"
  if [ "$(tr -cd '\000' <"$file" | wc -c)" != 0 ] || [ "$lines" -gt 1 ] ||
    { [ "$lines" = 1 ] && [ -n "$(tail -c 1 "$file")" ]; }; then
    secret_failed "$name" "$version" "it holds a line break or a NUL, which an environment variable cannot: use as: file"
  fi
  { printf '%s=' "$name" && cat "$file" && [ "$lines" = 1 ] || printf '\n'; } >>"${SECRETS_DIR}/env"
  rm -f "$file"
}

# fetch_secrets: every secret of SECRETS, before the container starts.
fetch_secrets() {
  local base="${SECRETS_DIR%/*}" fs name as version names="" gid=61000 mask
  [ -n "$SECRETS" ] || return 0
  { set +x; } 2>/dev/null
  mask="$(umask)"
  umask 077
  mkdir -p "$base"
  fs="$(stat -f -c %T "$base" 2>/dev/null)"
  if [ "$fs" != tmpfs ] && [ "$fs" != ramfs ]; then
    mount -t tmpfs -o size=4m,mode=0700 tmpfs "$base" 2>/dev/null ||
      secret_failed "${SECRETS%% *}" "-" "no memory file system (tmpfs) at ${base} to keep it in"
  fi
  mkdir -p "$SECRETS_DIR"
  # As root (a real VM), a file secret belongs to a group of its own that only the container joins (--group-add),
  # whatever user the image runs as; a bootstrap not run as root (the emulator's VMs) keeps it its own.
  SECRETS_GID=""
  if [ "$(id -u)" = 0 ]; then
    while getent group "$gid" >/dev/null; do gid=$((gid + 1)); done
    SECRETS_GID="$gid"
  fi
  SECRETS_ACCOUNT="$(metadata instance/service-accounts/default/email || echo 'the VM service account')"
  printf 'Authorization: Bearer %s\n' "$(token)" >"${SECRETS_DIR}/.auth"
  while read -r name as version; do
    [ -n "$name" ] || continue
    fetch_secret "$name" "$as" "$version"
    names+="${names:+, }\"${name}\""
  done <<<"$SECRETS"
  rm -f "${SECRETS_DIR}/.auth"
  SECRET_ARGS+=(--env-file "${SECRETS_DIR}/env")
  if [ -n "$SECRETS_GID" ] && grep -q ' file ' <<<"$SECRETS"; then
    SECRET_ARGS+=(--group-add "$SECRETS_GID")
  fi
  umask "$mask"
  event secrets_read "\"secrets\": [${names}]"
}
# --- end secrets --------------------------------------------------------------------------------------------

REGISTRY="${IMAGE%%/*}"
case "$REGISTRY" in
  *-docker.pkg.dev | gcr.io | *.gcr.io)
    token | docker login -u oauth2accesstoken --password-stdin "https://${REGISTRY}" >/dev/null ||
      log "docker login to ${REGISTRY} failed" ;;
esac

pulled=""
for attempt in 1 2 3; do
  if docker pull "$IMAGE"; then
    pulled=1
    break
  fi
  log "docker pull failed (attempt ${attempt})"
  sleep $((attempt * 2))
done
if [ -z "$pulled" ]; then
  declare image_json
  json_str image_json "$IMAGE"
  event image_pull_failed "\"image\": ${image_json}"
  write_exit failed 125 "docker pull ${IMAGE} failed: does the image exist, and may the VM's service account read it?"
  finish 125
fi

fetch_secrets

# --privileged: the container opens the TPU chips (/dev/accel*, /dev/vfio); --net=host: the hosts of a pod slice
# reach each other and the metadata server as the VM does; --stop-timeout: whoever stops the container (this script,
# or Docker itself as the VM shuts down) gives the job the platform's grace (STOP_S), not Docker's default 10 s.
event container_started
docker run --rm --name "$CONTAINER" --privileged --net=host --stop-timeout "$STOP_S" --env-file "${WORKDIR}/job.env" \
  ${SECRET_ARGS[@]+"${SECRET_ARGS[@]}"} "$IMAGE" &
child=$!

# The job stops itself at its deadline; if it cannot (hung, its supervisor gone), this backstop stops it 5 minutes
# later, and the node is deleted below. It runs as a process group of its own (set -m while it starts), so that it
# is stopped whole, its `sleep` too, whenever that started: killing the subshell alone could leave the sleep running
# with the script's output open (seen on a loaded machine).
delay=$((DEADLINE - $(date +%s) + 300))
[ "$delay" -lt 0 ] && delay=0
set -m
(
  sleep "$delay" &&
    touch "${WORKDIR}/watchdog-fired" &&
    log "the run's deadline passed 5 minutes ago: stopping the container" &&
    docker stop --time "$STOP_S" "$CONTAINER" >/dev/null 2>&1
) &
watchdog=$!
set +m

# A shutdown (preemption, maintenance, the node deleted) sends SIGTERM, and so does a notice of one (below): stop the
# container so that the job saves and records its state, and leave the node alone: it is not the job's end, and the
# runner decides (recreate after a preemption, or delete).
shutdown=""
trap '[ -n "$shutdown" ] || { shutdown=1; docker stop --time "$STOP_S" "$CONTAINER" >/dev/null 2>&1; }' TERM INT

# notice KEY PATTERN EVENT: watch instance/KEY on the metadata server until its value matches PATTERN, then stop the
# job at once (SIGTERM to this script) and record EVENT. The platform's grace runs from the notice (a Spot VM is
# powered off 30 s after instance/preempted turns TRUE), so the job hears of it now, not when the shutdown reaches
# this script. wait_for_change with the value's ETag: the server answers when the value changes, and a change
# between two requests is answered at once. A key the server does not have (404) is not watched.
notice() {
  local etag=none code value
  while :; do
    code="$(curl -s -o "${WORKDIR}/$3.value" -D "${WORKDIR}/$3.headers" -w '%{http_code}' \
      -H 'Metadata-Flavor: Google' "${METADATA_URL}/instance/$1?wait_for_change=true&timeout_sec=300&last_etag=${etag}")"
    case "$code" in
      200) ;;
      404) log "the metadata server has no instance/$1: not watched"; return ;;
      *) sleep 5; continue ;;
    esac
    value="$(cat "${WORKDIR}/$3.value")"
    # shellcheck disable=SC2254  # PATTERN is a pattern
    case "$value" in $2) break ;; esac
    etag="$(sed -n 's/^[Ee][Tt][Aa][Gg]: *\([0-9A-Za-z_-]*\).*/\1/p' "${WORKDIR}/$3.headers")"
    sleep 1  # a server that answers at once (no wait_for_change) is not asked in a busy loop
  done
  log "instance/$1 is ${value}: stopping the job, with ${STOP_S}s to save"
  local value_json
  json_str value_json "$value"
  # Up in the run directory before the stop: an exit record the stop brings about is then never there without the
  # notice that explains it (the runner would take the job's stop for its end and not recreate the machine). The
  # upload is bounded, as the grace runs; if it fails, container_exited's upload carries the line from this disk.
  event_line "$3" "\"value\": ${value_json}, \"grace_s\": ${STOP_S}"
  PUT_OPTS=(--max-time 3 --retry-max-time 3)
  put_events
  kill -TERM "$$"
}
notices=()
set -m
notice preempted TRUE preemption_notice &
notices+=("$!")
notice maintenance-event 'TERMINATE*' maintenance_notice &
notices+=("$!")
set +m
rc=0
wait "$child" || rc=$?
while kill -0 "$child" 2>/dev/null; do
  rc=0
  wait "$child" || rc=$?
done
kill -- -"$watchdog" 2>/dev/null
for pid in "${notices[@]}"; do kill -- -"$pid" 2>/dev/null; done
secrets_forget
[ -e "${WORKDIR}/watchdog-fired" ] && rc="$SAFETY_STOP"
event container_exited "\"exit_code\": ${rc}${shutdown:+, \"shutdown\": true}"
found=0
exists "exit/worker-${WORKER}.json" || found=$?
case "$found" in
  1) [ -n "$shutdown" ] || write_exit failed "$rc" "the container exited with ${rc} before writing its exit record" ;;
  2) log "could not check for this worker's exit record; it is left as it is" ;;
esac
if [ -n "$shutdown" ]; then
  log "the VM is shutting down (preemption or maintenance): the node is left to the runner"
  exit "$rc"
fi
finish "$rc"
