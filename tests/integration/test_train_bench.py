"""python -m bench.speed.throughput: the harness and the bare loop train identically; the report (incl. MFU) is
complete."""

import pytest
import torch

from bench.speed import throughput
from tests.train_utils import CACHE


@pytest.mark.slow
def test_harness_and_bare_loop_give_identical_losses_and_a_full_report(tmp_path):
    tiny = {"model.hidden_size": 32, "model.num_layers": 2, "model.num_heads": 2, "data.vocab_size": 384,
            "data.seq_len": 32, "data.max_tokens": 40000, "data.cache_dir": CACHE, "train.batch_size": 8,
            "train.steps": 4, "train.cpu": True, "train.threads": 2}
    threads = torch.get_num_threads()
    try:  # the runs set train.threads for the process: the tests after this one keep theirs
        result = throughput.section("cpu-tiny", tiny, warmup=1, repeats=1, peak=1e12)  # the MFU path runs on CPU too
    finally:
        torch.set_num_threads(threads)
    run = result["runs"][0]
    assert run["max_loss_diff"] == 0.0  # same model, same batches, same optimizer: bit-identical losses
    assert run["harness_tok_s"] > 0 and run["bare_tok_s"] > 0 and 0 < result["median"]["ratio"]
    assert 0 < result["mfu"]["harness_tok_s"] < 1
