//! In which order a pass claims from its sources (the default queue and
//! each queue this binary declares), so that a backlog on one never keeps
//! another waiting until it drains.
//!
//! A pass claims its sources one after another, each for the room the ones
//! before left, and stops when it has none: whichever comes first takes all
//! of it when it has a backlog. So the order changes from pass to pass:
//! - a source that came back short at its last claim (it had nothing more,
//!   or its limits held it) is claimed again ahead of the others once
//!   [`PROBE_EVERY`] has passed, so work newly due there waits at most
//!   about that long behind another's backlog;
//! - the sources with a backlog (their last claim filled its room) take
//!   turns at going first, one more place each pass;
//! - the sources that came back short within [`PROBE_EVERY`] go last, in
//!   turn too: claiming them first would only cost an empty statement.
//!
//! Only the order is kept here, shared by the worker's overlapping passes;
//! which rows a claim takes stays the store's business.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a source that came back short waits behind the ones with a
/// backlog before a pass claims it first again.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(100);

/// The claim order of a worker's sources, numbered `0..n` (`0`: the
/// default queue, then the declared queues in the registry's order).
#[derive(Debug, Default)]
pub(crate) struct ClaimTurns {
    inner: Mutex<Turns>,
}

#[derive(Debug, Default)]
struct Turns {
    /// How many orders were handed out: the turn of the next.
    turn: usize,
    /// Per source: when its last claim came back short, `None` when it
    /// filled its room (or was never claimed).
    short_since: Vec<Option<Instant>>,
}

impl ClaimTurns {
    /// The order in which a pass claims `n` sources now.
    pub(crate) fn order(&self, n: usize) -> Vec<usize> {
        self.order_at(n, Instant::now())
    }

    /// Records how a claim of `source` for `room` went: it took `got`.
    pub(crate) fn claimed(&self, source: usize, room: i64, got: usize) {
        self.claimed_at(source, room, got, Instant::now());
    }

    fn order_at(&self, n: usize, now: Instant) -> Vec<usize> {
        let mut turns = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        turns.short_since.resize(n, None);
        let turn = turns.turn;
        turns.turn = turn.wrapping_add(1);
        let (mut probes, mut backlogged, mut idle) = (Vec::new(), Vec::new(), Vec::new());
        for (source, short) in turns.short_since.iter().enumerate() {
            match short {
                None => backlogged.push(source),
                Some(at) if now.duration_since(*at) >= PROBE_EVERY => probes.push(source),
                Some(_) => idle.push(source),
            }
        }
        rotate(&mut backlogged, turn);
        rotate(&mut idle, turn);
        probes.extend(backlogged);
        probes.extend(idle);
        probes
    }

    fn claimed_at(&self, source: usize, room: i64, got: usize, now: Instant) {
        let mut turns = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(short) = turns.short_since.get_mut(source) {
            *short = ((got as i64) < room).then_some(now);
        }
    }
}

/// `sources` started at place `turn` (modulo its length).
fn rotate(sources: &mut [usize], turn: usize) {
    if !sources.is_empty() {
        let at = turn % sources.len();
        sources.rotate_left(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backlogs_take_turns_and_idle_sources_are_probed_first() {
        let turns = ClaimTurns::default();
        let t0 = Instant::now();
        // Never claimed: all count as backlogged, taking turns.
        assert_eq!(turns.order_at(3, t0), [0, 1, 2]);
        assert_eq!(turns.order_at(3, t0), [1, 2, 0]);
        // 0 and 2 came back short: 1 goes first, they follow in turn.
        turns.claimed_at(0, 4, 1, t0);
        turns.claimed_at(1, 4, 4, t0);
        turns.claimed_at(2, 4, 0, t0);
        assert_eq!(turns.order_at(3, t0), [1, 0, 2]);
        assert_eq!(turns.order_at(3, t0), [1, 2, 0]);
        // Once PROBE_EVERY passed, the short ones go first.
        let later = t0 + PROBE_EVERY;
        assert_eq!(turns.order_at(3, later), [0, 2, 1]);
        // Two backlogs alternate.
        turns.claimed_at(0, 4, 4, later);
        turns.claimed_at(2, 4, 0, later);
        let firsts: Vec<usize> = (0..4).map(|_| turns.order_at(3, later)[0]).collect();
        assert_eq!(firsts, [1, 0, 1, 0]);
    }
}
