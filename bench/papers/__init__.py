"""The three papers' tables at this machine's scale, one command each:

    python -m bench.papers multilevel        # Zou et al., ICLR 2024: GPT / BERT / DeiT tables
    python -m bench.papers apollo            # Pan et al., AAAI 2024: loss vs FLOPs, GLUE after pre-training
    python -m bench.papers pipetransformer   # He et al., ICML 2021: Table 1 and its breakdown, measured and simulated
    python -m bench.papers <paper> --smoke   # a few steps of everything (seconds; the test suite runs it)

Each records its page's data, ``bench/results/papers_<paper>.json`` (every table as rows, the numbers the notes
quote, the training commands, the machine and wall time), draws its figure beside it and prints the tables; the
page itself, docs/results/<paper>.md, is ``python -m bench.pages``'s (bench/pages/papers.py). ``--smoke`` records
into its ``--out`` folder. Runs are cached by config hash, so a re-run only redoes what changed.
"""
