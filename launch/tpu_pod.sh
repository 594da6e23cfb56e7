#!/usr/bin/env bash
# Runs one nsl config on every worker of a Cloud TPU VM pod slice (docs/guide/pods.md). Usage:
#   launch/tpu_pod.sh CONFIG WORKDIR [--config.a.b=v ...] [launcher flags]
# CONFIG is relative to this checkout (configs/sps.py:standard_xl); WORKDIR is gs://BUCKET/... or an
# absolute path on storage every worker mounts: all hosts write checkpoint shards there.
# Environment: TPU_NAME and ZONE (required), PROJECT (optional gcloud project), NSL_SETUP (a
#   command run on every worker in the code directory instead of the default environment setup),
#   NSL_STALE_GRACE (seconds a stale TPU holder gets to exit after SIGTERM, default 30),
#   NSL_DRY_RUN=1 (print the gcloud commands instead of running them).
# What it does, as MaxText's multihost runner does:
#  1. ships this checkout's code -- the files git would commit (`git ls-files -co --exclude-standard`)
#     -- as a reproducible archive named by its content hash, copied to every worker and unpacked
#     into ~/nsl-code/<hash> (the same code unpacks once; nothing runs from ~/nsl);
#  2. on every worker, creates ~/nsl-code/<hash>/.venv with uv (`pip install --user uv`): a managed
#     CPython 3.11 where the image's python3 is older, and `uv pip install -e '.[tpu]'` (uv's cache
#     makes a new code hash's environment cheap); once per code hash;
#  3. stops a stale holder of the TPU left by an earlier run (a process with /dev/accel* or /dev/vfio
#     open, or a trainer started from ~/nsl-code or ~/nsl): SIGTERM (nsl checkpoints and exits),
#     SIGKILL after NSL_STALE_GRACE s -- libtpu would otherwise refuse the busy chips;
#  4. runs `python -m nsl.launch --distributed=auto` (JAX detects the pod) on every worker through
#     `nsl.scaling.task`, which keeps each worker's output in WORKDIR/logs/worker<N>.log.
set -euo pipefail
. "$(dirname "$0")/common.sh"
need_args 2 "TPU_NAME=... ZONE=... $0 CONFIG WORKDIR [--config.a.b=v ...]" "$@"
: "${TPU_NAME:?set TPU_NAME to the TPU VM name}"
: "${ZONE:?set ZONE to the TPU VM zone}"
config=$1 workdir=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
case $workdir in
  gs://* | /*) ;;
  *) echo "$0: WORKDIR must be gs://BUCKET/... or an absolute path every worker mounts, got '$workdir'" >&2; exit 2 ;;
esac
case $config in "$root"/*) config=${config#"$root"/} ;; esac  # the workers' copy is elsewhere

# -- 1. the code archive ---------------------------------------------------------------------------
if ! git -C "$root" rev-parse --show-toplevel >/dev/null 2>&1; then
  echo "$0: $root is not a git checkout: the script ships the checkout it lives in" >&2
  exit 2
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
(cd "$root" && git ls-files -co --exclude-standard -z |
  while IFS= read -r -d '' f; do if [ -f "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi; done |
  tar --null -T - --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu -cf "$scratch/code.tar")
hash=$(sha256sum "$scratch/code.tar" | cut -c1-16)
archive="nsl-code-$hash.tar.gz"
gzip -n -c "$scratch/code.tar" >"$scratch/$archive"

# -- 2-3. the worker's preparation -----------------------------------------------------------------
default_setup='if [ ! -f .venv/.nsl-ready ]; then
  export PATH="$HOME/.local/bin:$PATH"
  command -v uv >/dev/null || python3 -m pip install -q --user uv ||
    python3 -m pip install -q --user --break-system-packages uv
  rm -rf .venv && uv venv -q --python 3.11 .venv
  uv pip install -q --python .venv/bin/python -e ".[tpu]"
  touch .venv/.nsl-ready
fi'
setup=${NSL_SETUP:-$default_setup}

# Runs on every worker (bash -c): unpack, set up, stop a stale TPU holder. Values enter as %q words.
prepare=$(printf 'set -euo pipefail; hash=%q; grace=%q; setup=%q\n' "$hash" "${NSL_STALE_GRACE:-30}" "$setup")
prepare+='
say() { echo "tpu_pod.sh [$(hostname)]: $*" >&2; }
code="$HOME/nsl-code/$hash" archive="$HOME/nsl-code-$hash.tar.gz"
if [ ! -f "$code/.nsl-unpacked" ]; then
  rm -rf "$code.part" && mkdir -p "$code.part" && tar -xzf "$archive" -C "$code.part"
  rm -rf "$code" && mv "$code.part" "$code" && touch "$code/.nsl-unpacked"
fi
rm -f "$archive"
cd "$code"
eval "$setup"
ancestors=" "; p=$$
while [ "${p:-0}" -gt 1 ]; do ancestors+="$p "; p=$(awk "/^PPid:/{print \$2}" /proc/$p/status 2>/dev/null || echo 0); done
stale() {  # pid<TAB>why, one a line: trainers this script (or its ~/nsl predecessor) started, TPU device holders
  local p cwd devs=()
  for p in $(pgrep -f -- "-m nsl[.](launch|scaling[.]task)( |$)" || true); do
    cwd=$(readlink "/proc/$p/cwd" 2>/dev/null) || continue
    case $cwd in "$HOME"/nsl-code/* | "$HOME"/nsl | "$HOME"/nsl/*) printf "%s\tan nsl trainer left running in %s\n" "$p" "$cwd" ;; esac
  done
  shopt -s nullglob; devs=(/dev/accel* /dev/vfio/[0-9]*); shopt -u nullglob
  if [ ${#devs[@]} -gt 0 ]; then
    for p in $( (sudo -n lsof -t "${devs[@]}" 2>/dev/null || lsof -t "${devs[@]}" 2>/dev/null || true) | sort -u); do
      printf "%s\tholds the TPU (%s)\n" "$p" "${devs[*]}"
    done
  fi
}
pids=""
while IFS=$'"'"'\t'"'"' read -r p why; do
  case "$ancestors $pids " in *" $p "*) continue ;; esac
  say "stopping stale TPU holder $p ($(tr "\0" " " </proc/$p/cmdline 2>/dev/null | cut -c1-160)): $why"
  kill -TERM "$p" 2>/dev/null || sudo -n kill -TERM "$p" 2>/dev/null || true
  pids+=" $p"
done < <(stale)
for p in $pids; do
  for _ in $(seq "$grace"); do kill -0 "$p" 2>/dev/null || break; sleep 1; done
  if kill -0 "$p" 2>/dev/null; then
    say "stale TPU holder $p ignored SIGTERM for ${grace} s: SIGKILL"
    kill -KILL "$p" 2>/dev/null || sudo -n kill -KILL "$p" 2>/dev/null || true
  fi
done'

# -- 4. the run ------------------------------------------------------------------------------------
args=$(printf ' %q' "--config=$config" "--workdir=$workdir" --distributed=auto "$@")
worker='${TPU_WORKER_ID:-$(curl -sf -m 5 -H "Metadata-Flavor: Google" http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number || hostname)}'
run=$(printf 'set -euo pipefail; cd "$HOME/nsl-code/"%q; i=%s; ' "$hash" "$worker")
run+="exec .venv/bin/python -m nsl.scaling.task $(printf '%q' "--workdir=$workdir") --name=\"worker\$i\" -- "
run+=".venv/bin/python -m nsl.launch$args"

where=(--zone="$ZONE")
if [ -n "${PROJECT:-}" ]; then where+=(--project="$PROJECT"); fi
copy=(gcloud compute tpus tpu-vm scp "$scratch/$archive" "$TPU_NAME:$archive" "${where[@]}" --worker=all)
ready=(gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${where[@]}" --worker=all --command="$prepare")
launch=(gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${where[@]}" --worker=all --command="$run")
if [ "${NSL_DRY_RUN:-0}" = 1 ]; then
  for cmd in copy ready launch; do
    declare -n c=$cmd
    printf '%q ' "${c[@]}"; echo
  done
  exit 0
fi
echo "tpu_pod.sh: code $hash to every worker of $TPU_NAME; logs in $workdir/logs/worker<N>.log" >&2
"${copy[@]}"
"${ready[@]}"
rm -rf "$scratch"
trap - EXIT
exec "${launch[@]}"  # a signal to this script reaches gcloud, which ends the workers' sessions
