//! Which aggregator group owns a room (docs/adr/0001, decision 5).
//!
//! A large operator's rooms are split between aggregator groups: each room
//! is reported to, summed and granted by one group only, so no process
//! holds every room. The owner is chosen by rendezvous hashing (highest
//! random weight) of the room's id with each group's name. Node and
//! aggregator compute it from the same list of names and agree without
//! talking, the choice is stable across restarts and releases (the hash is
//! fixed here, not `std`'s), rooms spread evenly, and a group added or
//! removed moves only the rooms it gains or had.
//!
//! An aggregator takes part only of the rooms its group owns
//! ([`Membership::owns`]); a node that sends it another room (a node whose
//! list of groups is out of date) gets no answer for that room, so it goes
//! by its own last share there, as when an aggregator is down.
use crate::room::RoomId;

/// The most groups a cluster is split into.
pub const MAX_GROUPS: usize = 64;

/// The rendezvous weight of `member` for `key`: FNV-1a over both (with a
/// zero byte between), then splitmix64's finalizer (FNV alone mixes the
/// last bytes poorly, and the names of one cluster differ mostly there).
#[must_use]
pub fn weight(key: &[u8], member: &[u8]) -> u64 {
    let bytes = key.iter().chain(&[0]).chain(member);
    let mut h = bytes.fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The index in `groups` of the group that owns `room`; `None` for no
/// groups. Ties (never seen in practice) go to the first.
#[must_use]
pub fn owner<S: AsRef<str>>(room: RoomId, groups: &[S]) -> Option<usize> {
    let key = room.0.to_le_bytes();
    groups
        .iter()
        .enumerate()
        .max_by_key(|&(i, g)| (weight(&key, g.as_ref().as_bytes()), core::cmp::Reverse(i)))
        .map(|(i, _)| i)
}

/// Why a list of groups cannot be used, for the caller to name its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupsError {
    /// The list itself (its length, a name, a name twice).
    #[error("{0}")]
    List(String),
    /// The aggregator's own group is not in the list.
    #[error("this aggregator's group {0:?} is not among them")]
    NotAmong(String),
}

/// Checks a cluster's group names: one at least, at most [`MAX_GROUPS`],
/// each 1–64 of `A-Z a-z 0-9 . _ -` (they are written into etcd's fence
/// and into metric labels), none twice.
pub fn check_names<S: AsRef<str>>(groups: &[S]) -> Result<(), GroupsError> {
    if groups.is_empty() {
        return Err(GroupsError::List("at least one group is required".into()));
    }
    if groups.len() > MAX_GROUPS {
        return Err(GroupsError::List(format!(
            "{} groups; at most {MAX_GROUPS}",
            groups.len()
        )));
    }
    for (i, g) in groups.iter().enumerate() {
        let g = g.as_ref();
        let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if g.is_empty() || g.len() > 64 || !g.chars().all(fine) {
            return Err(GroupsError::List(format!(
                "{g:?} is not a group name (1 to 64 of A-Z a-z 0-9 . _ -)"
            )));
        }
        if groups[..i].iter().any(|h| h.as_ref() == g) {
            return Err(GroupsError::List(format!("{g:?} is listed twice")));
        }
    }
    Ok(())
}

/// One aggregator's place among the groups: its own group and all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// Every group's name, in the order configured (the order does not
    /// change any room's owner).
    pub groups: Vec<String>,
    /// The index of this aggregator's group in `groups`.
    pub own: usize,
}

impl Membership {
    /// `own` among `groups`, checked.
    pub fn new(own: &str, groups: Vec<String>) -> Result<Self, GroupsError> {
        check_names(&groups)?;
        let own = groups
            .iter()
            .position(|g| g == own)
            .ok_or_else(|| GroupsError::NotAmong(own.to_owned()))?;
        Ok(Self { groups, own })
    }

    /// This aggregator's group's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.groups[self.own]
    }

    /// Whether this aggregator's group owns `room`.
    #[must_use]
    pub fn owns(&self, room: RoomId) -> bool {
        owner(room, &self.groups) == Some(self.own)
    }

    /// The groups as one canonical text, sorted (the order configured does
    /// not matter): `eu,us`. Written into the ledger's fence with the
    /// epoch, so an aggregator with another list under the same epoch
    /// (which would own other rooms) is refused.
    #[must_use]
    pub fn canonical(&self) -> String {
        let mut sorted: Vec<&str> = self.groups.iter().map(String::as_str).collect();
        sorted.sort_unstable();
        sorted.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("group-{i}")).collect()
    }

    #[test]
    fn rooms_spread_evenly_and_the_order_of_the_list_does_not_matter() {
        let groups = names(4);
        let mut reversed = groups.clone();
        reversed.reverse();
        let mut per = [0_u32; 4];
        for r in 0..4_000 {
            let room = RoomId::from_name(&format!("room-{r}"));
            let i = owner(room, &groups).unwrap();
            per[i] += 1;
            assert_eq!(
                reversed[owner(room, &reversed).unwrap()],
                groups[i],
                "same owner whatever the order"
            );
        }
        for count in per {
            assert!((850..=1_150).contains(&count), "{per:?}");
        }
        assert_eq!(owner(RoomId(1), &[] as &[String]), None);
    }

    /// A group added takes rooms only for itself; a group removed gives
    /// away only its own rooms. Nothing else moves.
    #[test]
    fn a_change_of_groups_moves_only_the_rooms_it_must() {
        let three = names(3);
        let four = names(4);
        let (mut gained, mut removed) = (0, 0);
        for r in 0..3_000 {
            let room = RoomId::from_name(&format!("room-{r}"));
            let before = &three[owner(room, &three).unwrap()];
            let after = &four[owner(room, &four).unwrap()];
            if before != after {
                assert_eq!(after, "group-3", "a room moved between old groups");
                gained += 1;
            }
            let two = &three[..2];
            let fewer = &two[owner(room, two).unwrap()];
            if before != "group-2" {
                assert_eq!(fewer, before, "a room of a kept group moved");
            } else {
                removed += 1;
            }
        }
        assert!(
            (600..=900).contains(&gained),
            "{gained} of 3000 moved to the new group"
        );
        assert!((850..=1_150).contains(&removed), "{removed}");
    }

    #[test]
    fn names_are_checked_and_the_membership_is_canonical() {
        let m = Membership::new("us", vec!["us".into(), "eu".into()]).unwrap();
        assert_eq!((m.name(), m.canonical().as_str()), ("us", "eu,us"));
        let owned = (0..100)
            .filter(|r| m.owns(RoomId::from_name(&format!("r{r}"))))
            .count();
        assert!((30..=70).contains(&owned), "{owned}");
        for (own, groups, says) in [
            ("eu", vec![], "at least one"),
            ("eu", vec!["eu", "eu"], "listed twice"),
            ("eu", vec!["eu", "u s"], "not a group name"),
            ("eu", vec!["eu", ""], "not a group name"),
            ("ap", vec!["eu", "us"], "\"ap\" is not among them"),
        ] {
            let groups = groups.into_iter().map(String::from).collect();
            let err = Membership::new(own, groups).unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
        let many: Vec<String> = names(65);
        assert!(
            check_names(&many)
                .unwrap_err()
                .to_string()
                .contains("at most 64")
        );
    }
}
