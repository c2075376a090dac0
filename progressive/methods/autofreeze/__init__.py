"""AutoFreeze and AutoCache (PipeTransformer, He et al., ICML 2021, part 1): a growing prefix of layers freezes on
the paper's schedule and a gradient criterion, and AutoCache keeps the frozen prefix's outputs. The algorithm and
its deviations: method.py's docstring; the options: options.py; the page: docs/autofreeze.md.
"""
