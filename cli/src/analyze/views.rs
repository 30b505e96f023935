//! The charts of the comparison, trend, valence, verdict and reward-health views (the same
//! drawing helpers and colours as [`super::charts`]).

use plotters::style::RGBColor;

use super::accum::Acc;
use super::charts::{
    Chart, DIM_COLORS, DOMINANT_COLORS, OUTCOME_COLORS, Series, TIE_COLOR, dim_legend,
    dominant_legend, interval_chart, share_bars, stacked_panels, variant_color,
};
use super::compare::{position, rows_for, turn_fits};
use super::health;
use super::stats::Interval;
use super::tables::{DIM_NAMES, dominant_shares, variant_name};
use super::verdict::Verdicts;

/// Figure 4 by valence: the composition of the mean weights, and the dominant dimension.
pub fn valence(acc: &Acc) -> Result<Vec<Chart>, String> {
    let groups: Vec<_> = acc
        .variants
        .iter()
        .filter_map(|(n, v)| {
            let g: Vec<_> = super::compare::by_valence(acc, v)
                .into_iter()
                .zip(&acc.valence.names)
                .filter(|(a, _)| a.n() > 0)
                .collect();
            (!g.is_empty()).then(|| (variant_name(n), g))
        })
        .collect();
    if groups.is_empty() {
        return Ok(Vec::new());
    }
    let panels = |value: &dyn Fn(&super::accum::WeightAcc) -> Vec<f64>| -> Vec<_> {
        groups
            .iter()
            .map(|(n, g)| {
                let cats = g.iter().map(|(a, v)| format!("{v} ({})", a.n())).collect();
                let vals = g.iter().map(|(a, _)| value(a)).collect();
                (n.clone(), cats, vals)
            })
            .collect()
    };
    let weights = panels(&|a| a.w.iter().map(|w| w.mean().unwrap_or(0.0)).collect());
    let dominant = panels(&|a| dominant_shares(a).to_vec());
    Ok(vec![
        stacked_panels(
            "weights_by_valence.svg",
            "Dimension weights by valence (Figure 4)",
            dim_legend(),
            &DIM_COLORS,
            "valence (rubrics)",
            "mean weight",
            &weights,
        )?,
        stacked_panels(
            "dominant_by_valence.svg",
            "Dominant dimension by valence",
            dominant_legend(),
            &DOMINANT_COLORS,
            "valence (rubrics)",
            "share of rubrics",
            &dominant,
        )?,
    ])
}

/// The slopes of the weights over turns, and the crossing turns.
pub fn trend(acc: &Acc) -> Result<Vec<Chart>, String> {
    let vars: Vec<(usize, String)> = acc
        .variants
        .iter()
        .enumerate()
        .filter(|(_, (_, v))| v.by_turn.len() >= 2)
        .map(|(i, (n, _))| (i, variant_name(n)))
        .collect();
    if vars.is_empty() {
        return Ok(Vec::new());
    }
    let cats: Vec<String> = vars.iter().map(|(_, n)| n.clone()).collect();
    let fits: Vec<_> = vars
        .iter()
        .map(|(i, _)| turn_fits(&acc.variants[*i].1))
        .collect();
    let series: Vec<Series> = (0..3)
        .map(|d| Series {
            name: DIM_NAMES[d].to_owned(),
            color: DIM_COLORS[d],
            points: fits
                .iter()
                .map(|f| f[d].slope().map(|b| (b, f[d].slope_ci95())))
                .collect(),
        })
        .collect();
    let mut out = vec![interval_chart(
        "trend.svg",
        "Trend of the weights over turns (Figure 3)",
        ("variant", "slope of the mean weight per turn"),
        &cats,
        &series,
        Some(0.0),
    )?];
    let t = super::trend::crossings(acc);
    if !t.rows.is_empty() {
        use super::tables::Cell;
        let mut cats = Vec::new();
        let mut points = Vec::new();
        for r in &t.rows {
            let text = |c: &Cell| match c {
                Cell::Text(s) => s.clone(),
                _ => String::new(),
            };
            let num = |c: &Cell| match c {
                Cell::Int(k) => Some(*k as f64),
                _ => None,
            };
            cats.push(format!(
                "{}: {} over {}",
                text(&r[0]),
                &text(&r[1])[..3],
                &text(&r[2])[..3]
            ));
            let turn = num(&r[3]).unwrap_or(0.0);
            let ci = match (num(&r[4]), num(&r[5])) {
                (Some(lo), Some(hi)) => Some(Interval { lo, hi }),
                _ => None,
            };
            points.push(Some((turn, ci)));
        }
        out.push(interval_chart(
            "crossing.svg",
            "Where one dimension overtakes another (Figure 3)",
            ("variant: dimension over dimension", "turn"),
            &cats,
            &[Series {
                name: "first crossing turn".to_owned(),
                color: DIM_COLORS[0],
                points,
            }],
            None,
        )?);
    }
    Ok(out)
}

/// One chart per compared pair and view: the differences with their intervals around 0.
pub fn comparisons(acc: &Acc) -> Result<Vec<Chart>, String> {
    let mut out = Vec::new();
    for (k, (a, b)) in acc.settings.compare.iter().enumerate() {
        let (Some(ia), Some(ib)) = (position(acc, a), position(acc, b)) else {
            continue;
        };
        let rows = rows_for(acc, ia, ib);
        let views = [
            "preference",
            "weights",
            "weights_by_turn",
            "weights_by_emotion",
            "weights_by_valence",
            "trend",
            "strategy",
        ];
        for view in views {
            let rs: Vec<_> = rows.iter().filter(|r| r.view == view).collect();
            if rs.is_empty() {
                continue;
            }
            let by_dim = view.starts_with("weights");
            let (cats, series): (Vec<String>, Vec<Series>) = if by_dim {
                let mut groups: Vec<String> = Vec::new();
                for r in &rs {
                    if !groups.contains(&r.group) {
                        groups.push(r.group.clone());
                    }
                }
                let series = (0..3)
                    .map(|d| Series {
                        name: DIM_NAMES[d].to_owned(),
                        color: DIM_COLORS[d],
                        points: groups
                            .iter()
                            .map(|g| {
                                rs.iter()
                                    .find(|r| r.group == *g && r.measure == DIM_NAMES[d])
                                    .and_then(|r| r.diff)
                            })
                            .collect(),
                    })
                    .collect();
                (groups, series)
            } else {
                let cats = rs.iter().map(|r| r.measure.clone()).collect();
                let color: RGBColor = variant_color(ia);
                (
                    cats,
                    vec![Series {
                        name: format!("{a} - {b}"),
                        color,
                        points: rs.iter().map(|r| r.diff).collect(),
                    }],
                )
            };
            let x = match view {
                "weights_by_turn" => "turn",
                "weights_by_emotion" => "emotion",
                "weights_by_valence" => "valence",
                "strategy" => "tactic",
                _ => "measure",
            };
            out.push(interval_chart(
                &format!("compare_{}_{view}.svg", k + 1),
                &format!("{a} - {b}: {view}"),
                (x, "difference A - B [95% CI]"),
                &cats,
                &series,
                Some(0.0),
            )?);
        }
    }
    Ok(out)
}

/// The verdict shares, one bar per system (choices) or outcome (pairwise).
pub fn verdicts(v: &Verdicts) -> Result<Vec<Chart>, String> {
    if v.groups.is_empty() {
        return Ok(Vec::new());
    }
    let mut cats = Vec::new();
    let mut counts = Vec::new();
    for ((judge, systems, pairwise), g) in &v.groups {
        let n = g.n();
        if *pairwise {
            for (i, o) in ["win", "tie", "loss"].iter().enumerate() {
                cats.push(format!("{judge}: {} {o} vs {}", systems[0], systems[1]));
                counts.push((g.counts[i], n));
            }
        } else {
            for (s, &k) in systems.iter().zip(&g.counts) {
                cats.push(format!("{judge}: {s}"));
                counts.push((k, n));
            }
        }
    }
    Ok(vec![share_bars(
        "verdicts.svg",
        "Verdicts of judges and annotators",
        "share of verdicts",
        &cats,
        &[("share".to_owned(), OUTCOME_COLORS[0], counts)],
    )?])
}

/// The reward-health charts: rho by bucket, zero-spread groups, ceiling and floor shares, the
/// loop's failure rates, and the weight entropy by turn.
pub fn health(acc: &Acc) -> Result<Vec<Chart>, String> {
    let vars = health::variants(acc);
    if vars.is_empty() {
        return Ok(Vec::new());
    }
    let color = |name: &str| {
        acc.variants
            .iter()
            .position(|(v, _)| variant_name(v) == name)
            .map_or(DIM_COLORS[0], variant_color)
    };
    let t = &acc.settings.thresholds;
    let b = &acc.settings.buckets;
    let nb = b.0.len();
    let mut cats: Vec<String> = (0..nb).map(|i| format!("turns {}", b.label(i))).collect();
    cats.push("all".to_owned());
    let mut out = Vec::new();
    let rho: Vec<Series> = vars
        .iter()
        .map(|(n, h)| Series {
            name: n.clone(),
            color: color(n),
            points: (0..=nb)
                .map(|i| h.rho(i).map(|(r, ci, _)| (r, ci)))
                .collect(),
        })
        .collect();
    if rho.iter().any(|s| s.points.iter().any(Option::is_some)) {
        out.push(interval_chart(
            "health_length.svg",
            "Reward health: Spearman's rho of reward and length",
            ("turn bucket", "rho [95% CI] (dashed: threshold)"),
            &cats,
            &rho,
            Some(t.length_rho),
        )?);
    }
    // The checks at a glance: each value over its threshold (the threshold over the value for
    // the one check that flags below it), so that every check flags above 1.
    let any_panel = vars.iter().any(|(_, h)| h.panel.is_panel());
    let names: Vec<String> = health::THRESHOLD_NAMES[..health::CHECKS]
        .iter()
        .filter(|n| any_panel || **n != "panel_alpha")
        .map(|n| (*n).to_owned())
        .collect();
    let checks: Vec<Series> = vars
        .iter()
        .map(|(n, h)| Series {
            name: n.clone(),
            color: color(n),
            points: {
                let fl = health::flags(h, t, b);
                // By name: a variant without a panel has no panel_alpha check.
                names
                    .iter()
                    .map(|n| {
                        let f = fl.iter().find(|f| f.check == n.as_str())?;
                        let v = f.value?;
                        // Alpha may be 0 or below: its disagreement 1 - alpha over the allowed.
                        let r = if f.check == "panel_alpha" {
                            (f.threshold < 1.0).then(|| (1.0 - v) / (1.0 - f.threshold))?
                        } else if f.rule == "<" {
                            (v > 0.0).then(|| f.threshold / v)?
                        } else {
                            (f.threshold > 0.0).then(|| v / f.threshold)?
                        };
                        r.is_finite().then_some((r, None))
                    })
                    .collect()
            },
        })
        .collect();
    if checks.iter().any(|s| s.points.iter().any(Option::is_some)) {
        out.push(interval_chart(
            "health_flags.svg",
            "Reward health: checks against their thresholds",
            ("check", "value / threshold (above 1 flags)"),
            &names,
            &checks,
            Some(1.0),
        )?);
    }
    let spread: Vec<Series> = vars
        .iter()
        .map(|(n, h)| Series {
            name: n.clone(),
            color: color(n),
            points: h.spread.iter().map(|s| health::rate(s[1], s[0])).collect(),
        })
        .collect();
    if spread.iter().any(|s| s.points.iter().any(Option::is_some)) {
        out.push(interval_chart(
            "health_groups.svg",
            "Reward health: groups whose rewards are all equal",
            (
                "turn bucket",
                "share of groups [95% CI] (dashed: threshold)",
            ),
            &cats,
            &spread,
            Some(t.zero_spread),
        )?);
    }
    let score_cats: Vec<String> = DIM_NAMES
        .iter()
        .flat_map(|d| [format!("{d} ceiling"), format!("{d} floor")])
        .collect();
    let scores: Vec<_> = vars
        .iter()
        .filter(|(_, h)| {
            h.scores
                .iter()
                .any(|d| d[super::record::MAX_CRITERIA].n > 0)
        })
        .map(|(n, h)| {
            let vals = (0..3)
                .flat_map(|d| {
                    let c = h.scores[d][super::record::MAX_CRITERIA];
                    [(c.ceiling, c.n), (c.floor, c.n)]
                })
                .collect();
            (n.clone(), color(n), vals)
        })
        .collect();
    if !scores.is_empty() {
        out.push(share_bars(
            "health_scores.svg",
            "Reward health: judge scores at the ceiling and the floor",
            "share of scores",
            &score_cats,
            &scores,
        )?);
    }
    let loop_cats: Vec<String> = [
        "no reward",
        "judge retried",
        "no valid rubric",
        "rubric repaired",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let rates: Vec<_> = vars
        .iter()
        .map(|(n, h)| {
            let groups = h.groups();
            (
                n.clone(),
                color(n),
                vec![
                    (h.null_reward, h.responses),
                    (h.retried, h.judge_attempts.n),
                    (groups - h.rubric_status[0], groups),
                    (h.repaired, h.repair_known),
                ],
            )
        })
        .collect();
    out.push(share_bars(
        "health_loop.svg",
        "Reward health: judge and rubric generator",
        "share",
        &loop_cats,
        &rates,
    )?);
    let turns: Vec<u32> = {
        let mut t: Vec<u32> = vars
            .iter()
            .flat_map(|(_, h)| h.entropy_by_turn.keys().copied())
            .collect();
        t.sort_unstable();
        t.dedup();
        t
    };
    if !turns.is_empty() {
        let series: Vec<Series> = vars
            .iter()
            .map(|(n, h)| Series {
                name: n.clone(),
                color: color(n),
                points: turns
                    .iter()
                    .map(|t| {
                        h.entropy_by_turn
                            .get(t)
                            .and_then(|w| w.mean().map(|m| (m, w.ci95())))
                    })
                    .collect(),
            })
            .collect();
        let cats: Vec<String> = turns.iter().map(u32::to_string).collect();
        out.push(interval_chart(
            "health_entropy.svg",
            "Reward health: weight entropy by turn",
            ("turn", "mean entropy, nats [95% CI] (dashed: threshold)"),
            &cats,
            &series,
            Some(t.entropy),
        )?);
    }
    Ok(out)
}

/// Unknown labels by name, as shares of all unknown labels left out.
pub fn unknown_labels(acc: &Acc) -> Result<Vec<Chart>, String> {
    let total: u64 = acc.unknown_names.values().sum::<u64>() + acc.unknown_other;
    if total == 0 {
        return Ok(Vec::new());
    }
    let mut named: Vec<(&String, &u64)> = acc.unknown_names.iter().collect();
    named.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let mut cats: Vec<String> = named.iter().map(|(n, _)| (*n).clone()).collect();
    let mut counts: Vec<(u64, u64)> = named.iter().map(|(_, k)| (**k, total)).collect();
    if acc.unknown_other > 0 {
        cats.push("(other names)".to_owned());
        counts.push((acc.unknown_other, total));
    }
    Ok(vec![share_bars(
        "unknown_labels.svg",
        "Unknown tactic labels",
        "share of the unknown labels left out",
        &cats,
        &[("unknown".to_owned(), TIE_COLOR, counts)],
    )?])
}
