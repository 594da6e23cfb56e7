#!/usr/bin/env bash
# Starts N local processes of one nsl run on this machine (JAX's distributed runtime; gloo
# collectives on CPU). Usage:
#   launch/local_multiprocess.sh N CONFIG WORKDIR [--config.a.b=v ...]
# Environment: NSL_PORT (coordinator port, default: a free one), NSL_LOCAL_DEVICES (fake CPU
# devices per process, default 1), PYTHON (default: .venv/bin/python if present, else python3).
# The exit status is the first non-zero status of the processes; SIGTERM/SIGINT are forwarded.
set -euo pipefail
. "$(dirname "$0")/common.sh"
need_args 3 "$0 N CONFIG WORKDIR [--config.a.b=v ...]" "$@"
n=$1 config=$2 workdir=$3
shift 3
need_count N "$n"
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$([ -x "$here/.venv/bin/python" ] && echo "$here/.venv/bin/python" || echo python3)}
port=${NSL_PORT:-$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
if [ -n "${NSL_LOCAL_DEVICES:-}" ]; then
  export XLA_FLAGS="--xla_force_host_platform_device_count=${NSL_LOCAL_DEVICES} ${XLA_FLAGS:-}"
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
fi
pids=()
for ((i = 0; i < n; i++)); do
  quiet=$([ "$i" -gt 0 ] && echo --quiet || true)
  "$python" -m nsl.launch --config="$config" --workdir="$workdir" --coordinator_address="127.0.0.1:$port" \
    --num_processes="$n" --process_id="$i" $quiet "$@" &
  pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' TERM INT
status=0
for pid in "${pids[@]}"; do
  while true; do
    rc=0
    wait "$pid" || rc=$?
    # A trapped signal interrupts `wait` (status > 128) while the child is still shutting down.
    if [ "$rc" -gt 128 ] && kill -0 "$pid" 2>/dev/null; then continue; fi
    break
  done
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
done
exit "$status"
