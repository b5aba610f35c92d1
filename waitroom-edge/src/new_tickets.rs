//! New tickets per client address: a fixed, lock-free table of rate limits.
//!
//! Every request without a usable ticket to a room that queues gets a new
//! ticket, and the engine counts it waiting (or gives it a slot). A client
//! that never keeps its cookie therefore makes a new visitor of every
//! request: at 20 requests a second it swells the queue the estimates are
//! computed from by 1,200 a minute, and before the engine's lottery rule it
//! won nearly every slot of a random room (issue 13, item 7). This table caps
//! how many new tickets one address is issued; a visitor who keeps its
//! ticket never touches it.
//!
//! Each of [`SLOTS`] cells is one `AtomicU64` holding a GCRA ("generic cell
//! rate algorithm", the token bucket as one timestamp): the theoretical
//! arrival time, in milliseconds, of the next ticket. A ticket is allowed
//! while that time is at most `burst` intervals ahead of now; each allowed
//! ticket pushes it one interval further. One compare-and-swap per new
//! visitor, no allocation, no lock. The cell is chosen by a keyed hash
//! (SipHash with a per-process random key) of the address — an IPv6 client
//! by its /64, which is what one subscriber is usually given — so nobody can
//! aim at another address's cell. Two addresses that meet in a cell share its
//! budget: with 4,096 cells that is a chance of one in 4,096 per busy address,
//! and it can only make the limit stricter, never let anyone past it.
use std::{
    hash::BuildHasher as _,
    net::IpAddr,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

use waitroom_common::time::UnixMillis;

/// Cells in the table (32 KiB). Enough that addresses over their limit
/// rarely share a cell with anyone else.
pub const SLOTS: usize = 4_096;

/// The limit in force; `per_minute == 0` turns it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewTicketRate {
    /// New tickets per address per minute, sustained.
    pub per_minute: u32,
    /// New tickets an idle address may be issued at once.
    pub burst: u32,
}

/// The per-address limit on new tickets, shared by every worker.
#[derive(Debug)]
pub struct NewTicketLimiter {
    /// Milliseconds between tickets at the sustained rate; 0: off.
    interval_ms: u64,
    /// How far ahead of now the next ticket's time may be: `burst` intervals.
    tolerance_ms: u64,
    hasher: std::hash::RandomState,
    cells: Box<[AtomicU64]>,
}

impl NewTicketLimiter {
    #[must_use]
    pub fn new(rate: NewTicketRate) -> Self {
        let interval_ms = if rate.per_minute == 0 {
            0
        } else {
            (60_000 / u64::from(rate.per_minute)).max(1)
        };
        Self {
            interval_ms,
            tolerance_ms: interval_ms * u64::from(rate.burst.max(1)),
            hasher: std::hash::RandomState::new(),
            cells: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Whether the limit is on at all.
    #[must_use]
    pub fn is_on(&self) -> bool {
        self.interval_ms != 0
    }

    /// Takes one new ticket for `client` at `now`: `Ok`, or `Err` with the
    /// milliseconds until the address may have one (for `Retry-After`).
    /// A refusal takes nothing.
    pub fn take(&self, client: IpAddr, now: UnixMillis) -> Result<(), u64> {
        if !self.is_on() {
            return Ok(());
        }
        let cell = &self.cells[self.hasher.hash_one(address_key(client)) as usize % SLOTS];
        let now = now.0;
        let mut current = cell.load(Relaxed);
        loop {
            let next = current.max(now) + self.interval_ms;
            if next > now + self.tolerance_ms {
                return Err(next - now - self.tolerance_ms);
            }
            match cell.compare_exchange_weak(current, next, Relaxed, Relaxed) {
                Ok(_) => return Ok(()),
                Err(seen) => current = seen,
            }
        }
    }
}

/// What one client is known by: an IPv4 address (or an IPv4-mapped IPv6 one)
/// whole, an IPv6 address by its /64.
fn address_key(client: IpAddr) -> u128 {
    match client.to_canonical() {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        // The low 64 bits cleared, then bit 32 set: no /64 equals an IPv4 key.
        IpAddr::V6(v6) => (u128::from(v6) & !u128::from(u64::MAX)) | 1 << 32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: UnixMillis = UnixMillis(1_800_000_000_000);

    fn limiter(per_minute: u32, burst: u32) -> NewTicketLimiter {
        NewTicketLimiter::new(NewTicketRate { per_minute, burst })
    }

    #[test]
    fn a_burst_then_the_sustained_rate_and_other_addresses_untouched() {
        let limit = limiter(60, 5);
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        for i in 0..5 {
            assert_eq!(limit.take(ip, T0), Ok(()), "burst ticket {i}");
        }
        let Err(wait) = limit.take(ip, T0) else {
            panic!("the sixth at once is over the burst")
        };
        assert_eq!(wait, 1_000, "one a second at 60 a minute");
        assert!(
            limit.take(ip, T0).is_err(),
            "a refusal takes nothing, and it is still too soon"
        );
        assert_eq!(limit.take(ip, UnixMillis(T0.0 + 1_000)), Ok(()));
        assert!(limit.take(ip, UnixMillis(T0.0 + 1_000)).is_err());
        // A minute of quiet refills the burst.
        let later = UnixMillis(T0.0 + 61_000);
        assert!((0..5).all(|_| limit.take(ip, later).is_ok()));
        assert!(limit.take(ip, later).is_err());
        // Another address has its own budget (unless it shares the cell: try a few).
        let others = (1..=20_u8)
            .map(|i| IpAddr::from([198, 51, 100, i]))
            .filter(|&other| limit.take(other, later).is_ok())
            .count();
        assert!(others >= 19, "{others} of 20 other addresses got a ticket");
    }

    #[test]
    fn a_polling_client_gets_the_sustained_rate_over_a_minute() {
        let limit = limiter(120, 300);
        let ip: IpAddr = "203.0.113.9".parse().unwrap();
        // 20 requests a second for two minutes.
        let granted = (0..2_400_u64)
            .filter(|i| limit.take(ip, UnixMillis(T0.0 + i * 50)).is_ok())
            .count();
        // The burst, then one every 500 ms over the 119.95 s the requests span.
        assert!(
            (538..=540).contains(&granted),
            "the burst plus two minutes at 120: {granted}"
        );
    }

    #[test]
    fn ipv6_counts_by_64_and_mapped_ipv4_as_ipv4() {
        let limit = limiter(60, 2);
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert!(limit.take(a, T0).is_ok());
        assert!(limit.take(b, T0).is_ok());
        assert!(limit.take(a, T0).is_err(), "one /64, one budget");
        assert_eq!(
            address_key("::ffff:192.0.2.1".parse().unwrap()),
            address_key("192.0.2.1".parse().unwrap())
        );
        assert_ne!(
            address_key("2001:db8:1:2::1".parse().unwrap()),
            address_key("2001:db8:1:3::1".parse().unwrap())
        );
        assert_ne!(
            address_key("::1".parse().unwrap()),
            address_key("0.0.0.0".parse().unwrap()),
            "the /64 of ::1 is not an IPv4 address"
        );
    }

    #[test]
    fn zero_is_off() {
        let limit = limiter(0, 0);
        assert!(!limit.is_on());
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        assert!((0..10_000).all(|_| limit.take(ip, T0).is_ok()));
    }

    #[test]
    fn racing_workers_never_grant_more_than_the_burst() {
        let limit = limiter(1, 50);
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let granted: usize = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| (0..100).filter(|_| limit.take(ip, T0).is_ok()).count()))
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(granted, 50);
    }
}
