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

Checkpoints are the trainer's (progressive.run.checkpoint: safetensors + JSON, verified): the full model and
the AdamW state by FQN, gathered to rank 0, so any layout (another K, another world size) loads them;
state.json keeps the layout and the profile, so a resumed run continues with the same partition, micro-
batches and future decisions. With AutoCache, every process also writes its own cache into the checkpoint
(progressive.run.checkpoint's per-process parts), so the caches come back to their processes. ``wall``
includes re-layouts and micro-batch profiles (they are the method's cost); the initial profile is not
counted.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from accelerate.utils import set_seed

from common.device import Stopwatch
from progressive.config import ConfigError, RunConfig, to_dict
from progressive.data import batch_indices
from progressive.model.build import guess_data_info
from progressive.pipeline import autopipe
from progressive.pipeline.checks import check_config, check_world
from progressive.pipeline.logs import LayoutLog
from progressive.pipeline.mesh import Layout
from progressive.pipeline.runtime import StageRuntime
from progressive.pipeline.stages import materialise, parameter_groups, set_hollow
from progressive.pipeline.transfer import SEP, gather_state, move_state, unflatten_state
from progressive.run import checkpoint as ckpt
from progressive.run.accelerator import build_accelerator
from progressive.run.tracking import MetricsLog, init_trackers, start_progress
from progressive.run.trainer import Counters, NonFiniteLoss, Trainer, inject_faults


class PipelineTrainer(LayoutLog, Trainer):
    """Runs a config with ``parallel.pipeline`` fixed or elastic (see the module docstring). Reuses the
    trainer's validation, data, batches, FLOPs count, metrics rows and summary; owns the loop."""

    def __init__(self, cfg: RunConfig, resume: bool = False, overwrite: bool = False):
        super().__init__(cfg, resume, overwrite)
        check_config(cfg, self.family, self.family.config_for(cfg.model, guess_data_info(cfg), cfg.data.seq_len))
        self.elastic = cfg.parallel.pipeline == "elastic"
        self.decide = getattr(self.method, "decide", None)  # AutoFreeze's decision (baseline: none)

    # ------------------------------------------------------------------------------------- setup

    def run(self) -> dict[str, Any]:
        """Train; see Trainer.run. Raises ConfigError when the launcher's world size cannot run the pipeline."""
        cfg, t = self.cfg, self.cfg.train
        if t.threads:
            torch.set_num_threads(t.threads)
        self.acc = build_accelerator(cfg)
        if not dist.is_initialized():  # one process: a group of one, so the one code path runs
            dist.init_process_group("nccl" if self.acc.device.type == "cuda" else "gloo", store=dist.HashStore(),
                                    rank=0, world_size=1)
        self.world, self.rank, self.device = dist.get_world_size(), dist.get_rank(), self.acc.device
        self._agree_on_start()
        check_world(cfg, self.world)
        return self._run_locked(self.rank == 0)

    def _run(self) -> dict[str, Any]:
        cfg, t = self.cfg, self.cfg.train
        if self.rank == 0:
            self._open_run_dir()
        dist.barrier()
        set_seed(t.seed)
        self._load_data()
        if self.n_val < t.batch_size:
            raise ConfigError(f"train.batch_size: {t.batch_size} > the {self.n_val} validation samples (a pipelined "
                              "evaluation runs whole global batches)")
        self.base_config = self.family.config_for(cfg.model, self.info, cfg.data.seq_len)
        self.phases = self.method.plan(self.base_config, self.step_flops)
        self.c, saved = Counters(), None
        set_seed(t.seed)
        model = self.family.build_model(self.phases[0].config, init_from=cfg.model.init_from).to(self.device)
        model.train()
        if self.resume_from is not None:
            state, parts = ckpt.load_checkpoint(self.resume_from)
            self._check_data(state)
            self.c = Counters(**{k: state[k] for k in asdict(Counters())})
            model.load_state_dict(parts["model"])
            self.method.load_state_dict(parts["method"])
            self._load_local(state)  # AutoCache's entries; every rank's generators are in parts["rng"]
            saved = (state, parts)
        self.raw, self.groups = model, parameter_groups(model)
        self.rt = StageRuntime(model, self.groups, cfg, self.family.objective in ("cls", "seqcls"), self.device,
                               self.acc.autocast)
        self.profile, self.budget = self._profile(saved)
        self.transitions: list[dict[str, Any]] = []
        self._build(self._first_layout(saved), {}, saved[1]["optimizer"] if saved else None,
                    saved[1]["scheduler"] if saved else None)
        if cfg.parallel.microbatches == "auto" and saved is None:
            self._profile_microbatches()
        self._note_layout(f"start: {self.layout.frozen} frozen", [], 0.0)
        if saved is not None:
            ranks = saved[1]["rng"]["ranks"]
            ckpt.set_rng_state(ranks[self.rank] if len(ranks) == self.world else ranks[0])
            if self.rank == 0:
                print(f"resuming {cfg.name} from step {self.c.step} (phase {self.c.phase}: "
                      f"{self.phases[self.c.phase].name}), {self.resume_from}", file=sys.stderr)
        return self._loop()

    def _profile(self, saved: tuple | None) -> tuple[autopipe.LayerProfile, float]:
        """The per-layer profile (measured on rank 0 on one micro-batch of the first step, then broadcast,
        so every rank partitions alike; a resumed run reuses its checkpoint's) and the memory budget: the
        largest stage of the starting pipeline (F = 0, K_0)."""
        p, t = self.cfg.parallel, self.cfg.train
        if saved is not None:
            prof = autopipe.LayerProfile(**saved[0]["pipeline"]["profile"])
        else:
            box = [None]
            if self.rank == 0:
                n = max(1, t.batch_size // self.world)  # one micro-batch at M = K_0: B / dp_0 / K_0
                ids = batch_indices(self.n_train, t.batch_size, t.seed, self.c.step)[:n]
                batch = {k: v.to(self.device) for k, v in
                         self._batch(self.train_data, ids, seed=t.seed * 1_000_003 + self.c.step).items()}
                box = [autopipe.profile_model(self.raw, batch, p.profile_steps).as_dict()]
            dist.broadcast_object_list(box, src=0)
            prof = autopipe.LayerProfile(**box[0])
        dp0 = self.world // p.stages
        start = autopipe.partition(prof, 0, p.stages, p.balance)
        return prof, max(autopipe.stage_memory(prof, 0, start, t.batch_size // dp0))

    def _first_layout(self, saved: tuple | None) -> Layout:
        p = self.cfg.parallel
        if saved is not None and saved[0]["world_size"] == self.world:
            return Layout.from_dict(saved[0]["pipeline"]["layout"])
        frozen = getattr(self.method, "frozen", 0)
        k = p.stages
        if self.elastic and frozen:  # K_0 at the start: AutoPipe compresses after freezing, as in the paper
            k, _ = autopipe.choose_stages(self.profile, frozen, k, self.world, self.cfg.train.batch_size,
                                          self.budget, p.balance)
        return self._layout(frozen, k, saved[0]["pipeline"]["layout"]["microbatches"] if saved else None)

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
        self.rt.build(layout, received, named_state, sched_state, self.phases[self.c.phase])
        self._flops_cache = {}

    @property
    def layout(self) -> Layout:
        """The current layout."""
        return self.rt.layout

    # ------------------------------------------------------------------------------------- one step

    def _train_step(self) -> None:
        t, c = self.cfg.train, self.c
        clock = Stopwatch(self.device)  # the pipeline's step ends in host syncs anyway (each loss is read)
        plan = self.method.before_step(c.step, self.raw)
        ids = batch_indices(self.n_train, t.batch_size, t.seed, c.step)
        mb = self.rt.local(self._batch(self.train_data, ids, seed=t.seed * 1_000_003 + c.step))
        self.rt.stage.busy = 0.0
        prefix = None
        if getattr(self.method, "caching", False):  # AutoCache serves stage 0 the frozen prefix
            mine = self.rt.local_ids(ids)
            prefix = lambda batch: self.method.serve_prefix(self.raw, batch, mine)  # noqa: E731
        losses = self.rt.run(mb, train=True, prefix=prefix)
        replica = sum(float(x.detach()) for x in losses) / len(losses) if losses else 0.0
        loss, norms, total, skipped = self.rt.reduce(replica)
        if self.decide is not None:
            self.method.record(norms)
        lr = self.rt.update(total)
        self.method.after_step(c.step, self.raw)
        c.step, c.step_in_phase = c.step + 1, c.step_in_phase + 1
        c.tokens += t.batch_size * self.family.tokens_per_sample(self.raw.config, self.cfg.data.seq_len)
        if prefix is not None:
            c.flops += self.method.cached_flops(self.raw, skipped)
        else:
            c.flops += plan.flops if plan.flops is not None else self._flops(plan.n_layers)
        seconds = clock.lap()
        c.wall += seconds
        self._pending, self._pending_n = self._pending + loss, self._pending_n + 1
        self._since_row[0] += 1
        self._since_row[1] += seconds
        self._segment.append((seconds, self.rt.stage.busy))
        self._after_step(lr)

    def _flush_loss(self) -> float | None:
        if self._pending_n == 0:
            return None
        loss, self._pending, self._pending_n = self._pending / self._pending_n, 0.0, 0
        if not np.isfinite(loss):
            good = ckpt.latest_good(self.run_dir)
            raise NonFiniteLoss(f"training loss became {loss} by step {self.c.step}; stopping. "
                                + (f"The last good checkpoint is {good}: resume it with --resume, e.g. with a lower "
                                   "--train.lr" if good else "No good checkpoint was written yet"))
        return loss

    def _after_step(self, lr: float) -> None:
        t, c = self.cfg.train, self.c
        phase = self.phases[c.phase]
        last = c.step_in_phase == phase.steps
        if c.step % t.log_every == 0 or last:
            loss = self._flush_loss()
            n, secs = self._since_row
            self._since_row = [0, 0.0]
            extra = {**self.method.log_fields(), **self._layout_fields(),
                     "samples_per_s": round(n * t.batch_size / secs, 3) if secs > 0 else None}
            self.log.log(self._row("train", loss=loss, lr=lr, **extra))
            self.bar.update(c.step - self.bar.n, phase.name, loss, lr, c.wall, c.tokens, c.flops,
                            self._layout_fields())
        if c.step % t.eval_every == 0 or last:
            self.log.log(self._row("val", **self.evaluate()))
        decided = None
        if self.decide is not None:
            # a fixed pipeline keeps K stages, so at least K layers stay active
            decided = self.decide(c.step - 1, cap=None if self.elastic else len(self.groups[1]) - self.layout.k)
        if decided is not None:
            self._relayout(decided)
        if c.step % t.checkpoint_every == 0:
            self._save()
        inject_faults(c.step, self.rank)

    def _layout_fields(self) -> dict[str, int]:
        return {"frozen": self.layout.frozen, "k": self.layout.k, "dp": self.layout.dp}

    # ------------------------------------------------------------------------------------- the loop

    def _loop(self) -> dict[str, Any]:
        cfg = self.cfg
        self._pending, self._pending_n, self._since_row, self._segment = 0.0, 0, [0, 0.0], []
        self.log = MetricsLog(self.run_dir, self.acc, keep_until_step=self.c.step if self.resume else None)
        init_trackers(self.acc, cfg)
        phase = self.phases[self.c.phase]
        self.bar = start_progress(cfg, self.phases, self.step_flops, self.base_config, self.c.step, self.rank == 0)
        try:
            with self._stoppable():
                if not self.resume:
                    self.log.log(self._row("val", **self.evaluate()))
                self._train_phase(phase.steps)
            self._segment_line()
        finally:
            self.bar.close()
            self.log.close()
            self.method.finish()
        self._gather_model()
        from progressive.run.summary import finish

        summary = finish(self)
        from common.trackers import end_trackers

        end_trackers(self.acc)
        return summary

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation loss over the first eval_batches x batch_size validation samples, whole global batches
        (and accuracy for classification), through the pipeline forward-only; as the trainer's."""
        t = self.cfg.train
        rounds = max(1, min(self.n_val, t.eval_batches * t.batch_size) // t.batch_size)
        total = torch.zeros(3, dtype=torch.float64, device=self.device)
        module = self.rt.module
        module.eval()
        for j in range(rounds):
            idx = np.arange(j * t.batch_size, (j + 1) * t.batch_size)
            mb = self.rt.local(self._batch(self.val_data, idx, seed=t.seed * 7919 + 104729 + j * t.batch_size))
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
        self._segment_line()
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
        self.c.wall += seconds
        self._note_layout(self.method.note(decided), why, seconds, old)

    def _profile_microbatches(self) -> None:
        """AutoPipe's micro-batch choice: time ``profile_steps`` pipeline steps (forward + backward, gradients
        discarded) on this step's batch for each candidate M; the slowest rank's median decides, so all
        ranks pick the same M."""
        t = self.cfg.train
        cands = autopipe.microbatch_candidates(self.layout.k, t.batch_size // self.layout.dp)
        if len(cands) > 1:
            ids = batch_indices(self.n_train, t.batch_size, t.seed, self.c.step)
            mb = self.rt.local(self._batch(self.train_data, ids, seed=t.seed * 1_000_003 + self.c.step))
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

    def _save(self) -> None:
        self._flush_loss()  # as the trainer: a resumed run averages its logged losses over the same steps
        got = gather_state(self.raw, self.rt.opt, self.groups, self.layout, self.device)
        rngs = [None] * self.world
        dist.all_gather_object(rngs, ckpt.rng_state())
        staged, _ = self._stage_local()
        if self.rank == 0:
            params = {k: v for k, v in got.items() if SEP not in k}
            weights = {k: params.get(k, v) for k, v in self.raw.state_dict().items()}  # buffers: rank 0's own
            finite = all(bool(torch.isfinite(w).all()) for w in params.values() if w.is_floating_point())
            counters = dict(asdict(self.c), config=to_dict(self.cfg), world_size=self.world,
                            phase_name=self.phases[self.c.phase].name, data=self.data_fingerprint, finite=finite,
                            pipeline={"layout": self.layout.as_dict(), "profile": self.profile.as_dict()})
            parts = {"model": weights, "optimizer": unflatten_state({k: v for k, v in got.items() if SEP in k}),
                     "scheduler": self.rt.sched.state_dict(), "method": self.method.state_dict(), "rng": {"ranks": rngs}}
            ckpt.save_checkpoint(self.run_dir, counters, parts, self.cfg.train.keep_checkpoints, staged)
        dist.barrier()
        self._saved_at = (self.c.phase, self.c.step)

    def _gather_model(self) -> None:
        """Rank 0 gets every weight (for the final Hugging Face checkpoint the summary writes)."""
        got = gather_state(self.raw, self.rt.opt, self.groups, self.layout, self.device)
        if self.rank == 0:
            names = {n for n, _ in self.raw.named_parameters()}
            materialise(self.raw, {k: v for k, v in got.items() if SEP not in k}, names, names, self.device)
            set_hollow(self.raw, False)
