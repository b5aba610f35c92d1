//! The cost of one admission decision, for the three paths a request takes:
//! (a) a returning admitted visitor, (b) a new visitor admitted, (c) a queued
//! visitor checking in; each with the node's ticket ledger and with one
//! that remembers nothing (`.../without_ledger`), so the ledger's cost per
//! decision reads off the pair; and the connection budget's check
//! (`ledger/note_connection_many`), which the node makes before deciding,
//! and for a new ticket's first connection (`ledger/note_connection_new_ticket`).
//! `cargo bench -p waitroom-common --features std`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use waitroom_common::counters::{PoolCounts, RoomCounters};
use waitroom_common::engine::decide;
use waitroom_common::ledger::TicketLedger;
use waitroom_common::room::{RoomConfig, RoomId};
use waitroom_common::slots::{SlotInputs, SlotPlan};
use waitroom_common::state::GlobalState;
use waitroom_common::ticket::Ticket;
use waitroom_common::time::{Minute, UnixMillis};

const NOW: UnixMillis = UnixMillis(1_700_000_000_000);

fn room() -> waitroom_common::room::Room {
    RoomConfig::with_limits(1_000_000_000, 1_000_000_000)
        .validate()
        .expect("valid room")
        .with_id(RoomId(1))
}

/// A state with a realistic queue (an hour of buckets) and `allowance` to hand out.
fn state(allowance: PoolCounts) -> GlobalState {
    let minute = NOW.minute();
    let waiting: Vec<(Minute, u64)> = (1..=60).map(|back| (minute.minus(back), 500)).collect();
    let plan = SlotPlan::new(SlotInputs {
        total_active_users: 1_000_000,
        new_users_per_minute: 10_000,
        active_users: 900_000,
        admitted_this_minute: 0,
        random: false,
        waiting: &waiting,
        traffic: &[],
        anywhere_weight: 0,
    });
    GlobalState::from_plan(
        NOW,
        900_000,
        0,
        &plan,
        10_000.0,
        PoolCounts::default(),
        allowance,
    )
}

fn bench(c: &mut Criterion) {
    let room = room();
    let counters = RoomCounters::new_boxed(RoomId(1));
    // A node's default ledger, and one that remembers nothing (every cookie
    // believed, as before the ledger): the pair tells what the ledger costs.
    let ledger = TicketLedger::new_boxed(1 << 20, [0x1234_5678, 0x9abc_def0]);
    let forgetful = TicketLedger::forgetful();

    for (suffix, ledger) in [("", &*ledger), ("/without_ledger", &*forgetful)] {
        // (a) Returning admitted visitor: session renewed, expiry moved.
        let global = state(PoolCounts::default());
        let admitted = Ticket {
            accepted_at: Some(NOW.minus_secs(60)),
            last_check_in: NOW.minus_secs(30),
            counted_expiry: Some(NOW.minus_secs(30).plus_minutes(5).expiry_slot()),
            id: 0x5eed,
            ..Ticket::new_visitor(RoomId(1), NOW.minus_secs(120), 20)
        };
        let mut i = 0_u64;
        c.bench_function(&format!("decide/returning_admitted{suffix}"), |b| {
            b.iter(|| {
                i += 1;
                let now = NOW.plus_millis(i % 1_000);
                black_box(decide(
                    &room,
                    &global,
                    &counters,
                    ledger,
                    black_box(Some(admitted)),
                    now,
                    i,
                ))
            })
        });

        // (a') The same, over 100,000 visitors in turn: each one's ledger
        // entry is cold in the cache, as on a busy node.
        let many: Vec<Ticket> = (1..=100_000_u64)
            .map(|id| Ticket { id, ..admitted })
            .collect();
        c.bench_function(&format!("decide/returning_admitted_many{suffix}"), |b| {
            b.iter(|| {
                i += 1;
                let now = NOW.plus_millis(i % 1_000);
                let ticket = many[(i.wrapping_mul(0x9e37_79b9) % many.len() as u64) as usize];
                black_box(decide(
                    &room,
                    &global,
                    &counters,
                    ledger,
                    black_box(Some(ticket)),
                    now,
                    i,
                ))
            })
        });

        // (b) New visitor admitted: all buckets covered, plenty of colo-share slots.
        let open = GlobalState {
            first_uncovered: None,
            ..state(PoolCounts {
                colo_share: u64::MAX / 2,
                ..PoolCounts::default()
            })
        };
        let open = GlobalState {
            buckets: Vec::new(),
            ..open
        };
        c.bench_function(&format!("decide/new_visitor_admitted{suffix}"), |b| {
            b.iter(|| {
                i += 1;
                black_box(decide(
                    &room,
                    &open,
                    &counters,
                    ledger,
                    black_box(None),
                    NOW,
                    i,
                ))
            })
        });

        // (c) Queued visitor checking in behind older buckets: counted, re-jittered, estimated.
        let queued = Ticket {
            last_check_in: NOW.minus_secs(30),
            id: 0x9eed,
            ..Ticket::new_visitor(RoomId(1), NOW.minus_secs(30), 20)
        };
        c.bench_function(&format!("decide/queued_visitor{suffix}"), |b| {
            b.iter(|| {
                i += 1;
                black_box(decide(
                    &room,
                    &global,
                    &counters,
                    ledger,
                    black_box(Some(queued)),
                    NOW,
                    i,
                ))
            })
        });
    }
}

/// The connection budget the node checks before deciding: one of a
/// browser's eight connections seen again, over 30,000 tickets in turn
/// (cold rows; the default ledger keeps rows for 65,536 tickets active
/// within the window).
fn connections(c: &mut Criterion) {
    let ledger = TicketLedger::new_boxed(1 << 20, [0x1234_5678, 0x9abc_def0]);
    let mut i = 0_u64;
    c.bench_function("ledger/note_connection_many", |b| {
        b.iter(|| {
            i += 1;
            let ticket = 1 + i.wrapping_mul(0x9e37_79b9) % 30_000;
            black_box(ledger.note_connection(
                black_box(ticket),
                ticket * 8 + i % 8,
                1_700_000_000 + i / 1_000_000,
                16,
                10,
            ))
        })
    });
}

/// A new ticket's first connection (the node notes it as it issues the
/// ticket): a row taken from the set's two, in a table whose rows are all
/// held by tickets seen within the window (a flood of new visitors, 50,000
/// a second against the default 65,536 rows).
fn new_tickets(c: &mut Criterion) {
    let ledger = TicketLedger::new_boxed(1 << 20, [0x1234_5678, 0x9abc_def0]);
    let mut i = 0_u64;
    c.bench_function("ledger/note_connection_new_ticket", |b| {
        b.iter(|| {
            i += 1;
            black_box(ledger.note_connection(
                black_box(i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
                i,
                1_700_000_000 + i / 50_000,
                16,
                10,
            ))
        })
    });
}

criterion_group!(benches, bench, connections, new_tickets);
criterion_main!(benches);
