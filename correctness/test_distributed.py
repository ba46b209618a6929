"""A GLAIHead trains under DistributedDataParallel (gloo, 2 CPU processes) to the weights one
process reaches on the concatenated batch.

Each rank takes its half of every batch; DDP averages the two halves' gradients, which is the
gradient of the mean loss over the whole batch, so after the same SGD steps both ranks hold
the single-process weights. The processes meet through a FileStore in a temporary folder and
gloo talks over the loopback interface only.

`HEADS` names the heads trained: add an entry (a builder taking a seed and returning an
nn.Module whose forward maps x [B, n0] to y [B, O]) to train another, e.g. a sparse head.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from glai_models import random_mlp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from glai_kernels.glai import from_mlp, prune

WORLD = 2
STEPS = 3
BATCH = 12  # per rank
WIDTHS = (5, 7, 6, 3)
LR = 0.5
# The two runs differ only in how each gradient's batch sum is split (two halves averaged by
# the all-reduce, or one sum): a few float64 roundings (u = 1.1e-16) per step. 1e-12 of the
# weights' scale leaves a 1000-fold margin over 3 steps; a lost or doubled half-batch moves
# them by ~1e-2.
TOLERANCE = 1e-12
# the workers take ~10 s on a loaded 2-core machine; a hang fails instead of blocking CI
SPAWN_TIMEOUT_S = 300


def dense_head(seed: int) -> nn.Module:
    """The dense estimator: every path of a random [5, 7, 6, 3] ReLU MLP, float64."""
    return from_mlp(random_mlp(WIDTHS, seed=seed, dtype=torch.float64), backend="torch")


def sparse_head(seed: int) -> nn.Module:
    """The pruned estimator in the sparse layout: its parameter is the K kept values."""
    reference = torch.randn(64, WIDTHS[0], dtype=torch.float64,
                            generator=torch.Generator().manual_seed(seed + 1))
    head = prune(dense_head(seed), reference, mu=0.5, layout="sparse").head
    head.backend = "torch"
    return head


HEADS: dict[str, Callable[[int], nn.Module]] = {"dense": dense_head, "sparse": sparse_head}


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s whole batch: x [WORLD*BATCH, n0] and its targets [WORLD*BATCH, O]."""
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(WORLD * BATCH, WIDTHS[0], generator=gen, dtype=torch.float64)
    return x, torch.randn(WORLD * BATCH, WIDTHS[-1], generator=gen, dtype=torch.float64)


def train(model: nn.Module, rank: int = 0, world: int = 1) -> None:
    """STEPS of SGD on the mean squared error, this rank's share of each batch."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, target = (t.chunk(world)[rank] for t in batch(step))
        opt.zero_grad()
        nn.functional.mse_loss(model(x), target).backward()
        opt.step()


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _worker(rank: int, store: str, kind: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=WORLD)
    try:
        model = DistributedDataParallel(HEADS[kind](seed=0))
        train(model, rank, WORLD)
        torch.save(_weights(model.module), f"{out}.{rank}")
        # DDP's reducer holds the process group: freed after destroy_process_group, gloo's
        # destructor joined threads waiting on the peer that had already exited, and the run
        # hung (seen twice). Both ranks finish, then the model goes, then the group.
        dist.barrier()
        del model
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="this torch has no gloo process group")
@pytest.mark.parametrize("kind", HEADS)
def test_ddp_trains_to_the_single_process_weights(kind, tmp_path, monkeypatch):
    if sys.platform == "linux":
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # loopback only
    out = tmp_path / "weights"
    workers = mp.spawn(_worker, args=(str(tmp_path / "store"), kind, str(out)), nprocs=WORLD,
                       join=False)
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while not workers.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in workers.processes:
                process.kill()
            pytest.fail(f"the {WORLD} DDP workers did not finish in {SPAWN_TIMEOUT_S} s")
    ranks = [torch.load(f"{out}.{r}", weights_only=True) for r in range(WORLD)]

    single = HEADS[kind](seed=0)
    start = _weights(single)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(single)
    finally:
        torch.set_num_threads(threads)
    expected = _weights(single)

    assert expected and all(set(r) == set(expected) for r in ranks)
    for name, want in expected.items():
        scale = float(want.abs().max())
        moved = float((want - start[name]).abs().max())
        assert moved > 1e-3 * scale, f"{name} barely trained ({moved:.3g}): the test is vacuous"
        for rank, got in enumerate(ranks):
            error = float((got[name] - want).abs().max())
            assert error <= TOLERANCE * scale, (
                f"{kind} head, rank {rank}: {name} is {error:.3g} from the single-process "
                f"weights (scale {scale:.3g})")

