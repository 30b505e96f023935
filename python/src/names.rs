//! The stable names of the core's option enums, as Python's string arguments spell them.
//!
//! Mirrors `care_core::Named` (one name per variant, `from_name` exact) until the core's own
//! table lands on main; then this module becomes `pub use care_core::Named`.

use care_core::grpo::{
    Aggregation, Baseline, KlEstimator, LossPreset, Preset, RatioLevel, Scale, SingletonPolicy,
    StdKind,
};
use care_core::{MissingPolicy, RangePolicy, ScoreScale, UnknownLabelPolicy};
use pyo3::PyResult;

use crate::error::invalid;

/// An enum of `care-core` with one stable name per variant.
pub trait Named: Copy + Eq + Sized + 'static {
    /// What the enum is, for messages.
    const KIND: &'static str;
    /// Every variant.
    const ALL: &'static [Self];
    /// The stable name of this variant.
    fn name(self) -> &'static str;
    /// The variant named exactly `name`.
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == name)
    }
}

macro_rules! named {
    ($ty:ty, $kind:literal, { $($v:ident => $name:literal),+ $(,)? }) => {
        impl Named for $ty {
            const KIND: &'static str = $kind;
            const ALL: &'static [Self] = &[$(<$ty>::$v),+];
            fn name(self) -> &'static str {
                match self { $(<$ty>::$v => $name),+ }
            }
        }
    };
}

named!(Baseline, "baseline", { Mean => "mean", LeaveOneOut => "leave_one_out", None => "none" });
named!(Scale, "scale", { GroupStd => "group_std", BatchStd => "batch_std", None => "none" });
named!(StdKind, "std estimator", { Unbiased => "unbiased", Biased => "biased" });
named!(SingletonPolicy, "singleton policy", { Zero => "zero", Raw => "raw", Error => "error" });
named!(Preset, "advantage preset", {
    Verl => "verl", Trl => "trl", TrlBatch => "trl_batch", OpenRlhf => "openrlhf",
    DrGrpo => "dr_grpo", Rloo => "rloo",
});
named!(Aggregation, "aggregation", {
    TokenMean => "token_mean", SeqMeanTokenMean => "seq_mean_token_mean",
    SeqMeanTokenSum => "seq_mean_token_sum", SeqMeanTokenSumNorm => "seq_mean_token_sum_norm",
    TokenSum => "token_sum",
});
named!(KlEstimator, "KL estimator", { K1 => "k1", Abs => "abs", K2 => "k2", K3 => "k3" });
named!(RatioLevel, "ratio level", { Token => "token", Sequence => "sequence" });
named!(LossPreset, "loss preset", { Verl => "verl", Trl => "trl" });
named!(MissingPolicy, "missing-score policy", { Error => "error", Zero => "zero", Skip => "skip" });
named!(RangePolicy, "out-of-range policy", { Error => "error", Clamp => "clamp" });
named!(ScoreScale, "score scale", { Normalized => "normalized", Raw => "raw" });
named!(UnknownLabelPolicy, "unknown-label policy", { Error => "error", Ignore => "ignore" });

/// Parses `value` as a name of `T`, naming the argument and the accepted names on failure.
pub fn parse<T: Named>(arg: &str, value: &str) -> PyResult<T> {
    T::from_name(value).ok_or_else(|| {
        let names: Vec<&str> = T::ALL.iter().map(|v| v.name()).collect();
        invalid(format!(
            "{arg}={value:?}: unknown {} (expected one of {})",
            T::KIND,
            names.join(", ")
        ))
    })
}
