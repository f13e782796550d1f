//! Call specs: the rules that derive a call's devices from its inputs, and the
//! cache of compiled programs keyed by input spec, with a fast path that
//! compares shardings by identity.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::sharding::same_device_set;
use crate::spec::ArraySpec;

/// The spec of a call: the key of its argument structure (see
/// [`flat_tree_key`](super::flat_tree_key) and [`tree_key`](super::tree_key))
/// and the spec of every leaf array, in flattening order.
#[derive(Clone, Debug)]
pub struct CallSpec {
    /// The key of the argument structure.
    pub tree: u64,
    /// One spec per leaf.
    pub leaves: Vec<ArraySpec>,
}

impl CallSpec {
    /// The devices of the call: those of the leaves' shardings, which must all use
    /// the same device set; with no leaves, `devices` (the function's
    /// specialization) or `invalid_argument`.
    pub fn devices(&self, devices: Option<&[Device]>) -> Result<Vec<Device>> {
        let Some(first) = self.leaves.first() else {
            return devices.map(<[Device]>::to_vec).ok_or_else(|| {
                // JAX's words, which code ported from JAX matches.
                Error::invalid_argument(
                    "No devices found. colocated_python function without input arguments must be first \
                     specialized with devices.",
                )
            });
        };
        for (i, leaf) in self.leaves.iter().enumerate().skip(1) {
            if !leaf.sharding.same_device_set(&first.sharding) {
                return Err(Error::invalid_argument(format!(
                    "inputs are on different device lists: input 0 on {:?}, input {i} on {:?}",
                    ids(first.sharding.devices()),
                    ids(leaf.sharding.devices())
                )));
            }
        }
        if let Some(devices) = devices {
            if !same_device_set(devices, first.sharding.devices()) {
                return Err(Error::invalid_argument(format!(
                    "the inputs are on devices {:?} but the function is specialized to {:?}",
                    ids(first.sharding.devices()),
                    ids(devices)
                )));
            }
        }
        Ok(first.sharding.devices().to_vec())
    }

    /// `invalid_argument` unless this call matches `expected` (a specialization's
    /// `in_specs`): same tree, and every leaf with the same shape, dtype and an
    /// equivalent sharding.
    pub fn check_matches(&self, expected: &CallSpec) -> Result<()> {
        if self.tree != expected.tree || self.leaves.len() != expected.leaves.len() {
            return Err(Error::invalid_argument(format!(
                "the call's arguments have another structure than the specialized in_specs ({} leaves, expected {})",
                self.leaves.len(),
                expected.leaves.len()
            )));
        }
        for (i, (got, want)) in self.leaves.iter().zip(&expected.leaves).enumerate() {
            if !got.matches(want) {
                return Err(Error::invalid_argument(format!(
                    "argument leaf {i} is {} with {:?} but in_specs says {} with {:?}",
                    got.describe(),
                    got.sharding,
                    want.describe(),
                    want.sharding
                )));
            }
        }
        Ok(())
    }
}

fn ids(devices: &[Device]) -> Vec<u32> {
    devices.iter().map(Device::id).collect()
}

/// Compares specs by sharding identity: cheap, used first.
struct ByIdentity(CallSpec);
/// Compares specs by value (equivalent shardings): used when identity misses.
struct ByValue(CallSpec);

impl Hash for ByIdentity {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.tree.hash(h);
        for leaf in &self.0.leaves {
            (leaf.dtype as u32, &leaf.shape, leaf.sharding.identity()).hash(h);
        }
    }
}
impl PartialEq for ByIdentity {
    fn eq(&self, other: &Self) -> bool {
        self.0.tree == other.0.tree
            && self.0.leaves.len() == other.0.leaves.len()
            && self.0.leaves.iter().zip(&other.0.leaves).all(|(a, b)| {
                a.dtype == b.dtype && a.shape == b.shape && a.sharding.same_as(&b.sharding)
            })
    }
}
impl Eq for ByIdentity {}

impl Hash for ByValue {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.tree.hash(h);
        for leaf in &self.0.leaves {
            (leaf.dtype as u32, &leaf.shape, ids(leaf.sharding.devices())).hash(h);
        }
    }
}
impl PartialEq for ByValue {
    fn eq(&self, other: &Self) -> bool {
        self.0.tree == other.0.tree
            && self.0.leaves.len() == other.0.leaves.len()
            && self
                .0
                .leaves
                .iter()
                .zip(&other.0.leaves)
                .all(|(a, b)| a.matches(b))
    }
}
impl Eq for ByValue {}

struct Maps<V> {
    by_identity: HashMap<ByIdentity, V>,
    by_value: HashMap<ByValue, V>,
}

/// Hit and miss counts of a [`SpecCache`] (as `functools.lru_cache`'s
/// `cache_info()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheInfo {
    /// Lookups that found an entry.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Entries held.
    pub currsize: usize,
}

/// One compiled program (or whatever an SDK keeps, `V`) per call spec.
///
/// A lookup first compares shardings by identity (the SDK hands the same
/// `Sharding` for equal sharding objects), and only on a miss compares them by
/// value. Entries keep their shardings alive, so identities cannot be reused.
pub struct SpecCache<V> {
    maps: Mutex<Maps<V>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl<V: Clone> Default for SpecCache<V> {
    fn default() -> Self {
        SpecCache {
            maps: Mutex::new(Maps {
                by_identity: HashMap::new(),
                by_value: HashMap::new(),
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }
}

impl<V: Clone> SpecCache<V> {
    /// The entry for `spec`, counting a hit or a miss.
    pub fn get(&self, spec: &CallSpec) -> Option<V> {
        self.lookup(spec, true)
    }

    /// Like [`get`](Self::get), but a miss is not counted: for a fast path whose
    /// miss falls back to a slower path that looks again (and counts it).
    pub fn get_hit(&self, spec: &CallSpec) -> Option<V> {
        self.lookup(spec, false)
    }

    /// Whether there is an entry for `spec` (counting nothing).
    pub fn contains(&self, spec: &CallSpec) -> bool {
        let maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        maps.by_identity.contains_key(&ByIdentity(spec.clone()))
            || maps.by_value.contains_key(&ByValue(spec.clone()))
    }

    fn lookup(&self, spec: &CallSpec, count_miss: bool) -> Option<V> {
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        let key = ByIdentity(spec.clone());
        if let Some(v) = maps.by_identity.get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Some(v.clone());
        }
        match maps.by_value.get(&ByValue(spec.clone())).cloned() {
            Some(v) => {
                maps.by_identity.insert(key, v.clone());
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(v)
            }
            None => {
                if count_miss {
                    self.misses.fetch_add(1, Ordering::Relaxed);
                }
                None
            }
        }
    }

    /// Stores `value` for `spec` (replacing any entry). A replaced entry is
    /// dropped after the cache's lock is released (dropping an SDK's value
    /// may run user code that uses the cache).
    pub fn insert(&self, spec: &CallSpec, value: V) {
        let replaced = {
            let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
            let a = maps
                .by_identity
                .insert(ByIdentity(spec.clone()), value.clone());
            let b = maps.by_value.insert(ByValue(spec.clone()), value);
            (a, b)
        };
        drop(replaced);
    }

    /// Drops every entry (after releasing the cache's lock, see
    /// [`insert`](Self::insert)) and resets the counts.
    pub fn clear(&self) {
        let dropped = {
            let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
            self.hits.store(0, Ordering::Relaxed);
            self.misses.store(0, Ordering::Relaxed);
            (
                std::mem::take(&mut maps.by_identity),
                std::mem::take(&mut maps.by_value),
            )
        };
        drop(dropped);
    }

    /// Hits, misses and size.
    pub fn info(&self) -> CacheInfo {
        let maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        CacheInfo {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            currsize: maps.by_value.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Client, ClientOptions};
    use crate::dtype::DType;
    use crate::error::ErrorCode;
    use crate::sharding::Sharding;

    fn client() -> Client {
        Client::new_local(ClientOptions {
            num_cpu_devices: Some(4),
            executor_threads: Some(2),
            ..Default::default()
        })
        .unwrap()
    }

    fn spec(sharding: &Sharding, shape: Vec<i64>) -> ArraySpec {
        ArraySpec::new(shape, DType::F32, sharding.clone()).unwrap()
    }

    #[test]
    fn equal_shardings_hit_by_value_then_by_identity() {
        let c = client();
        let devices = c.devices()[..2].to_vec();
        let a = Sharding::replicated(devices.clone()).unwrap();
        let b = Sharding::replicated(devices).unwrap();
        let cache: SpecCache<u32> = SpecCache::default();
        let call = |s: &Sharding, shape| CallSpec {
            tree: 7,
            leaves: vec![spec(s, shape)],
        };
        assert_eq!(cache.get(&call(&a, vec![4])), None);
        cache.insert(&call(&a, vec![4]), 1);
        assert_eq!(cache.get(&call(&a, vec![4])), Some(1));
        assert_eq!(
            cache.get(&call(&b, vec![4])),
            Some(1),
            "an equal sharding object hits"
        );
        assert_eq!(cache.get(&call(&b, vec![8])), None, "another shape misses");
        assert_eq!(
            cache.get(&CallSpec {
                tree: 8,
                leaves: vec![spec(&a, vec![4])]
            }),
            None,
            "another tree misses"
        );
        assert_eq!(
            cache.info(),
            CacheInfo {
                hits: 2,
                misses: 3,
                currsize: 1
            }
        );
        cache.clear();
        assert_eq!(
            cache.info(),
            CacheInfo {
                hits: 0,
                misses: 0,
                currsize: 0
            }
        );
    }

    #[test]
    fn get_hit_counts_hits_but_leaves_misses_to_the_slower_path() {
        let c = client();
        let sharding = Sharding::replicated(c.devices()[..1].to_vec()).unwrap();
        let call = CallSpec {
            tree: 1,
            leaves: vec![spec(&sharding, vec![2])],
        };
        let cache: SpecCache<u32> = SpecCache::default();
        assert_eq!(cache.get_hit(&call), None);
        assert_eq!(cache.info().misses, 0, "a fast-path miss is not counted");
        assert_eq!(cache.get(&call), None);
        cache.insert(&call, 5);
        assert_eq!(cache.get_hit(&call), Some(5));
        assert_eq!(
            cache.info(),
            CacheInfo {
                hits: 1,
                misses: 1,
                currsize: 1
            }
        );
    }

    #[test]
    fn call_devices_come_from_the_inputs_or_the_specialization() {
        let c = client();
        let first = Sharding::replicated(c.devices()[..2].to_vec()).unwrap();
        let other = Sharding::replicated(c.devices()[2..].to_vec()).unwrap();
        let none = CallSpec {
            tree: 0,
            leaves: vec![],
        };
        let err = none.devices(None).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        assert_eq!(
            err.message(),
            "No devices found. colocated_python function without input arguments must be first \
             specialized with devices."
        );
        assert_eq!(
            none.devices(Some(&c.devices()[..1])).unwrap(),
            c.devices()[..1].to_vec()
        );
        let mixed = CallSpec {
            tree: 0,
            leaves: vec![spec(&first, vec![2]), spec(&other, vec![2])],
        };
        assert!(mixed
            .devices(None)
            .unwrap_err()
            .message()
            .contains("different device lists"));
        let one = CallSpec {
            tree: 0,
            leaves: vec![spec(&first, vec![2])],
        };
        assert_eq!(one.devices(None).unwrap(), c.devices()[..2].to_vec());
        assert!(one
            .devices(Some(&c.devices()[2..]))
            .unwrap_err()
            .message()
            .contains("specialized to"));
        let err = one
            .check_matches(&CallSpec {
                tree: 0,
                leaves: vec![spec(&first, vec![4])],
            })
            .unwrap_err();
        assert!(err.message().contains("in_specs says"), "{err}");
    }
}
