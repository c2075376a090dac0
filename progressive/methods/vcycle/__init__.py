"""The V-cycle: multi-level training (Zou, Zhang, Deng, ICLR 2024): coalescing, de-coalescing and interpolation
between levels of a K-level V-cycle. The algorithm, its deviations and their reasons: method.py's docstring; the
options: options.py; the page: docs/vcycle.md.
"""
