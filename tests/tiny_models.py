"""Tiny random models of every supported family (fp32, dropout 0) and their inputs, for tests: the models
live in bench/lib/tiny.py (the exactness benches measure on them too); the random shapes are here."""

from __future__ import annotations

from hypothesis import strategies as st

from bench.lib.tiny import (  # noqa: F401  (re-exported for the tests)
    ALL_CLASSES,
    BERT_CLASSES,
    GPT2_CLASSES,
    LLAMA_CLASSES,
    VIT_CLASSES,
    VOCAB,
    Shape,
    main_output,
    make_config,
    make_inputs,
    make_model,
)


@st.composite
def shapes(draw, classes=ALL_CLASSES, k: int = 2, depth: int = 2) -> Shape:
    """Random small shapes whose sizes divide by ``k`` (width) and ``depth`` (layers)."""
    cls = draw(st.sampled_from(classes))
    heads = k * draw(st.integers(1, 2))
    kv = None
    if cls in LLAMA_CLASSES:
        kv = draw(st.sampled_from([h for h in (heads, heads // 2, 1) if h >= 1 and heads % h == 0]))
    return Shape(cls=cls, heads=heads, head_dim=draw(st.sampled_from([4, 8])),
                 layers=depth * draw(st.integers(1, 2)), ffn_mult=draw(st.sampled_from([2, 3])),
                 kv_heads=kv, tied=draw(st.booleans()))
