#!/usr/bin/env bash
# The check prepared for nsl's first GPU (docs/guide/accelerators.md). NOT YET RUN ON A GPU: no
# GPU has been lent to this project so far; `--cpu-dry-run` (tests/test_gpu_check.py) runs every
# step's code on CPU, so what is untested is the hardware, not the script.
#
# Usage: tools/gpu_check.sh [--cpu-dry-run] [--out=FILE] [--rules=causal,dd_self,...]
# On one H100/H200, at most 8 minutes (each step has its own time limit):
#   1. kernels: the Pallas GPU kernel compiled (Triton, not interpreted), alone and under shard_map,
#      and cuDNN on the rules it takes, against the dense reference on every rule of
#      tests/kernels/kernel_cases.py: output, lse, dq, dk, dv, in float32 and bfloat16;
#   2. nsl.bench.attention at 4096 slots in bfloat16: Pallas SPS (stream-major) vs dense masked
#      (xla) vs cuDNN causal, forward + backward;
#   3. nsl.bench.train_step for configs/sps.py:standard_xs and :sps_xs in bfloat16, with MFU
#      against the chip's published peak (nsl.topology.CHIPS).
# One JSON line per figure on stdout and appended to --out (default runs/gpu_check.jsonl); the
# last line says whether every step passed (exit status 1 otherwise). Python: $NSL_PYTHON, else
# the checkout's .venv (`pip install -e ".[gpu]"`).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
dry=0 out=runs/gpu_check.jsonl rules=""
for arg in "$@"; do
  case $arg in
    --cpu-dry-run) dry=1 ;;
    --out=*) out=${arg#--out=} ;;
    --rules=*) rules=${arg#--rules=} ;;
    *) echo "$0: unknown argument '$arg' (use --cpu-dry-run, --out=FILE, --rules=a,b)" >&2; exit 2 ;;
  esac
done
py=${NSL_PYTHON:-$repo/.venv/bin/python}
[ -x "$py" ] || py=python3
mkdir -p "$(dirname "$out")"
start=$SECONDS failed=0

# step NAME LIMIT_S CMD...: runs CMD under a time limit, keeps its JSON lines, records a failure.
step() {
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  timeout "$limit" "$@" 2> "$out.$name.err" | grep --line-buffered '^{' | tee -a "$out"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    failed=1
    printf '{"check": "%s", "ok": false, "exit": %d, "timed_out": %s, "seconds": %d, "stderr": "%s"}\n' \
      "$name" "$rc" "$([ "$rc" = 124 ] && echo true || echo false)" $((SECONDS - t0)) "$out.$name.err" | tee -a "$out"
  fi
}

if [ $dry = 1 ]; then
  export JAX_PLATFORMS=cpu
  scale=4  # CPU interpret mode: generous limits for the same code at tiny sizes
  kernel_args=(--cpu-dry-run)
  attention_args=(--slots=128 --batch=1 --heads=2 --head_dim=16 --repeats=1)
  tiny=(--batch=2 --seq_len=64 --steps=1 --config.model.n_layers=1 --config.model.d_model=64
        --config.model.n_heads=2 --config.model.d_ff=128)
else
  scale=1
  kernel_args=()
  attention_args=(--slots=4096 --batch=2 --heads=8 --head_dim=64 --repeats=5)
  tiny=(--batch=8 --steps=5)
fi
[ -n "$rules" ] && kernel_args+=(--rules="$rules")

step environment $((20 * scale)) "$py" -c '
import json, jax
from nsl.kernels import cudnn
from nsl import topology
d = jax.devices()[0]
chip = topology.chip_for_device(d.device_kind)
print(json.dumps({"check": "environment", "jax": jax.__version__, "backend": jax.default_backend(),
                  "devices": jax.device_count(), "device_kind": d.device_kind,
                  "chip": chip and chip.name, "cudnn_available": cudnn.available()}))'
step kernels $((200 * scale)) "$py" tools/gpu_check.py kernels "${kernel_args[@]}"
step attention $((80 * scale)) bash -c 'set -o pipefail; "$0" "$@" | "$0" tools/gpu_check.py tag attention' "$py" \
  -m nsl.bench.attention --rules=sps_stream_major,causal --impls=pallas_gpu,xla,cudnn --dtype=bfloat16 \
  "${attention_args[@]}"
for config in standard_xs sps_xs; do
  step "train_step_$config" $((85 * scale)) bash -c 'set -o pipefail; "$0" "$@" | "$0" tools/gpu_check.py mfu' "$py" \
    -m nsl.bench.train_step --config="configs/sps.py:$config" --config.model.dtype=bfloat16 "${tiny[@]}"
done
printf '{"check": "gpu_check", "ok": %s, "dry_run": %s, "seconds": %d, "out": "%s"}\n' \
  "$([ $failed = 0 ] && echo true || echo false)" "$([ $dry = 1 ] && echo true || echo false)" \
  $((SECONDS - start)) "$out" | tee -a "$out"
exit $failed
