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
# accelerate launch (torchrun underneath) kills its workers this many seconds after it forwards the SIGTERM (torch's
# default: 30): the stop gets the warning's 300 s, less a margin for the launchers to exit
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-270}

stopping=0
forward() {  # the scheduler's warning (or a preemption): pass it on; the job checkpoints and exits
  stopping=1
  echo "slurm.sh: got SIGTERM, forwarding it to the job (it stops at the next step boundary with a checkpoint)" >&2
  kill -TERM "$job" 2>/dev/null
}
trap forward TERM

# srun forwards the signal to every node's task; accelerate launch forwards it to every rank. The arguments go
# to the node's shell as its own positional parameters, never pasted into its command text: an argument is one
# argument, whatever characters it holds.
srun --kill-on-bad-exit=1 bash -c 'exec accelerate launch --config_file "$1" --num_machines "$2" \
  --num_processes "$3" --machine_rank "$SLURM_NODEID" --main_process_ip "$4" --main_process_port "$5" \
  train.py --config "$6" --resume auto "${@:7}"' slurm-node "$ACCELERATE_CONFIG" "$SLURM_NNODES" \
  "$((SLURM_NNODES * GPUS_PER_NODE))" "$MASTER_ADDR" "$MASTER_PORT" "$RECIPE" "$@" &
job=$!
# `wait` returns early (status > 128) when the trap runs: wait again until the job itself has exited.
while true; do
  wait "$job"
  rc=$?
  kill -0 "$job" 2>/dev/null || break
done

# 75: train.py stopped on the signal after a checkpoint. Launchers may report any failure of a rank as 1, so
# a forwarded signal also requeues, unless the run has finished meanwhile (its summary.json).
# The run folder: --output_dir / --name from the job's arguments (either form), else the recipe's, else the defaults.
RUN_DIR=$(python - "$RECIPE" "$@" <<'PY' 2>/dev/null
import sys, yaml
recipe, args = sys.argv[1], sys.argv[2:]
found = {"name": "run", "output_dir": "outputs", **{k: v for k, v in (yaml.safe_load(open(recipe)) or {}).items()
                                                   if k in ("name", "output_dir")}}
for i, a in enumerate(args):
    for key in ("name", "output_dir"):
        if a == f"--{key}" and i + 1 < len(args):
            found[key] = args[i + 1]
        elif a.startswith(f"--{key}="):
            found[key] = a.split("=", 1)[1]
print(f"{found['output_dir']}/{found['name']}")
PY
)
if [ "$rc" -eq 75 ] || { [ "$stopping" -eq 1 ] && [ ! -f "$RUN_DIR/summary.json" ]; }; then
  echo "slurm.sh: the run stopped with a checkpoint (exit $rc); requeueing job $SLURM_JOB_ID" >&2
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
exit "$rc"
