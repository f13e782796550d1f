//! The registry of values of this process that programs refer to by
//! reference: the controller's own callables (a colocated function, a
//! colocated class) that its own host runs as they are, without
//! serializing them, as JAX does for local devices.
//!
//! An SDK registers a value and gets a [`LocalValue`]; its
//! [`reference`](LocalValue::reference) (text) goes in the program's payload.
//! The language executor's `load` hands the reference to
//! [`LocalValue::resolve`], which checks that it names a live value of this
//! process and gives the same `LocalValue`. The value stays registered while
//! any `LocalValue` of it lives (the SDK's function object holds one, each
//! loaded program another) and goes with the last of them: nothing grows
//! while functions come and go, and nothing goes while a call needs it.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, Result};
use crate::process::PerProcess;

/// What every reference starts with (then the process's token and the key,
/// `colocated-local:<16 hex digits>:<decimal key>`).
pub const LOCAL_REFERENCE_PREFIX: &str = "colocated-local:";

/// The registry of this process (a forked child makes its own, with a token
/// of its own: its parent's references are not its).
struct Registry {
    /// Random, per process: a reference made elsewhere does not match it.
    token: u64,
    next: AtomicU64,
    entries: Mutex<HashMap<u64, Weak<Entry>>>,
}

static REGISTRY: PerProcess<Registry> = PerProcess::new();

fn registry() -> &'static Registry {
    REGISTRY.get_or_init(|| Registry {
        token: process_token(),
        next: AtomicU64::new(1),
        entries: Mutex::new(HashMap::new()),
    })
}

/// A random token for this process (a counter mixed with the clock and the
/// process id without the system's randomness).
fn process_token() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_ok() {
        return u64::from_le_bytes(bytes);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t.rotate_left(17) ^ u64::from(std::process::id())
}

impl Registry {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Weak<Entry>>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One registered value.
struct Entry {
    registry: &'static Registry,
    key: u64,
    value: Arc<dyn Any + Send + Sync>,
}

impl Drop for Entry {
    /// Unregisters the value (its own drop runs after this, with no lock of
    /// core held). A child forked after it was registered leaves its
    /// parent's registry alone (its lock may have been held at the fork).
    fn drop(&mut self) {
        if !std::ptr::eq(self.registry, registry()) {
            return;
        }
        let mut entries = self.registry.entries();
        // Only this entry's own slot: a key is never used twice.
        if entries
            .get(&self.key)
            .is_some_and(|w| w.strong_count() == 0)
        {
            entries.remove(&self.key);
        }
    }
}

/// A value of this process registered for programs to refer to: cloning it
/// keeps the same registration. The value is dropped (on the thread that
/// drops the last `LocalValue`, with no lock of core held) when the last
/// clone goes; a language whose values must be released on a thread of
/// their own registers a `Send` token whose drop sends them there.
#[derive(Clone)]
pub struct LocalValue(Arc<Entry>);

impl LocalValue {
    /// Registers `value` and gives its handle.
    pub fn register(value: Arc<dyn Any + Send + Sync>) -> LocalValue {
        let registry = registry();
        let key = registry.next.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(Entry {
            registry,
            key,
            value,
        });
        registry.entries().insert(key, Arc::downgrade(&entry));
        LocalValue(entry)
    }

    /// The text that names this value in a program's payload (ASCII, without
    /// quotes or backslashes: it fits in JSON as it is).
    pub fn reference(&self) -> String {
        format!(
            "{LOCAL_REFERENCE_PREFIX}{:016x}:{}",
            self.0.registry.token, self.0.key
        )
    }

    /// The registered value.
    pub fn value(&self) -> &Arc<dyn Any + Send + Sync> {
        &self.0.value
    }

    /// The registered value as a `T`, if it is one.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        let value: &(dyn Any + Send + Sync) = &*self.0.value;
        value.downcast_ref::<T>()
    }

    /// Whether `payload` is a reference (begins as one; it may still be
    /// malformed, which [`resolve`](Self::resolve) says).
    pub fn is_reference(payload: &[u8]) -> bool {
        payload.starts_with(LOCAL_REFERENCE_PREFIX.as_bytes())
    }

    /// The value `reference` names, kept registered while the result lives.
    ///
    /// Errors (`InvalidArgument`): a reference that does not parse, one made
    /// by another process (a program serialized and loaded elsewhere, or a
    /// forked child's parent), and one whose value is no longer registered
    /// (every handle of it went) or never was.
    pub fn resolve(reference: &[u8]) -> Result<LocalValue> {
        let shown =
            || crate::error::bound_text(&String::from_utf8_lossy(reference), 80).into_owned();
        let malformed = || {
            Error::invalid_argument(format!(
                "malformed reference to a value of the controller's process: {}",
                shown()
            ))
        };
        let rest = reference
            .strip_prefix(LOCAL_REFERENCE_PREFIX.as_bytes())
            .ok_or_else(malformed)?;
        let rest = std::str::from_utf8(rest).map_err(|_| malformed())?;
        let (token, key) = rest.split_once(':').ok_or_else(malformed)?;
        let parsed = (token.len() == 16)
            .then(|| u64::from_str_radix(token, 16).ok())
            .flatten()
            .zip(key.parse::<u64>().ok().filter(|_| !key.starts_with('+')));
        let (token, key) = parsed.ok_or_else(malformed)?;
        let registry = registry();
        if token != registry.token {
            return Err(Error::invalid_argument(format!(
                "{} refers to a value of another process: only the process that made the program runs it by reference",
                shown()
            )));
        }
        let entry = registry.entries().get(&key).and_then(Weak::upgrade);
        entry.map(LocalValue).ok_or_else(|| {
            Error::invalid_argument(format!(
                "{} names no value of this process (it was released, or never registered)",
                shown()
            ))
        })
    }
}

impl fmt::Debug for LocalValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LocalValue")
            .field(&self.reference())
            .finish()
    }
}

/// How many values this process has registered now (for diagnostics and
/// tests: it returns to where it was when the functions that made them, and
/// the programs that loaded them, are gone).
pub fn local_values() -> usize {
    registry()
        .entries()
        .values()
        .filter(|w| w.strong_count() > 0)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code_and_message(reference: &[u8]) -> (crate::error::ErrorCode, String) {
        let err = LocalValue::resolve(reference).expect_err("refused");
        (err.code(), err.message().to_string())
    }

    #[test]
    fn a_reference_resolves_to_its_value_while_a_handle_lives() {
        let value = LocalValue::register(Arc::new(41_u32));
        let reference = value.reference();
        assert!(LocalValue::is_reference(reference.as_bytes()));
        let loaded = LocalValue::resolve(reference.as_bytes()).expect("resolves");
        assert_eq!(loaded.downcast_ref::<u32>(), Some(&41));
        assert_eq!(loaded.downcast_ref::<u64>(), None);
        // The loaded program's handle keeps it after the SDK's went.
        drop(value);
        assert_eq!(
            LocalValue::resolve(reference.as_bytes())
                .expect("still registered")
                .downcast_ref::<u32>(),
            Some(&41)
        );
        drop(loaded);
        let (code, message) = code_and_message(reference.as_bytes());
        assert_eq!(code, crate::error::ErrorCode::InvalidArgument);
        assert!(
            message.contains("names no value of this process"),
            "{message}"
        );
    }

    #[test]
    fn the_value_is_dropped_with_its_last_handle() {
        struct Counted(Arc<AtomicU64>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicU64::new(0));
        let value = LocalValue::register(Arc::new(Counted(dropped.clone())));
        let key = value.0.key;
        let other = value.clone();
        drop(value);
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
        assert!(registry().entries().contains_key(&key));
        drop(other);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        assert!(
            !registry().entries().contains_key(&key),
            "the slot went too"
        );
    }

    #[test]
    fn values_of_dropped_handles_leave_the_registry() {
        let mine: Vec<LocalValue> = (0..100)
            .map(|i| LocalValue::register(Arc::new(i)))
            .collect();
        let keys: Vec<u64> = mine.iter().map(|v| v.0.key).collect();
        drop(mine);
        let entries = registry().entries();
        assert!(keys.iter().all(|k| !entries.contains_key(k)));
    }

    #[test]
    fn a_reference_of_another_process_is_refused() {
        let value = LocalValue::register(Arc::new(()));
        let key = value.0.key;
        let foreign = format!(
            "{LOCAL_REFERENCE_PREFIX}{:016x}:{key}",
            registry().token.wrapping_add(1)
        );
        let (code, message) = code_and_message(foreign.as_bytes());
        assert_eq!(code, crate::error::ErrorCode::InvalidArgument);
        assert!(message.contains("another process"), "{message}");
    }

    #[test]
    fn forged_and_malformed_references_are_refused() {
        let token = registry().token;
        let never = format!("{LOCAL_REFERENCE_PREFIX}{token:016x}:{}", u64::MAX);
        let (code, message) = code_and_message(never.as_bytes());
        assert_eq!(code, crate::error::ErrorCode::InvalidArgument);
        assert!(message.contains("names no value"), "{message}");
        for bad in [
            b"colocated-local:".to_vec(),
            b"colocated-local:12:3".to_vec(),
            format!("{LOCAL_REFERENCE_PREFIX}{token:016x}:").into_bytes(),
            format!("{LOCAL_REFERENCE_PREFIX}{token:016x}:+1").into_bytes(),
            format!("{LOCAL_REFERENCE_PREFIX}{token:016x}:x").into_bytes(),
            b"colocated-local:\xff\xfe:1".to_vec(),
            b"cloudpickle bytes".to_vec(),
        ] {
            let (code, message) = code_and_message(&bad);
            assert_eq!(code, crate::error::ErrorCode::InvalidArgument);
            assert!(message.starts_with("malformed reference"), "{message}");
        }
    }

    #[test]
    fn local_values_counts_live_registrations() {
        // (Other tests register and release at the same time.)
        let mine: Vec<LocalValue> = (0..10)
            .map(|_| LocalValue::register(Arc::new(())))
            .collect();
        assert!(local_values() >= 10);
        let keys: Vec<u64> = mine.iter().map(|v| v.0.key).collect();
        drop(mine);
        let entries = registry().entries();
        assert!(keys.iter().all(|k| !entries.contains_key(k)));
    }
}
