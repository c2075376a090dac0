#!/usr/bin/env bash
# Multi-node training on SLURM: one `accelerate launch` per node, 8 GPUs each, preemption-safe.
#   sbatch --nodes 4 launch/slurm.sh launch/recipes/gpt2_base_vcycle.yaml [--key value ...]
# The job always runs `train.py --config RECIPE --resume auto`: it resumes when outputs/<name>/ holds a
# checkpoint and starts fresh when it holds none, so the scheduler can repeat it unchanged. Five minutes
# before the time limit SLURM sends this script SIGTERM (--signal=B:TERM@300); the script forwards it to the
# job, every rank stops at the same step boundary, writes a checkpoint, flushes the trackers and exits, and
# the script requeues the job (--requeue), which then continues where it stopped (the W&B run included).
# For FSDP2 use --config_file launch/accelerate/fsdp.yaml in ACCELERATE_CONFIG.
#SBATCH --job-name=growtrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=48:00:00
#SBATCH --signal=B:TERM@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%j.out
set -uo pipefail
RECIPE=${1:?usage: sbatch launch/slurm.sh RECIPE.yaml [--key value ...]}
shift
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}" || exit 2
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-launch/accelerate/multinode.yaml}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=${MASTER_PORT:-29500}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

stopping=0
forward() {  # the scheduler's warning (or a preemption): pass it on; the job checkpoints and exits
  stopping=1
  echo "slurm.sh: got SIGTERM, forwarding it to the job (it stops at the next step boundary with a checkpoint)" >&2
  kill -TERM "$job" 2>/dev/null
}
trap forward TERM

# srun forwards the signal to every node's task; accelerate launch forwards it to every rank.
srun --kill-on-bad-exit=1 bash -c "accelerate launch \
  --config_file $ACCELERATE_CONFIG \
  --num_machines $SLURM_NNODES --num_processes $((SLURM_NNODES * GPUS_PER_NODE)) \
  --machine_rank \$SLURM_NODEID --main_process_ip $MASTER_ADDR --main_process_port $MASTER_PORT \
  train.py --config $RECIPE --resume auto $*" &
job=$!
# `wait` returns early (status > 128) when the trap runs: wait again until the job itself has exited.
while true; do
  wait "$job"
  rc=$?
  kill -0 "$job" 2>/dev/null || break
done

# 75: train.py stopped on the signal after a checkpoint. Launchers may report any failure of a rank as 1, so
# a forwarded signal also requeues, unless the run has finished meanwhile (its summary.json).
NAME=$(python -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['name'])" "$RECIPE" 2>/dev/null)
if [ "$rc" -eq 75 ] || { [ "$stopping" -eq 1 ] && [ ! -f "outputs/$NAME/summary.json" ]; }; then
  echo "slurm.sh: the run stopped with a checkpoint (exit $rc); requeueing job $SLURM_JOB_ID" >&2
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
exit "$rc"
