//! Trends over turns (paper Figure 3): the least-squares slope of each dimension's weight over
//! the turn, and the first turn where one dimension's mean weight overtakes another's ("the two
//! crossing around turn 8"), with a bootstrap interval.

use super::accum::{Acc, VariantAcc};
use super::compare::turn_fits;
use super::stats::{SplitMix, nearest_rank};
use super::tables::{Cell, Column, DIM_NAMES, Kind, Table, variant_name};

fn col(name: &str, kind: Kind) -> Column {
    Column {
        name: name.to_owned(),
        kind,
    }
}

/// The slope table: per variant and dimension, the slope of the weight per turn with its t
/// interval, over the valid rubrics that have a turn.
pub fn slopes(acc: &Acc) -> Table {
    let mut rows = Vec::new();
    for (name, v) in &acc.variants {
        if v.by_turn.len() < 2 {
            continue;
        }
        let fits = turn_fits(v);
        for (d, f) in fits.iter().enumerate() {
            let Some(b) = f.slope() else { continue };
            rows.push(vec![
                Cell::Text(variant_name(name)),
                Cell::Text(DIM_NAMES[d].to_owned()),
                Cell::Int(f.n),
                Cell::Int(v.by_turn.len() as u64),
                Cell::Mean(b, f.slope_ci95()),
            ]);
        }
    }
    Table {
        name: "trend",
        title: "Trend of the weights over turns (Figure 3)".to_owned(),
        caption: "Least-squares slope of each dimension's category_weight on the turn, over the \
                  valid rubrics with a turn (change of the weight per turn), with the 95% t \
                  interval b +- t(0.975, n - 2) se(b)."
            .to_owned(),
        columns: vec![
            col("variant", Kind::Plain),
            col("dimension", Kind::Plain),
            col("rubrics", Kind::Plain),
            col("turns", Kind::Plain),
            col("slope", Kind::Interval),
        ],
        rows,
    }
}

/// The first turn (after the first) where `a`'s mean exceeds `b`'s while it did not at the
/// turn before: the turn where `a` overtakes `b`.
pub fn first_crossing(turns: &[u32], means: &[[f64; 3]], a: usize, b: usize) -> Option<u32> {
    means
        .windows(2)
        .zip(turns.iter().skip(1))
        .find(|(w, _)| w[0][a] <= w[0][b] && w[1][a] > w[1][b])
        .map(|(_, &t)| t)
}

/// One replicate's per-turn means: each turn's rubrics resampled with replacement (from its
/// sample; a turn with more rubrics than the sample keeps its exact mean and gets the sample's
/// deviation scaled to its own size).
fn replicate(v: &VariantAcc, rng: &mut SplitMix, out: &mut Vec<[f64; 3]>) {
    out.clear();
    for (t, a) in &v.by_turn {
        let full = [0, 1, 2].map(|d| a.w[d].mean().unwrap_or(0.0));
        let Some(sample) = v.turn_samples.get(t).filter(|s| !s.items.is_empty()) else {
            out.push(full);
            continue;
        };
        let k = sample.items.len();
        let mut sum = [0.0; 3];
        for _ in 0..k {
            let x = sample.items[rng.below(k as u64) as usize];
            for d in 0..3 {
                sum[d] += x[d];
            }
        }
        let n = a.n();
        if n as usize <= k {
            out.push(sum.map(|s| s / k as f64));
        } else {
            let scale = (k as f64 / n as f64).sqrt();
            let mut m = [0.0; 3];
            for d in 0..3 {
                let base: f64 = sample.items.iter().map(|x| x[d]).sum::<f64>() / k as f64;
                m[d] = full[d] + (sum[d] / k as f64 - base) * scale;
            }
            out.push(m);
        }
    }
}

/// The crossing table: per variant and ordered pair of dimensions whose mean weights cross,
/// the first crossing turn and its bootstrap interval.
pub fn crossings(acc: &Acc) -> Table {
    let reps = acc.settings.bootstrap;
    let mut rows = Vec::new();
    for (i, (name, v)) in acc.variants.iter().enumerate() {
        if v.by_turn.len() < 2 {
            continue;
        }
        let turns: Vec<u32> = v.by_turn.keys().copied().collect();
        let means: Vec<[f64; 3]> = v
            .by_turn
            .values()
            .map(|a| [0, 1, 2].map(|d| a.w[d].mean().unwrap_or(0.0)))
            .collect();
        let pairs: Vec<(usize, usize, u32)> = (0..3)
            .flat_map(|a| (0..3).map(move |b| (a, b)))
            .filter(|(a, b)| a != b)
            .filter_map(|(a, b)| first_crossing(&turns, &means, a, b).map(|t| (a, b, t)))
            .collect();
        if pairs.is_empty() {
            continue;
        }
        // One stream per variant: the same replicates serve every pair of dimensions.
        let mut rng = SplitMix(acc.settings.seed ^ 0xC0FF_EE00 ^ i as u64);
        let mut found: Vec<Vec<f64>> = vec![Vec::with_capacity(reps as usize); pairs.len()];
        let mut buf = Vec::with_capacity(turns.len());
        for _ in 0..reps {
            replicate(v, &mut rng, &mut buf);
            for (slot, &(a, b, _)) in found.iter_mut().zip(&pairs) {
                // No crossing in a replicate counts as "after the last turn".
                slot.push(first_crossing(&turns, &buf, a, b).map_or(f64::INFINITY, f64::from));
            }
        }
        for (mut f, (a, b, t)) in found.into_iter().zip(pairs) {
            f.sort_by(f64::total_cmp);
            let crossed = f.iter().filter(|x| x.is_finite()).count() as u64;
            let lo = nearest_rank(&f, 0.025).filter(|x| x.is_finite());
            let hi = nearest_rank(&f, 0.975).filter(|x| x.is_finite());
            rows.push(vec![
                Cell::Text(variant_name(name)),
                Cell::Text(DIM_NAMES[a].to_owned()),
                Cell::Text(DIM_NAMES[b].to_owned()),
                Cell::Int(u64::from(t)),
                lo.map_or(Cell::Empty, |x| Cell::Int(x as u64)),
                hi.map_or(Cell::Empty, |x| Cell::Int(x as u64)),
                Cell::Share(crossed, u64::from(reps)),
            ]);
        }
    }
    Table {
        name: "crossing",
        title: "Where one dimension overtakes another (Figure 3)".to_owned(),
        caption: format!(
            "Per variant, each ordered pair of dimensions whose mean weights cross: the first \
             turn where the first dimension's mean weight exceeds the second's after a turn \
             where it did not, and its 95% bootstrap interval (the 2.5% and 97.5% nearest-rank \
             percentiles over {reps} replicates, each resampling every turn's rubrics with \
             replacement, seed {}). A replicate without a crossing counts as later than every \
             turn: an empty upper limit means more than 2.5% of the replicates never cross. \
             \"replicates\" counts those that cross.",
            acc.settings.seed
        ),
        columns: vec![
            col("variant", Kind::Plain),
            col("overtaking", Kind::Plain),
            col("overtaken", Kind::Plain),
            col("turn", Kind::Plain),
            col("turn_lo", Kind::Plain),
            col("turn_hi", Kind::Plain),
            col("replicates", Kind::Share),
        ],
        rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_crossing_is_the_first_overtaking() {
        let turns = [1, 2, 3, 4, 5];
        let m = [
            [0.2, 0.6, 0.2],
            [0.3, 0.5, 0.2],
            [0.45, 0.35, 0.2],
            [0.3, 0.5, 0.2],
            [0.5, 0.3, 0.2],
        ];
        assert_eq!(first_crossing(&turns, &m, 0, 1), Some(3));
        assert_eq!(first_crossing(&turns, &m, 1, 0), Some(4));
        assert_eq!(first_crossing(&turns, &m, 2, 0), None);
        // Leading from the start is not overtaking.
        assert_eq!(first_crossing(&turns, &m, 1, 2), None);
    }
}
