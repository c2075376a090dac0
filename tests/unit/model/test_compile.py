"""train.compile: Accelerate compiles the model with inductor in prepare (so again after every change);
methods still see the plain module; the compiled steps compute what the eager ones compute. Accelerate's
settings hold per process, so the compiled run gets its own process."""

import copy
import json
import json as _json
import subprocess
import sys

import numpy as np
import pytest
from accelerate.utils import is_compiled_module

from progressive.config import dump_yaml
from progressive.run.trainer import Trainer
from tests.train_utils import ROOT, rows, tiny_cfg


@pytest.mark.slow
def test_compiled_training_matches_eager_and_reports_compile_time(tmp_path):
    over = dict(method="baseline", train__steps=3, train__eval_every=100)
    eager = tiny_cfg(tmp_path / "eager", **over)
    tr = Trainer(eager)
    tr.run()
    assert not is_compiled_module(tr.model)
    compiled = tiny_cfg(tmp_path / "compiled", train__compile=True, **over)
    path = tmp_path / "compiled.yaml"
    path.write_text(dump_yaml(compiled))
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config", str(path)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = rows(eager.run_dir, "train"), rows(compiled.run_dir, "train")
    assert np.allclose([r["loss"] for r in a], [r["loss"] for r in b], rtol=0, atol=1e-5)
    assert "compile_s" not in a[-1] and 0 < b[-1]["compile_s"] <= b[-1]["wall"]  # the first step, part of wall
    assert json.loads((compiled.run_dir / "summary.json").read_text())["steps"] == 3


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_compiled_causal_lm_hands_sdpa_no_mask_even_where_dynamo_folds_is_exporting_to_true(monkeypatch, family):
    """torch 2.11's dynamo makes torch.compiler.is_exporting() True while tracing, and transformers then builds the
    causal mask (no flash kernel); the families' attention (progressive.model.attention) builds none, and the loss is
    plain SDPA's."""

    import torch
    import transformers.masking_utils as masking

    from progressive.config import ModelConfig
    from progressive.model.attention import CAUSAL_SDPA, compiled_sdpa_masks
    from progressive.model.build import DataInfo, get_family

    fam = get_family(family)
    config = fam.build_config(ModelConfig(family=family, hidden_size=32, num_layers=2, num_heads=2, dropout=0.0),
                              DataInfo(vocab_size=64, bos_id=0, eos_id=0), 16)
    torch.manual_seed(0)
    ours = fam.build_model(copy.deepcopy(config)).eval()
    plain = fam.model_cls(copy.deepcopy(config)).eval()
    plain.load_state_dict(ours.state_dict())
    assert ours.config._attn_implementation == CAUSAL_SDPA and plain.config._attn_implementation == "sdpa"
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(masking, "is_torchdynamo_exporting", lambda: True)
    loss, masks = compiled_sdpa_masks(ours, ids)
    plain_loss, plain_masks = compiled_sdpa_masks(plain, ids)
    assert masks and not any(masks) and all(plain_masks)
    assert loss == pytest.approx(plain_loss, abs=1e-5)
    padded = torch.ones_like(ids)
    padded[0, -3:] = 0  # with padding it defers to transformers' mask, exactly as plain SDPA
    assert ours(input_ids=ids, attention_mask=padded, labels=ids).loss.item() == pytest.approx(
        plain(input_ids=ids, attention_mask=padded, labels=ids).loss.item(), abs=1e-6)


def test_a_saved_checkpoint_does_not_carry_the_attention_name(tmp_path):

    from transformers import GPT2LMHeadModel

    from progressive.config import ModelConfig
    from progressive.model.build import DataInfo, get_family

    fam = get_family("gpt2")
    model = fam.build_model(fam.build_config(ModelConfig(family="gpt2", hidden_size=32, num_layers=1, num_heads=2),
                                             DataInfo(vocab_size=64, bos_id=0, eos_id=0), 16))
    model.save_pretrained(tmp_path)
    assert "sdpa_causal" not in (tmp_path / "config.json").read_text()
    assert GPT2LMHeadModel.from_pretrained(tmp_path).config._attn_implementation == "sdpa"
    assert _json.loads((tmp_path / "config.json").read_text())["model_type"] == "gpt2"
