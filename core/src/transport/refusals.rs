//! The worker's log of refused requests (a wrong or missing token, an unknown
//! session): each names its peer, and a peer gets at most one line per
//! second, so a stranger hammering the port cannot flood the operator's log.
//! The refusals left out are counted and told with that peer's next line.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A peer (IP address) gets at most one line per period.
const PERIOD: Duration = Duration::from_secs(1);
/// The most peers remembered at once (a bound on what strangers make the
/// worker allocate); beyond it, refusals are counted for all of them together.
const MAX_PEERS: usize = 1024;

/// Refusals of one peer since its last line.
#[derive(Default)]
struct Peer {
    /// When its last line was logged (`None`: never).
    logged: Option<Instant>,
    untold: u64,
}

/// What a refusal leads to.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Log a line, and say that `untold` refusals of this peer (and
    /// `forgotten` of peers no longer remembered) were left out before it.
    Log { untold: u64, forgotten: u64 },
    /// Only counted.
    Quiet,
}

#[derive(Default)]
struct State {
    peers: HashMap<Option<IpAddr>, Peer>,
    /// Refusals of peers beyond [`MAX_PEERS`], counted together.
    crowd: Peer,
    /// Untold refusals of peers dropped to make room.
    forgotten: u64,
    /// When peers were last dropped to make room (at most once a period).
    pruned: Option<Instant>,
}

/// Rate-limited warnings about refused requests (see the module docs).
#[derive(Default)]
pub(crate) struct RefusalLog {
    state: Mutex<State>,
    /// Every refusal, logged or not.
    total: AtomicU64,
}

impl RefusalLog {
    /// Logs (at `warn`) that a request from `peer` was refused because of
    /// `reason`, unless that peer had a line less than a second ago: then it
    /// is only counted.
    pub(crate) fn refused(&self, peer: Option<SocketAddr>, reason: &str) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let Verdict::Log { untold, forgotten } = self.verdict(peer.map(|p| p.ip()), Instant::now())
        else {
            return;
        };
        let peer = peer.map_or_else(|| "unknown".to_string(), |p| p.to_string());
        if untold == 0 && forgotten == 0 {
            tracing::warn!(%peer, "refused a request: {reason}");
        } else {
            let others = match forgotten {
                0 => String::new(),
                n => format!(", {n} from other peers"),
            };
            tracing::warn!(
                %peer,
                suppressed = untold,
                "refused a request: {reason} ({untold} more from this peer not shown{others})"
            );
        }
    }

    /// How many requests were refused so far.
    pub(crate) fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    fn verdict(&self, ip: Option<IpAddr>, now: Instant) -> Verdict {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let state = &mut *guard;
        let known = state.peers.contains_key(&ip);
        let due = |t: Option<Instant>| t.is_none_or(|t| now.duration_since(t) >= PERIOD);
        if !known && state.peers.len() >= MAX_PEERS && due(state.pruned) {
            // Make room: forget the peers quiet for a period, and the crowd
            // (their counts are told with the next line).
            state.pruned = Some(now);
            let mut forgotten = std::mem::take(&mut state.crowd).untold;
            state.peers.retain(|_, p| {
                let keep = !due(p.logged);
                if !keep {
                    forgotten += p.untold;
                }
                keep
            });
            state.forgotten += forgotten;
        }
        let slot = if known || state.peers.len() < MAX_PEERS {
            state.peers.entry(ip).or_default()
        } else {
            &mut state.crowd
        };
        if !due(slot.logged) {
            slot.untold += 1;
            return Verdict::Quiet;
        }
        slot.logged = Some(now);
        Verdict::Log {
            untold: std::mem::take(&mut slot.untold),
            forgotten: std::mem::take(&mut state.forgotten),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn one_line_per_peer_per_period_with_the_count_left_out() {
        let log = RefusalLog::default();
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let logged = |untold| Verdict::Log {
            untold,
            forgotten: 0,
        };
        assert_eq!(log.verdict(ip(1), at(0)), logged(0));
        for ms in 1..200 {
            assert_eq!(log.verdict(ip(1), at(ms)), Verdict::Quiet);
        }
        // Another peer has its own budget; an unknown peer too.
        assert_eq!(log.verdict(ip(2), at(10)), logged(0));
        assert_eq!(log.verdict(None, at(10)), logged(0));
        assert_eq!(log.verdict(None, at(11)), Verdict::Quiet);
        // A period later the next line tells how many were left out.
        assert_eq!(log.verdict(ip(1), at(1000)), logged(199));
        assert_eq!(log.verdict(ip(1), at(1001)), Verdict::Quiet);
        assert_eq!(log.verdict(ip(1), at(2500)), logged(1));
        assert_eq!(log.verdict(ip(1), at(4000)), logged(0));
    }

    #[test]
    fn a_crowd_of_peers_is_bounded_and_its_refusals_still_counted() {
        let log = RefusalLog::default();
        let start = Instant::now();
        let peer = |i: usize| Some(IpAddr::from((i as u32 + 1).to_be_bytes()));
        let mut lines = 0;
        for i in 0..MAX_PEERS * 3 {
            if log.verdict(peer(i), start) != Verdict::Quiet {
                lines += 1;
            }
        }
        // The remembered peers, and one line for everyone beyond them.
        assert_eq!(lines, MAX_PEERS + 1);
        let state = log.state.lock().unwrap();
        assert_eq!(state.peers.len(), MAX_PEERS);
        assert_eq!(state.crowd.untold, 2 * MAX_PEERS as u64 - 1);
        drop(state);
        // A period later, the quiet peers and the crowd make room for a new
        // peer; what they left out is told with the next line.
        assert_eq!(log.verdict(peer(0), start), Verdict::Quiet);
        let later = start + PERIOD * 2;
        assert_eq!(
            log.verdict(peer(MAX_PEERS * 5), later),
            Verdict::Log {
                untold: 0,
                forgotten: 2 * MAX_PEERS as u64
            }
        );
        assert_eq!(log.state.lock().unwrap().peers.len(), 1);
    }
}
