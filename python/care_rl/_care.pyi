# Type stub of the extension module care_rl._care (python/src). Arrays are numpy arrays,
# torch tensors or DLPack capsules; outputs are written in place.
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

from ._types import (
    Alignment,
    GeneratorReward,
    GroupReport,
    JudgeReport,
    OutputCheck,
    PolicyReward,
    PreferenceReward,
    ProfileGroupReport,
    ProfileReward,
    ProfileValidation,
    StrategyCounts,
    Validation,
)

Array = Any
Text = Union[str, bytes]
Policy = Union[None, str, Mapping[str, object]]

__version__: str
LOSS_STATS_FIELDS: List[Tuple[str, str, int, str]]
LOSS_STATS_DEVICE_FIELDS: List[Tuple[str, str, int, str]]
ROLLOUT_STATS_FIELDS: List[str]
ROLLOUT_STATS_DEVICE_FIELDS: List[Tuple[str, str, int, str]]
LOGITS_NO_ROLLOUT: str
WORKSPACE_BYTES: int
WHITEN_MEAN_STD_F64: Tuple[int, int]
WHITENED_STATUS_WORD: int

class CareError(ValueError):
    code: str
    number: int
    message: str
    violations: List[Any]

class Rubric:
    def __init__(self, text: Text, policy: Policy = None) -> None: ...
    @property
    def weights(self) -> Tuple[float, float, float]: ...
    @property
    def scoring_weights(self) -> Tuple[float, float, float]: ...
    @property
    def counts(self) -> Tuple[int, int, int]: ...
    @property
    def total_criteria(self) -> int: ...
    @property
    def criteria(self) -> List[Tuple[str, str, str]]: ...
    @property
    def rationales(self) -> Tuple[str, str, str]: ...

RubricLike = Union[Rubric, str, bytes]

PROFILE_NAMES: List[str]
TEMPLATE_FAMILIES: List[str]

def read_prompt(prompt: str, template: str = "auto") -> Tuple[Optional[str], List[Tuple[str, str]]]: ...
def strip_end_tokens(response: str, template: str = "auto", extra: Sequence[str] = ()) -> Tuple[str, str]: ...

class Profile:
    def __init__(self, name_or_json: Text) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def rubric_source(self) -> str: ...
    @property
    def score_range(self) -> Tuple[int, int]: ...
    @property
    def dimensions(self) -> List[Tuple[str, float, int]]: ...
    @property
    def criteria(self) -> List[Tuple[str, str, str, float]]: ...
    @property
    def spans(self) -> List[str]: ...
    @property
    def judge_span(self) -> Optional[str]: ...
    @property
    def emotion(self) -> Optional[Tuple[str, float]]: ...
    @property
    def vetoes(self) -> List[Tuple[str, int]]: ...
    def total_criteria(self, rubric: Optional[RubricLike] = None) -> int: ...

def validate_profile(text: Text) -> ProfileValidation: ...
def check_output(profile: Profile, output: Text) -> OutputCheck: ...
def profile_reward(
    profile: Profile, output: Text, scores: Array, emotion: Optional[str] = None,
    rubric: Optional[RubricLike] = None, missing: Optional[str] = None,
    out_of_range: Optional[str] = None, uniform_weights: Optional[bool] = None,
) -> ProfileReward: ...
def profile_reward_group(
    profile: Profile, outputs: Sequence[Text], scores: Array, out: Array,
    emotion: Optional[str] = None, rubric: Optional[RubricLike] = None,
    missing: Optional[str] = None, out_of_range: Optional[str] = None,
    uniform_weights: Optional[bool] = None, details: bool = False,
) -> Tuple[ProfileGroupReport, Optional[List[Optional[ProfileReward]]]]: ...
def render_profile_judge_prompt(
    profile: Profile, context: Sequence[str], seeker_turn: str, response: str,
    rubric: Optional[RubricLike] = None,
) -> str: ...
def parse_profile_judge_output(
    text: Text, profile: Profile, out: Array, rubric: Optional[RubricLike] = None,
) -> JudgeReport: ...

def error(code: str, what: str) -> CareError: ...
def advantage_options(preset: Optional[str] = None, **overrides: object) -> str: ...
def loss_options(preset: Optional[str] = None, **overrides: object) -> str: ...
def advantage_option_fields(spec: str) -> List[Tuple[str, str]]: ...
def loss_option_fields(spec: str) -> List[Tuple[str, str]]: ...
def validate(text: Text, policy: Policy = None) -> Validation: ...
def format_reward(text: Text, policy: Policy = None) -> float: ...
def policy_reward(
    rubric: RubricLike, scores: Array, missing: Optional[str] = None,
    out_of_range: Optional[str] = None, uniform_weights: Optional[bool] = None,
) -> PolicyReward: ...
def policy_reward_group(
    rubric: RubricLike, scores: Array, out: Array, missing: Optional[str] = None,
    out_of_range: Optional[str] = None, uniform_weights: Optional[bool] = None,
) -> GroupReport: ...
def preference_reward(
    rubric: RubricLike, chosen: Array, rejected: Array, tau: Optional[float] = None,
    scale: Optional[str] = None, missing: Optional[str] = None,
    out_of_range: Optional[str] = None, uniform_weights: Optional[bool] = None,
) -> PreferenceReward: ...
def generator_reward(
    rubric_text: Text, chosen: Array, rejected: Array, chosen_tactics: Sequence[str],
    lambda_: Optional[float] = None, gamma: Optional[float] = None, tau: Optional[float] = None,
    scale: Optional[str] = None, missing: Optional[str] = None,
    out_of_range: Optional[str] = None, uniform_weights: Optional[bool] = None,
    unknown_label: Optional[str] = None, policy: Policy = None,
) -> GeneratorReward: ...
def alignment(weights: Tuple[float, float, float], counts: Tuple[int, int, int]) -> Alignment: ...
def strategy_counts(labels: Sequence[str], unknown_label: Optional[str] = None) -> StrategyCounts: ...
def render_judge_prompt(rubric: RubricLike, context: Sequence[str], seeker_turn: str, response: str) -> str: ...
def parse_judge_output(text: Text, rubric: RubricLike, out: Array) -> JudgeReport: ...
def group_advantages(
    rewards: Array, out: Array, options: str, group_size: int = 0, group_offsets: Optional[Array] = None,
    valid: Optional[Array] = None, stats: Optional[Array] = None, stream: int = 0,
    workspace: Optional[Array] = None, batch_std: Optional[Array] = None,
) -> None: ...
def group_partial_sums(
    rewards: Array, out: Array, group_size: int = 0, group_offsets: Optional[Array] = None,
    valid: Optional[Array] = None, stream: int = 0, workspace: Optional[Array] = None,
) -> None: ...
def group_partial_squares(
    rewards: Array, sums: Array, out: Array, group_size: int = 0,
    group_offsets: Optional[Array] = None, valid: Optional[Array] = None, stream: int = 0,
    workspace: Optional[Array] = None,
) -> None: ...
def group_advantages_finalize(
    rewards: Array, sums: Array, m2: Array, out: Array, options: str, group_size: int = 0,
    group_offsets: Optional[Array] = None, valid: Optional[Array] = None,
    stats: Optional[Array] = None, stream: int = 0, workspace: Optional[Array] = None,
) -> None: ...
def policy_loss(
    logp: Array, advantages: Array, seq_offsets: Array, grad: Optional[Array], stats: Array,
    options: str, adv_per_token: bool, logp_old: Optional[Array] = None,
    logp_ref: Optional[Array] = None, mask: Optional[Array] = None, max_seq_len: int = 0,
    stream: int = 0, workspace: Optional[Array] = None, grad_in_input_dtype: bool = False,
    logp_rollout: Optional[Array] = None, rollout_stats: Optional[Array] = None,
) -> Optional[float]: ...
def policy_loss_workspace_bytes(options: str, n_tokens: int) -> int: ...
def discounted_returns(
    token_rewards: Array, seq_offsets: Array, returns: Array, gamma: float = 1.0,
    mask: Optional[Array] = None, stream: int = 0, workspace: Optional[Array] = None,
    masked_token: str = "skip",
) -> None: ...
def discounted_returns_whitened(
    token_rewards: Array, seq_offsets: Array, advantages: Array, returns: Array,
    gamma: float = 1.0, mask: Optional[Array] = None, masked_token: str = "skip",
    eps: float = 1e-8, std_kind: str = "unbiased", count_eps: float = 0.0, stream: int = 0,
    workspace: Optional[Array] = None,
) -> Optional[Tuple[float, float]]: ...
def gae_whitened(
    token_rewards: Array, values: Array, seq_offsets: Array, advantages: Array, returns: Array,
    gamma: float = 1.0, lambda_: float = 1.0, mask: Optional[Array] = None, eps: float = 1e-8,
    std_kind: str = "unbiased", count_eps: float = 0.0, stream: int = 0,
    workspace: Optional[Array] = None,
) -> Optional[Tuple[float, float]]: ...
def whitened_workspace_bytes(n_tokens: int) -> int: ...
def gae(
    token_rewards: Array, values: Array, seq_offsets: Array, advantages: Array, returns: Array,
    gamma: float = 1.0, lambda_: float = 1.0, mask: Optional[Array] = None, stream: int = 0,
    workspace: Optional[Array] = None,
) -> None: ...
def whiten(
    values: Array, eps: float = 1e-8, std_kind: str = "unbiased", mask: Optional[Array] = None,
    stream: int = 0, workspace: Optional[Array] = None, count_eps: float = 0.0,
) -> Optional[Tuple[float, float]]: ...
def rollout_correction(
    logp_old: Array, logp_rollout: Array, seq_offsets: Array, weights: Array, keep: Array,
    stats: Array, options: str, mask: Optional[Array] = None,
) -> None: ...
def selective_log_softmax(
    logits: Array, targets: Array, logp: Array, lse: Array, temperature: float = 1.0,
    mask: Optional[Array] = None, entropy: Optional[Array] = None, stream: int = 0,
    workspace: Optional[Array] = None,
) -> None: ...
def selective_log_softmax_backward(
    logits: Array, targets: Array, dlogits: Array, lse: Array, temperature: float = 1.0,
    mask: Optional[Array] = None, entropy: Optional[Array] = None, dlogp: Optional[Array] = None,
    dentropy: Optional[Array] = None, stream: int = 0,
) -> None: ...
def logits_policy_loss(
    logits: Array, targets: Array, advantages: Array, seq_offsets: Array, logp: Array,
    lse: Array, dlogp: Array, stats: Array, options: str, adv_per_token: bool,
    temperature: float = 1.0, logp_old: Optional[Array] = None, logp_ref: Optional[Array] = None,
    mask: Optional[Array] = None, max_seq_len: int = 0, stream: int = 0,
    workspace: Optional[Array] = None, logp_rollout: Optional[Array] = None,
) -> Optional[float]: ...
def logits_policy_loss_fused(
    logits: Array, targets: Array, advantages: Array, seq_offsets: Array, stats: Array,
    options: str, adv_per_token: bool, temperature: float = 1.0, logp_old: Optional[Array] = None,
    logp_ref: Optional[Array] = None, mask: Optional[Array] = None, dlogits: Optional[Array] = None,
    logp: Optional[Array] = None, lse: Optional[Array] = None, stream: int = 0,
    workspace: Optional[Array] = None,
) -> None: ...
def fused_supported(options: str) -> bool: ...
def check_advantage_status(status: int) -> None: ...
def check_log_softmax_status(status: int) -> None: ...
def check_tokens_status(status: int) -> None: ...
def check_whiten_status(status: int) -> None: ...
def check_whitened_status(tokens_status: int, whiten_status: int) -> None: ...
def cuda_driver_available() -> bool: ...
