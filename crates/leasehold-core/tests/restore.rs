//! A table prepared for a new cluster (a restore from a backup): every
//! token and lease id after it is above anything the old cluster could have
//! handed out after the backup, and restored leases get a full TTL.

use leasehold_core::{Command, Event, LockTable, Mode, Response, Stamp, RESTORE_STRIDE};
use proptest::prelude::*;

fn apply(table: &mut LockTable, now: u64, epoch: u64, command: Command) -> Response {
    let mut events: Vec<Event> = Vec::new();
    let out = table.apply(Stamp { now, epoch }, command, &mut events);
    table.check_invariants().expect("invariants");
    out.expect("the command succeeds")
}

fn grant_and_acquire(table: &mut LockTable, now: u64, epoch: u64, key: &str) -> (u64, u64) {
    let command = Command::GrantAndAcquire {
        ttl_ms: 10_000,
        holder: "h".into(),
        key: key.into(),
        wait_ms: 0,
        lock_delay_ms: 0,
        request_id: 0,
        mode: Mode::Exclusive,
    };
    match apply(table, now, epoch, command) {
        Response::Acquired(grant) => (grant.lease, grant.fence),
        other => panic!("not acquired: {other:?}"),
    }
}

proptest! {
    #[test]
    fn after_a_restore_every_token_and_lease_is_above_the_old_clusters(
        before in 1usize..40,
        after in 0usize..200,
        floor in prop_oneof![Just(0u64), 0u64..(3 * RESTORE_STRIDE)],
    ) {
        let epoch = 5 << 24;
        let mut old = LockTable::new();
        for i in 0..before {
            grant_and_acquire(&mut old, 1_000 + i as u64, epoch, &format!("k{i}"));
        }
        let mut backup = old.clone();
        // The old cluster goes on after the backup, and its grants are lost.
        let mut highest = (0, 0);
        for i in 0..after {
            let (lease, fence) = grant_and_acquire(&mut old, 2_000 + i as u64, epoch, &format!("late{i}"));
            highest = (highest.0.max(lease), highest.1.max(fence));
        }

        let backed_up_next = backup.next_fence();
        let (next_fence, next_lease) = backup.prepare_for_new_cluster(floor).expect("prepared");
        backup.check_invariants().expect("invariants after the restore");
        prop_assert!(next_fence >= floor && next_lease >= floor.max(RESTORE_STRIDE));
        // A whole stride of room for what the old cluster granted after.
        prop_assert!(next_fence >= backed_up_next + RESTORE_STRIDE);
        prop_assert_eq!(backup.epoch(), 0);
        let (lease, fence) = grant_and_acquire(&mut backup, 1_500, 1 << 24, "new");
        prop_assert!(fence > highest.1 && fence >= RESTORE_STRIDE);
        prop_assert!(lease > highest.0 && lease >= RESTORE_STRIDE);
        // A lease granted after the backup is not found, nor reused.
        if highest.0 > 0 {
            let mut events = Vec::new();
            let renew = backup.apply(Stamp { now: 1_501, epoch: 1 << 24 }, Command::KeepAlive { lease: highest.0 }, &mut events);
            prop_assert!(renew.is_err());
        }
    }
}

#[test]
fn restored_leases_get_a_full_ttl_from_the_new_clusters_first_leader() {
    let epoch = 9 << 24;
    let mut table = LockTable::new();
    let (lease, _) = grant_and_acquire(&mut table, 1_000, epoch, "k");
    // The backup is taken 9 s into a 10 s lease.
    let mut events = Vec::new();
    table
        .apply(Stamp { now: 10_000, epoch }, Command::Tick, &mut events)
        .expect("tick");
    table.prepare_for_new_cluster(0).expect("prepared");
    // The new cluster's first leader stamps its first command with term 1.
    apply(&mut table, 10_000, 1 << 24, Command::Tick);
    let view = table.lease(lease, 10_000).expect("the restored lease");
    assert_eq!(view.ttl_left_ms, 10_000, "{view:?}");
}

#[test]
fn each_restore_moves_the_sequences_at_least_a_stride_up() {
    let mut table = LockTable::new();
    grant_and_acquire(&mut table, 1_000, 1 << 24, "k");
    assert_eq!(
        table.prepare_for_new_cluster(0).expect("first"),
        (2 * RESTORE_STRIDE, 2 * RESTORE_STRIDE)
    );
    assert_eq!(
        table.prepare_for_new_cluster(0).expect("second"),
        (4 * RESTORE_STRIDE, 4 * RESTORE_STRIDE)
    );
    // A floor holds for both sequences: a second restore of one backup
    // hands out neither the tokens nor the lease ids of the first.
    assert_eq!(
        table
            .prepare_for_new_cluster(7 * RESTORE_STRIDE + 7)
            .expect("floor"),
        (7 * RESTORE_STRIDE + 7, 7 * RESTORE_STRIDE + 7)
    );
}

#[test]
fn a_floor_or_a_sequence_without_room_is_refused_and_changes_nothing() {
    let mut table = LockTable::new();
    grant_and_acquire(&mut table, 1_000, 1 << 24, "k");
    let before = table.clone();
    let err = table
        .prepare_for_new_cluster(u64::MAX - 1)
        .expect_err("no room above the floor");
    assert!(err.to_string().contains("fence_floor"), "{err}");
    assert_eq!(table, before);
    // A floor just inside the room is taken.
    let floor = u64::MAX - RESTORE_STRIDE;
    assert_eq!(table.prepare_for_new_cluster(floor).expect("room").0, floor);
    // Now the sequence itself has no stride of room left above it.
    let before = table.clone();
    assert!(table.prepare_for_new_cluster(0).is_err());
    assert_eq!(table, before);
}
