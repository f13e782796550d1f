//! Tree keys: the key of a call's argument structure ([`CallSpec::tree`]),
//! decided here for every SDK.
//!
//! A colocated function keeps one compiled program per tree key and leaf
//! specs, so two calls share a program exactly when their keys are equal.
//! The keys come from two places, and never collide:
//!
//! - [`flat_tree_key`]: the call of `n` positional arrays and nothing else
//!   (no keywords, no containers), the common case, which SDKs recognise
//!   without building a structure (the C ABI knows no other);
//! - the interner ([`tree_key`], [`new_tree_key`]): every other structure,
//!   by a canonical form the SDK supplies; equal forms get one key and
//!   different forms different keys (ids handed out in order, never hashes,
//!   which two structures could share). It keeps the most recently used
//!   forms only, so that trees with data-dependent shapes cannot grow it
//!   without bound: a form it forgot gets a new key when seen again (one
//!   more compilation), never a key another form has or had.
//!
//! The canonical form is the SDK's, but one rule is everyone's: the keys of a
//! dict (a JavaScript object) are sorted, as JAX's pytrees (optree) sort
//! them, so `{a, b}` and `{b, a}` are one structure, their leaves are
//! flattened in sorted key order, and they take the same program.
//!
//! [`CallSpec::tree`]: super::CallSpec::tree

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

/// High bits of every flat key. Interned keys count up from 1 and stay below
/// 2^63, so they never reach these bits.
const FLAT: u64 = 0xF1A7_0000_0000_0000;

/// The tree key of a call whose arguments are `n` positional arrays and
/// nothing else. Pure and the same in every process.
pub fn flat_tree_key(n: usize) -> u64 {
    FLAT | (n as u64 & 0x0000_FFFF_FFFF_FFFF)
}

/// The next interned key.
static NEXT: AtomicU64 = AtomicU64::new(1);

/// The most canonical forms the interner keeps. A program whose trees have
/// data-dependent shapes (an object keyed by user ids) would otherwise grow
/// it for the life of the process; past this many, the least recently used
/// forms are forgotten. Forgetting is safe because a key is never handed out
/// twice: a form seen again after that gets a fresh key, which costs its
/// functions one compilation (a cache miss), never a wrong program.
const INTERNED_FORMS: usize = 4096;

/// Interned canonical forms and their keys.
static INTERNED: LazyLock<Mutex<Interner>> =
    LazyLock::new(|| Mutex::new(Interner::new(INTERNED_FORMS)));

/// A key and when its form was last asked for.
struct Interned {
    key: u64,
    used: u64,
}

/// Canonical forms and their keys, at most `capacity` of them, the least
/// recently used forgotten first.
struct Interner {
    forms: HashMap<Box<[u8]>, Interned>,
    /// Counts lookups: each form's `used` is the count at its last one, so
    /// the smallest are the least recently used.
    clock: u64,
    capacity: usize,
}

impl Interner {
    fn new(capacity: usize) -> Self {
        Interner {
            forms: HashMap::new(),
            clock: 0,
            capacity: capacity.max(1),
        }
    }

    /// The key of `canonical`: its own if it is kept, else a fresh one.
    fn key(&mut self, canonical: &[u8]) -> u64 {
        self.clock += 1;
        if let Some(form) = self.forms.get_mut(canonical) {
            form.used = self.clock;
            return form.key;
        }
        if self.forms.len() >= self.capacity {
            self.evict();
        }
        let key = new_tree_key();
        self.forms.insert(
            canonical.into(),
            Interned {
                key,
                used: self.clock,
            },
        );
        key
    }

    /// Forgets the least recently used quarter of the forms at once, so that
    /// its linear cost is spread over the insertions that refill it.
    fn evict(&mut self) {
        let forget = (self.forms.len() / 4).max(1);
        let mut used: Vec<u64> = self.forms.values().map(|f| f.used).collect();
        // Every lookup has its own count, so exactly `forget` forms were
        // used at or before the `forget`-th smallest.
        let (_, &mut last, _) = used.select_nth_unstable(forget - 1);
        self.forms.retain(|_, f| f.used > last);
    }
}

/// The tree key of the structure whose canonical form is `canonical` (bytes
/// that are equal exactly when the structures are: dict keys sorted, see the
/// module docs): the same key for the same form while the process keeps the
/// form, as it does the 4096 most recently used; a form forgotten and seen
/// again gets a new key, never one another form had or has.
/// Thread-safety: any thread.
pub fn tree_key(canonical: &[u8]) -> u64 {
    INTERNED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .key(canonical)
}

/// A key that no structure has yet: for an SDK that interns its structures by
/// its own equality, where a byte form would cost more on its hot path
/// (Python's optree treedefs, which compare their nodes' data as Python
/// objects). It never equals a flat key or another interned key.
/// Thread-safety: any thread.
pub fn new_tree_key() -> u64 {
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_keys_depend_on_the_count_alone() {
        assert_eq!(flat_tree_key(2), flat_tree_key(2));
        assert_ne!(flat_tree_key(1), flat_tree_key(2));
        assert_ne!(flat_tree_key(0), flat_tree_key(1));
    }

    #[test]
    fn equal_forms_share_a_key_and_no_key_is_a_flat_one() {
        let a = tree_key(b"[{\"a\":0,\"b\":0}]");
        let b = tree_key(b"[{\"a\":0,\"b\":0},0]");
        assert_eq!(a, tree_key(b"[{\"a\":0,\"b\":0}]"));
        assert_ne!(a, b);
        let fresh = new_tree_key();
        assert!(fresh != a && fresh != b);
        for key in [a, b, fresh] {
            assert_eq!(key & FLAT, 0, "an interned key has none of the flat bits");
            assert!((0..1024).all(|n| flat_tree_key(n) != key));
        }
    }

    fn form(i: usize) -> Vec<u8> {
        format!("{{\"user{i}\":0}}").into_bytes()
    }

    #[test]
    fn the_interner_keeps_at_most_its_capacity_of_forms() {
        let mut interner = Interner::new(64);
        for i in 0..10_000 {
            interner.key(&form(i));
            assert!(interner.forms.len() <= 64);
        }
        assert!(interner.forms.len() >= 48, "evicts a quarter at a time");
    }

    #[test]
    fn a_form_seen_again_after_eviction_gets_a_key_no_form_has_or_had() {
        let mut interner = Interner::new(16);
        let mut every = std::collections::HashSet::new();
        let first = interner.key(&form(0));
        every.insert(first);
        for i in 1..100 {
            every.insert(interner.key(&form(i)));
        }
        assert!(!interner.forms.contains_key(form(0).as_slice()));
        let again = interner.key(&form(0));
        assert_ne!(again, first);
        assert!(!every.contains(&again), "a fresh key, not an evicted one");
        let live: Vec<u64> = interner.forms.values().map(|f| f.key).collect();
        assert_eq!(live.iter().filter(|&&k| k == again).count(), 1);
        assert_eq!(interner.key(&form(0)), again, "kept from now on");
    }

    #[test]
    fn a_form_in_use_keeps_its_key_among_many_others() {
        let mut interner = Interner::new(16);
        let hot = interner.key(b"hot");
        for i in 0..1_000 {
            interner.key(&form(i));
            assert_eq!(
                interner.key(b"hot"),
                hot,
                "least recently used, not first in, goes"
            );
        }
        assert!(interner.forms.len() <= 16);
    }
}
