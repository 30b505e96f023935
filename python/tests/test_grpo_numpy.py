"""The GRPO step on numpy arrays (no torch): advantages against SPEC §9 written out with
numpy, the cross-rank phases against the one-rank call, and the loss against SPEC §10 with
its gradient checked by finite differences."""

from __future__ import annotations

import numpy as np
import pytest

import care_rl
from care_rl import CareError


def _adv_ref(r, g, eps, baseline="mean", scale="group_std", singleton="zero"):
    """SPEC §9 for contiguous groups of size g, valid = not NaN, in float64."""
    r = np.asarray(r, np.float64).reshape(-1, g)
    out = np.zeros_like(r)
    for i, row in enumerate(r):
        ok = ~np.isnan(row)
        x = row[ok]
        n = len(x)
        if n == 0:
            continue
        if n == 1:
            out[i, ok] = 0.0 if singleton == "zero" else x / (1 + eps)
            continue
        m = x.mean()
        b = m if baseline == "mean" else (x.sum() - x) / (n - 1)
        c = x - b
        if scale == "group_std":
            c = c / (x.std(ddof=1) + eps) if x.std() > 0 else np.zeros_like(c)
        out[i, ok] = c
    return out.reshape(-1)


def test_advantages_match_spec_formulas():
    rng = np.random.default_rng(0)
    r = rng.random(6 * 5).astype(np.float32)
    r[3] = np.nan
    r[25:] = 0.5  # an all-equal group gives exactly 0
    for preset, kw in (
        ("verl", dict(eps=1e-6)),
        ("trl", dict(eps=1e-4)),
        ("dr_grpo", dict(eps=0.0, scale="none")),
        ("rloo", dict(eps=0.0, scale="none", baseline="loo")),
    ):
        got = care_rl.group_advantages(r, 5, preset=preset, dtype=np.float64)
        want = _adv_ref(r, 5, **kw)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=preset)
    assert (care_rl.group_advantages(r, 5)[25:] == 0).all()
    two_d = care_rl.group_advantages(r.reshape(6, 5))
    assert two_d.shape == (6, 5) and two_d.dtype == np.float32


def test_advantage_options_and_stats():
    r = np.array([1.0, 0.0, 0.5, 0.5, 0.2, 0.2, 0.9, 0.1], np.float32)
    adv, stats = care_rl.group_advantages(r, 4, preset="trl", return_stats=True)
    assert stats.shape == (2, 4)
    np.testing.assert_allclose(stats[:, 0], [4, 4])
    np.testing.assert_allclose(stats[:, 1], [0.5, 0.35], rtol=1e-6)
    np.testing.assert_allclose(stats[0, 2], np.std([1, 0, 0.5, 0.5], ddof=1), rtol=1e-6)
    assert stats[:, 3].tolist() == [0.0, 0.0]
    # A preset with an override equals the option text it is built from.
    text = care_rl.advantage_options("trl", scale="none")
    assert "scale=none" in text and "eps=0.0001" in text
    valid = np.array([1, 1, 1, 1, 0, 0, 0, 1], bool)
    masked = care_rl.group_advantages(r, 4, valid=valid, preset="openrlhf", singleton="zero")
    assert masked[4:7].tolist() == [0, 0, 0] and masked[7] == 0  # a singleton group gets 0
    with pytest.raises(CareError) as e:
        care_rl.group_advantages(r, 4, valid=valid, preset="openrlhf")
    assert e.value.code == "singleton_group"
    with pytest.raises(CareError) as e:
        care_rl.group_advantages(r, 3)
    assert (e.value.code, e.value.number) == ("invalid_layout", 401)
    with pytest.raises(CareError) as e:
        care_rl.group_advantages(r, 4, eps=-1)
    assert e.value.code == "invalid_argument"
    with pytest.raises(CareError) as e:
        care_rl.group_advantages(r, 4, scale="sideways")
    assert "group_std" in str(e.value)
    with pytest.raises(CareError) as e:
        care_rl.group_advantages(r, 4, epsilon=1e-3)
    assert "eps" in str(e.value)


def test_cross_rank_phases_equal_one_rank():
    """Two simulated ranks, each with part of every group (CSR layouts with the same B)."""
    rng = np.random.default_rng(3)
    offs = np.array([0, 3, 7, 7, 12], np.uint32)  # ragged, with an empty group
    r = rng.random(12).astype(np.float32)
    full = care_rl.group_advantages(r, group_offsets=offs, preset="trl", dtype=np.float64)
    # Rank 0 holds the first sample of each group, rank 1 the rest.
    r0_idx, r1_idx, o0, o1 = [], [], [0], [0]
    for g in range(4):
        a, b = int(offs[g]), int(offs[g + 1])
        split = min(b, a + 1)
        r0_idx += list(range(a, split))
        r1_idx += list(range(split, b))
        o0.append(len(r0_idx))
        o1.append(len(r1_idx))
    ranks = [(r[r0_idx], np.array(o0, np.uint32)), (r[r1_idx], np.array(o1, np.uint32))]
    sums = sum(care_rl.group_partial_sums(x, group_offsets=o) for x, o in ranks)
    m2 = sum(care_rl.group_partial_squares(x, sums, group_offsets=o) for x, o in ranks)
    got = np.empty(12)
    for (x, o), idx in zip(ranks, (r0_idx, r1_idx)):
        got[idx] = care_rl.group_advantages_finalize(
            x, sums, m2, group_offsets=o, preset="trl", dtype=np.float64
        )
    np.testing.assert_allclose(got, full, rtol=0, atol=1e-12)


def _loss_ref(logp, old, adv_tok, mask, eps_low=0.2, eps_high=0.2, dual=0.0):
    """SPEC §10, token_mean, no KL, in float64: (loss, dL/dlogp)."""
    delta = np.clip(logp - old, -20, 20)
    rho = np.exp(delta)
    pg1 = -adv_tok * rho
    pg2 = -adv_tok * np.clip(rho, 1 - eps_low, 1 + eps_high)
    l = np.maximum(pg1, pg2)
    g = np.where(pg2 > pg1, 0.0, -adv_tok * rho)
    if dual > 1:
        d = (adv_tok < 0) & (-adv_tok * dual < l)
        l = np.where(d, -adv_tok * dual, l)
        g = np.where(d, 0.0, g)
    w = mask / mask.sum()
    return float((w * l).sum()), w * g


def test_policy_loss_matches_spec_and_finite_differences():
    rng = np.random.default_rng(4)
    b, length = 5, 7
    old = -rng.random((b, length)) * 2
    logp = old + rng.normal(0, 0.3, (b, length))
    mask = (rng.random((b, length)) > 0.25).astype(np.float64)
    adv = rng.normal(0, 1, b).astype(np.float32)
    res = care_rl.policy_loss(logp, old, adv, mask=mask, preset="verl")
    want, grad = _loss_ref(logp, old, np.repeat(adv.astype(np.float64), length).reshape(b, length), mask, dual=3.0)
    assert res.loss == pytest.approx(want, rel=1e-12)
    np.testing.assert_allclose(res.grad, grad, rtol=1e-6, atol=1e-9)
    assert res.grad.dtype == np.float32 and res.grad.shape == (b, length)
    assert res.stats["tokens"] == mask.sum() and res.stats["sequences"] == b
    assert list(res.stats) == [f[0] for f in care_rl.LOSS_STATS_FIELDS]
    # Finite differences of the float64 loss at a few counted tokens away from the clip edges.
    h = 1e-6
    for t in np.flatnonzero(mask.reshape(-1))[:5]:
        e = np.zeros(b * length)
        e[t] = h
        up = care_rl.policy_loss(logp + e.reshape(b, length), old, adv, mask=mask, preset="verl").loss
        dn = care_rl.policy_loss(logp - e.reshape(b, length), old, adv, mask=mask, preset="verl").loss
        assert res.grad.reshape(-1)[t] == pytest.approx((up - dn) / (2 * h), abs=1e-6)
    # Masked tokens get exactly 0, whatever they hold.
    poisoned = logp.copy()
    poisoned[mask == 0] = np.nan
    again = care_rl.policy_loss(poisoned, old, adv, mask=mask, preset="verl")
    assert again.loss == res.loss and (again.grad[mask == 0] == 0).all()


def test_presets_keep_their_policy_loss_and_counts_through_the_option_text():
    # The option text carries every field a preset sets: a preset of the policy-loss family
    # must not fall back to the clipped ratio on its way through the text.
    for preset, field, want in (
        ("verl_cispo", "policy_loss", "cispo"),
        ("verl_sapo", "sapo_tau_neg", "1.05"),
        ("verl_geo_mean", "policy_loss", "gmpo"),
        ("verl_gspo", "ratio_level", "sequence_token"),
        ("trl_grpo", "sequence_count", "all"),
        ("verl_seq_mean_token_sum_norm", "aggregation", "token_sum_norm"),
    ):
        fields = dict(care_rl._care.loss_option_fields(care_rl.loss_options(preset)))
        assert fields[field] == want, (preset, fields)
    fields = dict(care_rl._care.advantage_option_fields(care_rl.advantage_options("gpg")))
    assert fields["reweight"] == "gpg"
    fields = dict(care_rl._care.advantage_option_fields(care_rl.advantage_options(std_floor=0.1)))
    assert fields["std_floor"] == "0.1"


def test_cispo_preset_gradient_is_the_detached_clipped_weight():
    # CISPO: l = -sg(clip(rho, 1 - eps_low, 1 + eps_high)) * A * logp, so the gradient is
    # -clip(rho) * A * w even where the ratio is clipped (verl eps 0.2 / 0.2, token mean).
    rng = np.random.default_rng(5)
    b, length = 3, 6
    old = -rng.random((b, length)) * 2
    logp = old + rng.normal(0, 0.4, (b, length))
    adv = rng.normal(0, 1, b).astype(np.float32)
    res = care_rl.policy_loss(logp, old, adv, preset="verl_cispo")
    a = np.repeat(adv.astype(np.float64), length).reshape(b, length)
    c = np.clip(np.exp(logp - old), 0.8, 1.2)
    n = b * length
    np.testing.assert_allclose(res.grad, -c * a / n, rtol=1e-6, atol=1e-9)
    assert res.loss == pytest.approx(float((-c * a * logp).sum() / n), rel=1e-12)
    clipped = ((np.exp(logp - old) > 1.2) | (np.exp(logp - old) < 0.8)).sum()
    assert clipped > 0 and res.stats["clipped"] == clipped


def test_policy_loss_layouts_and_errors():
    logp = np.array([-0.5, -1.0, -0.7, -2.0], np.float32)
    offs = np.array([0, 1, 4], np.uint32)
    per_seq = care_rl.policy_loss(logp, None, [1.0, -1.0], offs)
    per_tok = care_rl.policy_loss(logp, None, [1.0, -1.0, -1.0, -1.0], offs)
    assert per_seq.loss == per_tok.loss
    with pytest.raises(CareError) as e:
        care_rl.policy_loss(logp, None, [1.0, 2.0, 3.0], offs)
    assert e.value.code == "length_mismatch"
    with pytest.raises(CareError) as e:
        care_rl.policy_loss(logp, None, [1.0, -1.0], np.array([0, 3, 2], np.uint32))
    assert e.value.code == "invalid_layout"
    with pytest.raises(CareError) as e:
        care_rl.policy_loss(logp, None, [1.0, -1.0], offs, eps_low=-0.1)
    assert e.value.code == "invalid_argument"
    # Global denominators: two halves with the global token count add up to the whole.
    whole = care_rl.policy_loss(logp, None, [1.0, -1.0], offs)
    a = care_rl.policy_loss(logp[:1], None, [1.0], np.array([0, 1], np.uint32), global_tokens=4)
    b = care_rl.policy_loss(logp[1:], None, [-1.0], np.array([0, 3], np.uint32), global_tokens=4)
    assert a.loss + b.loss == pytest.approx(whole.loss, abs=1e-15)
