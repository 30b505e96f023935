"""The six classes where care's defaults and verl's own code differ (verl-project/verl@1dda039;
volcengine/verl@b178a3c for REINFORCE++ before verl #7300), through the Python surface: each
verl-named preset or switch gives verl's numbers, computed here by numpy transcriptions of
verl's formulas in float64, and care's own default keeps its choice. The Rust differential
suite (tests/tests/peers.rs) runs the same classes on random cases."""

from __future__ import annotations

import numpy as np
import pytest

import care_rl

SAFETY_BOUND = 20.0


def _masked_mean(v, m):
    """verl ``masked_mean``: sum / (count + 1e-8)."""
    return float((v * m).sum() / (m.sum() + 1e-8))


def _masked_whiten(v, m):
    """verl ``masked_whiten`` (unbiased ``masked_var``, ``rsqrt(var + 1e-8)``), times the mask."""
    mean = _masked_mean(v, m)
    n = m.sum()
    var = _masked_mean((v - mean) ** 2, m) * (n / (n - 1))
    return (v - mean) / np.sqrt(var + 1e-8) * m


def _vanilla(logp, old, adv, mask, w=None):
    """verl ``compute_policy_loss_vanilla`` (eps 0.2, clip_ratio_c 3), token-mean."""
    ratio = np.exp(np.clip(logp - old, -20, 20))
    l1 = np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.8, 1.2))
    pg = np.where(adv < 0, np.minimum(-adv * 3.0, l1), l1)
    if w is not None:
        pg = pg * w
    return float((pg * mask).sum() / mask.sum())


def test_class1_bypass_ppo_clip_and_reinforce():
    # The case: verl's bypass ppo_clip gives -1.2 and no gradient (the clip binds).
    one = dict(seq_offsets=[0, 1], logp_rollout=np.array([-1.5]))
    for extra in ({}, dict(rollout_is="token", rollout_is_threshold=2.0)):
        res = care_rl.policy_loss(np.array([-1.0]), None, np.array([1.0], np.float32), preset="verl_bypass", **one, **extra)
        assert res.loss == pytest.approx(-1.2, abs=1e-12)
        assert res.grad.tolist() == [0.0]
        own = care_rl.policy_loss(np.array([-1.0]), None, np.array([1.0], np.float32), preset="verl", **one, **extra)
        w = np.exp(0.5) if extra else 1.0
        assert own.loss == pytest.approx(-w, rel=1e-7)  # care's reading: on-policy, weights applied
    # Random padded batches: ppo_clip against verl's vanilla with the rollout as the old
    # log-probs (no weights), reinforce (verl_gpg without logp_old) against -A * w * logp.
    rng = np.random.default_rng(31)
    b, length = 4, 6
    logp = -rng.random((b, length)) * 2 - 0.05
    roll = logp - rng.uniform(-0.5, 0.5, (b, length))
    mask = (rng.random((b, length)) > 0.2).astype(np.float64)
    mask[0, 0] = 1.0
    adv = rng.normal(size=b).astype(np.float32)
    adv_tok = np.repeat(adv.astype(np.float64), length).reshape(b, length)
    res = care_rl.policy_loss(logp, None, adv, mask=mask, logp_rollout=roll, preset="verl_bypass")
    assert res.loss == pytest.approx(_vanilla(logp, roll, adv_tok, mask), rel=1e-9)
    w = np.minimum(np.exp(np.clip(logp - roll, -SAFETY_BOUND, SAFETY_BOUND)) * mask, 1.5)
    res = care_rl.policy_loss(
        logp, None, adv, mask=mask, logp_rollout=roll, preset="verl_gpg", rollout_is="token", rollout_is_threshold=1.5
    )
    want = float((-adv_tok * logp * w * mask).sum() / mask.sum())
    assert res.loss == pytest.approx(want, rel=1e-9)
    np.testing.assert_allclose(res.grad, (-adv_tok * w * mask / mask.sum()).astype(np.float32), rtol=1e-6)
    # Bypass takes the old log-probs from the rollout: both given is an error.
    with pytest.raises(care_rl.CareError) as e:
        care_rl.policy_loss(logp, logp, adv, mask=mask, logp_rollout=roll, preset="verl_bypass")
    assert e.value.code == "invalid_argument"


def test_class2_reinforce_pp_masked_token():
    r = np.array([0.0, 0.0, 1.0, 0.5], np.float32)
    offs, mask = [0, 3, 4], np.array([1, 0, 1, 1], np.uint8)
    # verl since 2026-08 (skip, the default) and before (reset), by hand.
    for rule, want in (("skip", [1.0, 0.0, 1.0, 0.5]), ("reset", [0.0, 0.0, 1.0, 0.5])):
        got = care_rl.discounted_returns(r, offs, mask, gamma=1.0, masked_token=rule)
        np.testing.assert_array_equal(got, np.array(want, np.float32))
        adv, ret, _, _ = care_rl.discounted_returns_whitened(r, offs, mask, masked_token=rule, count_eps=1e-8)
        np.testing.assert_array_equal(ret, got)
        np.testing.assert_allclose(adv, _masked_whiten(np.array(want), mask.astype(np.float64)), rtol=1e-6, atol=1e-7)
    with pytest.raises(care_rl.CareError) as e:
        care_rl.discounted_returns(r, offs, mask, masked_token="restart")
    assert e.value.code == "invalid_argument"


def test_class3_kl_cov_coefficient():
    assert "kl_cov_coef=0.1," in care_rl.loss_options("verl_kl_cov")
    assert "kl_cov_coef=1.0," in care_rl.loss_options()
    # One token, selected (k = 1): -A rho + coef |delta|.
    res = care_rl.policy_loss(np.array([-1.0]), np.array([-1.5]), np.array([1.0], np.float32), [0, 1], preset="verl_kl_cov")
    assert res.loss == pytest.approx(-np.exp(0.5) + 0.1 * 0.5, abs=1e-12)


def test_class4_gpg_singleton_groups():
    verl = care_rl.group_advantages([1.0, 0.0, 2.0], group_offsets=[0, 2, 3], preset="verl_gpg", dtype=np.float64)
    np.testing.assert_array_equal(verl, [0.75, -0.75, 3.0])
    paper = care_rl.group_advantages([1.0, 0.0, 2.0], group_offsets=[0, 2, 3], preset="gpg", dtype=np.float64)
    np.testing.assert_array_equal(paper, [0.75, -0.75, 0.0])


def test_class5_gmpo_weight_floor():
    # Token weights e^-20 (a rollout log ratio of -30, clamped at 20 by both) and 1.
    logp, old = np.array([-1.0, -1.2]), np.array([-1.1, -1.1])
    roll = old + np.array([30.0, 0.0])
    adv = np.array([1.0], np.float32)
    kw = dict(seq_offsets=[0, 2], logp_rollout=roll, rollout_is="token", rollout_is_threshold=np.inf)
    w = np.exp(np.clip(old - roll, -SAFETY_BOUND, SAFETY_BOUND))
    seq_w = np.exp(np.log(w + 1e-10).sum() / (2 + 1e-8))
    ratio = np.exp((0.1 - 0.1) / (2 + 1e-8))  # the clipped log ratios [0.1, -0.1]
    verl = -1.0 * ratio * seq_w  # torch.mean over the one row
    res = care_rl.policy_loss(logp, old, adv, preset="verl_geo_mean", **kw)
    # verl's count + 1e-8 shifts the mean log weight (-11.5) by about 6e-8 relative.
    assert res.loss == pytest.approx(verl, rel=1e-6)
    own = care_rl.policy_loss(logp, old, adv, preset="verl_geo_mean", gmpo_weight_floor=0.0, **kw)
    assert own.loss == pytest.approx(-np.exp(-10.0), rel=1e-9)


def test_class6_whitening_in_float64():
    # Returns climbing from about 500 by 0.01 a token: rounding them to float32 before
    # whitening costs more than 1e-5; the fused call matches verl's float64 path to 1e-6.
    t = 40
    r = np.full(t, 0.01037, np.float32)
    r[-1] = 500.12346
    want_ret = np.cumsum(r.astype(np.float64)[::-1])[::-1]
    want = _masked_whiten(want_ret, np.ones(t))
    adv, ret, mean, _ = care_rl.discounted_returns_whitened(r, [0, t], count_eps=1e-8)
    assert np.max(np.abs(adv - want) / (1 + np.abs(want))) <= 1e-6
    assert mean == pytest.approx(want_ret.mean(), rel=1e-7)
    stored, _, _ = care_rl.whiten(care_rl.discounted_returns(r, [0, t]), count_eps=1e-8)
    assert np.max(np.abs(stored - want) / (1 + np.abs(want))) > 1e-5
    # GAE: the same fused path.
    v = np.linspace(0.0, 1.0, t).astype(np.float32)
    gadv, gret, _, _ = care_rl.gae_whitened(r, v, [0, t], count_eps=1e-8)
    np.testing.assert_allclose(gret, (want_ret - v.astype(np.float64)) + v, rtol=1e-6)
    np.testing.assert_allclose(gadv, _masked_whiten(want_ret - v.astype(np.float64), np.ones(t)), rtol=1e-6, atol=1e-6)
