//! The one definition of the loss statistics' field list, for every mirror of [`LossStats`]:
//! the C `care_loss_stats`, the Python `LossStats`, and the device accumulator of the kernels
//! (`care_kernels::params::LossStatsRaw`, C `CareLossStats`), whose fields carry the same names.
//! Tests in each layer compare their struct with this table.

use core::mem::{offset_of, size_of};

use super::LossStats;

/// The C type of one field of a statistics struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldKind {
    /// `double` (`f64`).
    F64,
    /// `float` (`f32`).
    F32,
    /// `uint32_t` (`u32`).
    U32,
}

impl FieldKind {
    /// Bytes of the field (also its alignment).
    pub const fn size(self) -> usize {
        match self {
            FieldKind::F64 => 8,
            FieldKind::F32 | FieldKind::U32 => 4,
        }
    }

    /// The C type name (`"double"`, `"float"`, `"uint32_t"`).
    pub const fn c_name(self) -> &'static str {
        match self {
            FieldKind::F64 => "double",
            FieldKind::F32 => "float",
            FieldKind::U32 => "uint32_t",
        }
    }
}

/// How two partial values of one statistic combine (micro-batches, ranks, device blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Combine {
    /// Added (an all-reduce with `SUM`).
    Sum,
    /// The smaller one (`MIN`).
    Min,
    /// The larger one (`MAX`).
    Max,
}

/// One field of a statistics struct: name, C type, byte offset, and how it combines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StatsField {
    /// The field's name, identical in every mirror (Rust, C, Python, CUDA).
    pub name: &'static str,
    /// Its C type.
    pub kind: FieldKind,
    /// Byte offset in the struct.
    pub offset: usize,
    /// How partial values combine.
    pub combine: Combine,
}

macro_rules! host_fields {
    ($($field:ident: $combine:ident),* $(,)?) => {
        [$(StatsField {
            name: stringify!($field),
            kind: FieldKind::F64,
            offset: offset_of!(LossStats, $field),
            combine: Combine::$combine,
        }),*]
    };
}

/// The fields of [`LossStats`] (and of C `care_loss_stats`, Python `LossStats`) in declaration
/// order: fourteen `f64`, no padding, [`LOSS_STATS_SIZE`] bytes in all. The names come from
/// the Rust fields themselves (`stringify!`), and a compile-time check fails when a field is
/// added to [`LossStats`] but not here, or listed out of order.
pub const LOSS_STATS_LAYOUT: [StatsField; 14] = host_fields![
    tokens: Sum,
    sequences: Sum,
    loss: Sum,
    clipped: Sum,
    clipped_low: Sum,
    clipped_high: Sum,
    dual_clipped: Sum,
    ppo_kl_sum: Sum,
    kl_sum: Sum,
    ratio_sum: Sum,
    log_ratio_clamped: Sum,
    non_finite: Sum,
    ratio_min: Min,
    ratio_max: Max,
];

/// Bytes of [`LossStats`] (and of C `care_loss_stats`).
pub const LOSS_STATS_SIZE: usize = size_of::<LossStats>();

// The table covers the whole struct, densely and in order.
const _: () = {
    let mut end = 0;
    let mut i = 0;
    while i < LOSS_STATS_LAYOUT.len() {
        assert!(
            LOSS_STATS_LAYOUT[i].offset == end,
            "LOSS_STATS_LAYOUT out of order"
        );
        end += LOSS_STATS_LAYOUT[i].kind.size();
        i += 1;
    }
    assert!(
        end == LOSS_STATS_SIZE,
        "LOSS_STATS_LAYOUT misses a field of LossStats"
    );
};

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn get(s: &LossStats, f: &StatsField) -> f64 {
        // SAFETY: the compile-time check above puts an f64 at every offset of the table.
        unsafe {
            (&raw const *s)
                .cast::<u8>()
                .add(f.offset)
                .cast::<f64>()
                .read()
        }
    }

    fn with_values(base: f64) -> LossStats {
        let mut s = LossStats::EMPTY;
        for (i, f) in LOSS_STATS_LAYOUT.iter().enumerate() {
            // SAFETY: as in `get`.
            unsafe {
                (&raw mut s)
                    .cast::<u8>()
                    .add(f.offset)
                    .cast::<f64>()
                    .write(base + i as f64)
            };
        }
        s
    }

    #[test]
    fn names_are_unique() {
        for (i, a) in LOSS_STATS_LAYOUT.iter().enumerate() {
            assert!(LOSS_STATS_LAYOUT[i + 1..].iter().all(|b| b.name != a.name));
        }
    }

    #[test]
    fn add_and_empty_follow_the_combine_rules() {
        // Distinct values per field, two orders of magnitude apart between the operands, so a
        // field combined by the wrong rule (or with a neighbour's value) is seen.
        let a = with_values(1.0);
        let b = with_values(100.0);
        let mut sum = a;
        sum.add(&b);
        let mut from_empty = LossStats::EMPTY;
        from_empty.add(&a);
        for f in &LOSS_STATS_LAYOUT {
            let (x, y) = (get(&a, f), get(&b, f));
            let want = match f.combine {
                Combine::Sum => x + y,
                Combine::Min => x.min(y),
                Combine::Max => x.max(y),
            };
            assert_eq!(get(&sum, f), want, "{}", f.name);
            // EMPTY is the identity of every rule.
            assert_eq!(get(&from_empty, f), x, "{}", f.name);
        }
    }
}
