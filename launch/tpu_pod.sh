#!/usr/bin/env bash
# Runs one nsl config on every worker of a Cloud TPU VM pod slice. Usage:
#   launch/tpu_pod.sh CONFIG WORKDIR [--config.a.b=v ...]
# Environment: TPU_NAME (required), ZONE (required), PROJECT (optional gcloud project),
#   NSL_REPO_DIR (the checkout on the workers, default ~/nsl), NSL_SETUP (a command run first on
#   every worker, default: create .venv and `pip install -e .[tpu]` there when missing),
#   NSL_DRY_RUN=1 (print the gcloud command instead of running it).
# JAX detects the pod itself (`--distributed=auto`). WORKDIR must be a POSIX path on storage
# every worker mounts (a Filestore/NFS share or a gcsfuse-mounted bucket): all hosts write their
# checkpoint shards and data-iterator states there; process 0 writes the records.
set -euo pipefail
. "$(dirname "$0")/common.sh"
need_args 2 "TPU_NAME=... ZONE=... $0 CONFIG WORKDIR [--config.a.b=v ...]" "$@"
: "${TPU_NAME:?set TPU_NAME to the TPU VM name}"
: "${ZONE:?set ZONE to the TPU VM zone}"
config=$1 workdir=$2
shift 2
repo=${NSL_REPO_DIR:-\~/nsl}
setup=${NSL_SETUP:-"[ -x .venv/bin/python ] || (python3 -m venv .venv && .venv/bin/pip install -q -e '.[tpu]')"}
args=$(printf ' %q' "--config=$config" "--workdir=$workdir" --distributed=auto "$@")
remote="cd $repo && $setup && .venv/bin/python -m nsl.launch$args"
cmd=(gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="$remote")
if [ -n "${PROJECT:-}" ]; then cmd+=(--project="$PROJECT"); fi
if [ "${NSL_DRY_RUN:-0}" = 1 ]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
exec "${cmd[@]}"
