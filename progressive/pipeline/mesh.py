"""The (dp, pp) mesh and the layout that says which rank holds which layers (PipeTransformer's AutoDP, sec. 3.3).

All processes live for the whole run (torchrun starts world = K_0 x dp_0 of them, one per device). A layout
puts them on a 2-D DeviceMesh of shape (dp, pp = K), row-major: rank r is replica d = r // K of pipeline
stage s = r % K, so a pipeline is K consecutive ranks (one node's devices, in the paper's setting) and the
replicas of a stage are K ranks apart. When AutoPipe halves K, ``build_mesh`` makes a new mesh
(dp, pp) -> (2 dp, pp / 2) with new process groups; rank r keeps its number and takes its new coordinates.

The authors kept idle processes blocked on a control broadcast until a pipeline needed them ("inactive
ranks") and re-created one NCCL group of active ranks per change; here every rank always trains (it is a
stage of some replica), so no rank idles, and the groups are torch's DeviceMesh sub-groups.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


@dataclass(frozen=True)
class Layout:
    """A pipeline layout: ``frozen`` layers outside it, the active layers split at ``bounds`` (frozen =
    b_0 < ... < b_K = L; (L, L) when everything is frozen and the one stage holds only the head), ``dp``
    replicas, ``microbatches`` per replica and step."""

    frozen: int
    bounds: tuple[int, ...]
    dp: int
    microbatches: int

    @property
    def k(self) -> int:
        """K, the number of stages."""
        return len(self.bounds) - 1

    @property
    def world(self) -> int:
        """Processes the layout needs: dp x K."""
        return self.dp * self.k

    def coords(self, rank: int) -> tuple[int, int]:
        """(replica d, stage s) of ``rank``."""
        return divmod(rank, self.k)

    def rank(self, replica: int, stage: int) -> int:
        """The rank of stage ``stage`` in replica ``replica``."""
        return replica * self.k + stage

    def sizes(self) -> list[int]:
        """Active layers per stage."""
        return [b - a for a, b in zip(self.bounds, self.bounds[1:])]

    def as_dict(self) -> dict:
        """JSON-able (kept in checkpoints)."""
        return {**asdict(self), "bounds": list(self.bounds)}

    @classmethod
    def from_dict(cls, d: dict) -> Layout:
        """Inverse of ``as_dict``."""
        return cls(int(d["frozen"]), tuple(int(b) for b in d["bounds"]), int(d["dp"]), int(d["microbatches"]))


@dataclass
class Mesh:
    """The DeviceMesh of a layout and this rank's place in it."""

    mesh: DeviceMesh
    dp_group: dist.ProcessGroup
    pp_group: dist.ProcessGroup
    replica: int
    stage: int

    def describe(self) -> dict:
        """What the process groups say (not what the layout intended): mesh shape, group sizes, ranks."""
        return {"mesh": list(self.mesh.shape), "dp_size": dist.get_world_size(self.dp_group),
                "pp_size": dist.get_world_size(self.pp_group), "dp_rank": dist.get_rank(self.dp_group),
                "pp_rank": dist.get_rank(self.pp_group)}


def build_mesh(layout: Layout, device: torch.device) -> Mesh:
    """A (dp, pp) DeviceMesh for ``layout`` over all ranks (collective: every rank calls it, in the same
    order).

    Raises:
        RuntimeError: the world size is not dp x K, or the groups disagree with the layout.
    """
    world = dist.get_world_size()
    if world != layout.world:
        raise RuntimeError(f"layout needs dp {layout.dp} x K {layout.k} = {layout.world} processes, world is {world}")
    mesh = init_device_mesh(device.type, (layout.dp, layout.k), mesh_dim_names=("dp", "pp"))
    replica, stage = layout.coords(dist.get_rank())
    out = Mesh(mesh, mesh["dp"].get_group(), mesh["pp"].get_group(), replica, stage)
    seen = out.describe()
    if (seen["dp_rank"], seen["pp_rank"], seen["dp_size"], seen["pp_size"]) != (replica, stage, layout.dp, layout.k):
        raise RuntimeError(f"rank {dist.get_rank()}: mesh groups {seen} disagree with layout {layout}")
    return out
