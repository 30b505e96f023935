//! The emulator catches what it claims to: a missing `__syncthreads` gives seed-dependent
//! results, a barrier some threads never reach and a shuffle with exited lanes fail the launch,
//! and the blocks of a grid run in a seed-dependent order.
#![allow(clippy::unwrap_used)]

use care_kernels_emu::{EmuError, selftest};

#[test]
fn missing_barrier_is_exposed_by_the_schedule() {
    let racy: Vec<Vec<u32>> = (0..16)
        .map(|s| selftest::publish(3, 64, false, s).unwrap())
        .collect();
    let correct = |out: &[u32]| {
        out.iter()
            .enumerate()
            .all(|(i, &v)| v == (i / 64) as u32 + 1)
    };
    assert!(
        racy.iter().any(|o| !correct(o)),
        "no schedule exposed the race"
    );
    for s in 0..16 {
        assert!(
            correct(&selftest::publish(3, 64, true, s).unwrap()),
            "with the barrier, seed {s}"
        );
    }
}

#[test]
fn unreachable_barrier_and_shuffle_with_exited_lane_fail() {
    assert_eq!(selftest::divergent_barrier(1), Err(EmuError::BlockBarrier));
    assert_eq!(
        selftest::shuffle_after_exit(1),
        Err(EmuError::WarpCollective)
    );
}

#[test]
fn blocks_run_in_a_seed_dependent_order() {
    let orders: Vec<Vec<u32>> = (0..8)
        .map(|s| selftest::block_order(40, s).unwrap())
        .collect();
    for o in &orders {
        let mut sorted = o.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..40).collect::<Vec<u32>>(),
            "every block runs once"
        );
    }
    assert!(
        orders.iter().any(|o| o != &orders[0]),
        "every seed ran the blocks in the same order"
    );
    assert!(
        orders.iter().any(|o| o.windows(2).any(|w| w[0] > w[1])),
        "no seed ran the blocks out of index order"
    );
}
