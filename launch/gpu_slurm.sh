#!/usr/bin/env bash
# Submits one nsl run to a SLURM GPU cluster: one process per node, all GPUs of a node in it.
# Usage:
#   launch/gpu_slurm.sh NODES CONFIG WORKDIR [--config.a.b=v ...]
# Environment: GPUS_PER_NODE (default 8), PARTITION, ACCOUNT, TIME (default 24:00:00),
#   NSL_REPO_DIR (default: this checkout), NSL_PORT (coordinator port, default 29500),
#   NSL_DRY_RUN=1 (print the batch script instead of submitting it).
# The first node of the allocation is the coordinator; each task passes its SLURM_PROCID as
# --process_id. WORKDIR must be on a filesystem shared by the nodes.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 NODES CONFIG WORKDIR [--config.a.b=v ...]" >&2
  exit 2
fi
nodes=$1 config=$2 workdir=$3
shift 3
repo=${NSL_REPO_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
gpus=${GPUS_PER_NODE:-8}
port=${NSL_PORT:-29500}
extra=$(printf ' %q' "$@")
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
#SBATCH --output=$workdir/slurm-%j.out
set -euo pipefail
coordinator=\$(scontrol show hostnames "\$SLURM_JOB_NODELIST" | head -n 1)
cd $repo
srun bash -c '.venv/bin/python -m nsl.launch --config=$config --workdir=$workdir \
  --coordinator_address='"\$coordinator"':$port --num_processes=\$SLURM_NTASKS --process_id=\$SLURM_PROCID$extra'
SBATCH
)
if [ "${NSL_DRY_RUN:-0}" = 1 ]; then
  echo "$script"
  exit 0
fi
mkdir -p "$workdir"
echo "$script" | sbatch
