"""Apollo (Pan et al., AAAI 2024) and the stacking recipes it holds as special cases (StackBERT, G_stack, late
expansion): staged depth growth with low-value-prioritized depth sampling and weight sharing. The algorithm, its
deviations from the authors' code and their reasons: method.py's docstring; the options: options.py; the page:
docs/apollo.md.
"""
