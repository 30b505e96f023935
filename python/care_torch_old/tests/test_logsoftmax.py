"""Tests of care_torch.logsoftmax: the selective log-softmax and the fused logits-to-loss path
against torch's ``log_softmax`` + ``gather`` and autograd (CPU: the Rust reference; CUDA: the
kernels, skipped without a GPU). Skipped entirely without torch.

Run: ``python -m unittest discover -s python/care_torch/tests`` after building libcare.
"""

from __future__ import annotations

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

try:
    import torch
except ImportError:
    torch = None


def _torch_ref(x, y, t, mask=None):
    ls = torch.log_softmax(x.float() / t, -1)
    lp = ls.gather(-1, y[..., None])[..., 0]
    p = ls.exp()
    ent = -(p * torch.where(p > 0, ls, torch.zeros_like(ls))).sum(-1)
    if mask is not None:
        lp, ent = lp * mask, ent * mask
    return lp, ent


@unittest.skipIf(torch is None, "torch is not installed")
class SelectiveLogSoftmax(unittest.TestCase):
    def _check(self, device, dtype, t, atol_grad):
        import care_torch

        gen = torch.Generator().manual_seed(7)
        x = (torch.randn(2, 5, 37, generator=gen) * 3).to(dtype)
        x[1, 1, :5] = float("-inf")  # a vocabulary mask
        y = torch.randint(0, 37, (2, 5), generator=gen)
        y[1, 1] = 7
        mask = torch.ones(2, 5, dtype=torch.bool)
        mask[0, :2] = False
        x, y, mask = x.to(device), y.to(device), mask.to(device)
        xs = x.detach().clone().requires_grad_(True)
        xf = x.detach().float().clone().requires_grad_(True)
        lp, ent = care_torch.selective_log_softmax(
            xs, y, temperature=t, mask=mask, return_entropy=True
        )
        want, went = _torch_ref(xf, y, t, mask)
        torch.testing.assert_close(lp, want.detach(), atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(ent, went.detach(), atol=2e-5, rtol=1e-5)
        g = torch.randn(2, 5, generator=gen).to(device)
        ge = torch.randn(2, 5, generator=gen).to(device)
        ((lp * g).sum() + (ent * ge).sum()).backward()
        ((want * g).sum() + (went * ge).sum()).backward()
        torch.testing.assert_close(xs.grad.float(), xf.grad, atol=atol_grad, rtol=atol_grad)
        self.assertTrue(bool((xs.grad[0, :2] == 0).all()), "masked rows get a zero gradient")

    def test_cpu_matches_torch(self):
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)):
            for t in (1.0, 0.6):
                with self.subTest(dtype=dtype, t=t):
                    self._check(torch.device("cpu"), dtype, t, tol)

    @unittest.skipUnless(torch is not None and torch.cuda.is_available(), "no CUDA device")
    def test_cuda_matches_torch(self):
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)):
            for t in (1.0, 0.6):
                with self.subTest(dtype=dtype, t=t):
                    self._check(torch.device("cuda"), dtype, t, tol)

    def test_strided_views_and_vocab_one(self):
        import care_torch

        x3 = torch.randn(3, 6, 40)
        y3 = torch.randint(0, 40, (3, 5))
        lp = care_torch.selective_log_softmax(x3[:, :-1], y3, temperature=0.6)
        torch.testing.assert_close(lp, _torch_ref(x3[:, :-1], y3, 0.6)[0])
        v2 = x3.view(-1, 40)[:, :33]  # rows 40 elements apart, 33 wide
        y2 = torch.randint(0, 33, (18,))
        torch.testing.assert_close(
            care_torch.selective_log_softmax(v2, y2), _torch_ref(v2, y2, 1.0)[0]
        )
        lp1 = care_torch.selective_log_softmax(torch.randn(4, 1), torch.zeros(4, dtype=torch.long))
        self.assertTrue(bool((lp1 == 0).all()))

    def test_bad_target_raises(self):
        import care_torch

        with self.assertRaises(care_torch.CareError):
            care_torch.selective_log_softmax(torch.randn(2, 5), torch.tensor([0, 5]))

    def test_logits_policy_loss_equals_composition(self):
        import care_torch

        gen = torch.Generator().manual_seed(3)
        x = torch.randn(2, 4, 11, generator=gen)
        y = torch.randint(0, 11, (2, 4), generator=gen)
        old = torch.randn(2, 4, generator=gen) - 2
        adv = torch.tensor([0.5, -1.0])
        mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
        xa = x.clone().requires_grad_(True)
        loss, stats, _ = care_torch.logits_policy_loss(
            xa, y, old, adv, mask=mask, temperature=0.7, return_stats=True
        )
        loss.backward()
        xb = x.clone().requires_grad_(True)
        lp = torch.log_softmax(xb / 0.7, -1).gather(-1, y[..., None])[..., 0]
        want = care_torch.policy_loss(lp, old, adv, mask=mask)
        want.backward()
        self.assertEqual(stats["tokens"], 5.0)
        torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(xa.grad, xb.grad, atol=1e-5, rtol=1e-4)


if __name__ == "__main__":
    unittest.main()
