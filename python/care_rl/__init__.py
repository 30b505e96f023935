"""care_rl: CARE rewards for RL trainers, through a running ``care serve``.

Stdlib only (``urllib``, ``json``): importable with ``PYTHONPATH=python`` and no third-party
package. The framework-specific entry points take the call signatures the frameworks use:

* :class:`TRLReward` -- an entry of TRL ``GRPOTrainer(reward_funcs=[...])``.
* :func:`compute_score` / :func:`compute_score_batch` -- verl ``custom_reward_function``
  (per sample, or with ``reward_model.reward_manager=batch``).
* :class:`CareRewardClient` -- the JSON API for whole groups, for anything else.
"""

from .rewards import (
    CareRewardClient,
    CareRewardError,
    TRLReward,
    compute_score,
    compute_score_batch,
)

__all__ = [
    "CareRewardClient",
    "CareRewardError",
    "TRLReward",
    "compute_score",
    "compute_score_batch",
]
