"""``care_torch``: the older import name of :mod:`care_rl.torch`, kept so that existing code
keeps importing. Everything here is ``care_rl.torch`` itself (one implementation): the module
object is the same, so ``care_torch.policy_loss is care_rl.torch.policy_loss``."""

import sys

import care_rl.torch as _impl

sys.modules[__name__] = _impl
