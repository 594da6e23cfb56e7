#!/usr/bin/env bash
# Submits one nsl run to a SLURM GPU cluster: one process per node, all GPUs of a node in it.
# Usage:
#   launch/gpu_slurm.sh NODES CONFIG WORKDIR [--config.a.b=v ...]
# Environment: GPUS_PER_NODE (default 8), PARTITION, ACCOUNT, TIME (default 24:00:00),
#   NSL_REPO_DIR (default: this checkout), NSL_PYTHON (default: NSL_REPO_DIR/.venv/bin/python,
#   a Python with `pip install -e ".[gpu]"`), NSL_PORT (coordinator port, default 29500),
#   NSL_DRY_RUN=1 (print the batch script instead of submitting it).
# The first node of the allocation is the coordinator (HOST:NSL_PORT); each task passes its
# SLURM_PROCID as --process_id and SLURM_NTASKS as --num_processes. A local WORKDIR (and a CONFIG
# file given relative to the current directory) is made absolute here, since the job runs from
# NSL_REPO_DIR, and must be on a filesystem shared by the nodes; a gs:// (any URL) WORKDIR is
# passed on as written, and sbatch's own output then goes to the first node's /tmp.
# A grid of such runs is `python -m nsl.scaling.grid run --backend=slurm`. docs/guide/accelerators.md.
set -euo pipefail
. "$(dirname "$0")/common.sh"
need_args 3 "$0 NODES CONFIG WORKDIR [--config.a.b=v ...]" "$@"
nodes=$1 config=$2 workdir=$3
shift 3
need_count NODES "$nodes"
repo=${NSL_REPO_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
python=${NSL_PYTHON:-$repo/.venv/bin/python}
gpus=${GPUS_PER_NODE:-8}
port=${NSL_PORT:-29500}
case $workdir in
  /* | *://*) ;;  # absolute, or object storage (gs://bucket/run): as given
  *) workdir=$PWD/$workdir ;;
esac
case $workdir in *://*) output=/tmp/slurm-%j.out remote=1 ;; *) output=$workdir/slurm-%j.out remote=0 ;; esac
config_file=${config%%:*}
if [ -e "$config_file" ] && [ "${config_file#/}" = "$config_file" ]; then
  config=$PWD/$config  # a relative FILE[:ARG] that exists here; otherwise it names one under the repo
fi
# Every argument, quoted once for the batch script's bash, where it becomes an array: no
# argument is ever re-parsed by a shell (spaces, quotes and parentheses survive as given).
args=$(printf ' %q' "--config=$config" "--workdir=$workdir" "$@")
script=$(cat <<SBATCH
#!/usr/bin/env bash
#SBATCH --job-name=nsl
#SBATCH --nodes=$nodes
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=$gpus
#SBATCH --time=${TIME:-24:00:00}
#SBATCH --signal=TERM@120
${PARTITION:+#SBATCH --partition=$PARTITION}
${ACCOUNT:+#SBATCH --account=$ACCOUNT}
#SBATCH --output=$output
set -euo pipefail
# sed reads every host name: \`head -n 1\` would close the pipe early, and with pipefail
# scontrol's SIGPIPE (exit 141) would end the job.
coordinator=\$(scontrol show hostnames "\$SLURM_JOB_NODELIST" | sed -n 1p)
args=($args)
cd $(printf '%q' "$repo")
# One task per node; SLURM_PROCID is each task's own, so the inner bash expands it there.
srun --ntasks-per-node=1 bash -c 'exec "\$0" -m nsl.launch "\$@" --num_processes="\$SLURM_NTASKS" --process_id="\$SLURM_PROCID"' \\
  $(printf '%q' "$python") "\${args[@]}" --coordinator_address="\$coordinator:$port"
SBATCH
)
if [ "${NSL_DRY_RUN:-0}" = 1 ]; then
  echo "$script"
  exit 0
fi
[ "$remote" = 1 ] || mkdir -p "$workdir"  # slurm writes its output file there
echo "$script" | sbatch
