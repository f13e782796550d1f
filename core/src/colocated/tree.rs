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
//!   which two structures could share).
//!
//! The canonical form is the SDK's, but one rule is everyone's: the keys of a
//! dict (a JavaScript object) are sorted, as JAX's pytrees (optree) sort
//! them, so `{a, b}` and `{b, a}` are one structure, their leaves are
//! flattened in sorted key order, and they take the same program.
//!
//! [`CallSpec::tree`]: super::CallSpec::tree

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

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

/// Interned canonical forms and their keys.
static INTERNED: Mutex<Option<HashMap<Box<[u8]>, u64>>> = Mutex::new(None);

/// The tree key of the structure whose canonical form is `canonical` (bytes
/// that are equal exactly when the structures are: dict keys sorted, see the
/// module docs): the same key for the same form, for the life of the
/// process. Thread-safety: any thread.
pub fn tree_key(canonical: &[u8]) -> u64 {
    let mut interned = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
    let map = interned.get_or_insert_with(HashMap::new);
    if let Some(&key) = map.get(canonical) {
        return key;
    }
    let key = new_tree_key();
    map.insert(canonical.into(), key);
    key
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
}
