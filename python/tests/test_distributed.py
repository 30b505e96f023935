"""Two processes with torch.distributed (gloo on 127.0.0.1), each holding part of the groups
and part of the tokens, reproduce the one-process advantages, loss, gradient and statistics by
all-reducing care's partial sums (SPEC §11 and the loss's global denominators).

Split: six groups of five rollouts; rank 0 holds groups 0-1 whole and the first two rollouts
of groups 2 and 3, rank 1 the rest (so groups 2 and 3 span both ranks, and every rank has
empty groups). Each rollout is one sequence of 1..7 tokens with a response mask.
"""

from __future__ import annotations

import os
import socket

import pytest

from conftest import need_torch

torch = need_torch()

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import numpy as np  # noqa: E402

import care_rl  # noqa: E402
import care_rl.torch as ct  # noqa: E402

G, B = 5, 6
N = G * B


def _data():
    g = torch.Generator().manual_seed(1234)
    rewards = torch.rand(N, generator=g)
    rewards[7] = float("nan")  # an invalid sample inside a split group
    lengths = torch.randint(1, 8, (N,), generator=g)
    t = int(lengths.sum())
    old = -torch.rand(t, generator=g, dtype=torch.float64) * 2
    logp = old + torch.randn(t, generator=g, dtype=torch.float64) * 0.3
    mask = torch.rand(t, generator=g) > 0.2
    return rewards, lengths, logp, old, mask


def _owner(i: int) -> int:
    g, j = divmod(i, G)
    return 0 if g < 2 or (g in (2, 3) and j < 2) else 1


def _worker(rank: int, port: int, world: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _check(rank)
    finally:
        dist.destroy_process_group()


def _check(rank: int) -> None:
    rewards, lengths, logp, old, mask = _data()
    seq = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])

    # ---- one process, the whole batch ----
    full_adv = torch.from_numpy(
        care_rl.group_advantages(rewards.numpy(), G, preset="trl", dtype=np.float64)
    )
    adv_f32 = ct.advantages(rewards, G, preset="trl")
    lp_full = logp.clone().requires_grad_()
    loss_full, stats_full = ct.policy_loss(
        lp_full, old, adv_f32, seq, mask, preset="verl", return_stats=True
    )
    loss_full.backward()

    # ---- this rank's part: its samples (CSR groups, same B everywhere) and their tokens ----
    mine = [i for i in range(N) if _owner(i) == rank]
    offs = [0]
    for gi in range(B):
        offs.append(offs[-1] + sum(1 for i in mine if i // G == gi))
    offs = torch.tensor(offs)
    r = rewards[mine]
    sums = ct.group_partial_sums(r, group_offsets=offs)
    dist.all_reduce(sums)
    m2 = ct.group_partial_squares(r, sums, group_offsets=offs)
    dist.all_reduce(m2)
    adv64 = ct.group_advantages_finalize(r, sums, m2, group_offsets=offs, preset="trl", dtype=torch.float64)
    torch.testing.assert_close(adv64, full_adv[mine], rtol=0, atol=1e-12)
    adv32 = ct.group_advantages_finalize(r, sums, m2, group_offsets=offs, preset="trl")
    torch.testing.assert_close(adv32, adv_f32[mine], rtol=0, atol=1e-6)

    tok = torch.cat([torch.arange(int(seq[i]), int(seq[i + 1])) for i in mine])
    my_seq = torch.cat([torch.zeros(1, dtype=torch.long), lengths[mine].cumsum(0)])
    my_mask = mask[tok]
    # The global denominators (token_mean: counted tokens over all ranks), as sums.
    n_tok = my_mask.sum().to(torch.float64)
    dist.all_reduce(n_tok)
    lp = logp[tok].clone().requires_grad_()
    # The single-process advantages are used so that the loss check isolates the loss.
    loss, stats = ct.policy_loss(
        lp, old[tok], adv_f32[mine], my_seq, my_mask, preset="verl",
        global_tokens=float(n_tok), return_stats=True,
    )  # fmt: skip
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    assert abs(total.item() - loss_full.item()) <= 1e-12, (total.item(), loss_full.item())
    # Each token's gradient has the same weight and terms as in one process: identical bits.
    assert torch.equal(lp.grad, lp_full.grad[tok])
    # Statistics are sums (ratio_min / ratio_max combine by min / max).
    fields = [f[3] for f in ct.LOSS_STATS_FIELDS]
    summed = stats.clone()
    dist.all_reduce(summed)
    lo = stats.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    hi = stats.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    combined = torch.where(
        torch.tensor([f == "min" for f in fields]), lo, torch.where(torch.tensor([f == "max" for f in fields]), hi, summed)
    )
    torch.testing.assert_close(combined, stats_full, rtol=0, atol=1e-12)

    # seq_mean_token_mean needs the global sequence count as well.
    counted = [bool(my_mask[int(my_seq[k]) : int(my_seq[k + 1])].any()) for k in range(len(mine))]
    n_seq = torch.tensor(float(sum(counted)), dtype=torch.float64)
    dist.all_reduce(n_seq)
    part = ct.policy_loss(
        logp[tok], old[tok], adv_f32[mine], my_seq, my_mask, preset="verl",
        aggregation="seq_mean_token_mean", global_sequences=float(n_seq),
    )  # fmt: skip
    dist.all_reduce(part)
    whole = ct.policy_loss(logp, old, adv_f32, seq, mask, preset="verl", aggregation="seq_mean_token_mean")
    assert abs(part.item() - whole.item()) <= 1e-12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_reproduce_one_process():
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("skipped distributed test: this torch has no gloo backend")
    mp.spawn(_worker, args=(_free_port(), 2), nprocs=2, join=True)
