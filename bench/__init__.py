"""Benchmarks, by room; each runs as ``python -m bench.<room>[.<name>]`` and writes data under bench/results/.

    lib/        the library every room imports (and nothing else of bench/): the run cache, output folders and
                results files, the reference envelope and savings, the frontier's rows and grid, the one table
                of run variants, tiny models of every family
    frontier/   every method on one compute-optimal frontier (python -m bench.frontier)
    papers/     the three papers' tables at this machine's scale (python -m bench.papers <paper>)
    claims/     one method claim each: the V-cycle's recipe search and ablation, Apollo, AutoFreeze
    speed/      system speed: throughput, data path, token preparation, FSDP2, elastic pipelining, the
                operators' time and memory, the loss's memory, the prepared GPU check and its bare anchor loop
    exactness/  how exact the operators are, per model class
    pages/      every generated page (the README's results block, docs/results/), rendered from bench/results/
                only, its prose in templates (python -m bench.pages [--check]); the only room that writes pages

Rooms import bench.lib and their own modules, never another room; a script never imports another script
(tests/unit/project/test_layout.py holds both).
"""
