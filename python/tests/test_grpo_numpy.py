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
    assert "rewards has 8 values, not a multiple of group_size 3" in str(e.value)
    with pytest.raises(CareError) as e:
        care_rl.group_advantages(r, group_offsets=np.array([0, 4, 9], np.uint32))
    assert "group_offsets ends at 9 but rewards has 8 values" in str(e.value)
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
    assert "seq_offsets[2] is smaller than seq_offsets[1]" in str(e.value)
    with pytest.raises(CareError) as e:
        care_rl.policy_loss(logp, None, [1.0, -1.0], offs, eps_low=-0.1)
    assert e.value.code == "invalid_argument"
    # Global denominators: two halves with the global token count add up to the whole.
    whole = care_rl.policy_loss(logp, None, [1.0, -1.0], offs)
    a = care_rl.policy_loss(logp[:1], None, [1.0], np.array([0, 1], np.uint32), global_tokens=4)
    b = care_rl.policy_loss(logp[1:], None, [-1.0], np.array([0, 3], np.uint32), global_tokens=4)
    assert a.loss + b.loss == pytest.approx(whole.loss, abs=1e-15)


# ---- rollout correction (SPEC §17) ---------------------------------------------------------


def _rollout_case():
    """Two sequences (4 + 3 tokens), logp == logp_old (so the PPO ratio is 1 and only the
    rollout weights change the loss), float64 throughout."""
    old = np.full(7, -1.0)
    roll = np.array([-1.0, -1.5, -0.7, -3.0, -1.2, -0.9, -1.0])
    adv = np.array([1.0, -0.5], np.float32)
    offs = np.array([0, 4, 7], np.uint32)
    return old.copy(), old, roll, adv, offs


def test_rollout_equal_to_old_changes_nothing():
    """logp_rollout == logp_old: every weight is 1 and nothing is rejected, so loss, gradient
    and statistics equal the call without it, bit for bit (with weights and criteria on)."""
    rng = np.random.default_rng(3)
    old = -rng.random(20) * 2
    logp = old + rng.normal(0, 0.3, 20)
    adv = rng.normal(size=4).astype(np.float32)
    offs = np.array([0, 3, 9, 15, 20], np.uint32)
    mask = rng.random(20) > 0.2
    kw = dict(preset="verl", rollout_is="token", rollout_is_threshold=2.0,
              rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold="2.0,0.01")  # fmt: skip
    plain = care_rl.policy_loss(logp, old, adv, offs, mask, **kw)
    corr = care_rl.policy_loss(logp, old, adv, offs, mask, logp_rollout=old.copy(), **kw)
    assert plain.rollout is None
    assert corr.loss == plain.loss
    np.testing.assert_array_equal(corr.grad, plain.grad)
    assert corr.stats == plain.stats
    r = corr.rollout
    assert r["tokens"] == mask.sum() and r["weight_sum"] == mask.sum()
    assert r["rejected_tokens"] == 0 and r["truncated"] == 0 and r["kl_sum"] == 0


def test_rollout_token_tis_and_rejection_by_hand():
    """Token TIS at C = 1.5 and token_k1 rejection outside [1/5, 5], worked out by hand:
    x = logp_old - logp_rollout = [0, .5, -.3, 2 | .2, -.1, 0]; w = min(e^x, 1.5); token 3
    (e^2 > 5) is dropped from the loss and from the token count (mode drop); token_mean over
    the 6 kept tokens of -A_i * w_t (ratio 1)."""
    logp, old, roll, adv, offs = _rollout_case()
    res = care_rl.policy_loss(
        logp, old, adv, offs, logp_rollout=roll, rollout_is="token", rollout_is_threshold=1.5,
        rollout_rs="token_k1", rollout_rs_threshold="5",
    )  # fmt: skip
    x = old - roll
    w = np.minimum(np.exp(x), 1.5)
    keep = np.array([1, 1, 1, 0, 1, 1, 1], bool)
    a_tok = np.repeat(adv.astype(np.float64), [4, 3])
    n = keep.sum()
    want_loss = (-a_tok * w)[keep].sum() / n
    want_grad = np.where(keep, -a_tok * w / n, 0.0)
    assert res.loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(res.grad, want_grad, rtol=1e-6, atol=1e-7)
    assert res.stats["tokens"] == 6
    r = res.rollout
    assert r["tokens"] == 7 and r["sequences"] == 2
    assert r["rejected_tokens"] == 1 and r["rejected_sequences"] == 1
    assert r["truncated"] == 2  # e^.5 and e^2 reach C (e^.2 does not)
    assert r["weight_sum"] == pytest.approx(w.sum(), rel=1e-12)
    assert r["kl_sum"] == pytest.approx((roll - old).sum(), rel=1e-12)


def test_rollout_correction_function_matches_the_loss():
    """care_rl.rollout_correction gives the weights and the mask the loss applied, and the same
    diagnostics."""
    logp, old, roll, adv, offs = _rollout_case()
    kw = dict(rollout_is="token", rollout_is_threshold=1.5, rollout_rs="token_k1", rollout_rs_threshold="5")
    rc = care_rl.rollout_correction(old, roll, offs, **kw)
    res = care_rl.policy_loss(logp, old, adv, offs, logp_rollout=roll, **kw)
    assert rc.stats == res.rollout
    np.testing.assert_array_equal(rc.keep, [True, True, True, False, True, True, True])
    w = np.where(rc.keep, np.minimum(np.exp(old - roll), 1.5), 0.0)
    np.testing.assert_allclose(rc.weights, w, rtol=1e-6)
    assert rc.weights.dtype == np.float32 and rc.keep.dtype == bool


def test_rollout_options_text_round_trips_and_errors():
    text = care_rl.loss_options(
        rollout_is="sequence", rollout_rs="token_k1,seq_sum_k2", rollout_rs_threshold="0.5_2,0.3",
        rollout_rejection="zero_weight",
    )  # fmt: skip
    assert "rollout_rs_token_k1=0.5_2.0" in text and "rollout_rs_seq_sum_k2=0.3" in text
    assert "rollout_is=sequence" in text and "rollout_rejection=zero_weight" in text
    fields = dict(care_rl._care.loss_option_fields(text))
    assert fields["rollout_rs_seq_sum_k2"] == "0.3"
    again = care_rl._care.loss_options(None, **fields)  # the fields as overrides give the text back
    assert again == text
    with pytest.raises(CareError) as e:
        care_rl.loss_options(rollout_rs="token_k1")
    assert e.value.code == "invalid_argument" and "rollout_rs_threshold" in str(e.value)
    with pytest.raises(CareError) as e:
        care_rl.loss_options(rollout_rs="token_k9", rollout_rs_threshold="2")
    assert e.value.code == "invalid_argument"
    with pytest.raises(CareError):
        care_rl.loss_options(rollout_rs_token_k2="0.1_0.5")  # k2 takes one upper bound
    with pytest.raises(CareError):
        care_rl.loss_options(rollout_is="tokens")


def test_rollout_input_errors():
    logp, old, roll, adv, offs = _rollout_case()
    with pytest.raises(CareError) as e:
        care_rl.policy_loss(logp, old, adv, offs, logp_rollout=roll[:6])
    assert e.value.code == "length_mismatch"


# ---- token-level estimators (SPEC §18) -------------------------------------------------------


def test_discounted_returns_by_hand():
    r = np.array([1.0, 0.0, 2.0, 5.0, 1.0], np.float32)
    offs = [0, 3, 5]
    got = care_rl.discounted_returns(r, offs, mask=[1, 0, 1, 1, 1], gamma=0.5)
    # Sequence 1: token 1 is masked (0, and skipped by the scan): G2 = 2, G0 = 1 + .5 * 2.
    # Sequence 2: G4 = 1, G3 = 5 + .5 * 1.
    np.testing.assert_array_equal(got, np.array([2.0, 0.0, 2.0, 5.5, 1.0], np.float32))


def test_gae_by_hand_and_lambda_one_is_returns_minus_values():
    r = np.array([0.0, 0.0, 1.0], np.float32)
    v = np.array([0.5, 0.25, 0.5], np.float32)
    adv, ret = care_rl.gae(r, v, [0, 3], gamma=0.5, lambda_=0.5)
    # delta = r + .5 V_next - V: [-.375, 0, .5]; A2 = .5, A1 = 0 + .25 * .5, A0 = -.375 + .25 * .125
    want = np.array([-0.375 + 0.25 * 0.125, 0.125, 0.5], np.float32)
    np.testing.assert_allclose(adv, want, rtol=1e-7)
    np.testing.assert_allclose(ret, want + v, rtol=1e-7)
    rng = np.random.default_rng(4)
    r = rng.normal(size=(3, 7)).astype(np.float32)
    v = rng.normal(size=(3, 7)).astype(np.float32)
    mask = rng.random((3, 7)) > 0.3
    adv, ret = care_rl.gae(r, v, mask=mask)
    g = care_rl.discounted_returns(r, mask=mask)
    np.testing.assert_allclose(adv, np.where(mask, g - v, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, np.where(mask, g, 0), rtol=1e-5, atol=1e-5)


def test_whiten_matches_numpy_and_errors():
    rng = np.random.default_rng(5)
    x = rng.normal(3, 2, size=40).astype(np.float32)
    m = rng.random(40) > 0.25
    for kind, ddof in (("unbiased", 1), ("biased", 0)):
        w, mean, std = care_rl.whiten(x, m, std_kind=kind)
        c = x[m].astype(np.float64)
        assert mean == pytest.approx(c.mean(), rel=1e-12)
        assert std == pytest.approx(c.std(ddof=ddof), rel=1e-12)
        np.testing.assert_allclose(w[m], (c - c.mean()) / np.sqrt(c.var(ddof=ddof) + 1e-8), rtol=1e-6)
        assert (w[~m] == 0).all()
    assert x[0] != 0  # the input is not modified
    with pytest.raises(CareError) as e:
        care_rl.whiten([1.0, np.nan])
    assert e.value.code == "non_finite"
    with pytest.raises(CareError) as e:
        care_rl.whiten([1.0, 2.0], std_kind="sample")
    assert e.value.code == "invalid_argument"
    with pytest.raises(CareError) as e:
        care_rl.gae([1.0, 2.0], [0.0], [0, 2])
    assert e.value.code == "length_mismatch"
    with pytest.raises(CareError) as e:
        care_rl.discounted_returns([1.0, 2.0], [0, 2], gamma=1.5)
    assert e.value.code == "invalid_argument"
def test_values_beyond_the_f32_range_are_errors_naming_the_array_and_index():
    # The one out-of-range rule of every surface: rounds to infinity in float32 -> non_finite.
    with pytest.raises(CareError) as e:
        care_rl.group_advantages([1.0, 1e39, 0.0, 1.0], 2)
    assert e.value.code == "non_finite"
    assert "rewards[1] = 1e+39 exceeds the f32 range" in str(e.value)
    with pytest.raises(CareError) as e:
        care_rl.group_advantages(np.array([[0.0, 1.0], [-4e38, 1.0]]))
    assert "rewards[1][0] = -4e+38 exceeds the f32 range" in str(e.value)
    with pytest.raises(CareError) as e:
        care_rl.policy_loss(np.zeros(2, np.float32), None, [1e39], [0, 2])
    assert e.value.code == "non_finite" and "advantages[0]" in str(e.value)
    with pytest.raises(CareError) as e:
        care_rl.policy_loss(np.zeros(2, np.float32), np.array([0.0, -1e300]), [1.0], [0, 2])
    assert "logp_old[1]" in str(e.value)
    # The largest float32, and values that round to it, are accepted.
    out = care_rl.group_advantages(np.array([3.4028235e38, 3.40282356e38]), 2)
    assert np.all(np.isfinite(out))
