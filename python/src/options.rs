//! Option sets as canonical text: `"baseline=mean,scale=group_std,...,eps=1e-6"`.
//!
//! The PyTorch custom ops take their options as one `str` argument (a graph constant under
//! `torch.compile`), so an option added to the core never changes an op's schema. The text is
//! produced here from a preset plus keyword overrides (validated by the core) and parsed here
//! again by each call; floats are written with Rust's shortest round-trip formatting, so the
//! text carries every bit. Field names are the Rust field names.

use care_core::grpo::{
    AdvantageOptions, LossOptions, LossPreset, Preset, Rejection, RolloutOptions,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::{OrRaise, invalid};
use crate::names::parse;

/// One option set with named fields.
pub trait OptionSet: Sized {
    /// What it is (messages).
    const WHAT: &'static str;
    /// The defaults, or a preset's values.
    fn base(preset: Option<&str>) -> PyResult<Self>;
    /// Sets field `key` from its text.
    fn set(&mut self, key: &str, value: &str) -> PyResult<()>;
    /// Sets the keyword overrides `(key, text)` in order (an option set whose fields come in
    /// pairs takes them here).
    fn set_overrides(&mut self, pairs: &[(String, String)]) -> PyResult<()> {
        pairs.iter().try_for_each(|(k, v)| self.set(k, v))
    }
    /// Every field with its canonical text.
    fn fields(&self) -> Vec<(&'static str, String)>;
    /// The core's own check.
    fn check(&self) -> PyResult<()>;
}

fn num(key: &str, value: &str) -> PyResult<f64> {
    value
        .trim()
        .parse::<f64>()
        .map_err(|_| invalid(format!("{key}={value:?}: expected a number")))
}

impl OptionSet for AdvantageOptions {
    const WHAT: &'static str = "advantage options";

    fn base(preset: Option<&str>) -> PyResult<Self> {
        Ok(match preset {
            None => AdvantageOptions::default(),
            Some(p) => AdvantageOptions::preset(parse::<Preset>("preset", p)?),
        })
    }

    fn set(&mut self, key: &str, value: &str) -> PyResult<()> {
        match key {
            "baseline" => self.baseline = parse(key, value)?,
            "scale" => self.scale = parse(key, value)?,
            "std_kind" => self.std_kind = parse(key, value)?,
            "singleton" => self.singleton = parse(key, value)?,
            "reweight" => self.reweight = parse(key, value)?,
            "eps" => self.eps = num(key, value)?,
            "std_floor" => self.std_floor = num(key, value)?,
            _ => return Err(unknown::<Self>(key, &self.fields())),
        }
        Ok(())
    }

    fn fields(&self) -> Vec<(&'static str, String)> {
        vec![
            ("baseline", self.baseline.name().into()),
            ("scale", self.scale.name().into()),
            ("std_kind", self.std_kind.name().into()),
            ("singleton", self.singleton.name().into()),
            ("reweight", self.reweight.name().into()),
            ("eps", format!("{:?}", self.eps)),
            ("std_floor", format!("{:?}", self.std_floor)),
        ]
    }

    fn check(&self) -> PyResult<()> {
        self.validate().or_raise(Self::WHAT)
    }
}

impl OptionSet for LossOptions {
    const WHAT: &'static str = "loss options";

    fn base(preset: Option<&str>) -> PyResult<Self> {
        Ok(match preset {
            None => LossOptions::default(),
            Some(p) => LossOptions::preset(parse::<LossPreset>("preset", p)?),
        })
    }

    fn set(&mut self, key: &str, value: &str) -> PyResult<()> {
        match key {
            "aggregation" => self.aggregation = parse(key, value)?,
            "ratio_level" => self.ratio_level = parse(key, value)?,
            "kl_estimator" => self.kl_estimator = parse(key, value)?,
            "policy_loss" => self.policy_loss = parse(key, value)?,
            "sequence_count" => self.sequence_count = parse(key, value)?,
            "eps_low" => self.eps_low = num(key, value)?,
            "eps_high" => self.eps_high = num(key, value)?,
            "dual_clip" => self.dual_clip = num(key, value)?,
            "log_ratio_clamp" => self.log_ratio_clamp = num(key, value)?,
            "seq_log_ratio_max" => self.seq_log_ratio_max = num(key, value)?,
            "beta" => self.beta = num(key, value)?,
            "kl_input_clamp" => self.kl_input_clamp = num(key, value)?,
            "kl_output_clamp" => self.kl_output_clamp = num(key, value)?,
            "global_tokens" => self.global_tokens = num(key, value)?,
            "global_sequences" => self.global_sequences = num(key, value)?,
            "horizon" => self.horizon = num(key, value)?,
            "sapo_tau_pos" => self.sapo_tau_pos = num(key, value)?,
            "sapo_tau_neg" => self.sapo_tau_neg = num(key, value)?,
            "cov_ratio" => self.cov_ratio = num(key, value)?,
            "clip_cov_lb" => self.clip_cov_lb = num(key, value)?,
            "clip_cov_ub" => self.clip_cov_ub = num(key, value)?,
            "kl_cov_coef" => self.kl_cov_coef = num(key, value)?,
            "gmpo_weight_floor" => self.gmpo_weight_floor = num(key, value)?,
            "bypass" => self.bypass = parse(key, value)?,
            "vespo_k_pos" => self.vespo_k_pos = num(key, value)?,
            "vespo_lambda_pos" => self.vespo_lambda_pos = num(key, value)?,
            "vespo_k_neg" => self.vespo_k_neg = num(key, value)?,
            "vespo_lambda_neg" => self.vespo_lambda_neg = num(key, value)?,
            "rollout_is" => self.rollout.is_level = parse(key, value)?,
            "rollout_is_threshold" => self.rollout.is_threshold = num(key, value)?,
            "rollout_is_threshold_low" => self.rollout.is_threshold_low = num(key, value)?,
            "rollout_rejection" => self.rollout.rejection_mode = parse(key, value)?,
            "rollout_log_ratio_clamp" => self.rollout.log_ratio_clamp = num(key, value)?,
            _ => match key.strip_prefix(RS_PREFIX).and_then(Rejection::from_name) {
                Some(r) => set_rejection(&mut self.rollout, r, key, value)?,
                None => return Err(unknown::<Self>(key, &self.fields())),
            },
        }
        Ok(())
    }

    fn set_overrides(&mut self, pairs: &[(String, String)]) -> PyResult<()> {
        let find = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        match (find("rollout_rs"), find("rollout_rs_threshold")) {
            (Some(o), Some(t)) => set_rejections(self, o, t)?,
            (None, None) => {}
            _ => {
                return Err(invalid(
                    "rollout_rs and rollout_rs_threshold: give both (criteria and thresholds) \
                     or neither"
                        .into(),
                ));
            }
        }
        pairs
            .iter()
            .filter(|(k, _)| k != "rollout_rs" && k != "rollout_rs_threshold")
            .try_for_each(|(k, v)| self.set(k, v))
    }

    fn fields(&self) -> Vec<(&'static str, String)> {
        let f = |x: f64| format!("{x:?}");
        let mut out = vec![
            ("aggregation", self.aggregation.name().into()),
            ("ratio_level", self.ratio_level.name().into()),
            ("kl_estimator", self.kl_estimator.name().into()),
            ("policy_loss", self.policy_loss.name().into()),
            ("sequence_count", self.sequence_count.name().into()),
            ("eps_low", f(self.eps_low)),
            ("eps_high", f(self.eps_high)),
            ("dual_clip", f(self.dual_clip)),
            ("log_ratio_clamp", f(self.log_ratio_clamp)),
            ("seq_log_ratio_max", f(self.seq_log_ratio_max)),
            ("beta", f(self.beta)),
            ("kl_input_clamp", f(self.kl_input_clamp)),
            ("kl_output_clamp", f(self.kl_output_clamp)),
            ("global_tokens", f(self.global_tokens)),
            ("global_sequences", f(self.global_sequences)),
            ("horizon", f(self.horizon)),
            ("sapo_tau_pos", f(self.sapo_tau_pos)),
            ("sapo_tau_neg", f(self.sapo_tau_neg)),
            ("cov_ratio", f(self.cov_ratio)),
            ("clip_cov_lb", f(self.clip_cov_lb)),
            ("clip_cov_ub", f(self.clip_cov_ub)),
            ("kl_cov_coef", f(self.kl_cov_coef)),
            ("gmpo_weight_floor", f(self.gmpo_weight_floor)),
            ("bypass", self.bypass.name().into()),
            ("vespo_k_pos", f(self.vespo_k_pos)),
            ("vespo_lambda_pos", f(self.vespo_lambda_pos)),
            ("vespo_k_neg", f(self.vespo_k_neg)),
            ("vespo_lambda_neg", f(self.vespo_lambda_neg)),
            ("rollout_is", self.rollout.is_level.name().into()),
            ("rollout_is_threshold", f(self.rollout.is_threshold)),
            ("rollout_is_threshold_low", f(self.rollout.is_threshold_low)),
            (
                "rollout_rejection",
                self.rollout.rejection_mode.name().into(),
            ),
            ("rollout_log_ratio_clamp", f(self.rollout.log_ratio_clamp)),
        ];
        // One field per active rejection criterion, `rollout_rs_<name>=<threshold>` in the form
        // the core parses (k1: `lower_upper`, else the upper bound); a comma list as verl
        // writes it would collide with the text's own separator.
        for r in Rejection::ALL {
            let b = self.rollout.bound(r);
            if b.on() {
                let v = if r.is_k1() {
                    format!("{:?}_{:?}", b.lower, b.upper)
                } else {
                    format!("{:?}", b.upper)
                };
                out.push((RS_FIELDS[r as usize], v));
            }
        }
        out
    }

    fn check(&self) -> PyResult<()> {
        self.validate().or_raise(Self::WHAT)
    }
}

/// The prefix of a rejection criterion's field.
const RS_PREFIX: &str = "rollout_rs_";

/// `rollout_rs_<name>` for every [`Rejection`], in number order (static names for `fields`).
const RS_FIELDS: [&str; Rejection::ALL.len()] = [
    "rollout_rs_token_k1",
    "rollout_rs_token_k2",
    "rollout_rs_token_k3",
    "rollout_rs_seq_sum_k1",
    "rollout_rs_seq_sum_k2",
    "rollout_rs_seq_sum_k3",
    "rollout_rs_seq_mean_k1",
    "rollout_rs_seq_mean_k2",
    "rollout_rs_seq_mean_k3",
    "rollout_rs_seq_max_k2",
    "rollout_rs_seq_max_k3",
];

/// Sets the threshold of one criterion from its text (`u`, or `lower_upper`), parsed by the
/// core's own `set_rejections` on a scratch copy so the other criteria stay as they are.
fn set_rejection(o: &mut RolloutOptions, r: Rejection, key: &str, value: &str) -> PyResult<()> {
    let mut scratch = RolloutOptions::DEFAULT;
    scratch.set_rejections(r.name(), value).map_err(|_| {
        invalid(format!(
            "{key}={value:?}: expected a threshold (k1: `lower_upper` ratio bounds or one \
                 number u meaning [1/u, u]; k2/k3: one upper bound)"
        ))
    })?;
    let b = scratch.bound(r);
    o.set_bound(r, b.lower, b.upper);
    Ok(())
}

/// verl's `rollout_rs` and `rollout_rs_threshold` (comma lists, as the CLI takes them) set
/// together: the criteria named replace the others.
fn set_rejections(o: &mut LossOptions, options: &str, thresholds: &str) -> PyResult<()> {
    o.rollout.set_rejections(options, thresholds).map_err(|_| {
        invalid(format!(
            "rollout_rs={options:?} with rollout_rs_threshold={thresholds:?}: expected names of \
             {} and one threshold for all or one per name",
            Rejection::NAMES.join(", ")
        ))
    })
}

fn unknown<T: OptionSet>(key: &str, fields: &[(&'static str, String)]) -> PyErr {
    let names: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
    invalid(format!(
        "unknown {} field {key:?} (expected one of {})",
        T::WHAT,
        names.join(", ")
    ))
}

/// The canonical text of `opts`.
pub fn to_spec<T: OptionSet>(opts: &T) -> String {
    let parts: Vec<String> = opts
        .fields()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    parts.join(",")
}

/// Parses the canonical text (missing fields keep their defaults) and checks the result.
pub fn from_spec<T: OptionSet>(spec: &str) -> PyResult<T> {
    let mut o = T::base(None)?;
    for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| invalid(format!("{}: {part:?} is not key=value", T::WHAT)))?;
        o.set(k.trim(), v.trim())?;
    }
    o.check()?;
    Ok(o)
}

/// A preset (or the defaults) with keyword overrides, checked, as canonical text. Override
/// values are names (enums) or numbers; `None` leaves the field as it is.
pub fn build<T: OptionSet>(
    preset: Option<&str>,
    overrides: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    let mut o = T::base(preset)?;
    let mut pairs = Vec::new();
    if let Some(kw) = overrides {
        for (k, v) in kw.iter() {
            if v.is_none() {
                continue;
            }
            let key: String = k.extract()?;
            let text = if let Ok(s) = v.extract::<String>() {
                s
            } else if v.is_instance_of::<pyo3::types::PyBool>() {
                return Err(invalid(format!(
                    "{key}: expected a name or a number, got a bool"
                )));
            } else {
                let x: f64 = v
                    .extract()
                    .map_err(|_| invalid(format!("{key}: expected a name or a number, got {v}")))?;
                format!("{x:?}")
            };
            pairs.push((key, text));
        }
    }
    o.set_overrides(&pairs)?;
    o.check()?;
    Ok(to_spec(&o))
}

/// `_care.advantage_options(preset=None, **overrides) -> str`.
#[pyfunction]
#[pyo3(signature = (preset=None, **overrides))]
pub fn advantage_options(
    preset: Option<&str>,
    overrides: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    build::<AdvantageOptions>(preset, overrides)
}

/// `_care.loss_options(preset=None, **overrides) -> str`.
#[pyfunction]
#[pyo3(signature = (preset=None, **overrides))]
pub fn loss_options(
    preset: Option<&str>,
    overrides: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    build::<LossOptions>(preset, overrides)
}

/// `_care.option_fields(spec) -> list[tuple[str, str]]`: the fields of a canonical text, after
/// parsing it (for display and tests).
#[pyfunction]
pub fn loss_option_fields(spec: &str) -> PyResult<Vec<(&'static str, String)>> {
    Ok(from_spec::<LossOptions>(spec)?.fields())
}

/// The fields of an advantage options text.
#[pyfunction]
pub fn advantage_option_fields(spec: &str) -> PyResult<Vec<(&'static str, String)>> {
    Ok(from_spec::<AdvantageOptions>(spec)?.fields())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: failing loudly is the point
mod tests {
    use super::*;

    #[test]
    fn rejection_fields_are_the_prefixed_core_names() {
        for r in Rejection::ALL {
            assert_eq!(RS_FIELDS[r as usize], format!("{RS_PREFIX}{}", r.name()));
        }
    }

    #[test]
    fn rollout_fields_round_trip_through_the_text() {
        let mut o = LossOptions::default();
        o.rollout.is_level = care_core::grpo::IsLevel::Sequence;
        o.rollout
            .set_rejections("token_k1,seq_mean_k3", "0.25_3,0.01")
            .unwrap();
        let back: LossOptions = from_spec(&to_spec(&o)).unwrap();
        assert_eq!(back, o);
    }
}
