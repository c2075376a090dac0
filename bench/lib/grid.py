"""The frontier's grid and its training jobs: what one run of the frontier is, for every room that reuses them.

``python -m bench.frontier`` plans and runs the whole grid; the papers' pages and the AutoFreeze LM bench
train single jobs of the same grid (``make_job``, ``train``), so that a run any of them made is a row the
others reuse: a job's key is the run cache's config hash (bench.lib.runs.config_hash).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, NamedTuple

from bench.lib.rows import code_version
from bench.lib.runs import config_hash, finished, run, summary
from bench.lib.variants import COARSE_LR, FRONTIER, LAYER_VARIANTS, WSD, overrides
from progressive.config import load_config
from progressive.model.build import get_family, guess_data_info, step_flops

ROOT = Path(__file__).resolve().parents[2]


class Check(NamedTuple):
    """A method's own tuning, at one cell: each of ``variants`` trained into ``size`` at ``budget``, at each of
    ``factors`` x the tuned LR of that size's baseline, on ``seeds``. The baseline got an LR sweep at every cell; the
    methods get these (their LR at 0.5x and 2x, the V-cycle's coarse-level LR scale as variants at 1x), so the two
    arms are tuned with comparable effort. The factor whose seed-0 run has the lowest validation loss is the method's
    LR (bench.lib.envelope.method_lr): its other seeds run there, and savings are of them; the page shows every
    factor."""

    size: tuple[int, int]
    budget: int
    variants: tuple[str, ...]
    factors: tuple[float, ...]
    seeds: tuple[int, ...]


Size = tuple[int, int]


class More(NamedTuple):
    """One step of the runs added once a grid had run, to settle the cells its verdicts turn on (``Grid.more``).
    Planned after every other job, the steps in the order listed (a stop half-way leaves the earlier steps done) and,
    within a step, seed by seed (seed 0's LRs first, then each of ``seeds`` in turn: a stop half-way leaves every
    item of the step with the same seeds), the items in the order listed.

    ``cells``: baseline cells (size, budget). A cell the grid's ``sizes`` and ``reference_budgets`` do not name is a
    new one: it is swept on seed 0 over ``lrs`` (or the grid's ``lrs``), extended at an edge as every sweep is, and
    its ``seeds`` run at the tuned LR once the sweep is over. A cell of the grid runs seed 0 at each of ``lrs`` it
    has not tried (the whole range, not only until the best is interior: a tuned LR is the best of every LR tried,
    so one of these can change it, and the grid's own sweep then runs its seeds) and ``seeds`` at its tuned LR.
    ``methods``: (variant, budget), each trained into ``target`` (default the grid's) at ``factors`` x the tuned LR
    of the target's cell at that budget, on ``seeds`` (seed 0 at it, the others at the method's own tuned LR,
    envelope.method_lr); a factor other than 1 is an LR check's (``all_checks``), which becomes the method's LR where
    it wins on seed-0 validation. A target other than the grid's is a baseline cell of the grid or of a step's
    ``cells``: its methods wait until its sweep is over."""

    what: str  # what the step settles, for the page and the plan's log
    cells: tuple[tuple[Size, int], ...] = ()
    lrs: tuple[float, ...] = ()
    seeds: tuple[int, ...] = ()
    methods: tuple[tuple[str, int], ...] = ()
    factors: tuple[float, ...] = (1.0,)
    target: Size | None = None  # the size the methods grow into (None: the grid's target)


@dataclasses.dataclass(frozen=True)
class Grid:
    """What the frontier runs. ``budgets``: steps of the ``target`` model (their FLOPs are the budgets)."""

    recipe: str
    sizes: tuple[tuple[int, int], ...]
    heads: int
    target: tuple[int, int]
    budgets: tuple[int, ...]
    seeds: tuple[int, ...]
    lrs: tuple[float, ...]
    lr_bounds: tuple[float, float]
    max_trials: int
    variants: tuple[str, ...]
    zeroshot_limit: int | None
    overrides: tuple[tuple[str, Any], ...] = ()
    # baseline-only budgets beyond the methods' (budget, sizes): the reference curves reach past the methods'
    # losses at both ends, so a saving is interpolated rather than a bound
    reference_budgets: tuple[tuple[int, tuple[tuple[int, int], ...]], ...] = ()
    stem: str = ""  # its files: frontier<stem>.csv, savings<stem>.csv, frontier<stem>.png, frontier<stem>.md
    method_seeds: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (budget, seeds) where methods run fewer seeds
    envelope_methods: bool = True  # also train the methods at the envelope's size (not only at the target)
    checks: tuple[Check, ...] = ()  # the methods' own LR checks (``Check``)
    more: tuple[More, ...] = ()  # runs added to settle the deciding cells, after every other job (``More``)
    # the smallest budget the predictions' law is fitted from (bench/lib/laws.py): below it a grid's deep models may
    # still be in their early transient, which no power law in the tokens describes
    law_from: int = 0
    split_note: str = " (611 blocks of 128 tokens)"  # the size of the validation and test splits, for the page
    about: str = ""  # what sets this grid apart, for its page's title
    beside: str = ""  # the grid (``GRIDS`` name) whose baseline cells its page sets beside its own (one change apart)

    def seeds_of_methods(self, budget: int) -> tuple[int, ...]:
        """The seeds the methods run at ``budget``."""
        return dict(self.method_seeds).get(budget, self.seeds)

    def upto(self, budget: int) -> Grid:
        """The part of this grid at budgets up to ``budget`` (a long grid run a part at a time; the rows carry
        over, since a job's key does not depend on the grid it was planned in)."""
        budgets = tuple(b for b in self.budgets if b <= budget)
        if not budgets:
            raise ValueError(f"no methods' budget of this grid is <= {budget} (budgets: {self.budgets})")
        refs = tuple((b, s) for b, s in self.reference_budgets if b <= budget)
        checks = tuple(c for c in self.checks if c.budget <= budget)
        more = tuple(m._replace(cells=tuple(c for c in m.cells if c[1] <= budget),
                                methods=tuple(v for v in m.methods if v[1] <= budget)) for m in self.more)
        return dataclasses.replace(self, budgets=budgets, reference_budgets=refs, checks=checks,
                                   more=tuple(m for m in more if m.cells or m.methods))

    def own_cells(self) -> list[tuple[Size, int]]:
        """The (size, budget) cells of the grid's own sweeps: each size at the methods' budgets, and the
        references (not the cells ``more`` adds)."""
        cells = [(s, b) for s in self.sizes for b in self.budgets]
        return cells + [(s, b) for b, sizes in self.reference_budgets for s in sizes]

    def baseline_cells(self) -> list[tuple[Size, int]]:
        """Every (size, budget) the baseline runs at: the grid's own cells, then the new ones of ``more``."""
        cells = self.own_cells()
        return cells + list(dict.fromkeys(c for m in self.more for c in m.cells if c not in cells))

    @property
    def all_checks(self) -> tuple[Check, ...]:
        """The methods' LR checks: ``checks`` and each step of ``more`` that trains methods at another factor than 1
        (one Check per budget, with the tuned LR's factor 1 beside)."""
        out = list(self.checks)
        for m in self.more:
            if m.methods and m.factors != (1.0,):
                for b in dict.fromkeys(b for _, b in m.methods):
                    out.append(Check(m.target or self.target, b, tuple(v for v, bb in m.methods if bb == b),
                                     tuple(sorted({1.0, *m.factors})), m.seeds))
        return tuple(out)

    @property
    def baseline_sizes(self) -> list[tuple[int, int]]:
        """Every size the baseline runs at (the methods' sizes and the reference-only ones), smallest first: the
        envelope is over all of them."""
        return sorted({s for s, _ in self.baseline_cells()})

    @property
    def all_budgets(self) -> list[int]:
        """The methods' budgets and the reference budgets, ascending."""
        return sorted({*self.budgets, *(b for b, _ in self.reference_budgets)})




FULL = Grid(recipe="configs/default.yaml", sizes=((2, 32), (2, 64), (4, 96), (4, 128)), heads=4, target=(4, 128),
            budgets=(75, 150, 300), seeds=(0, 1, 2), lrs=(1e-3, 2e-3, 4e-3), lr_bounds=(1.25e-4, 1.28e-1),
            max_trials=8, variants=FRONTIER, zeroshot_limit=None,
            reference_budgets=((37, ((1, 16), (2, 16), (2, 32), (2, 64), (4, 96), (4, 128))), (75, ((1, 16), (2, 16))),
                               (150, ((2, 16),)), (600, ((2, 32), (2, 64), (4, 128)))),
            # the recipe's V-cycle at coarse-level LR scales 4 (its own), 2 and 1 where the review asked, and every
            # method's LR at 0.5x and 2x at one 4x128 cell; three seeds each
            checks=(*(Check(size, b, COARSE_LR, (1.0,), (0, 1, 2)) for size, b in (((4, 128), 75), ((4, 128), 150),
                                                                                  ((2, 32), 300))),
                    Check((4, 128), 150, FRONTIER, (0.5, 1.0, 2.0), (0, 1, 2))))
# The layer-dominated grid: at vocabulary 512 and width 64 the LM head is 20% / 11% / 6% of a training step's FLOPs
# of 2x64 / 4x64 / 8x64 (``regime``), so growing depth makes most of a step cheaper. Budgets are steps of the 4x64
# target (3.62e9 FLOPs a step): 1242, 2484, 4967 and 9934 steps are 4.5e12, 9e12, 1.8e13 and 3.6e13 FLOPs, about
# 10, 21, 42 and 84 tokens per parameter of 4x64. The methods grow into 4x64; 3 seeds at the two largest budgets,
# 1 at the smallest.
# Added once the whole grid had run, to settle the cells its verdicts turn on, the most decisive first (a stop
# half-way leaves them settled): more seeds where the hull is read for the methods that win, and for those methods;
# the sizes and LRs that could move that hull (6x64, 8x64's best LR at 14049, every size's LR over the whole range
# at the budgets that decide); the methods' own LR where they win, and the paper's 4x G_stack (1 -> 4 layers) beside
# this grid's 2x one; then a second width, so that the envelope is over shapes, not depths alone.
WIDE = (2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2)  # the whole LR range every deciding cell is swept over
# the hull's neighbours: the sizes that compete at its budgets, the cells near its chords
NEIGHBOURS = (((2, 64), 1242), ((2, 64), 9934), ((4, 64), 9934), ((8, 64), 14049), ((2, 64), 4967), ((2, 64), 7024))
LAYERS_MORE = (
    More("seeds 3-5 of the hull's cells where methods win, and of those methods",
         cells=(((8, 64), 9934), ((4, 64), 14049), ((2, 64), 2484)), seeds=(3, 4, 5),
         methods=(("gstack2", 9934), ("stackbert", 9934), ("apollo_authors", 9934), ("apollo_authors", 4967))),
    More("seed 3 of the hull's neighbours (the sizes that compete at its budgets, the cells near its chords)",
         cells=NEIGHBOURS, seeds=(3,)),
    # what can move the hull where the savings are read (9934) comes before the neighbours' seeds 4-5, since a stop
    # loses the runs in flight: 6x64 there, its seeds 3-5 once it joined the hull (at 1.6e-2, on 2 seeds), the other
    # sizes' untried LRs there, then 8x64's at 14049
    More("6x64 at 9934 steps, swept over the whole range", cells=(((6, 64), 9934),), lrs=WIDE, seeds=(1, 2)),
    More("seeds 3-5 of 6x64 at 9934 steps (the hull's cell where the savings are read)", cells=(((6, 64), 9934),),
         seeds=(3, 4, 5)),
    More("every size's LR over the whole range at 9934 steps (where the savings are read)",
         cells=(((2, 64), 9934), ((4, 64), 9934), ((8, 64), 9934)), lrs=WIDE),
    More("8x64 at 14049 steps at 1.6e-2 and above (its best at 9934)", cells=(((8, 64), 14049),), lrs=WIDE),
    More("seeds 4-5 of the hull's neighbours", cells=NEIGHBOURS, seeds=(4, 5)),
    More("6x64 at 14049 steps, swept over the whole range", cells=(((6, 64), 14049),), lrs=WIDE, seeds=(1, 2)),
    More("every size's LR over the whole range at the other deciding budgets (14049, 4967 steps)",
         cells=(((4, 64), 14049), ((1, 64), 4967), ((2, 64), 4967), ((4, 64), 4967), ((8, 64), 4967)), lrs=WIDE),
    More("the winning methods' own LR at 0.5x and 2x where they win",
         methods=(("gstack2", 9934), ("stackbert", 9934), ("apollo_authors", 9934)), factors=(0.5, 2.0), seeds=(0,)),
    More("the paper's G_stack (4x growth, 1 -> 4 layers) where the 2x variant wins", methods=(("gstack", 9934),),
         seeds=(0, 1, 2)),
    # (the 4x G_stack's smaller budgets came after the second width at 9934 until its own LR at 4,967 steps, 4e-3,
    # tested 2.8505 on seed 0, below every baseline there (2x64's 2.8834 over 5 seeds): a cell that can decide a
    # verdict against the envelope, where the width-32 seeds at 3.6e13, 0.28 above the hull, cannot)
    More("the paper's G_stack at the smaller budgets", methods=(("gstack", 4967), ("gstack", 2484)), seeds=(0, 1, 2)),
    # (it ran there at 4x64's tuned LR alone, 1.6e-2 / 8e-3, where the 2x variant tests 0.1 worse than at its own
    # 2e-3: its own LR, as every method's is chosen; once two LRs ran the sweep goes on at an edge, and seeds 1-2
    # move to the winner)
    More("the paper's G_stack's own LR at the smaller budgets (0.25x and 0.5x 4x64's)",
         methods=(("gstack", 4967), ("gstack", 2484)), factors=(0.25, 0.5), seeds=(0,)),
    More("a second width at 9934 steps: 96 at 2-6 layers, 32 at 4-8",
         cells=tuple((s, 9934) for s in ((2, 96), (4, 96), (6, 96), (4, 32), (6, 32), (8, 32))), seeds=(1, 2)),
    More("the second width at 9934 steps over the whole LR range",
         cells=tuple((s, 9934) for s in ((2, 96), (4, 96), (6, 96), (4, 32), (6, 32), (8, 32))), lrs=WIDE),
    More("every size's LR over the whole range at 2484 steps",
         cells=(((2, 64), 2484), ((4, 64), 2484), ((8, 64), 2484)), lrs=WIDE),
    More("the second width at 14049 steps",
         cells=tuple((s, 14049) for s in ((2, 96), (4, 96), (6, 96), (4, 32), (6, 32), (8, 32))), seeds=(1, 2)),
    More("seeds 3-5 of 6x64 at 14049 steps", cells=(((6, 64), 14049),), seeds=(3, 4, 5)),
    # the second width took the hull's two largest budgets (2x96) on 2 seeds, where the rule's simulated error rate
    # is 3.6-3.8% (a reference of one degree of freedom); on 5 it is 2.1-2.4% (bench.frontier.false_positives)
    More("seeds 3-5 of the hull's cells at the two largest budgets (2x96)",
         cells=(((2, 96), 9934), ((2, 96), 14049)), seeds=(3, 4, 5)),
    # a method read on seeds 1-2 against those settled cells: the rule's rate is 3.0% at a cell, 4.4% on a chord
    # (bench.frontier.false_positives); on 5 seeds 2.3-2.6%
    More("seeds 3-5 of the methods read on 2 seeds against the envelope",
         methods=(("gstack2", 4967), ("stackbert", 4967), ("gstack", 4967), ("gstack", 2484),
                  ("vcycle_paper_gstack", 4967), ("vcycle_paper", 4967), ("vcycle_coarse_lr1x", 4967),
                  ("vcycle_coarse_lr2x", 4967)), seeds=(3,)),
    # Closing the envelope (evidence 4): the best tuned shape was the widest tried at every budget (2x96 at 3.6e13
    # and 5.1e13, 2x64 at 1.8e13 and below), so the envelope's optimum lay on the grid's edge. Sweeps on seed 0
    # first, the most decisive first: 2x96's neighbours in depth and width where the savings are read, then the
    # widths past them, then the smaller budgets; the seeds of the cells that make the hull come after.
    More("2x96's neighbours at 3.6e13 (1x96, 3x96, 2x128), swept on seed 0",
         cells=tuple((s, 9934) for s in ((2, 128), (1, 96), (3, 96)))),
    # Growing into the envelope's shape (item 2): 2x128 tied 2x96 at 3.6e13 on seed 0 (validation 2.6796 against
    # 2.679), so width growth into it from 2x64 (the V-cycle's exact width de-coalescing; and the paper's V-cycle with
    # a width-only coarse level) is read there, its predictions committed first (bench/results/predictions/)
    # (2x128's own seeds 1-2 beside them: the same-size reference a width growth is read against)
    More("width growth into 2x128 at 3.6e13 (from 2x64), seeds 0-2, and 2x128's seeds 1-2",
         cells=(((2, 128), 9934),), target=(2, 128), seeds=(0, 1, 2),
         methods=(("width_grow", 9934), ("vcycle_paper_width", 9934))),
    More("width growth with the split's noise at 1.0 into 2x128 at 3.6e13, seeds 0-2", target=(2, 128),
         seeds=(0, 1, 2), methods=(("width_grow_noise1", 9934),)),
    More("2x96's neighbours at 5.1e13 (1x96, 3x96, 2x128), swept on seed 0",
         cells=tuple((s, 14049) for s in ((2, 128), (1, 96), (3, 96)))),
    # the first method that is one folder (progressive/methods/midas/): its bench variant comes from the registry,
    # its prediction was committed first (bench/results/predictions/layers-midas-4x64-9934.json)
    More("MIDAS (middle-block stacking) into 4x64 at 3.6e13, seeds 0-2", seeds=(0, 1, 2), methods=(("midas", 9934),)),
    # 2x96 turned out interior at 3.6e13 (1x96, 3x96, 2x64 and 2x128 all above it), and 2x128 leads 5.1e13 with no
    # neighbour of its own tried: its neighbours there come before the width-192 cells that can no longer change an
    # interior optimum
    More("widths 128 and 192 at 1-3 layers at 3.6e13 (1x128, 3x128, 2x192), swept on seed 0",
         cells=tuple((s, 9934) for s in ((1, 128), (3, 128), (2, 192)))),
    More("2x128's neighbours at 5.1e13 (1x128, 3x128, 2x192), swept on seed 0",
         cells=tuple((s, 14049) for s in ((1, 128), (3, 128), (2, 192)))),
    More("width 192 at 1 and 3 layers at 3.6e13 and 5.1e13, swept on seed 0",
         cells=tuple((s, b) for b in (9934, 14049) for s in ((1, 192), (3, 192)))),
    More("widths 96 and 128 at 1-3 layers at 1.8e13 and below (and 1x64 at 9e12, 4.5e12), swept on seed 0",
         cells=tuple((s, b) for b in (4967, 2484, 1242)
                     for s in ((2, 96), (2, 128), (1, 96), (3, 96), (1, 128), (3, 128), (1, 64))
                     if (s, b) != ((1, 64), 4967))),
    More("seeds 4-5 of the methods read on 2 seeds against the envelope",
         methods=(("gstack2", 4967), ("stackbert", 4967), ("gstack", 4967), ("gstack", 2484),
                  ("vcycle_paper_gstack", 4967), ("vcycle_paper", 4967), ("vcycle_coarse_lr1x", 4967),
                  ("vcycle_coarse_lr2x", 4967)), seeds=(4, 5)),
    # The next budget up (1e14 FLOPs, 28,098 steps of 4x64), predicted before any of its runs: the shapes the
    # envelope's prediction and the hull below it name (6x96, 2x96, 2x128) and the methods' target, seeds 0-2
    More("the envelope at 1e14 (6x96, 2x96, 2x128, 4x64), swept on seed 0, then seeds 1-2",
         cells=tuple((s, 28098) for s in ((4, 64), (2, 96), (2, 128), (6, 96))), seeds=(1, 2)),
    More("every method into 4x64 at 1e14, seeds 0-2", seeds=(0, 1, 2),
         methods=tuple((v, 28098) for v in LAYER_VARIANTS)),
)
LAYERS = Grid(recipe="configs/default.yaml", sizes=((2, 64), (4, 64), (8, 64)), heads=4, target=(4, 64),
              budgets=(2484, 4967, 9934), seeds=(0, 1, 2), lrs=(2e-3, 4e-3, 8e-3), lr_bounds=(2.5e-4, 6.4e-2),
              # zero-shot no more (0): at vocabulary 512 these models score LAMBADA 0.000 and the task costs ~3 min a
              # run; the rows that have it keep it
              max_trials=8, variants=LAYER_VARIANTS, zeroshot_limit=0,
              overrides=(("data.vocab_size", 512),),
              # 1x64 where a method ends below the envelope: 2x64, the smallest size, leads every budget, so a
              # smaller model could lower the envelope there (bracketing it from below, as the default grid does)
              # 7024 steps (2.5e13 FLOPs, a factor sqrt(2) from both neighbours): the envelope's size went from 2x64
              # at 1.8e13 to 8x64 at 3.6e13 (seeds 1-2), so the crossover, where 4x64 could lead, lies between
              # 14049 steps (5.1e13, sqrt(2) above the largest): methods that end below every baseline at 3.6e13
              # have only a ">= 0" saving there; the two sizes that could lead above it turn it into a value
              reference_budgets=((1242, ((2, 64), (4, 64), (8, 64))), (4967, ((1, 64),)),
                                 (7024, ((2, 64), (4, 64), (8, 64))), (14049, ((4, 64), (8, 64)))), stem="_layers",
              method_seeds=((2484, (0,)),), envelope_methods=False, split_note="",
              # (8x64 tests 3.96 at 1,242 steps, 0.8 above 2x64 there, and 3.03 at 4,967)
              law_from=2484,
              # every method's LR at 0.5x and 2x (one seed: a 9e12 run is ~8 min; StackBERT and Apollo, the two
              # nearest the baseline at seed 0, first; the V-cycle at its best coarse scale at this cell, 2x)
              # (and the paper's V-cycle at coarse LR scales 4, 2 and 1: its variants, run at every budget)
              checks=(Check((4, 64), 2484, ("stackbert", "apollo_authors"), (0.5, 1.0, 2.0), (0,)),
                      Check((4, 64), 2484, ("gstack2", "vcycle_paper_gstack", "vcycle_coarse_lr2x"), (0.5, 1.0, 2.0),
                            (0,)),
                      Check((4, 64), 2484, ("vcycle_paper", "vcycle_coarse_lr2x", "vcycle_coarse_lr1x"), (1.0,), (0,))),
              more=LAYERS_MORE,
              about="the layer-dominated grid (vocabulary 512, sizes 2x64 / 4x64 / 8x64, target 4x64)")
SMOKE = Grid(recipe="configs/tiny_test.yaml", sizes=((2, 16), (2, 32)), heads=2, target=(2, 32), budgets=(6, 12),
             seeds=(0, 1), lrs=(3e-3, 6e-3), lr_bounds=(1e-3, 1.2e-2), max_trials=3, variants=("vcycle", "gstack"),
             zeroshot_limit=2, overrides=(("data.cache_dir", str(ROOT / ".cache" / "data")),))
# The newest recipe (evidence 4): the layer grid under a warmup-stable-decay schedule (20% cooldown, linear to 0 as the
# recipe's own decay ends), so that a method on WSD is read against baselines on WSD. Its sizes are the shapes that
# made the envelope (2x64, 2x96) and the methods' target (4x64), its budgets three of the layer grid's; late expansion
# (Bu 2026: grow at 0.8 of the steps, from half the depth or from one layer) and StackBERT beside it as the stacking
# it descends from. The comparison is WSD against the recipe's linear decay to 0 (configs/default.yaml), not cosine.
LAYERS_WSD = dataclasses.replace(
    LAYERS, overrides=(("data.vocab_size", 512), *WSD.items()), sizes=((2, 64), (2, 96), (4, 64)),
    budgets=(2484, 4967, 9934), reference_budgets=(), method_seeds=(), checks=(), more=(), stem="_layers_wsd",
    variants=("late_expansion", "late_expansion_1", "stackbert"), beside="layers",
    about="the layer grid under WSD (vocabulary 512, sizes 2x64 / 2x96 / 4x64, target 4x64, a 20% cooldown)")
GRIDS = {"default": FULL, "layers": LAYERS, "layers_wsd": LAYERS_WSD}  # --grid NAME




# ---------------------------------------------------------------------------------------------- jobs


def _base(g: Grid, size: tuple[int, int], lr: float, seed: int) -> dict[str, Any]:
    return {**dict(g.overrides), "model.num_layers": size[0], "model.hidden_size": size[1],
            "model.num_heads": g.heads, "data.test_fraction": 0.02, "train.lr": lr, "train.seed": seed,
            "train.threads": 1, "train.progress": False, "train.eval_every": 10**6, "train.eval_batches": 10**5,
            "train.checkpoint_every": 10**6, "train.report_to": "none"}


def step_flops_of(g: Grid, size: tuple[int, int]) -> int:
    """Training FLOPs of one optimizer step of the baseline of ``size``."""

    cfg = load_config(ROOT / g.recipe, {**_base(g, size, 1e-3, 0), "method.name": "baseline"})
    fam = get_family(cfg.model.family)
    return step_flops(cfg, fam, fam.config_for(cfg.model, guess_data_info(cfg), cfg.data.seq_len))


def regime(g: Grid, size: tuple[int, int]) -> dict[str, float]:
    """What a model of ``size`` in grid ``g`` is made of: its parameters, the share of them in the token and
    position embeddings, and the share of a training step's FLOPs in the LM head (6 x width x vocabulary a token)."""

    cfg = load_config(ROOT / g.recipe, {**_base(g, size, 1e-3, 0), "method.name": "baseline"})
    fam = get_family(cfg.model.family)
    config = fam.config_for(cfg.model, guess_data_info(cfg), cfg.data.seq_len)
    model = fam.build_model(config, meta=True)
    params = sum(p.numel() for p in model.parameters())
    embed = sum(p.numel() for n, p in model.named_parameters() if n.endswith(("wte.weight", "wpe.weight")))
    tokens = cfg.train.batch_size * cfg.data.seq_len
    head = 6 * config.n_embd * config.vocab_size * tokens
    return {"params": params, "embedding_share": embed / params,
            "head_flops_share": head / step_flops(cfg, fam, config)}


def make_job(g: Grid, method: str, variant: str, size: tuple[int, int], budget: int, lr: float, seed: int,
             flops: dict[tuple[int, int], int], priority: int) -> dict[str, Any]:
    """A training job: its overrides, the row fields it fixes and its cache key (bench.lib.runs.config_hash)."""

    budget_flops = budget * flops[g.target]
    steps = max(1, round(budget_flops / flops[size]))  # the target's own steps at this budget
    over = {**_base(g, size, lr, seed), "train.steps": steps,
            **({"method.name": "baseline"} if method == "baseline" else overrides(variant, size[0]))}
    key = config_hash(load_config(ROOT / g.recipe, over))
    meta = {"method": method, "variant": variant, "layers": size[0], "width": size[1], "lr": lr, "budget": budget,
            "budget_flops": budget_flops, "seed": seed}
    return {"kind": "train", "key": key, "overrides": over, "meta": meta,
            "order": (priority, seed, budget, method, variant, size, lr)}



def train(job: dict[str, Any], recipe: str, root: str) -> dict[str, Any]:
    """Train ``job`` (cached under ``root/<key>``) and return its frontier row, with the code version that trained
    it (bench.lib.rows.code_version; "unknown (reused from the run cache)" when an earlier run was read back). A
    job of kind "retime" or "reproduce" exists to train again: it never reads a finished run back."""

    load1 = os.getloadavg()[0]
    cfg = load_config(ROOT / recipe, job["overrides"])
    again = job.get("kind") in ("retime", "reproduce")
    version = "unknown (reused from the run cache)" if finished(cfg, root) and not again else code_version()
    _, folder = run(cfg, root, job["key"], again=again)
    s = summary(folder)
    params = s["phases"][-1]["params"]
    return {**job["meta"], "steps": s["steps"], "tokens": s["tokens"], "params": params,
            "tokens_per_param": s["tokens"] / params, "flops": s["flops"], "val_loss": s["final_val_loss"],
            "test_loss": s["final_test_loss"], "wall_s": s["train_wall_s"], "load1": load1, "key": job["key"],
            "code_version": version}


