"""The command line's input rules in Python: ``None`` or NaN where a number is needed is
``non_finite`` naming the array and index (masked entries are never read); a size or a layout
that is not an integer is a ``ValueError`` (``CareError``, code ``schema``), never truncated;
a mask holds only true, false, 0 or 1. Each case is a named regression of a silent result."""

import math

import numpy as np
import pytest

import care_rl
from care_rl import CareError


def _raises(code: str, place: str, f):
    with pytest.raises(CareError) as e:
        f()
    assert e.value.code == code, str(e.value)
    assert place in str(e.value), str(e.value)
    assert isinstance(e.value, ValueError)
    return e.value


def test_none_among_log_probs_is_non_finite_not_a_nan_loss():
    # Used to return a loss and a gradient computed from NaN.
    _raises("non_finite", "logp[1]", lambda: care_rl.policy_loss([0.1, None], None, [1.0], [0, 2]))
    _raises("non_finite", "logp[1]", lambda: care_rl.policy_loss([-1.0, math.nan], [-1.0, -2.0], [1.0], [0, 2]))
    _raises("non_finite", "logp_old[0]", lambda: care_rl.policy_loss([-1.0, -2.0], [None, -2.0], [1.0], [0, 2]))
    _raises("non_finite", "advantages[0]", lambda: care_rl.policy_loss([-1.0, -2.0], None, [None], [0, 2]))
    _raises(
        "non_finite",
        "logp_rollout[1]",
        lambda: care_rl.policy_loss([-1.0, -2.0], None, [1.0], [0, 2], logp_rollout=[-1.0, math.nan]),
    )
    # Masked tokens are never read; the reference only under the KL term.
    ok = care_rl.policy_loss([None, -2.0], [None, -2.0], [1.0], [0, 2], mask=[0, 1])
    assert math.isfinite(ok.loss) and ok.grad[0] == 0
    care_rl.policy_loss([-1.0, -2.0], None, [1.0], [0, 2], logp_ref=[None, -2.0])
    _raises(
        "non_finite",
        "logp_ref[0]",
        lambda: care_rl.policy_loss([-1.0, -2.0], None, [1.0], [0, 2], logp_ref=[None, -2.0], beta=0.1),
    )


def test_nan_inputs_of_the_other_token_functions_are_non_finite():
    _raises("non_finite", "token_rewards[1]", lambda: care_rl.discounted_returns([1.0, None], [0, 2]))
    care_rl.discounted_returns([1.0, None], [0, 2], mask=[1, 0])
    _raises("non_finite", "values[1]", lambda: care_rl.gae([1.0, 2.0], [0.5, math.nan], [0, 2]))
    _raises("non_finite", "logp_old[1]", lambda: care_rl.rollout_correction([-1.0, None], [-1.0, -2.0], [0, 2]))
    _raises("non_finite", "logp_rollout[0]", lambda: care_rl.rollout_correction([-1.0, -2.0], [math.nan, -2.0], [0, 2]))
    _raises("non_finite", "weights[1]", lambda: care_rl.alignment([0.3, None, 0.4], [1, 2, 0]))
    sums = care_rl.group_partial_sums(np.array([1.0, 2.0], np.float32), 2)
    sums[0, 1] = math.nan
    _raises("non_finite", "sums[1]", lambda: care_rl.group_partial_squares(np.array([1.0, 2.0], np.float32), sums, 2))


def test_a_nan_reward_still_means_an_invalid_sample():
    # The documented exception: rewards are the one input where NaN (or None) has a meaning.
    a = care_rl.group_advantages([1.0, None, 3.0, 4.0], 2, preset="trl", singleton="zero")
    assert a[1] == 0 and a[0] == 0


def test_a_non_integral_group_size_or_layout_is_a_value_error_never_truncated():
    # group_advantages(r, 2.9) used to run with groups of 2; [0, 2.7, 6] used to become [0, 2, 6].
    r = [1.0, 2.0, 3.0, 4.0]
    _raises("schema", "group_size = 2.9", lambda: care_rl.group_advantages(r, 2.9))
    _raises("schema", "group_size = nan", lambda: care_rl.group_advantages(r, math.nan))
    _raises("schema", "group_size = -2", lambda: care_rl.group_advantages(r, -2))
    _raises("schema", "group_offsets[1] = 2.7", lambda: care_rl.group_advantages(r, group_offsets=[0, 2.7, 4]))
    _raises("schema", "group_offsets[1] = None", lambda: care_rl.group_advantages(r, group_offsets=[0, None, 4]))
    _raises("schema", "group_size = 2.5", lambda: care_rl.group_partial_sums(r, 2.5))
    lp = [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]
    _raises("schema", "seq_offsets[1] = 2.7", lambda: care_rl.policy_loss(lp, None, [1.0, 1.0], [0, 2.7, 6]))
    _raises("schema", "seq_offsets[1] = -1", lambda: care_rl.policy_loss(lp, None, [1.0, 1.0], [0, -1, 6]))
    _raises("schema", "seq_offsets[2] = 4294967296", lambda: care_rl.policy_loss(lp, None, [1.0, 1.0], [0, 2, 2**32]))
    _raises("schema", "seq_offsets[1] = 2.5", lambda: care_rl.discounted_returns(lp, [0, 2.5, 6]))
    _raises("schema", "counts[1] = 2.7", lambda: care_rl.alignment([0.3, 0.3, 0.4], [1, 2.7, 0]))
    # An integral float is that integer.
    np.testing.assert_array_equal(care_rl.group_advantages(r, 2.0), care_rl.group_advantages(r, 2))
    a = care_rl.policy_loss(lp, None, [1.0, 1.0], np.array([0.0, 2.0, 6.0]))
    b = care_rl.policy_loss(lp, None, [1.0, 1.0], [0, 2, 6])
    assert a.loss == b.loss


def test_a_mask_holds_only_true_false_zero_or_one():
    r = [1.0, 2.0, 3.0, 4.0]
    _raises("schema", "valid[1] = 0.5", lambda: care_rl.group_advantages(r, 2, valid=[1, 0.5, 1, 1]))
    _raises("schema", "mask[0] = 2", lambda: care_rl.policy_loss([-1.0, -2.0], None, [1.0], [0, 2], mask=[2, 1]))
    _raises("schema", "mask[1] = None", lambda: care_rl.discounted_returns([1.0, 2.0], [0, 2], mask=[1, None]))
    care_rl.group_advantages(r, 2, valid=[True, False, 1.0, 0])


def test_torch_cpu_tensors_follow_the_same_rules():
    torch = pytest.importorskip("torch")
    import care_rl.torch as ct

    lp = torch.tensor([0.1, float("nan"), 0.3], requires_grad=True)
    _raises("non_finite", "logp[1]", lambda: ct.policy_loss(lp, None, torch.tensor([1.0]), torch.tensor([0, 3])))
    x = torch.tensor([0.1, 0.2, 0.3])
    _raises("schema", "seq_offsets[1] = 1.5", lambda: ct.policy_loss(x, None, torch.tensor([1.0, 1.0]), torch.tensor([0, 1.5, 3])))
    _raises("schema", "group_size = 2.9", lambda: ct.advantages(torch.tensor([1.0, 2.0, 3.0, 4.0]), 2.9))
    _raises("schema", "valid[1] = 0.5", lambda: ct.advantages(torch.tensor([1.0, 2.0, 3.0, 4.0]), 2, valid=torch.tensor([1, 0.5, 1, 1])))
    _raises("schema", "group_size = 2.5", lambda: ct.group_partial_sums(torch.tensor([1.0, 2.0, 3.0, 4.0]), 2.5))
    _raises("non_finite", "token_rewards[1]", lambda: ct.discounted_returns(torch.tensor([1.0, float("nan")]), torch.tensor([0, 2])))
    _raises("schema", "targets", lambda: ct.selective_log_softmax(torch.randn(2, 5), torch.tensor([1.5, 2.0])))
    ct.selective_log_softmax(torch.randn(2, 5), torch.tensor([1.0, 2.0]))
