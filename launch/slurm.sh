#!/usr/bin/env bash
# Multi-node training on SLURM: one `accelerate launch` per node, 8 GPUs each.
#   sbatch --nodes 4 launch/slurm.sh launch/recipes/gpt2_base_vcycle.yaml [--key value ...]
# Resubmitting the same command continues the run from its last checkpoint (--resume is added when
# outputs/<name>/checkpoints exists), so preemption or a time limit loses at most checkpoint_every steps.
#SBATCH --job-name=growtrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=48:00:00
#SBATCH --output=slurm-%j.out
set -euo pipefail
RECIPE=${1:?usage: sbatch launch/slurm.sh RECIPE.yaml [--key value ...]}
shift
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
GPUS_PER_NODE=8
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=${MASTER_PORT:-29500}
NAME=$(python -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['name'])" "$RECIPE")
RESUME=""
if [ -d "outputs/$NAME/checkpoints" ]; then RESUME="--resume"; fi
export OMP_NUM_THREADS=8
srun --kill-on-bad-exit=1 bash -c "accelerate launch \
  --config_file launch/accelerate/multinode.yaml \
  --num_machines $SLURM_NNODES --num_processes $((SLURM_NNODES * GPUS_PER_NODE)) \
  --machine_rank \$SLURM_NODEID --main_process_ip $MASTER_ADDR --main_process_port $MASTER_PORT \
  train.py --config $RECIPE $RESUME $*"
