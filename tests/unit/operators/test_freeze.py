"""operators.freeze_prefix: what freezes, what keeps training (a tied head), and that the prefix runs
without autograd yet computes exactly what the plain model computes."""

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

from operators import OperatorError
from operators.freeze import freeze_prefix, frozen_layers, prefix_hooks_paused
from tests.unit.model.test_flops import FAMILIES, _inputs

GPT2 = dict(vocab_size=64, n_positions=16, n_embd=32, n_layer=3, n_head=2, bos_token_id=0, eos_token_id=0,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def test_a_tied_lm_head_is_never_frozen_by_accident():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**GPT2))
    assert model.lm_head.weight is model.transformer.wte.weight
    frozen = freeze_prefix(model, 2)
    assert "transformer.wte.weight" not in frozen and "transformer.wpe.weight" in frozen
    assert {n.split(".")[2] for n in frozen if n.startswith("transformer.h.")} == {"0", "1"}
    ids = torch.randint(0, 64, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.requires_grad  # the head trains
    assert model.transformer.wpe.weight.grad is None and model.transformer.h[1].mlp.c_fc.weight.grad is None
    assert model.transformer.h[2].mlp.c_fc.weight.grad is not None
    # the embedding learns from the head only: its gradient is exactly the head's
    ref = GPT2LMHeadModel(GPT2Config(**GPT2))
    ref.load_state_dict(model.state_dict())
    h = ref.transformer(input_ids=ids).last_hidden_state.detach()
    torch.nn.functional.cross_entropy(ref.lm_head(h)[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1)).backward()
    assert torch.allclose(model.lm_head.weight.grad, ref.lm_head.weight.grad, atol=1e-6)


def test_frozen_prefix_computes_what_the_plain_model_computes_and_keeps_the_callers_grad_mode():
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=3,
                                                     num_attention_heads=2, intermediate_size=64, num_labels=3))
    model.eval()
    ids = torch.randint(1, 64, (2, 8))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    freeze_prefix(model, 2)
    assert frozen_layers(model) == 2 and not model.bert.embeddings.word_embeddings.weight.requires_grad
    assert torch.equal(model(input_ids=ids).logits.detach(), before)
    with torch.no_grad():
        model(input_ids=ids)
        assert not torch.is_grad_enabled()  # restored to the caller's mode, not switched on
    assert torch.is_grad_enabled()
    with prefix_hooks_paused(model):
        assert model(input_ids=ids).logits.requires_grad
    with pytest.raises(OperatorError, match="a prefix only grows"):
        freeze_prefix(model, 1)
    freeze_prefix(model, 3)
    assert frozen_layers(model) == 3 and model.classifier.weight.requires_grad


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_serving_a_cached_prefix_output_computes_the_same_outputs_for_every_class(name):
    """AutoCache's forward: the prefix's output fed at depth 1 and at depth L (only the head runs), and the
    incremental path (depth 1 -> 2 through layer 1 only), all equal the plain forward bit for bit."""
    from operators.freeze import forward_from, prefix_output

    torch.manual_seed(0)
    model = FAMILIES[name]().eval()
    inputs = _inputs(model)
    with torch.no_grad():
        ref = model(**inputs)
    key = "logits" if "logits" in ref else "last_hidden_state"
    h1 = prefix_output(model, inputs, stop=1)
    h2 = prefix_output(model, inputs, stop=2, start=1, hidden=h1)
    assert torch.equal(h2, prefix_output(model, inputs, stop=2))
    for start, h in ((1, h1), (2, h2)):
        with torch.no_grad():
            assert torch.equal(forward_from(model, inputs, start, h)[key], ref[key])
