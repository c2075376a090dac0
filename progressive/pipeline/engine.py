"""The elastic pipeline engine: PipeTransformer (He et al., ICML 2021) on torch.distributed.pipelining.

One process per device (``torchrun --nproc_per_node W train.py ... --parallel.pipeline elastic``). Every
process builds the full model from the seed (or ``model.init_from``), so all start identical, and keeps
only its slice. A step of global batch B (a pure function of (seed, step), as in the trainer): replica d of
dp takes samples [d B/dp, (d+1) B/dp); its K stages run (or, with AutoCache, serve) the frozen prefix and
the M micro-batches, average
gradients over replicas and sum norms and the loss over stages (runtime.py); AdamW steps on each stage.

The loss is the mean over the dp x M micro-batches of their mean losses, the trainer's definition with
world x grad_accum = dp x M micro-batches; for fixed-length batches (causal LM blocks, images) it is the
global batch mean. Evaluation runs the same pipeline forward-only.

After a step, AutoFreeze decides (``AutoFreeze.decide`` on the all-reduced norms: every rank decides the
same). When the frozen prefix grows, AutoPipe (autopipe.py) chooses K (halving while memory allows, only
for ``parallel.pipeline: elastic``) and re-balances the active layers, AutoDP (mesh.py) re-meshes (dp, pp)
-> (2 dp, pp/2) when K halves, weights and AdamW state move by FQN to their new holders (transfer.py;
frozen weights reach the new stage-0 replicas too), the stages, optimizers (same moments, same step
counts) and schedule are rebuilt, and M is re-profiled. The sampler needs no rebuilding: the local slice
is recomputed from (replica, dp) every step, so each sample is still seen once per epoch, and the global
batch and LR schedule are unchanged.

Logs: metrics.jsonl rows as the trainer's (kind, step, phase, tokens, flops, wall, loss, lr) plus frozen,
k, dp and samples_per_s (global samples over the wall-clock of the steps since the previous row); at every
change one line per decision (why K) and one line for the layout that just ended: frozen depth, K, dp,
layers per stage, measured compute ms per step per stage, micro-batches and samples/s.

The trainer (progressive/run/trainer.py) runs the loop, with ``PipelineEngine`` as its engine: this file
is only what differs from data parallel; progressive.cli passes it as ``Trainer(..., engine=PipelineEngine)``.

Checkpoints are the trainer's (progressive.run.checkpoint: safetensors + JSON, verified): the full model and
the AdamW state by FQN, gathered to rank 0, so any layout (another K, another world size) loads them;
state.json keeps the layout and the profile, so a resumed run continues with the same partition, micro-
batches and future decisions. With AutoCache, every process also writes its own cache into the checkpoint
(progressive.run.checkpoint's per-process parts), so the caches come back to their processes. ``wall``
includes re-layouts and micro-batch profiles (they are the method's cost); the initial profile is not
counted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import set_seed

from common.device import Stopwatch
from progressive.config import ConfigError, RunConfig
from progressive.data import batch_indices
from progressive.methods.base import Method
from progressive.model.build import guess_data_info
from progressive.pipeline import autopipe
from progressive.pipeline.checks import check_config, check_world
from progressive.pipeline.logs import LayoutLog
from progressive.pipeline.mesh import Layout
from progressive.pipeline.runtime import StageRuntime
from progressive.pipeline.stages import materialise, parameter_groups, set_hollow
from progressive.pipeline.transfer import SEP, gather_state, move_state, unflatten_state
from progressive.run import checkpoint as ckpt
from progressive.run.engine import FlopsCount, RunParts, Saved, Stepped
from progressive.run.sharding import Replicated


class PipelineEngine:
    """The trainer's engine for ``parallel.pipeline`` fixed or elastic (see the module docstring): how the
    processes join, the stages' setup, the pipelined step and evaluation, AutoPipe's re-layout as the change
    after a step, gathered checkpoints, the final model.

    Made once the processes have joined (``join``) and the run's parts are built: every process builds the full
    model (from the seed, or the checkpoint's weights) and keeps its stage; then the profile, the first layout and
    the micro-batches.

    Args:
        cfg: the run's config (refused, before any data loads, when a pipeline cannot run it: ``check``).
        family: the model family.
        method: the method (AutoFreeze, or baseline on a fixed pipeline).
        step_flops: (HF config, layers run) -> one step's training FLOPs.
        acc: the run's Accelerator.
        compiled: train.compile as decided (a pipeline's stages run eager).
        run: the parts the trainer built (the data, the phases, the counters, ...).
        saved: the checkpoint being resumed, or None for a fresh run.
    """

    pipelined = True

    @staticmethod
    def check(cfg: RunConfig, family: Any) -> None:
        """Refuse a config no pipeline runs (``checks.check_config``), before any data loads."""
        check_config(cfg, family, family.config_for(cfg.model, guess_data_info(cfg), cfg.data.seq_len))

    @staticmethod
    def join(cfg: RunConfig, acc: Accelerator) -> None:
        """A process group (of one, for one process: the one code path runs) whose world the pipeline's
        stages x replicas must fit. Raises ConfigError when it cannot run the pipeline."""
        if not dist.is_initialized():
            dist.init_process_group("nccl" if acc.device.type == "cuda" else "gloo", store=dist.HashStore(),
                                    rank=0, world_size=1)
        check_world(cfg, dist.get_world_size())

    def __init__(self, cfg: RunConfig, family: Any, method: Method, step_flops: Any, acc: Accelerator,
                 compiled: bool, run: RunParts, saved: Saved | None):
        t = cfg.train
        if run.data.n_val < t.batch_size:
            raise ConfigError(f"train.batch_size: {t.batch_size} > the {run.data.n_val} validation samples (a "
                              "pipelined evaluation runs whole global batches)")
        self.cfg, self.family, self.method, self.acc, self.run = cfg, family, method, acc, run
        self.flops = FlopsCount(step_flops)
        self.elastic = cfg.parallel.pipeline == "elastic"
        self.world, self.rank, self.device = dist.get_world_size(), dist.get_rank(), acc.device
        self.sharding = Replicated(acc)  # no FSDP2: each stage's weights are whole (checkpointed by rank 0)
        set_seed(t.seed)
        model = self.family.build_model(run.phases[0].config, init_from=cfg.model.init_from).to(self.device)
        model.train()
        if saved is not None:
            model.load_state_dict(saved.parts["model"])
            self.method.load_state_dict(saved.parts["method"])
            run.checkpoints.load_local(saved.checkpoint, saved.state)  # AutoCache's entries
        self.raw = model  # every process's full-size model, holding only its stage
        self.groups = parameter_groups(model)  # (embeddings, layers, head) parameter names
        self.rt = StageRuntime(model, self.groups, cfg, self.family.objective in ("cls", "seqcls"), self.device,
                               self.acc.autocast)
        self.log = LayoutLog(self.world, self.rank, t.batch_size, run.transitions)
        self.microbatch_profile: dict[int, float] = {}  # ms per candidate M at the last profile
        self._since_row = [0, 0.0]  # steps and their seconds since the previous row
        # the per-layer profile, and AutoPipe's memory budget: the largest stage of the starting pipeline
        self.profile, self.budget = self._profile(saved)
        self._build(self._first_layout(saved), {}, saved.parts["optimizer"] if saved else None,
                    saved.parts["scheduler"] if saved else None)
        if cfg.parallel.microbatches == "auto" and saved is None:
            self._profile_microbatches()
        self._note_layout(f"start: {self.layout.frozen} frozen", [], 0.0)
        self._since_row = [0, 0.0]
        # this process's generators (a resumed run's: every rank's were saved), none for a fresh run
        ranks = None if saved is None else saved.parts["rng"]["ranks"]
        self.restored_rng: dict | None = None if ranks is None else ranks[self.rank if len(ranks) == self.world else 0]

    @property
    def model(self) -> torch.nn.Module:
        """The model (this process holds its stage's slice)."""
        return self.raw

    @property
    def opt(self) -> torch.optim.Optimizer:
        """This stage's AdamW."""
        return self.rt.opt

    def _profile(self, saved: Saved | None) -> tuple[autopipe.LayerProfile, float]:
        """The per-layer profile (measured on rank 0 on one micro-batch of the first step, then broadcast,
        so every rank partitions alike; a resumed run reuses its checkpoint's) and the memory budget: the
        largest stage of the starting pipeline (F = 0, K_0)."""
        p, t = self.cfg.parallel, self.cfg.train
        if saved is not None:
            prof = autopipe.LayerProfile(**saved.state["pipeline"]["profile"])
        else:
            box = [None]
            if self.rank == 0:
                n = max(1, t.batch_size // self.world)  # one micro-batch at M = K_0: B / dp_0 / K_0
                data, step = self.run.data, self.run.c.step
                ids = batch_indices(data.n_train, t.batch_size, t.seed, step)[:n]
                batch = {k: v.to(self.device) for k, v in
                         data.batch(data.train, ids, seed=t.seed * 1_000_003 + step).items()}
                box = [autopipe.profile_model(self.raw, batch, p.profile_steps).as_dict()]
            dist.broadcast_object_list(box, src=0)
            prof = autopipe.LayerProfile(**box[0])
        dp0 = self.world // p.stages
        start = autopipe.partition(prof, 0, p.stages, p.balance)
        return prof, max(autopipe.stage_memory(prof, 0, start, t.batch_size // dp0))

    def _first_layout(self, saved: Saved | None) -> Layout:
        p = self.cfg.parallel
        if saved is not None and saved.state["world_size"] == self.world:
            return Layout.from_dict(saved.state["pipeline"]["layout"])
        frozen = self.method.frozen
        k = p.stages
        if self.elastic and frozen:  # K_0 at the start: AutoPipe compresses after freezing, as in the paper
            k, _ = autopipe.choose_stages(self.profile, frozen, k, self.world, self.cfg.train.batch_size,
                                          self.budget, p.balance)
        return self._layout(frozen, k, saved.state["pipeline"]["layout"]["microbatches"] if saved else None)

    def _layout(self, frozen: int, k: int, microbatches: int | None = None) -> Layout:
        """The balanced layout of K stages over the active layers; M pinned, given, or a first guess (K)."""
        dp, m = self.world // k, self.cfg.parallel.microbatches
        local = self.cfg.train.batch_size // dp
        if m == "auto":
            m = microbatches if microbatches and local % microbatches == 0 else \
                autopipe.microbatch_candidates(k, local)[0]
        else:
            m = min(m, local)
        return Layout(frozen, autopipe.partition(self.profile, frozen, k, self.cfg.parallel.balance), dp, m)

    def _build(self, layout: Layout, received: dict, named_state: dict | None, sched_state: dict | None) -> None:
        self.rt.build(layout, received, named_state, sched_state, self.run.phases[self.run.c.phase])
        self.flops.clear()

    @property
    def layout(self) -> Layout:
        """The current layout."""
        return self.rt.layout

    # ------------------------------------------------------------------------------------- one step

    def step(self) -> Stepped:
        """One step of the pipeline over the global batch (every replica its slice)."""
        t, c, data = self.cfg.train, self.run.c, self.run.data
        clock = Stopwatch(self.device)  # the pipeline's step ends in host syncs anyway (each loss is read)
        self.method.phase = c.phase  # the phase its hooks run in (Method.phase)
        plan = self.method.before_step(c.step, self.raw)
        ids = batch_indices(data.n_train, t.batch_size, t.seed, c.step)
        mb = self.rt.local(data.batch(data.train, ids, seed=t.seed * 1_000_003 + c.step))
        self.rt.stage.busy = 0.0
        prefix = None
        if self.method.caching:  # AutoCache serves stage 0 the frozen prefix
            mine = self.rt.local_ids(ids)
            prefix = lambda batch: self.method.serve_prefix(self.raw, batch, mine)  # noqa: E731
        losses = self.rt.run(mb, train=True, prefix=prefix)
        replica = sum(float(x.detach()) for x in losses) / len(losses) if losses else 0.0
        loss, norms, total, skipped = self.rt.reduce(replica)
        if self.method.freezes:
            self.method.record(norms)
        lr = self.rt.update(total)
        self.method.after_step(c.step, self.raw)
        c.step, c.step_in_phase = c.step + 1, c.step_in_phase + 1
        c.tokens += t.batch_size * self.family.tokens_per_sample(self.raw.config, self.cfg.data.seq_len)
        if prefix is not None:
            c.flops += self.method.cached_flops(self.raw, skipped)
        else:
            c.flops += plan.flops if plan.flops is not None else self.flops(self.raw.config, plan.n_layers)
        seconds = clock.lap()
        c.wall += seconds
        self._since_row[0] += 1
        self._since_row[1] += seconds
        self.log.step(seconds, self.rt.stage.busy)
        return Stepped(lr, 0, [loss])

    def global_loss(self, mean: float) -> float:
        """The mean loss since the last row: each step's is already the mean over the replicas
        (StageRuntime.reduce)."""
        return float(mean)

    def tick(self) -> float:
        """Nothing: ``wall`` advances step by step (each step ends in host syncs) and at re-layouts."""
        return 0.0

    def row_fields(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The layout (frozen, K, dp) and the samples/s of the steps since the previous row."""
        n, secs = self._since_row
        self._since_row = [0, 0.0]
        fields = {**self.method.log_fields(), **self._layout_fields(),
                  "samples_per_s": round(n * self.cfg.train.batch_size / secs, 3) if secs > 0 else None}
        return fields, self._layout_fields()

    def changes(self, epoch_before: int) -> None:
        """AutoFreeze's decision on this step's norms (the same on every rank); a change re-lays the pipeline."""
        if not self.method.freezes:
            return
        # a fixed pipeline keeps K stages, so at least K layers stay active
        cap = None if self.elastic else len(self.groups[1]) - self.layout.k
        decided = self.method.decide(self.run.c.step - 1, cap=cap)
        if decided is not None:
            self._relayout(decided)

    def _layout_fields(self) -> dict[str, int]:
        return {"frozen": self.layout.frozen, "k": self.layout.k, "dp": self.layout.dp}

    def transition(self, index: int) -> tuple[str, float, float]:
        """Never called: a pipelined run has one phase (``checks.check_config`` refuses methods that change
        the model's shape)."""
        raise RuntimeError("a pipelined run has one phase: no level change")

    # ------------------------------------------------------------------------------------- the loop

    @torch.no_grad()
    def evaluate(self, data: Any = None, n: int | None = None) -> dict[str, float]:
        """Validation loss over the first eval_batches x batch_size validation samples, whole global batches
        (and accuracy for classification), through the pipeline forward-only; as the trainer's."""
        t, data = self.cfg.train, self.run.data
        rounds = max(1, min(data.n_val, t.eval_batches * t.batch_size) // t.batch_size)
        total = torch.zeros(3, dtype=torch.float64, device=self.device)
        module = self.rt.module
        module.eval()
        for j in range(rounds):
            idx = np.arange(j * t.batch_size, (j + 1) * t.batch_size)
            mb = self.rt.local(data.batch(data.val, idx, seed=t.seed * 7919 + 104729 + j * t.batch_size))
            module.correct = []
            losses = self.rt.run(mb, train=False)
            if losses:
                # the real micro-batches are the last M forwards: a fresh schedule first infers shapes by a
                # forward on uninitialised inputs, whose "correct" count is noise
                total[2] += sum(module.correct[-len(losses):])
                labels = mb["labels"].tensor_split(len(losses))  # the schedule's own split
                for loss, lab in zip(losses, labels):
                    w = float((lab != -100).sum()) if self.family.is_text else float(len(lab))
                    total[0] += float(loss) * w
                    total[1] += w
        module.train()
        dist.all_reduce(total)  # only the last stage's ranks hold losses
        scores = {"val_loss": float(total[0] / total[1])}
        if self.family.objective in ("cls", "seqcls"):
            scores["val_accuracy"] = float(total[2] / total[1])
        return scores

    # ------------------------------------------------------------------------------------- changes

    def _relayout(self, decided: tuple[int, int, int, int]) -> None:
        clock = Stopwatch(self.device)
        self.log.end(self.run.c.step, self.layout)
        old, frozen, p = self.layout, decided[1], self.cfg.parallel
        why = []
        k = old.k
        if self.elastic:
            k, why = autopipe.choose_stages(self.profile, frozen, k, self.world, self.cfg.train.batch_size,
                                            self.budget, p.balance)
        new = self._layout(frozen, k)
        received, state = move_state(self.raw, self.rt.opt, self.groups, old, new, self.device)
        self._build(new, received, state, self.rt.sched.state_dict())
        if p.microbatches == "auto":
            self._profile_microbatches()
        seconds = clock.lap()
        self.run.c.wall += seconds
        self._note_layout(self.method.note(decided), why, seconds, old)

    def _profile_microbatches(self) -> None:
        """AutoPipe's micro-batch choice: time ``profile_steps`` pipeline steps (forward + backward, gradients
        discarded) on this step's batch for each candidate M; the slowest rank's median decides, so all
        ranks pick the same M."""
        t, data, step = self.cfg.train, self.run.data, self.run.c.step
        cands = autopipe.microbatch_candidates(self.layout.k, t.batch_size // self.layout.dp)
        if len(cands) > 1:
            ids = batch_indices(data.n_train, t.batch_size, t.seed, step)
            mb = self.rt.local(data.batch(data.train, ids, seed=t.seed * 1_000_003 + step))
            times = []
            for m in cands:
                self.rt.schedule(m)
                runs = []
                for _ in range(self.cfg.parallel.profile_steps + 1):  # the first run infers shapes: not timed
                    clock = Stopwatch(self.device)
                    self.rt.run(mb, train=True)
                    dist.barrier(group=self.rt.mesh.pp_group)
                    runs.append(clock.lap())
                times.append(float(np.median(runs[1:])))
            self.rt.opt.zero_grad(set_to_none=True)
            slowest = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            self.microbatch_profile = {m: round(1e3 * s, 2) for m, s in zip(cands, slowest.tolist())}
            best = cands[int(torch.argmin(slowest))]
        else:
            self.microbatch_profile, best = {}, cands[0]
        self.rt.schedule(best)

    # ------------------------------------------------------------------------------------- logs, state

    def _note_layout(self, note: str, why: list[str], seconds: float, old: Layout | None = None) -> None:
        """Record the current layout (a change from ``old``, or the start) in summary.json and on the console."""
        c = self.run.c
        self.log.change(c.step, self.run.phases[c.phase].name, note, why, seconds, self.layout, self.rt.mesh,
                        self.profile, self.microbatch_profile, old)

    def checkpoint_parts(self) -> tuple[dict[str, Any], bool, Any, dict[str, Any]]:
        """The full model and the AdamW state by FQN, gathered to rank 0 from the stages (any layout loads
        them), every rank's generators, the layout and the profile (a resumed run continues with the same
        partition, micro-batches and future decisions)."""
        got = gather_state(self.raw, self.rt.opt, self.groups, self.layout, self.device)
        rngs = [None] * self.world
        dist.all_gather_object(rngs, ckpt.rng_state())
        staged, _ = self.run.checkpoints.stage(self.run.c, self.sharding, self.raw, self.rt.opt)
        if self.rank != 0:
            return {}, True, staged, {}
        params = {k: v for k, v in got.items() if SEP not in k}
        weights = {k: params.get(k, v) for k, v in self.raw.state_dict().items()}  # buffers: rank 0's own
        finite = all(bool(torch.isfinite(w).all()) for w in params.values() if w.is_floating_point())
        parts = {"model": weights, "optimizer": unflatten_state({k: v for k, v in got.items() if SEP in k}),
                 "scheduler": self.rt.sched.state_dict(), "rng": {"ranks": rngs}}
        return parts, finite, staged, {"pipeline": {"layout": self.layout.as_dict(), "profile": self.profile.as_dict()}}

    def test_scores(self) -> None:
        """None: a pipelined evaluation runs whole global batches, so no test split is scored."""
        return None

    def final_model(self) -> None:
        """The last layout's line, then rank 0 gets every weight (for the final Hugging Face checkpoint)."""
        self.log.end(self.run.c.step, self.layout)
        self._gather_model()

    def _gather_model(self) -> None:
        """Rank 0 gets every weight (for the final Hugging Face checkpoint the summary writes)."""
        got = gather_state(self.raw, self.rt.opt, self.groups, self.layout, self.device)
        if self.rank == 0:
            names = {n for n, _ in self.raw.named_parameters()}
            materialise(self.raw, {k: v for k, v in got.items() if SEP not in k}, names, names, self.device)
            set_hollow(self.raw, False)

    def close(self) -> None:
        """Nothing runs in the background."""
