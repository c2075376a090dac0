"""MIDAS: Saunshi et al., "On the Inductive Bias of Stacking Towards Improving Reasoning", NeurIPS 2024: gradual
stacking in which each growth inserts a copy of the model's middle block, not a copy on top.

The model's L layers are ``L / block`` blocks of ``block`` layers. Stage k (k = 0 .. K-1) trains the first
``start + k`` blocks' worth of layers, ``(start + k) x block``, as a plain HF model; the last stage is the whole
model (K = L / block - start + 1 stages). Between stages the model of n blocks becomes one of n + 1: blocks
0 .. m, then a copy of block m, then blocks m + 1 .. n - 1, with m = n // 2, the middle block (the upper of the two
middle ones when n is even: 2 blocks -> [0, 1, 1], 3 -> [0, 1, 1, 2]). The copy map is given
to the depth operators as data (operators.depth: ``grow_depth``, ``map_depth_state``), AdamW's moments follow it
(``optimizer_state: mapped``: both copies keep the block's moments) or restart (``reset``).

Stage lengths follow PROP-alpha: stage k's share of train.steps is (k + 1)^alpha / sum_j (j + 1)^alpha, so later,
larger stages run longer (alpha 0: equal stages); the last stage then fills what is left of the FLOPs budget of
train.steps full-model steps (progressive.methods.base.staged_phases, Apollo's planner), so the method spends the
baseline's FLOPs. One LR schedule runs over all stages (``schedule: global``, a WSD cooldown once at the end), or
one per stage (``per_stage``).

Recipe: configs/midas.yaml; the page: docs/midas.md; the bench's variant: ``midas`` (options.VARIANTS).
"""
