"""Tests of care_torch: the ctypes layer on plain buffers, and the torch functions on CPU
tensors against the SPEC §9-10 formulas written with torch ops (and against autograd).

Run: ``python -m pytest python/care_torch/tests`` (or ``python -m unittest discover -s
python/care_torch/tests``) after ``cargo build --release -p care-ffi``. The torch tests skip
when torch is not installed; the CUDA test skips without a GPU.
"""

from __future__ import annotations

import array
import ctypes
import math
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from care_torch import _lib  # noqa: E402

try:
    import torch
except ImportError:  # the ctypes tests still run
    torch = None


def _addr(buf):
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)) if len(buf) else None


class CtypesLayer(unittest.TestCase):
    """The ctypes declarations against libcare, with stdlib arrays only."""

    def test_abi_and_presets(self):
        lib = _lib.lib()
        self.assertEqual(lib.care_abi_version(), _lib.ABI_VERSION)
        self.assertEqual(ctypes.sizeof(_lib.AdvantageOptions), 32)
        self.assertEqual(ctypes.sizeof(_lib.GroupStats), 16)
        self.assertEqual(ctypes.sizeof(_lib.LossStats), 14 * 8)
        self.assertEqual(ctypes.sizeof(_lib.LossOptions), 16 + 11 * 8)
        verl = _lib.advantage_options("verl")
        trl = _lib.advantage_options("trl")
        self.assertEqual((verl.eps, trl.eps), (1e-6, 1e-4))
        self.assertEqual(verl.singleton, _lib.SINGLETONS["raw"])
        self.assertEqual(_lib.advantage_options("trl", scale="none").scale, _lib.SCALES["none"])
        with self.assertRaises(_lib.CareError) as e:
            _lib.advantage_options("no_such_preset")
        self.assertEqual(e.exception.code, 102)
        with self.assertRaises(ValueError):
            _lib.advantage_options(scale="sideways")
        self.assertEqual(_lib.loss_options("verl").dual_clip, 3.0)
        self.assertEqual(
            _lib.loss_options(aggregation="token_sum").aggregation, _lib.AGGREGATIONS["token_sum"]
        )

    def test_group_advantages_on_plain_buffers(self):
        lib = _lib.lib()
        rewards = array.array("f", [1.0, 0.0, 0.5, 0.5, 0.2, 0.2, 0.9, 0.1])
        out = array.array("f", [0.0] * 8)
        opts = _lib.advantage_options("trl")
        code = lib.care_group_advantages(
            _addr(rewards), 8, None, 0, 4, None, 0, ctypes.byref(opts),
            _addr(out), 8, None, 0,
        )  # fmt: skip
        _lib.check(code, "care_group_advantages")
        for g in range(2):
            grp = rewards[4 * g : 4 * g + 4]
            mean = sum(grp) / 4
            std = math.sqrt(sum((x - mean) ** 2 for x in grp) / 3)
            for i in range(4):
                want = (grp[i] - mean) / (std + 1e-4)
                self.assertAlmostEqual(out[4 * g + i], want, places=5)

    def test_errors_carry_the_care_result(self):
        lib = _lib.lib()
        rewards = array.array("f", [1.0, 0.0, 0.5])
        out = array.array("f", [0.0] * 3)
        code = lib.care_group_advantages(
            _addr(rewards), 3, None, 0, 2, None, 0, None, _addr(out), 3, None, 0
        )
        self.assertEqual(code, 401)  # CARE_ERR_INVALID_LAYOUT: 2 does not divide 3
        with self.assertRaisesRegex(_lib.CareError, "401"):
            _lib.check(code, "care_group_advantages")


def _ref_advantages(r, g, eps, singleton_raw=False):
    """SPEC §9 default path (mean, group std, unbiased) in float64 torch ops."""
    x = r.double().reshape(-1, g)
    mean = x.mean(1, keepdim=True)
    std = x.std(1, unbiased=True, keepdim=True)
    a = (x - mean) / (std + eps)
    same = (x == x[:, :1]).all(1, keepdim=True)
    return torch.where(same, torch.zeros_like(a), a).reshape(-1)


def _ref_loss(logp, logp_old, adv_tok, mask, eps_low=0.2, eps_high=0.2, clamp=20.0):
    """SPEC §10 token_mean loss with torch ops; autograd gives the reference gradient."""
    delta = torch.clamp(logp - logp_old, -clamp, clamp)
    rho = torch.exp(delta)
    pg1 = -adv_tok * rho
    pg2 = -adv_tok * torch.clamp(rho, 1 - eps_low, 1 + eps_high)
    per_tok = torch.maximum(pg1, pg2)
    m = mask.to(per_tok.dtype)
    return (per_tok * m).sum() / m.sum()


@unittest.skipIf(torch is None, "torch is not installed")
class TorchCpu(unittest.TestCase):
    def setUp(self):
        import care_torch

        self.ct = care_torch
        self.gen = torch.Generator().manual_seed(0)

    def test_advantages_match_the_formula_1d_and_2d(self):
        r = torch.randint(0, 31, (64 * 16,), generator=self.gen).float() / 30
        r[:16] = 0.5  # one all-equal group: A = 0
        a = self.ct.advantages(r, group_size=16, preset="trl")
        want = _ref_advantages(r, 16, 1e-4)
        torch.testing.assert_close(a.double(), want, atol=1e-5, rtol=1e-5)
        self.assertTrue(torch.all(a[:16] == 0))
        a2 = self.ct.advantages(r.reshape(64, 16), preset="trl")
        self.assertEqual(a2.shape, (64, 16))
        torch.testing.assert_close(a2.reshape(-1), a)

    def test_advantages_stats_offsets_and_invalid(self):
        r = torch.tensor([1.0, 0.0, float("nan"), 0.5, 0.25, 0.75])
        a, st = self.ct.advantages(r, group_offsets=[0, 3, 6], preset=None, return_stats=True)
        self.assertEqual(a[2].item(), 0.0)  # NaN reward: invalid, A = 0
        self.assertEqual(st[:, 0].tolist(), [2.0, 3.0])
        self.assertAlmostEqual(st[1, 1].item(), 0.5, places=6)
        # Dr. GRPO: no scale, so A = r - mean exactly.
        d = self.ct.advantages(r[3:], group_size=3, preset="dr_grpo")
        torch.testing.assert_close(d, torch.tensor([0.0, -0.25, 0.25]))
        with self.assertRaises(self.ct.CareError):
            self.ct.advantages(torch.tensor([1.0, 2.0]), group_size=1, preset="openrlhf")

    def _batch(self, b=6, length=40, dtype=None):
        logp = -torch.rand(b, length, generator=self.gen) * 3
        old = logp + 0.3 * torch.randn(b, length, generator=self.gen)
        mask = torch.ones(b, length, dtype=torch.bool)
        mask[:, :5] = False
        mask[0, 30:] = False
        adv = torch.randn(b, generator=self.gen)
        dtype = dtype or torch.float32
        return logp.to(dtype), old.to(dtype), mask, adv

    def test_loss_and_fused_gradient_match_autograd_of_the_formula(self):
        logp, old, mask, adv = self._batch()
        x = logp.clone().requires_grad_(True)
        loss, stats = self.ct.policy_loss(x, old, adv, mask=mask, return_stats=True)
        loss.backward()
        y = logp.double().clone().requires_grad_(True)
        want = _ref_loss(y, old.double(), adv.double()[:, None].expand_as(y), mask)
        want.backward()
        self.assertAlmostEqual(loss.item(), want.item(), places=5)
        torch.testing.assert_close(x.grad.double(), y.grad, atol=1e-7, rtol=1e-5)
        self.assertEqual(stats["tokens"], float(mask.sum()))
        self.assertGreater(stats["clipped"], 0)  # the 0.3 noise makes some ratios clip
        # Masked tokens get exactly 0 even with NaN inputs.
        logp2 = logp.clone()
        logp2[~mask] = float("nan")
        x2 = logp2.requires_grad_(True)
        self.ct.policy_loss(x2, old, adv, mask=mask).backward()
        self.assertTrue(torch.all(x2.grad[~mask] == 0))
        self.assertTrue(torch.isfinite(x2.grad).all())

    def test_per_token_advantages_csr_layout_and_grad_output_scaling(self):
        logp, old, mask, adv = self._batch(b=3, length=10)
        tok_adv = adv[:, None].expand(3, 10).contiguous()
        flat = logp.reshape(-1).clone().requires_grad_(True)
        offs = torch.tensor([0, 10, 20, 30])
        l1 = self.ct.policy_loss(flat, old.reshape(-1), tok_adv.reshape(-1), offs, mask.reshape(-1))
        l2 = self.ct.policy_loss(logp, old, adv, mask=mask)
        self.assertAlmostEqual(l1.item(), l2.item(), places=6)
        (3.0 * l1).backward()
        y = logp.reshape(-1).double().clone().requires_grad_(True)
        (
            3.0
            * _ref_loss(y, old.reshape(-1).double(), tok_adv.reshape(-1).double(), mask.reshape(-1))
        ).backward()
        torch.testing.assert_close(flat.grad.double(), y.grad, atol=1e-7, rtol=1e-5)

    def test_bf16_inputs_give_a_bf16_gradient(self):
        logp, old, mask, adv = self._batch(dtype=torch.bfloat16)
        x = logp.clone().requires_grad_(True)
        loss = self.ct.policy_loss(x, old, adv, mask=mask)
        loss.backward()
        self.assertEqual(x.grad.dtype, torch.bfloat16)
        want = _ref_loss(logp.double(), old.double(), adv.double()[:, None].expand(6, 40), mask)
        self.assertAlmostEqual(loss.item(), want.item(), places=5)

    def test_micro_batches_with_global_denominators_add_up(self):
        logp, old, mask, adv = self._batch(b=8, length=24)
        whole = logp.clone().requires_grad_(True)
        self.ct.policy_loss(whole, old, adv, mask=mask).backward()
        n_tok = float(mask.sum())
        parts, total = [], 0.0
        for sl in (slice(0, 3), slice(3, 8)):
            x = logp[sl].clone().requires_grad_(True)
            loss = self.ct.policy_loss(x, old[sl], adv[sl], mask=mask[sl], global_tokens=n_tok)
            loss.backward()
            total += loss.item()
            parts.append(x.grad)
        self.assertAlmostEqual(total, self.ct.policy_loss(logp, old, adv, mask=mask).item(), 6)
        torch.testing.assert_close(torch.cat(parts), whole.grad, atol=1e-9, rtol=1e-6)

    def test_verl_preset_dual_clip_and_options(self):
        logp, old, mask, adv = self._batch()
        base = self.ct.policy_loss(logp, old, adv, mask=mask)
        tsum = self.ct.policy_loss(logp, old, adv, mask=mask, aggregation="token_sum")
        self.assertAlmostEqual(tsum.item() / float(mask.sum()), base.item(), places=4)
        _, st = self.ct.policy_loss(logp, old, adv, mask=mask, preset="verl", return_stats=True)
        self.assertGreaterEqual(st["dual_clipped"], 0)
        with self.assertRaises(TypeError):
            self.ct.policy_loss(logp, old, adv, mask=mask, no_such_option=1.0)
        with self.assertRaises(ValueError):
            self.ct.policy_loss(logp, old, adv[:-1], mask=mask)


@unittest.skipIf(torch is None or not torch.cuda.is_available(), "no CUDA device")
class TorchCuda(unittest.TestCase):
    def test_cuda_matches_cpu(self):
        import care_torch as ct

        gen = torch.Generator().manual_seed(1)
        r = torch.rand(8192, generator=gen)
        torch.testing.assert_close(
            ct.advantages(r.cuda(), group_size=16).cpu(), ct.advantages(r, group_size=16),
            atol=1e-5, rtol=1e-4,
        )  # fmt: skip
        logp = -torch.rand(64, 512, generator=gen) * 3
        old = logp + 0.2 * torch.randn(64, 512, generator=gen)
        adv = torch.randn(64, generator=gen)
        xc = logp.clone().requires_grad_(True)
        xg = logp.cuda().requires_grad_(True)
        lc = ct.policy_loss(xc, old, adv)
        lg = ct.policy_loss(xg, old.cuda(), adv.cuda())
        lc.backward()
        lg.backward()
        self.assertAlmostEqual(lc.item(), lg.item(), places=4)
        torch.testing.assert_close(xg.grad.cpu(), xc.grad, atol=1e-6, rtol=1e-4)


if __name__ == "__main__":
    unittest.main()
