"""Train a transformer with a method that changes the model while it trains (or the baseline).

    python train.py                                  # configs/default.yaml: small GPT-2, 2-level V-cycle
    python train.py --config configs/X.yaml --train.lr 3e-4 --report_to wandb
    python train.py --compare baseline,vcycle        # same data, budget and seed; "% saved" at equal loss
    python train.py --resume                         # continue outputs/<name>/ from its last checkpoint
    python train.py --config launch/recipes/gpt2_base_vcycle.yaml --dry_run
    torchrun --nproc_per_node 2 train.py --train.cpu true ...     # DDP (accelerate launch on GPUs)

See ``python train.py --help`` and progressive/cli.py.
"""

import sys

if __name__ == "__main__":
    from progressive.cli import entry

    sys.exit(entry())
