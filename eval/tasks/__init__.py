"""Zero-shot language-modelling tasks for ``eval.zeroshot``: bundled-data loaders (``lm_data``), the
batched log-likelihood scorer (``scoring``), and lm-evaluation-harness task configs (``harness/``)."""
