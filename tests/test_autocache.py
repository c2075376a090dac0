"""AutoCache's store: byte bounds per tier, the disk tier round-trips, one entry per sample, depths."""

import numpy as np
import pytest
import torch

from progressive.autocache import ActivationCache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_memory_then_disk_tiers_respect_their_byte_bounds_and_round_trip(tmp_path, dtype):
    shape = (4, 8)
    entry = 32 * torch.empty((), dtype=dtype).element_size()
    cache = ActivationCache(shape, dtype, memory_bytes=3 * entry + 1, disk_bytes=2 * entry, disk_dir=tmp_path / "c")
    x = torch.randn(7, *shape).to(dtype)
    cache.put(np.arange(7), depth=2, values=x)
    assert len(cache.mem) == 3 and len(cache.disk_of) == 2  # samples 5, 6 fit nowhere: not cached
    assert cache.stats.memory_bytes == 3 * entry and cache.stats.disk_bytes == 2 * entry
    assert cache.depths(np.array([0, 4, 5])).tolist() == [2, 2, -1]
    assert torch.equal(cache.get(np.array([4, 0, 3])), x[[4, 0, 3]])  # disk, memory, disk
    y = torch.randn(2, *shape).to(dtype)
    cache.put(np.array([0, 4]), depth=3, values=y)  # a deeper entry replaces the stale one in place
    assert cache.depths(np.array([0, 4, 1])).tolist() == [3, 3, 2]
    assert torch.equal(cache.get(np.array([0, 4])), y) and len(cache.mem) == 3 and len(cache.disk_of) == 2
    cache.close()
    assert not (tmp_path / "c").exists()


def test_negative_bounds_are_refused():
    with pytest.raises(ValueError, match="cache bounds must be >= 0"):
        ActivationCache((2,), torch.float32, memory_bytes=-1)
