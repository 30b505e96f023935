//! Launch geometry of every kernel family, and the overrides the tests use ([`Tuning`]).

/// Grid and block of one launch (x, y, z). Every block size used is a multiple of 32, at most
/// 1024: the kernels' reductions rely on full warps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Grid dimensions.
    pub grid: (u32, u32, u32),
    /// Block dimensions.
    pub block: (u32, u32, u32),
}

/// Threads per block of the loss, the log-softmax and the block-per-group advantages.
pub const BLOCK: u32 = 256;
/// Largest group (mean size for CSR layouts) that gets one warp instead of one block: up to 4
/// rewards per lane keeps a warp busy without leaving a block mostly idle.
pub const WARP_GROUP_MAX: u32 = 128;
/// Vocabularies up to this size get one warp per log-softmax row (64 elements per lane at
/// most), larger ones one block per row.
pub const WARP_VOCAB_MAX: u32 = 2048;
/// The largest `grid.x` CUDA allows (2^31 - 1).
pub const MAX_GRID_X: u32 = i32::MAX as u32;

/// Overrides of the tuned launch choices. The defaults are what the GPU uses; tests set them to
/// cover both team modes, multi-chunk sequences and grid-stride loops at small sizes. Every
/// choice is correct for every input; only speed differs. Each family reads the fields it has
/// and ignores the others; [`Tuning::check`] validates all of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tuning {
    /// Threads per block (every family): a multiple of 32 in `32..=1024`.
    pub threads: Option<u32>,
    /// Advantages: one warp per group (`true`) or one block per group (`false`).
    pub warp_per_group: Option<bool>,
    /// Loss: blocks per sequence (`grid.y`, `1..=65535`; the launch uses at most 1024).
    pub loss_chunks: Option<u32>,
    /// Log-softmax: one block per row (`true`) or one warp per row (`false`).
    pub block_team: Option<bool>,
    /// Log-softmax and `whiten_apply_f32`: at most this many blocks (`>= 1`); the teams (the
    /// threads) then stride over the rows (the values).
    pub max_blocks: Option<u32>,
}

impl Tuning {
    /// Checks every override: `threads` a multiple of 32 in `32..=1024`, `loss_chunks` in
    /// `1..=65535`, `max_blocks >= 1`. Errors: [`care_core::Error::InvalidArgument`].
    pub fn check(&self) -> Result<(), care_core::Error> {
        let threads_ok = self
            .threads
            .is_none_or(|n| (32..=1024).contains(&n) && n.is_multiple_of(32));
        let chunks_ok = self.loss_chunks.is_none_or(|c| (1..=65535).contains(&c));
        let blocks_ok = self.max_blocks.is_none_or(|b| b >= 1);
        if threads_ok && chunks_ok && blocks_ok {
            Ok(())
        } else {
            Err(care_core::Error::InvalidArgument)
        }
    }
}

/// Geometry of `group_advantages_f32` and its team width: 8, 16 or 32 lanes of a warp per group
/// (mean group size up to 8, 16, 128), 0 for one block per group.
///
/// Team mode: `256 / width` groups per 256-thread block, `grid.x = ceil(groups * width / 256)`. Block mode: one
/// 256-thread block per group, `grid.x = groups`. Token
/// broadcast walks all tokens of a group, so by default it takes block mode.
pub fn advantages_geometry(
    n: u32,
    num_groups: u32,
    broadcast: bool,
    tuning: Tuning,
) -> (Geometry, u32) {
    let mean_size = n.checked_div(num_groups).unwrap_or(0);
    let warp = tuning
        .warp_per_group
        .unwrap_or(!broadcast && mean_size <= WARP_GROUP_MAX);
    // Team width: the narrowest segment of a warp (8, 16 or 32 lanes) that still gives each
    // lane at most one reward of a mean-sized group; 0 is one block per group.
    let width = match (warp, mean_size) {
        (false, _) => 0,
        (true, 0..=8) => 8,
        (true, 9..=16) => 16,
        (true, _) => 32,
    };
    let block = tuning.threads.unwrap_or(BLOCK);
    let grid = if warp {
        num_groups.div_ceil(block / width)
    } else {
        num_groups
    };
    (
        Geometry {
            grid: (grid.max(1), 1, 1),
            block: (block, 1, 1),
        },
        width,
    )
}

/// Geometry of `batch_std_f32`: from `n` rewards that of [`whiten_stats_geometry`] (per-block
/// moments merged through the slots); from group moments one block.
pub fn batch_std_geometry(n: u32, from_moments: bool, tuning: Tuning) -> Geometry {
    if from_moments {
        return Geometry {
            grid: (1, 1, 1),
            block: (tuning.threads.unwrap_or(BLOCK), 1, 1),
        };
    }
    whiten_stats_geometry(u64::from(n), tuning)
}

/// Geometry of `group_alpha_f32`: one block of 1024 threads walks every group.
pub fn group_alpha_geometry(tuning: Tuning) -> Geometry {
    Geometry {
        grid: (1, 1, 1),
        block: (tuning.threads.unwrap_or(1024), 1, 1),
    }
}

/// Threads per block of `discounted_returns_f32` and `gae_f32` (one warp per sequence): two
/// sequences per block, so a batch of a few hundred sequences spreads over as many SMs as
/// possible, since each sequence's scan is a chain of dependent `f64` operations that one SM
/// runs no faster in bulk.
pub const RETURNS_BLOCK: u32 = 64;

/// Geometry of `discounted_returns_f32` and `gae_f32`: one warp per sequence,
/// `grid.x = max(1, ceil(n_seq / (block / 32)))` (one thread runs even with no sequence: it
/// checks the offsets' ends).
pub fn returns_geometry(n_seq: u32, tuning: Tuning) -> Geometry {
    let block = tuning.threads.unwrap_or(RETURNS_BLOCK);
    Geometry {
        grid: (n_seq.div_ceil((block / 32).max(1)).max(1), 1, 1),
        block: (block, 1, 1),
    }
}

/// Geometry of `whiten_stats_f32`: blocks of 256 threads (or `Tuning::threads`) over
/// contiguous ranges of at least 8 values per thread, at most
/// [`STAT_SLOTS`](crate::params::STAT_SLOTS) (or `Tuning::max_blocks`) blocks.
pub fn whiten_stats_geometry(n: u64, tuning: Tuning) -> Geometry {
    let block = tuning.threads.unwrap_or(BLOCK);
    let cap = tuning
        .max_blocks
        .unwrap_or(crate::params::STAT_SLOTS as u32)
        .min(crate::params::STAT_SLOTS as u32);
    let blocks = n
        .div_ceil(u64::from(block) * 8)
        .clamp(1, u64::from(cap.max(1)));
    Geometry {
        grid: (u32::try_from(blocks).unwrap_or(1), 1, 1),
        block: (block, 1, 1),
    }
}

/// Blocks of `whiten_apply_f32` at most: 8 per SM of an H200 (132 SMs) with 256 threads each,
/// enough to saturate memory bandwidth; the threads stride over longer batches.
pub const WHITEN_APPLY_BLOCKS: u32 = 1056;

/// Geometry of `whiten_apply_f32`: `ceil(n / block)` blocks, at most [`WHITEN_APPLY_BLOCKS`]
/// (or `Tuning::max_blocks`), at least 1.
pub fn whiten_apply_geometry(n: u64, tuning: Tuning) -> Geometry {
    let block = tuning.threads.unwrap_or(BLOCK);
    let cap = tuning
        .max_blocks
        .unwrap_or(WHITEN_APPLY_BLOCKS)
        .min(MAX_GRID_X);
    let blocks = n.div_ceil(u64::from(block)).clamp(1, u64::from(cap.max(1)));
    Geometry {
        grid: (u32::try_from(blocks).unwrap_or(1), 1, 1),
        block: (block, 1, 1),
    }
}

/// Blocks the loss launch aims for when sequences are few: two per SM of an H100/H200 (132
/// SMs), so a micro-batch of a handful of long sequences still spreads over the whole GPU.
pub const LOSS_TARGET_BLOCKS: u32 = 264;

/// Geometry of `grpo_loss_*`: `grid = (min(n_seq, 1024 / chunks), chunks)`, so a long sequence
/// spreads over several blocks, and the blocks of each chunk row stride over the sequences; at
/// most [`STAT_SLOTS`](crate::params::STAT_SLOTS) blocks in all. `max_len` is the caller's hint of the longest sequence (0: the mean length
/// `n_tok / n_seq`).
///
/// `chunks` is at least `ceil(len / 2048)` (8 tokens per thread) and at most 1024. When no
/// block re-reads its whole sequence (`rescans` false: token-level ratio, and no mask scan for
/// `seq_mean_token_mean`), it grows toward [`LOSS_TARGET_BLOCKS`] blocks in all, down to one
/// token per thread; with `rescans` every extra chunk would read the sequence again, so it stays
/// at the minimum.
pub fn loss_geometry(
    n_seq: u32,
    n_tok: u32,
    max_len: u32,
    rescans: bool,
    tuning: Tuning,
) -> Geometry {
    let block = tuning.threads.unwrap_or(BLOCK);
    let len = if max_len > 0 {
        max_len
    } else {
        n_tok.checked_div(n_seq).unwrap_or(0)
    };
    let min_chunks = len.div_ceil(block * 8);
    let auto = if rescans {
        min_chunks
    } else {
        let spread = LOSS_TARGET_BLOCKS.div_ceil(n_seq.max(1));
        min_chunks.max(spread.min(len.div_ceil(block)))
    };
    // At most STAT_SLOTS blocks in all (one statistics slot each): the blocks of a chunk row
    // stride over the sequences.
    let slots = crate::params::STAT_SLOTS as u32;
    let chunks = tuning.loss_chunks.unwrap_or(auto).clamp(1, slots);
    Geometry {
        grid: (n_seq.clamp(1, slots / chunks), chunks, 1),
        block: (block, 1, 1),
    }
}

/// Geometry of `grpo_loss_denoms`: up to 1024 blocks striding over the sequences.
pub fn denoms_geometry(n_seq: u32, tuning: Tuning) -> Geometry {
    Geometry {
        grid: (n_seq.clamp(1, 1024), 1, 1),
        block: (tuning.threads.unwrap_or(BLOCK), 1, 1),
    }
}

/// Geometry of `grpo_cov_means` and `grpo_cov_keys`: that of [`denoms_geometry`], at most
/// 1024 blocks (`params::COV_PARTS`, the slots of the per-block sums) striding over the
/// sequences.
pub fn cov_geometry(n_seq: u32, tuning: Tuning) -> Geometry {
    denoms_geometry(n_seq, tuning)
}

/// Geometry of `grpo_cov_radix`: up to 1024 blocks striding over the tokens (each block adds
/// its shared-memory histogram to the round's with at most 256 atomics).
pub fn cov_radix_geometry(n_tok: u32, tuning: Tuning) -> Geometry {
    let threads = tuning.threads.unwrap_or(BLOCK);
    Geometry {
        grid: (n_tok.div_ceil(threads).clamp(1, 1024), 1, 1),
        block: (threads, 1, 1),
    }
}

/// Geometry of `grpo_cov_cut`: one block of 1024 threads (the tie scan walks the keys in
/// tiles of the block's size).
pub fn cov_cut_geometry() -> Geometry {
    Geometry {
        grid: (1, 1, 1),
        block: (1024, 1, 1),
    }
}

/// Geometry of the log-softmax kernels and whether a block (not a warp) owns a row.
///
/// Block mode: `grid.x = N` blocks of 256 threads (a row of 151,936 bf16 logits is 18,992
/// 16-byte vectors, 74 per thread, two loads in flight each). Warp mode: 8 rows per 256-thread
/// block, `grid.x = ceil(N / 8)`. Either way `grid.x` is capped at [`MAX_GRID_X`] (and at
/// `max_blocks`) and the teams stride over the rows, so `N` has no limit.
pub fn log_softmax_geometry(rows: u64, vocab: u32, tuning: Tuning) -> (Geometry, bool) {
    let block_team = tuning.block_team.unwrap_or(vocab > WARP_VOCAB_MAX);
    let threads = tuning.threads.unwrap_or(BLOCK);
    let teams_per_block = if block_team {
        1
    } else {
        u64::from(threads / 32)
    };
    let cap = u64::from(tuning.max_blocks.unwrap_or(MAX_GRID_X).min(MAX_GRID_X));
    let blocks = rows.div_ceil(teams_per_block.max(1)).clamp(1, cap.max(1));
    // `blocks <= cap <= MAX_GRID_X`, so the conversion cannot fail.
    let grid = u32::try_from(blocks).unwrap_or(MAX_GRID_X);
    (
        Geometry {
            grid: (grid, 1, 1),
            block: (threads, 1, 1),
        },
        block_team,
    )
}

/// Blocks of the fused logits-to-loss pass by default: one per SM of an H100/H200 (132 SMs), so
/// that the rows in flight (one per block) keep the second touch of each logit within L2 (the
/// arithmetic is in docs/KERNELS.md).
pub const FUSED_BLOCKS: u32 = 132;

/// Geometry of `logits_loss_*`: `min(rows, FUSED_BLOCKS)` blocks (or `Tuning::max_blocks`, at
/// most [`STAT_SLOTS`](crate::params::STAT_SLOTS)) of 1024 threads (or `Tuning::threads`), each
/// owning a contiguous range of rows.
pub fn logits_loss_geometry(rows: u64, tuning: Tuning) -> Geometry {
    let threads = tuning.threads.unwrap_or(1024);
    let cap = tuning
        .max_blocks
        .unwrap_or(FUSED_BLOCKS)
        .min(crate::params::STAT_SLOTS as u32);
    let blocks = rows.clamp(1, u64::from(cap.max(1)));
    Geometry {
        grid: (u32::try_from(blocks).unwrap_or(1), 1, 1),
        block: (threads, 1, 1),
    }
}

/// Blocks the log-softmax backward aims for when rows are few: four per SM of an H100/H200 (the
/// launch bounds' minimum), so that 64 rows do not leave half of the SMs idle.
pub const LSM_BWD_TARGET_BLOCKS: u32 = 528;

/// Geometry of the log-softmax backward: that of [`log_softmax_geometry`], and in block-team
/// mode with fewer row blocks than [`LSM_BWD_TARGET_BLOCKS`], each row split over `grid.y`
/// blocks (every gradient element is independent), as long as each thread keeps two 16-byte
/// vectors of the row.
pub fn log_softmax_backward_geometry(rows: u64, vocab: u32, tuning: Tuning) -> (Geometry, bool) {
    let (mut g, block_team) = log_softmax_geometry(rows, vocab, tuning);
    if block_team {
        let per_thread = u64::from(g.block.0) * 2 * 8; // two vectors of 8 16-bit elements
        let most = u64::from(vocab).div_ceil(per_thread).max(1);
        let want = u64::from(LSM_BWD_TARGET_BLOCKS).div_ceil(u64::from(g.grid.0).max(1));
        g.grid.1 = u32::try_from(want.min(most).clamp(1, 65535)).unwrap_or(1);
    }
    (g, block_team)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_covers_every_group_and_sequence() {
        // Team mode: groups of 8 in segments of 8 lanes, 32 groups per 256-thread block.
        let (g, width) = advantages_geometry(8 * 1001, 1001, false, Tuning::default());
        assert_eq!(width, 8);
        assert_eq!(g.grid.0 * (g.block.0 / 8), 1024);
        let (g, width) = advantages_geometry(64 * 1001, 1001, false, Tuning::default());
        assert_eq!(width, 32);
        assert_eq!(g.grid.0 * (g.block.0 / 32), 1008);
        assert_eq!(
            advantages_geometry(16 * 5, 5, false, Tuning::default()).1,
            16
        );
        // Block mode for large groups and for the token broadcast.
        let (g, width) = advantages_geometry(1000 * 200, 1000, false, Tuning::default());
        assert_eq!(width, 0);
        assert_eq!((g.grid.0, g.block.0), (1000, 256));
        let (_, width) = advantages_geometry(16, 2, true, Tuning::default());
        assert_eq!(width, 0);
        let (g, _) = advantages_geometry(5000, 1, false, Tuning::default());
        assert_eq!(g.block.0, BLOCK);
        // Loss: one block row per sequence; chunks of at most 2048 tokens, more (down to 256
        // tokens) while the grid is small, unless every chunk re-reads its sequence.
        let g = loss_geometry(3, 0, 4097, true, Tuning::default());
        assert_eq!((g.grid.0, g.grid.1), (3, 3));
        let g = loss_geometry(3, 0, 4097, false, Tuning::default());
        assert_eq!((g.grid.0, g.grid.1), (3, 17));
        let g = loss_geometry(8, 0, 32768, false, Tuning::default());
        assert_eq!((g.grid.0, g.grid.1), (8, 33));
        let g = loss_geometry(1024, 0, 4096, false, Tuning::default());
        assert_eq!((g.grid.0, g.grid.1), (512, 2));
        let g = loss_geometry(100_000, 0, 0, false, Tuning::default());
        assert_eq!((g.grid.0, g.grid.1), (1024, 1));
        let g = loss_geometry(1, 0, u32::MAX, true, Tuning::default());
        assert_eq!((g.grid.0, g.grid.1), (1, 1024));
        let g = loss_geometry(4, 400, 0, false, Tuning::default());
        assert_eq!((g.grid.0, g.grid.1), (4, 1));
        assert_eq!(
            loss_geometry(0, 0, 0, false, Tuning::default()).grid,
            (1, 1, 1)
        );
        assert_eq!(denoms_geometry(5000, Tuning::default()).grid.0, 1024);
        // Returns and GAE: one warp per sequence, at least one block.
        let g = returns_geometry(1000, Tuning::default());
        assert_eq!((g.grid.0, g.block.0), (500, RETURNS_BLOCK));
        assert_eq!(returns_geometry(0, Tuning::default()).grid.0, 1);
        // Whitening: capped grid-stride pass.
        let g = whiten_apply_geometry(10_000_000_000, Tuning::default());
        assert_eq!((g.grid.0, g.block.0), (WHITEN_APPLY_BLOCKS, BLOCK));
        assert_eq!(whiten_apply_geometry(0, Tuning::default()).grid.0, 1);
        assert_eq!(whiten_apply_geometry(257, Tuning::default()).grid.0, 2);
    }

    #[test]
    fn log_softmax_geometry_has_no_row_limit_and_picks_the_team() {
        // Far more rows than a grid dimension holds: the grid is capped and the teams stride.
        let (g, block) = log_softmax_geometry(5_000_000_000, 151_936, Tuning::default());
        assert!(block);
        assert_eq!(g.grid, (MAX_GRID_X, 1, 1));
        assert_eq!(g.block, (BLOCK, 1, 1));
        // Small vocabularies: one warp per row, 8 rows per 256-thread block.
        let (g, block) = log_softmax_geometry(100_001, 2048, Tuning::default());
        assert!(!block);
        assert_eq!(g.grid.0, 100_001u32.div_ceil(8));
        // Overrides.
        let t = Tuning {
            threads: Some(64),
            block_team: Some(false),
            max_blocks: Some(3),
            ..Tuning::default()
        };
        let (g, block) = log_softmax_geometry(1000, 151_936, t);
        assert!(!block);
        assert_eq!((g.grid.0, g.block.0), (3, 64));
        // No rows still gives a valid (never launched) geometry.
        assert_eq!(log_softmax_geometry(0, 10, Tuning::default()).0.grid.0, 1);
        // The backward splits the rows of a small batch: 64 rows of 151,936 over 9 blocks each.
        let (g, _) = log_softmax_backward_geometry(64, 151_936, Tuning::default());
        assert_eq!((g.grid.0, g.grid.1), (64, 9));
        let (g, _) = log_softmax_backward_geometry(8192, 151_936, Tuning::default());
        assert_eq!((g.grid.0, g.grid.1), (8192, 1));
        let (g, _) = log_softmax_backward_geometry(4, 1000, Tuning::default());
        assert_eq!(g.grid.1, 1, "a short row is not split");
    }

    #[test]
    fn tuning_checks_every_override() {
        assert_eq!(Tuning::default().check(), Ok(()));
        let bad = [
            Tuning {
                threads: Some(48),
                ..Tuning::default()
            },
            Tuning {
                threads: Some(2048),
                ..Tuning::default()
            },
            Tuning {
                loss_chunks: Some(0),
                ..Tuning::default()
            },
            Tuning {
                loss_chunks: Some(65536),
                ..Tuning::default()
            },
            Tuning {
                max_blocks: Some(0),
                ..Tuning::default()
            },
        ];
        for t in bad {
            assert_eq!(t.check(), Err(care_core::Error::InvalidArgument), "{t:?}");
        }
        let good = Tuning {
            threads: Some(1024),
            warp_per_group: Some(true),
            loss_chunks: Some(65535),
            block_team: Some(false),
            max_blocks: Some(1),
        };
        assert_eq!(good.check(), Ok(()));
    }
}
