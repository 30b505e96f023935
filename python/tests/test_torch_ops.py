"""The PyTorch side: every ``care::`` op passes ``torch.library.opcheck``; results and
gradients match the SPEC formulas written with torch ops (and autograd through them);
``torch.compile(fullgraph=True)`` of a training step matches eager; CUDA runs match the CPU and
can be captured in a CUDA graph (skipped without a GPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import need_gpu, need_torch

torch = need_torch()

import care_rl  # noqa: E402
import care_rl.torch as ct  # noqa: E402
from care_rl import CareError, _care  # noqa: E402

OPS = [
    "group_advantages",
    "policy_loss",
    "selective_log_softmax",
    "selective_log_softmax_backward",
    "logits_policy_loss",
    "discounted_returns",
    "gae",
    "whiten",
    "discounted_returns_whitened",
    "gae_whitened",
    "logits_policy_loss_fused",
]


def _loss_inputs(device="cpu", dtype=torch.float32, b=4, length=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, length, generator=g, dtype=torch.float64) * 2
    logp = old + torch.randn(b, length, generator=g, dtype=torch.float64) * 0.3
    mask = torch.rand(b, length, generator=g) > 0.25
    adv = torch.randn(b, generator=g)
    ref = old + torch.randn(b, length, generator=g, dtype=torch.float64) * 0.2
    to = lambda t: t.to(dtype).to(device)  # noqa: E731
    return to(logp), to(old), to(ref), mask.to(device), adv.to(device)


def _loss_ref(logp, old, ref, adv_tok, mask, eps=0.2, dual=0.0, beta=0.0):
    """SPEC §10 in torch ops (float64): token_mean, clip, dual clip, k3 KL."""
    delta = (logp - old).clamp(-20, 20)
    rho = delta.exp()
    pg1 = -adv_tok * rho
    pg2 = -adv_tok * rho.clamp(1 - eps, 1 + eps)
    l = torch.maximum(pg1, pg2)
    if dual > 1:
        l = torch.where(adv_tok < 0, torch.minimum(l, -adv_tok * dual), l)
    if beta > 0:
        x = (ref - logp).clamp(-20, 20)
        l = l + beta * (x.exp() - x - 1).clamp(-10, 10)
    m = mask.to(l.dtype)
    return (l * m).sum() / m.sum()


# ---- opcheck -----------------------------------------------------------------------------------


def _op_cases(device):
    logp, old, ref, mask, adv = _loss_inputs(device)
    offs = torch.arange(0, 25, 6, dtype=torch.int32, device=device)
    lp = logp.reshape(-1).clone().requires_grad_()
    x = torch.randn(10, 13, device=device, requires_grad=True)
    y = torch.randint(0, 13, (10,), device=device)
    m = torch.rand(10, device=device) > 0.2
    _, _, lse = torch.ops.care.selective_log_softmax(x.detach(), y, m, 0.7, True)
    ent = torch.ops.care.selective_log_softmax(x.detach(), y, m, 0.7, True)[1]
    verl = ct.loss_options("verl")
    return {
        "group_advantages": (torch.rand(12, device=device), None, None, 4, ct.advantage_options("trl")),
        "policy_loss": (
            lp, old.reshape(-1), ref.reshape(-1), adv, offs, mask.reshape(-1),
            ct.loss_options("verl", beta=0.1), False, 0.0, 0.0, 0.0, 6,
        ),
        "selective_log_softmax": (x, y, m, 0.7, True),
        "selective_log_softmax_backward": (
            x.detach(), y, m, 0.7, lse, ent, torch.randn(10, device=device), torch.randn(10, device=device),
        ),
        "logits_policy_loss": (
            x, y, -torch.rand(10, device=device), None, torch.randn(2, device=device),
            torch.tensor([0, 4, 10], dtype=torch.int32, device=device), m, 1.0, verl, False,
            0.0, 0.0, 0.0, 0,
        ),
        "discounted_returns": (torch.randn(10, device=device), _TOK_OFFS.to(device), m, 0.9, "reset"),
        "gae": (torch.randn(10, device=device), torch.randn(10, device=device), _TOK_OFFS.to(device), m, 0.9, 0.8),
        "whiten": (torch.randn(10, device=device), m, 1e-8, "biased", 1e-8),
        "logits_policy_loss_fused": (
            x.detach(), y, -torch.rand(10, device=device), None, torch.randn(2, device=device),
            torch.tensor([0, 4, 10], dtype=torch.int32, device=device), m, 1.0, verl, False,
            0.0, 0.0, 0.0,
        ),
        "discounted_returns_whitened": (
            torch.randn(10, device=device), _TOK_OFFS.to(device), m, 0.9, "reset", 1e-8, "unbiased", 1e-8,
        ),
        "gae_whitened": (
            torch.randn(10, device=device), torch.randn(10, device=device), _TOK_OFFS.to(device), m, 0.9, 0.8,
            1e-8, "biased", 0.0,
        ),
    }  # fmt: skip


_TOK_OFFS = torch.tensor([0, 3, 3, 10], dtype=torch.int32)  # an empty sequence in the middle


@pytest.mark.parametrize("name", OPS)
def test_opcheck_cpu(name):
    args = _op_cases("cpu")[name]
    torch.library.opcheck(getattr(torch.ops.care, name).default, args)


@pytest.mark.parametrize("name", OPS)
def test_opcheck_cuda(name):
    need_gpu()
    args = _op_cases("cuda")[name]
    torch.library.opcheck(getattr(torch.ops.care, name).default, args)


# ---- values and gradients ----------------------------------------------------------------------


def test_advantages_match_numpy_and_are_not_differentiable():
    r = torch.rand(24, requires_grad=True)
    a = ct.advantages(r, 6, preset="trl")
    assert not a.requires_grad and a.dtype == torch.float32
    np.testing.assert_array_equal(a.numpy(), care_rl.group_advantages(r.detach().numpy(), 6, preset="trl"))
    offs = torch.tensor([0, 5, 5, 24])
    valid = torch.rand(24) > 0.3
    b = ct.advantages(r.detach(), group_offsets=offs, valid=valid, preset="dr_grpo")
    want = care_rl.group_advantages(
        r.detach().numpy(), group_offsets=offs.numpy(), valid=valid.numpy(), preset="dr_grpo"
    )
    np.testing.assert_array_equal(b.numpy(), want)
    assert ct.advantages(r.detach().reshape(4, 6)).shape == (4, 6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_policy_loss_and_gradient_match_autograd_of_the_formula(dtype):
    logp, old, ref, mask, adv = _loss_inputs(dtype=dtype)
    lp = logp.clone().requires_grad_()
    loss, stats = ct.policy_loss(lp, old, adv, mask=mask, logp_ref=ref, preset="verl", beta=0.05, return_stats=True)
    loss.backward()
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert lp.grad.dtype == dtype
    # The reference sees exactly the values care sees (the inputs in their dtype, widened).
    x = logp.double().requires_grad_()
    want = _loss_ref(x, old.double(), ref.double(), adv.double()[:, None].expand_as(x), mask, dual=3.0, beta=0.05)
    want.backward()
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    assert loss.item() == pytest.approx(want.item(), rel=tol, abs=tol)
    # The gradient is computed in float64 and rounded once to float32, then to the dtype.
    torch.testing.assert_close(lp.grad.double(), x.grad.to(torch.float32).to(dtype).double(), rtol=1e-6, atol=1e-9)
    st = ct.stats_dict(stats)
    assert st["tokens"] == mask.sum().item() and st["loss"] == pytest.approx(loss.item(), rel=1e-6)
    assert list(st) == [f[0] for f in ct.LOSS_STATS_FIELDS]


def test_policy_loss_options_layouts_and_errors():
    logp, old, ref, mask, adv = _loss_inputs()
    flat = logp.reshape(-1)
    offs = torch.arange(0, 25, 6)
    a = ct.policy_loss(logp, old, adv, mask=mask)
    b = ct.policy_loss(flat, old.reshape(-1), adv, offs, mask.reshape(-1))
    c = ct.policy_loss(flat, old.reshape(-1), adv.repeat_interleave(6), offs, mask.reshape(-1))
    assert a.item() == b.item() == c.item()
    seq = ct.policy_loss(logp, old, adv, mask=mask, aggregation="seq_mean_token_mean")
    m = mask.double()
    per = (_loss_terms(logp, old, adv) * m).sum(1) / m.sum(1)
    assert seq.item() == pytest.approx(per.mean().item(), rel=1e-6)
    with pytest.raises(CareError) as e:
        ct.policy_loss(logp, old, adv[:3], mask=mask)
    assert e.value.code == "length_mismatch"
    with pytest.raises(CareError) as e:
        ct.policy_loss(logp, old, adv, mask=mask, aggregation="mean")
    assert e.value.code == "invalid_argument" and "token_mean" in str(e.value)
    with pytest.raises(CareError) as e:
        ct.policy_loss(flat, None, adv, torch.tensor([0, 6, 3, 12, 24]))
    assert e.value.code == "invalid_layout"
    with pytest.raises(CareError) as e:
        ct.policy_loss(logp.to(torch.int32), None, adv, mask=mask)
    assert e.value.code == "invalid_argument" and "int32" in str(e.value)
    with pytest.raises(CareError) as e:
        ct.policy_loss(logp, old[:, :5], adv, mask=mask)
    assert e.value.code == "length_mismatch"


def _loss_terms(logp, old, adv):
    rho = (logp.double() - old.double()).clamp(-20, 20).exp()
    a = adv.double()[:, None]
    return torch.maximum(-a * rho, -a * rho.clamp(0.8, 1.2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_selective_log_softmax_matches_torch(dtype):
    g = torch.Generator().manual_seed(5)
    wide = torch.randn(9, 40, generator=g).to(dtype)
    x = wide[:, :31]  # strided rows, read in place
    y = torch.randint(0, 31, (9,), generator=g)
    mask = torch.ones(9, dtype=torch.bool)
    mask[4] = False
    xr = x.detach().clone().requires_grad_()
    lp, ent = ct.selective_log_softmax(xr, y, temperature=0.8, mask=mask, return_entropy=True)
    ((lp * torch.arange(9)).sum() + ent.sum() * 0.5).backward()
    xd = x.double().requires_grad_()
    ls = torch.log_softmax(xd / 0.8, -1)
    want_lp = ls.gather(-1, y[:, None])[:, 0] * mask
    want_ent = -(ls.exp() * ls).sum(-1) * mask
    ((want_lp * torch.arange(9)).sum() + 0.5 * want_ent.sum()).backward()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(lp.double(), want_lp, rtol=tol, atol=tol)
    torch.testing.assert_close(ent.double(), want_ent, rtol=tol, atol=tol)
    gtol = 1e-12 if dtype == torch.float64 else (1e-2 if dtype == torch.bfloat16 else 1e-6)
    torch.testing.assert_close(xr.grad.double(), xd.grad, rtol=gtol, atol=gtol)
    assert (xr.grad[4] == 0).all() and lp[4] == 0
    assert (lp <= 0).all()  # a log-prob is never positive
    with pytest.raises(CareError) as e:
        ct.selective_log_softmax(x, torch.full((9,), 31))
    assert e.value.code == "invalid_argument"


def test_logits_policy_loss_is_the_composition():
    g = torch.Generator().manual_seed(6)
    b, length, v = 3, 5, 17
    x = torch.randn(b, length, v, generator=g)
    y = torch.randint(0, v, (b, length), generator=g)
    mask = torch.rand(b, length, generator=g) > 0.2
    old = -torch.rand(b, length, generator=g) * 3
    adv = torch.randn(b, generator=g)
    x1 = x.clone().requires_grad_()
    loss, stats, logp = ct.logits_policy_loss(
        x1, y, old, adv, mask=mask, temperature=0.9, preset="trl", return_stats=True, return_logp=True
    )
    loss.backward()
    x2 = x.clone().requires_grad_()
    lp = ct.selective_log_softmax(x2, y, temperature=0.9, mask=mask)
    want = ct.policy_loss(lp, old, adv, mask=mask, preset="trl")
    want.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    torch.testing.assert_close(logp, lp.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-7)
    assert ct.stats_dict(stats)["tokens"] == mask.sum().item()


def _fused_case(device="cpu", seed=8):
    g = torch.Generator().manual_seed(seed)
    b, length, v = 3, 5, 17
    x = torch.randn(b, length, v, generator=g)
    y = torch.randint(0, v, (b, length), generator=g)
    mask = torch.rand(b, length, generator=g) > 0.2
    old = -torch.rand(b, length, generator=g) * 3
    adv = torch.randn(b, generator=g)
    return tuple(t.to(device) for t in (x, y, mask, old, adv))


@pytest.mark.parametrize("preset", ["trl", "verl", "verl_cispo", "verl_gpg"])
def test_logits_policy_loss_fused_is_the_three_step_path(preset):
    """On CPU tensors the one-pass function returns the loss, stats, log-probs and the
    gradient that logits_policy_loss and its backward give, bit for bit (the same reference
    underneath), for the token-local presets; it is not differentiable itself."""
    x, y, mask, old, adv = _fused_case()
    x1 = x.clone().requires_grad_()
    loss, stats, logp = ct.logits_policy_loss(
        x1, y, old, adv, mask=mask, temperature=0.9, preset=preset, return_stats=True, return_logp=True
    )
    loss.backward()
    floss, d, fstats, flogp = ct.logits_policy_loss_fused(
        x, y, old, adv, mask=mask, temperature=0.9, preset=preset, return_stats=True, return_logp=True
    )
    assert floss.item() == loss.item()
    assert torch.equal(d, x1.grad) and d.shape == x.shape
    assert torch.equal(flogp, logp)
    assert ct.stats_dict(fstats) == ct.stats_dict(stats)
    assert not d.requires_grad


def test_logits_policy_loss_fused_refuses_what_it_cannot_compute():
    """Sequence-level losses, the rollout correction and bypass mode need whole sequences (or
    the rollout log-probs) first: fused_supported says so and the call raises
    invalid_argument, on any device."""
    x, y, mask, old, adv = _fused_case()
    assert ct.fused_supported("trl") and ct.fused_supported("verl", kl_estimator="k3", beta=0.1)
    for preset, extra in [("verl_geo_mean", {}), ("verl_gspo", {}), ("trl_vespo", {}), ("verl_bypass", {}),
                          ("verl", {"rollout_is": "token", "rollout_is_threshold": 2.0})]:  # fmt: skip
        assert not ct.fused_supported(preset, **extra), preset
        with pytest.raises(CareError) as e:
            ct.logits_policy_loss_fused(x, y, old, adv, mask=mask, preset=preset, **extra)
        assert e.value.code == "invalid_argument", preset
    with pytest.raises(CareError) as e:
        ct.logits_policy_loss_fused(x, y, old, adv, mask=mask, in_place=True)
    assert e.value.code == "invalid_argument"


def test_cuda_logits_policy_loss_fused_matches_the_three_kernel_path():
    """On CUDA one kernel gives the loss, log-probs and dL/dlogits of the three-kernel path
    within the kernels' tolerance (different block sizes), out of place and in place (equal
    to each other bit for bit), bf16 logits included."""
    need_gpu()
    for dt in (torch.float32, torch.bfloat16):
        x, y, mask, old, adv = _fused_case("cuda", seed=9)
        x = (x * 3).to(dt)
        x1 = x.clone().requires_grad_()
        loss, logp = ct.logits_policy_loss(x1, y, old, adv, mask=mask, preset="verl", return_logp=True)
        loss.backward()
        floss, d, flogp = ct.logits_policy_loss_fused(x, y, old, adv, mask=mask, preset="verl", return_logp=True)
        assert d.dtype == dt and d.is_cuda
        assert abs(floss.item() - loss.item()) <= 1e-5 * max(1.0, abs(loss.item()))
        torch.testing.assert_close(flogp, logp, rtol=1e-5, atol=1e-5)
        tol = 1e-5 if dt == torch.float32 else 2e-2
        torch.testing.assert_close(d.float(), x1.grad.float(), rtol=tol, atol=tol)
        xi = x.clone()
        iloss, di = ct.logits_policy_loss_fused(xi, y, old, adv, mask=mask, preset="verl", in_place=True)
        assert di is xi and torch.equal(di, d) and iloss.item() == floss.item()


def test_care_torch_is_an_alias():
    import care_torch

    assert care_torch is ct
    assert care_torch.policy_loss is ct.policy_loss and care_torch.CareError is CareError


# ---- torch.compile -----------------------------------------------------------------------------


def _compile_step():
    logp, old, ref, mask, adv_seq = _loss_inputs(b=6, length=8, seed=9)
    rewards = torch.rand(12, generator=torch.Generator().manual_seed(10))

    def step(lp, rewards):
        adv = ct.advantages(rewards, 2, preset="trl")[::2]
        loss = ct.policy_loss(lp, old, adv, mask=mask, logp_ref=ref, preset="verl", beta=0.01, eps_high=0.28)
        loss.backward()
        return loss.detach()

    return logp, rewards, step


def test_compile_fullgraph_step_matches_eager():
    """torch.compile(fullgraph=True) of advantages + loss op + backward: no graph break, and
    bit-identical to eager on the CPU (the compiled graph calls the same Rust code)."""
    if not hasattr(torch._dynamo.config, "trace_autograd_ops"):
        pytest.skip("this torch cannot trace backward() inside a compiled function")
    logp, rewards, step = _compile_step()
    lp1 = logp.clone().requires_grad_()
    lp2 = logp.clone().requires_grad_()
    eager = step(lp1, rewards)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled = torch.compile(step, fullgraph=True)
        got = compiled(lp2, rewards)
        lp3 = logp.clone().requires_grad_()
        again = compiled(lp3, rewards)  # a second call reuses the graph
    torch.testing.assert_close(got, eager, rtol=0, atol=0)
    torch.testing.assert_close(lp2.grad, lp1.grad, rtol=0, atol=0)
    torch.testing.assert_close(lp3.grad, lp1.grad, rtol=0, atol=0)
    assert again.item() == eager.item()


def test_compile_fullgraph_logits_loss_forward():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4, 6, 23, generator=g)
    y = torch.randint(0, 23, (4, 6), generator=g)
    old = -torch.rand(4, 6, generator=g)
    adv = torch.randn(4, generator=g)

    def fwd(x):
        return ct.logits_policy_loss(x, y, old, adv, preset="verl")

    torch._dynamo.reset()
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager = fwd(x1)
    eager.backward()
    got = torch.compile(fwd, fullgraph=True)(x2)
    got.backward()
    torch.testing.assert_close(got, eager, rtol=0, atol=0)
    torch.testing.assert_close(x2.grad, x1.grad, rtol=0, atol=0)


# ---- CUDA (skipped without a GPU) ---------------------------------------------------------------


def test_cuda_matches_cpu():
    need_gpu()
    logp, old, ref, mask, adv = _loss_inputs()
    cpu = ct.policy_loss(logp.clone().requires_grad_(), old, adv, mask=mask, preset="verl")
    lp = logp.cuda().requires_grad_()
    gpu, stats = ct.policy_loss(lp, old.cuda(), adv.cuda(), mask=mask.cuda(), preset="verl", return_stats=True)
    assert gpu.is_cuda and stats.is_cuda
    gpu.backward()
    assert gpu.item() == pytest.approx(cpu.item(), rel=1e-5)
    assert ct.stats_dict(stats)["tokens"] == mask.sum().item()
    x = torch.randn(33, 257)
    y = torch.randint(0, 257, (33,))
    a = ct.selective_log_softmax(x, y)
    b = ct.selective_log_softmax(x.cuda(), y.cuda())
    torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-5)
    r = torch.rand(64)
    torch.testing.assert_close(ct.advantages(r.cuda(), 8).cpu(), ct.advantages(r, 8), rtol=1e-5, atol=1e-6)


def test_cuda_graph_capture_of_a_step():
    """A loss step captured in a CUDA graph and replayed gives the eager result: the ops launch
    on the capturing stream, allocate through PyTorch and never synchronize."""
    need_gpu()
    logp, old, ref, mask, adv = _loss_inputs(device="cuda")
    static_lp = logp.clone()
    opts = ct.loss_options("verl")

    def run():
        lp = static_lp.detach().requires_grad_()
        loss = ct.policy_loss(lp, old, adv, mask=mask, options=opts)
        (g,) = torch.autograd.grad(loss, lp)
        return loss, g

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            run()  # warm up (module load, allocator)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss_out, grad_out = run()
    graph.replay()
    torch.cuda.synchronize()
    want_loss, want_grad = run()
    assert loss_out.item() == pytest.approx(want_loss.item(), rel=1e-6)
    torch.testing.assert_close(grad_out, want_grad)


# ---- rollout correction ------------------------------------------------------------------------

_ROLL = dict(rollout_is="token", rollout_is_threshold=1.5, rollout_rs="token_k1", rollout_rs_threshold="3")


def _rollout_args(device="cpu"):
    logp, old, ref, mask, adv = _loss_inputs(device)
    g = torch.Generator().manual_seed(5)
    roll = (old.double() + torch.randn(old.shape, generator=g, dtype=torch.float64) * 0.6).to(old.dtype)
    return logp, old, ref, mask, adv, roll.to(device)


def test_opcheck_policy_loss_with_rollout():
    logp, old, ref, mask, adv, roll = _rollout_args()
    offs = torch.arange(0, 25, 6, dtype=torch.int32)
    lp = logp.reshape(-1).clone().requires_grad_()
    args = (
        lp, old.reshape(-1), ref.reshape(-1), adv, offs, mask.reshape(-1),
        ct.loss_options("verl", beta=0.1, **_ROLL), False, 0.0, 0.0, 0.0, 6, roll.reshape(-1),
    )  # fmt: skip
    torch.library.opcheck(torch.ops.care.policy_loss.default, args)


def test_rollout_equal_to_old_is_bit_identical_and_gets_no_gradient():
    logp, old, ref, mask, adv, _ = _rollout_args()
    lp1, lp2 = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    roll = old.clone().requires_grad_()
    l1 = ct.policy_loss(lp1, old, adv, mask=mask, logp_ref=ref, preset="verl", beta=0.1, **_ROLL)
    l2 = ct.policy_loss(lp2, old, adv, mask=mask, logp_ref=ref, logp_rollout=roll, preset="verl", beta=0.1, **_ROLL)
    (l1 + 0).backward()
    l2.backward()
    torch.testing.assert_close(l2, l1, rtol=0, atol=0)
    torch.testing.assert_close(lp2.grad, lp1.grad, rtol=0, atol=0)
    assert roll.grad is None  # the rollout weights are constants


def test_rollout_torch_matches_numpy():
    """The op and the plain function run the same core; with rejections and truncation on, the
    loss and the gradient agree exactly (float64), and the correction changed the loss."""
    logp, old, ref, mask, adv, roll = _rollout_args()
    logp, old, roll = logp.double(), old.double(), roll.double()
    lp = logp.clone().requires_grad_()
    loss = ct.policy_loss(lp, old, adv, mask=mask, logp_rollout=roll, preset="verl", **_ROLL)
    loss.backward()
    ref_np = care_rl.policy_loss(
        logp.numpy(), old.numpy(), adv.numpy(), mask=mask.numpy(), logp_rollout=roll.numpy(), preset="verl", **_ROLL
    )  # fmt: skip
    assert loss.item() == ref_np.loss
    np.testing.assert_array_equal(lp.grad.float().numpy(), ref_np.grad)
    assert ref_np.rollout["rejected_tokens"] > 0 and ref_np.rollout["truncated"] > 0
    plain = care_rl.policy_loss(logp.numpy(), old.numpy(), adv.numpy(), mask=mask.numpy(), preset="verl")
    assert plain.loss != ref_np.loss


def test_rollout_stats_of_the_op_match_numpy():
    """return_rollout_stats gives the diagnostics of care_rl.policy_loss on the same inputs,
    float64 [13] in ROLLOUT_STATS_FIELDS order, after the loss stats; all zero without
    logp_rollout."""
    logp, old, ref, mask, adv, roll = _rollout_args()
    logp, old, roll = logp.double(), old.double(), roll.double()
    loss, stats, rstats = ct.policy_loss(
        logp, old, adv, mask=mask, logp_rollout=roll, preset="verl", return_stats=True,
        return_rollout_stats=True, **_ROLL,
    )  # fmt: skip
    ref_np = care_rl.policy_loss(
        logp.numpy(), old.numpy(), adv.numpy(), mask=mask.numpy(), logp_rollout=roll.numpy(), preset="verl", **_ROLL
    )  # fmt: skip
    assert rstats.dtype == torch.float64 and rstats.shape == (len(care_rl.ROLLOUT_STATS_FIELDS),)
    assert ct.rollout_stats_dict(rstats) == ref_np.rollout
    assert ref_np.rollout["rejected_tokens"] > 0
    assert ct.stats_dict(stats) == ref_np.stats
    loss2, r0 = ct.policy_loss(logp, old, adv, mask=mask, preset="verl", return_rollout_stats=True)
    assert r0.tolist() == [0.0] * len(care_rl.ROLLOUT_STATS_FIELDS)


def test_rollout_device_fields_cover_the_host_fields():
    """ROLLOUT_STATS_DEVICE_FIELDS names every host field once, densely, 4-byte fields, all sums."""
    dev = _care.ROLLOUT_STATS_DEVICE_FIELDS
    assert sorted(f[0] for f in dev) == sorted(_care.ROLLOUT_STATS_FIELDS)
    assert [f[2] for f in dev] == [4 * i for i in range(len(dev))]
    assert {f[1] for f in dev} <= {"float", "uint32_t"} and {f[3] for f in dev} == {"sum"}


def test_raw_rollout_stats_convert_by_name():
    """The raw device struct (float sums, uint32 counts) converts to the host layout by field
    name: each field i holding i + 1 reads back as i + 1 under its own name (a CPU tensor
    stands for the device one: the conversion only reads the offsets)."""
    dev = _care.ROLLOUT_STATS_DEVICE_FIELDS
    raw = torch.zeros(len(dev), dtype=torch.float32)
    ints = raw.view(torch.int32)
    for i, (name, kind, offset, _) in enumerate(dev):
        if kind == "float":
            raw[offset // 4] = i + 1
        else:
            ints[offset // 4] = i + 1

    class _Cuda(torch.Tensor):  # reports is_cuda so the device branch runs on the CPU
        @property
        def is_cuda(self):
            return True

    got = ct.rollout_stats_dict(ct._rollout_host_layout(raw.as_subclass(_Cuda)))
    assert got == {name: float(i + 1) for i, (name, _, _, _) in enumerate(dev)}


def test_logits_policy_loss_refuses_rollout():
    x = torch.randn(2, 3, 7)
    y = torch.randint(0, 7, (2, 3))
    old = -torch.rand(2, 3)
    with pytest.raises(CareError) as e:
        ct.logits_policy_loss(x, y, old, torch.randn(2), logp_rollout=old)
    assert e.value.code == "invalid_argument" and "rollout" in str(e.value)
    # The extension refuses it too (as care_logits_policy_loss does in C).
    with pytest.raises(CareError) as e:
        care_rl._care.logits_policy_loss(
            x.reshape(6, 7), y.reshape(6), torch.randn(2), torch.tensor([0, 3, 6], dtype=torch.int32),
            torch.empty(6), torch.empty(6), torch.empty(6), torch.empty(14, dtype=torch.float64),
            ct.loss_options(), False, logp_rollout=old.reshape(6),
        )  # fmt: skip
    assert e.value.code == "invalid_argument"


def test_compile_fullgraph_with_rollout():
    if not hasattr(torch._dynamo.config, "trace_autograd_ops"):
        pytest.skip("this torch cannot trace backward() inside a compiled function")
    logp, old, ref, mask, adv, roll = _rollout_args()

    def step(lp):
        loss = ct.policy_loss(lp, old, adv, mask=mask, logp_rollout=roll, preset="verl", **_ROLL)
        loss.backward()
        return loss.detach()

    lp1, lp2 = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    eager = step(lp1)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        got = torch.compile(step, fullgraph=True)(lp2)
    torch.testing.assert_close(got, eager, rtol=0, atol=0)
    torch.testing.assert_close(lp2.grad, lp1.grad, rtol=0, atol=0)


@pytest.mark.parametrize("preset", ["verl_clip_cov", "verl_kl_cov"])
def test_cuda_covariance_losses_match_cpu(preset):
    """Clip-Cov and KL-Cov on the device (the covariance selection's pre-passes, then the
    fused loss) against the CPU reference: 5% of the counted tokens selected, and the op
    sizes its own workspace for the selection."""
    need_gpu()
    logp, old, ref, mask, adv = _loss_inputs()
    kw = dict(cov_ratio=0.05, clip_cov_lb=-100.0, clip_cov_ub=100.0)
    lc = logp.clone().requires_grad_()
    cpu = ct.policy_loss(lc, old, adv, mask=mask, preset=preset, **kw)
    cpu.backward()
    lg = logp.cuda().requires_grad_()
    gpu = ct.policy_loss(lg, old.cuda(), adv.cuda(), mask=mask.cuda(), preset=preset, **kw)
    gpu.backward()
    plain = ct.policy_loss(logp.clone().requires_grad_(), old, adv, mask=mask, preset="verl")
    assert cpu.item() != plain.item()  # the selection did something
    assert gpu.item() == pytest.approx(cpu.item(), rel=1e-5)
    torch.testing.assert_close(lg.grad.cpu(), lc.grad, rtol=1e-5, atol=1e-6)


def test_loss_workspace_grows_for_the_covariance_losses():
    base = _care.policy_loss_workspace_bytes(care_rl.loss_options(preset="verl"), 1000)
    assert base == _care.WORKSPACE_BYTES
    cov = care_rl.loss_options(preset="verl_kl_cov")
    assert _care.policy_loss_workspace_bytes(cov, 1000) - _care.policy_loss_workspace_bytes(cov, 0) == 8000
    with pytest.raises(CareError):
        _care.policy_loss_workspace_bytes(cov, 2**32)


def test_cuda_rollout_matches_cpu():
    """The device loss with logp_rollout (the correction inside the fused kernel) against the
    CPU reference, with truncation and a rejection on."""
    need_gpu()
    logp, old, ref, mask, adv, roll = _rollout_args()
    lc = logp.clone().requires_grad_()
    cpu = ct.policy_loss(lc, old, adv, mask=mask, logp_rollout=roll, preset="verl", **_ROLL)
    cpu.backward()
    lg = logp.cuda().requires_grad_()
    gpu = ct.policy_loss(lg, old.cuda(), adv.cuda(), mask=mask.cuda(), logp_rollout=roll.cuda(), preset="verl", **_ROLL)
    gpu.backward()
    plain = ct.policy_loss(logp, old, adv, mask=mask, preset="verl")
    assert cpu.item() != plain.item()  # the correction did something
    assert gpu.item() == pytest.approx(cpu.item(), rel=1e-5)
    torch.testing.assert_close(lg.grad.cpu(), lc.grad, rtol=1e-5, atol=1e-6)


def test_cuda_rollout_stats_match_cpu():
    """The device rollout diagnostics (accumulated in the fused loss pass, converted from the
    raw struct) against the CPU ones on the same inputs: counts exactly, sums to float32."""
    need_gpu()
    logp, old, ref, mask, adv, roll = _rollout_args()
    _, cpu = ct.policy_loss(logp, old, adv, mask=mask, logp_rollout=roll, preset="verl", return_rollout_stats=True, **_ROLL)
    _, gpu = ct.policy_loss(
        logp.cuda(), old.cuda(), adv.cuda(), mask=mask.cuda(), logp_rollout=roll.cuda(), preset="verl",
        return_rollout_stats=True, **_ROLL,
    )  # fmt: skip
    assert gpu.is_cuda and gpu.dtype == torch.float64
    c, g = ct.rollout_stats_dict(cpu), ct.rollout_stats_dict(gpu)
    assert c["rejected_tokens"] > 0 and c["truncated"] > 0
    for name in ("tokens", "sequences", "rejected_tokens", "rejected_sequences", "non_finite"):
        assert g[name] == c[name], name
    for name in care_rl.ROLLOUT_STATS_FIELDS:
        assert g[name] == pytest.approx(c[name], rel=1e-4, abs=1e-4 * c["tokens"]), name


# ---- token-level estimators (SPEC §18) ----------------------------------------------------------


def _token_case(seed=0, n_seq=9):
    """Ragged sequences (empty ones included) with a mask, float32 rewards and values."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, 40, (n_seq,), generator=g)
    lens[1] = 0
    offs = torch.cat((torch.zeros(1, dtype=torch.int64), lens.cumsum(0))).to(torch.int32)
    n = int(offs[-1])
    r = torch.randn(n, generator=g) * 3
    v = torch.randn(n, generator=g)
    mask = torch.rand(n, generator=g) > 0.2
    return r, v, offs, mask


def test_token_estimators_torch_cpu_equal_numpy():
    """On CPU tensors the torch functions run the same core as the numpy ones: equal bit for
    bit, CSR and padded layouts alike, outputs on the input's device and not requiring grad."""
    r, v, offs, mask = _token_case()
    got = ct.discounted_returns(r, offs, mask, gamma=0.9)
    want = care_rl.discounted_returns(r.numpy(), offs.numpy(), mask.numpy(), gamma=0.9)
    np.testing.assert_array_equal(got.numpy(), want)
    adv, ret = ct.gae(r, v, offs, mask, gamma=0.95, lambda_=0.9)
    wa, wr = care_rl.gae(r.numpy(), v.numpy(), offs.numpy(), mask.numpy(), gamma=0.95, lambda_=0.9)
    np.testing.assert_array_equal(adv.numpy(), wa)
    np.testing.assert_array_equal(ret.numpy(), wr)
    w, mean, std = ct.whiten(r, mask, std_kind="biased")
    ww, wm, ws = care_rl.whiten(r.numpy(), mask.numpy(), std_kind="biased")
    np.testing.assert_array_equal(w.numpy(), ww)
    assert (mean.item(), std.item()) == (wm, ws) and mean.dtype == torch.float64
    # Padded [B, L]: offsets built from the shape, results of that shape.
    rp, vp = torch.randn(3, 5), torch.randn(3, 5)
    mp = torch.rand(3, 5) > 0.3
    a2, r2 = ct.gae(rp, vp, mask=mp, gamma=0.5, lambda_=0.7)
    wa2, wr2 = care_rl.gae(rp.numpy(), vp.numpy(), mask=mp.numpy(), gamma=0.5, lambda_=0.7)
    assert a2.shape == (3, 5)
    np.testing.assert_array_equal(a2.numpy(), wa2)
    np.testing.assert_array_equal(r2.numpy(), wr2)
    g2 = ct.discounted_returns(rp, mask=mp)
    np.testing.assert_array_equal(g2.numpy(), care_rl.discounted_returns(rp.numpy(), mask=mp.numpy()))
    rg = r.clone().requires_grad_()
    assert not ct.discounted_returns(rg, offs).requires_grad
    assert not ct.whiten(rg)[0].requires_grad
    assert rg.grad is None and r.equal(rg.detach())  # the input is not whitened in place


def test_whitened_chains_torch_cpu_equal_numpy():
    """The one-call f64 chains on CPU tensors run the same core as the numpy functions: equal
    bit for bit, the statistics as 0-d float64 tensors, nothing requiring grad."""
    r, v, offs, mask = _token_case()
    adv, ret, mean, std = ct.discounted_returns_whitened(r, offs, mask, gamma=0.9, masked_token="reset", count_eps=1e-8)
    wa, wr, wm, ws = care_rl.discounted_returns_whitened(
        r.numpy(), offs.numpy(), mask.numpy(), gamma=0.9, masked_token="reset", count_eps=1e-8
    )
    np.testing.assert_array_equal(adv.numpy(), wa)
    np.testing.assert_array_equal(ret.numpy(), wr)
    assert (mean.item(), std.item()) == (wm, ws) and mean.dtype == torch.float64
    adv, ret, mean, std = ct.gae_whitened(r, v, offs, mask, gamma=0.95, lambda_=0.9, std_kind="biased")
    wa, wr, wm, ws = care_rl.gae_whitened(
        r.numpy(), v.numpy(), offs.numpy(), mask.numpy(), gamma=0.95, lambda_=0.9, std_kind="biased"
    )
    np.testing.assert_array_equal(adv.numpy(), wa)
    np.testing.assert_array_equal(ret.numpy(), wr)
    assert (mean.item(), std.item()) == (wm, ws)
    assert not ct.gae_whitened(r.clone().requires_grad_(), v, offs)[0].requires_grad


def test_cuda_whitened_chains_match_cpu():
    """On CUDA the chains keep the unrounded values on the device between the kernels: the
    returns equal the host's bit for bit, the whitened values, mean and std are within the
    Whiten tolerance of the host's f64 chain (returns around 500 with a 1e-3 spread, where
    rounding them first would not be), and the numpy-level functions take CUDA tensors."""
    need_gpu()
    b = 64
    d = np.sin(np.arange(b) * 0.37).astype(np.float32) * 1e-3
    r = np.stack([50.0 + d, 500.0 - d], axis=1).reshape(-1).astype(np.float32)
    offs = np.arange(0, 2 * b + 1, 2, dtype=np.int32)
    wa, wr, wm, ws = care_rl.discounted_returns_whitened(r, offs, gamma=0.9, count_eps=1e-8)
    adv, ret, mean, std = care_rl.discounted_returns_whitened(
        torch.from_numpy(r).cuda(), torch.from_numpy(offs).cuda(), gamma=0.9, count_eps=1e-8
    )
    assert adv.is_cuda and mean.is_cuda and mean.dtype == torch.float64
    np.testing.assert_array_equal(ret.cpu().numpy(), wr)
    bound = 1e-9 * 600 / ws + np.abs(wa.astype(np.float64)) / 8388608.0
    assert (np.abs(adv.cpu().numpy().astype(np.float64) - wa) <= bound).all()
    assert abs(mean.item() - wm) <= 1e-9 * 600 + abs(wm) / 8388608.0
    assert abs(std.item() - ws) <= 1e-9 * 600 + abs(ws) / 8388608.0
    rt, v, o, m = _token_case(seed=5, n_seq=40)
    wa, wr, _, _ = care_rl.gae_whitened(rt.numpy(), v.numpy(), o.numpy(), m.numpy(), gamma=0.99, lambda_=0.95)
    adv, ret, _, _ = ct.gae_whitened(rt.cuda(), v.cuda(), o.cuda(), m.cuda(), gamma=0.99, lambda_=0.95)
    np.testing.assert_array_equal(ret.cpu().numpy(), wr)
    np.testing.assert_allclose(adv.cpu().numpy(), wa, rtol=2.4e-7, atol=1e-6)


def test_cuda_whitened_statuses_stay_on_the_device_unless_checked():
    """A malformed layout and a non-finite return do not raise on CUDA unless
    set_device_checks is on; then they raise the host codes, the layout first."""
    need_gpu()
    r = torch.tensor([1.0, 2.0, 3.0], device="cuda")
    bad = torch.tensor([0, 3, 2, 3], dtype=torch.int32, device="cuda")
    nan = torch.tensor([1.0, float("nan"), 2.0], device="cuda")
    good = torch.tensor([0, 3], dtype=torch.int32, device="cuda")
    ct.discounted_returns_whitened(r, bad)
    ct.discounted_returns_whitened(nan, good)
    ct.set_device_checks(True)
    try:
        with pytest.raises(CareError) as e:
            ct.gae_whitened(r, r, bad)
        assert e.value.code == "invalid_layout"
        with pytest.raises(CareError) as e:
            ct.discounted_returns_whitened(nan, good)
        assert e.value.code == "non_finite"
        ct.gae_whitened(r, r, good)
    finally:
        ct.set_device_checks(False)


def test_token_estimators_torch_cpu_errors_match_numpy():
    """The torch CPU path raises the host codes: a malformed layout, a non-finite value to
    whiten, a bad option, a length mismatch."""
    r = torch.tensor([1.0, 2.0, 3.0])
    for offs in ([0, 2], [0, 3, 2, 3], [1, 3]):
        with pytest.raises(CareError) as e:
            ct.discounted_returns(r, offs)
        assert e.value.code == "invalid_layout", offs
        with pytest.raises(CareError) as e:
            ct.gae(r, r, offs)
        assert e.value.code == "invalid_layout", offs
    with pytest.raises(CareError) as e:
        ct.whiten(torch.tensor([1.0, float("nan")]))
    assert e.value.code == "non_finite"
    with pytest.raises(CareError) as e:
        ct.gae(r, torch.zeros(2), [0, 3])
    assert e.value.code == "length_mismatch"
    with pytest.raises(CareError) as e:
        ct.discounted_returns(r, [0, 3], gamma=1.5)
    assert e.value.code == "invalid_argument"
    with pytest.raises(CareError) as e:
        ct.whiten(r, std_kind="sample")
    assert e.value.code == "invalid_argument"
    with pytest.raises(CareError) as e:
        ct.discounted_returns(r)  # 1-D without offsets
    assert e.value.code == "invalid_argument"


def _whiten_within_tolerance(got, mean, std, x, mask, std_kind):
    """kernels/src/tolerance.rs, Quantity::Whiten for float32: |got - want| <= 1e-9 * scale +
    2^-23 * |want|, with scale the largest counted |x| (mean, std) or that times
    1 / sqrt(var + eps) (the whitened values); masked values are +0."""
    want, wmean, wstd = care_rl.whiten(x, mask, std_kind=std_kind)
    counted = x[mask].astype(np.float64)
    big = np.abs(counted).max()
    assert abs(mean - wmean) <= 1e-9 * big + abs(wmean) / 8388608.0
    assert abs(std - wstd) <= 1e-9 * big + abs(wstd) / 8388608.0
    var = wstd**2  # the estimator's variance (std_kind)
    inv = 1.0 / math.sqrt(var + 1e-8)
    bound = 1e-9 * big * inv + np.abs(want.astype(np.float64)) / 8388608.0
    assert (np.abs(got.astype(np.float64) - want) <= bound).all()
    assert (np.signbit(got[~mask]) == False).all() and (got[~mask] == 0).all()  # noqa: E712


def test_cuda_token_estimators_match_cpu():
    """CUDA returns and GAE equal the host results bit for bit (ragged layout, empty sequences,
    mask); whitening is within the Whiten tolerance; care_rl's numpy-level functions take CUDA
    tensors and return CUDA tensors."""
    need_gpu()
    r, v, offs, mask = _token_case(seed=3, n_seq=33)
    rn, vn, on, mn = r.numpy(), v.numpy(), offs.numpy(), mask.numpy()
    want = care_rl.discounted_returns(rn, on, mn, gamma=0.97)
    got = ct.discounted_returns(r.cuda(), offs.cuda(), mask.cuda(), gamma=0.97)
    assert got.is_cuda
    np.testing.assert_array_equal(got.cpu().numpy(), want)
    wa, wr = care_rl.gae(rn, vn, on, mn, gamma=0.99, lambda_=0.95)
    adv, ret = care_rl.gae(r.cuda(), v.cuda(), offs.cuda(), mask.cuda(), gamma=0.99, lambda_=0.95)
    assert adv.is_cuda and ret.is_cuda
    np.testing.assert_array_equal(adv.cpu().numpy(), wa)
    np.testing.assert_array_equal(ret.cpu().numpy(), wr)
    # Host offsets with CUDA rewards: moved to the device by the wrapper.
    a2, _ = ct.gae(r.cuda(), v.cuda(), on, mask.cuda(), gamma=0.99, lambda_=0.95)
    np.testing.assert_array_equal(a2.cpu().numpy(), wa)
    x = (torch.randn(5000) * 4 + 7).numpy()
    m = np.random.default_rng(1).random(5000) > 0.3
    for kind in ("unbiased", "biased"):
        w, mean, std = care_rl.whiten(torch.from_numpy(x).cuda(), torch.from_numpy(m).cuda(), std_kind=kind)
        assert w.is_cuda and mean.is_cuda and std.is_cuda and mean.dtype == torch.float64
        _whiten_within_tolerance(w.cpu().numpy(), mean.item(), std.item(), x, m, kind)


def test_cuda_token_statuses_stay_on_the_device_unless_checked():
    """A malformed layout and a non-finite value to whiten do not raise on CUDA (that would
    synchronize) unless set_device_checks is on; then they raise the host codes."""
    need_gpu()
    r = torch.tensor([1.0, 2.0, 3.0], device="cuda")
    bad = torch.tensor([0, 3, 2, 3], dtype=torch.int32, device="cuda")
    nan = torch.tensor([1.0, float("nan"), 2.0], device="cuda")
    ct.discounted_returns(r, bad)
    ct.gae(r, r, bad)
    w, _, _ = ct.whiten(nan)
    # Refused: the copy is left as it was.
    assert torch.equal(w.isnan(), nan.isnan()) and w[0].item() == 1.0 and w[2].item() == 2.0
    ct.set_device_checks(True)
    try:
        with pytest.raises(CareError) as e:
            ct.discounted_returns(r, bad)
        assert e.value.code == "invalid_layout"
        with pytest.raises(CareError) as e:
            ct.gae(r, r, bad)
        assert e.value.code == "invalid_layout"
        with pytest.raises(CareError) as e:
            ct.whiten(nan)
        assert e.value.code == "non_finite"
        ct.gae(r, r, torch.tensor([0, 1, 3], dtype=torch.int32, device="cuda"))  # a good layout passes
        ct.whiten(r)
    finally:
        ct.set_device_checks(False)


def test_cuda_token_argument_checks():
    """The binding checks every CUDA argument before a launch: the workspace is required,
    every tensor on the rewards' device, lengths and dtypes as on the host."""
    need_gpu()
    from torch.utils.dlpack import to_dlpack as dl

    r = torch.rand(6, device="cuda")
    offs = torch.tensor([0, 2, 6], dtype=torch.int32, device="cuda")
    out = torch.empty(6, device="cuda")
    ws = torch.empty(_care.WORKSPACE_BYTES // 4, dtype=torch.int32, device="cuda")
    with pytest.raises(CareError) as e:
        _care.discounted_returns(dl(r), dl(offs), dl(out), 1.0, None, 0, None)
    assert e.value.code == "invalid_argument" and "workspace" in str(e.value)
    with pytest.raises(CareError) as e:
        _care.discounted_returns(dl(r), dl(offs.cpu()), dl(out), 1.0, None, 0, dl(ws))
    assert e.value.code == "invalid_argument"
    with pytest.raises(CareError) as e:
        _care.gae(dl(r), dl(r[:5]), dl(offs), dl(out), dl(torch.empty(6, device="cuda")), 1.0, 1.0, None, 0, dl(ws))
    assert e.value.code == "length_mismatch"
    with pytest.raises(CareError) as e:
        _care.discounted_returns(dl(r.double()), dl(offs), dl(out), 1.0, None, 0, dl(ws))
    assert e.value.code == "invalid_argument"
    with pytest.raises(CareError) as e:
        _care.discounted_returns(dl(r), dl(offs[:0]), dl(out), 1.0, None, 0, dl(ws))
    assert e.value.code == "invalid_layout"
    with pytest.raises(CareError) as e:
        _care.whiten(dl(r), 1e-8, "unbiased", None, 0, dl(ws[:2]))
    assert e.value.code == "invalid_argument"
    with pytest.raises(CareError) as e:
        _care.discounted_returns(dl(r), dl(offs), dl(out), 2.0, None, 0, dl(ws))
    assert e.value.code == "invalid_argument"
