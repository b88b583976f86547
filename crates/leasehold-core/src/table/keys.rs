//! A lease's keys: the ones it holds, or the ones it waits for.

use std::collections::BTreeSet;
use std::sync::Arc;

/// A set of keys, in key order, sharing the lock table's `Arc`s.
///
/// Most leases hold one key or none and wait for none, so those take no
/// allocation of their own: a `BTreeSet` keeps even a single key in a node
/// with room for eleven, 192 bytes, which at a million sessions was about a
/// fifth of a node's memory. A set of two or more is a boxed `BTreeSet`, so
/// a lease holding a million keys costs about what it did.
///
/// Each set has one form: `Many` always has two keys or more, so two equal
/// sets compare equal however they were built.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) enum Keys {
    #[default]
    None,
    One(Arc<str>),
    /// Boxed, so a `Keys` is 24 bytes, as a `BTreeSet` is, and a lease stays
    /// 96 (unboxed, they would be 32 and 112).
    #[allow(clippy::box_collection)]
    Many(Box<BTreeSet<Arc<str>>>),
}

/// The keys of a [`Keys`], in order.
pub(super) type Iter<'a> = std::iter::Chain<
    std::option::IntoIter<&'a Arc<str>>,
    std::iter::Flatten<std::option::IntoIter<&'a BTreeSet<Arc<str>>>>,
>;

impl Keys {
    pub(super) fn len(&self) -> usize {
        match self {
            Keys::None => 0,
            Keys::One(_) => 1,
            Keys::Many(keys) => keys.len(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        matches!(self, Keys::None)
    }

    pub(super) fn contains(&self, key: &str) -> bool {
        match self {
            Keys::None => false,
            Keys::One(one) => &**one == key,
            Keys::Many(keys) => keys.contains(key),
        }
    }

    /// Adds `key`; false if it was there already.
    pub(super) fn insert(&mut self, key: Arc<str>) -> bool {
        match self {
            Keys::None => {
                *self = Keys::One(key);
                true
            }
            Keys::One(one) if *one == key => false,
            Keys::One(one) => {
                let both = BTreeSet::from([one.clone(), key]);
                *self = Keys::Many(Box::new(both));
                true
            }
            Keys::Many(keys) => keys.insert(key),
        }
    }

    /// Takes `key` out; false if it was not there.
    pub(super) fn remove(&mut self, key: &str) -> bool {
        match self {
            Keys::None => false,
            Keys::One(one) => {
                if &**one != key {
                    return false;
                }
                *self = Keys::None;
                true
            }
            Keys::Many(keys) => {
                if !keys.remove(key) {
                    return false;
                }
                if keys.len() == 1 {
                    if let Some(last) = keys.pop_first() {
                        *self = Keys::One(last);
                    }
                }
                true
            }
        }
    }

    /// Whether the set is in its one form (`Many` holds two keys or more).
    pub(super) fn is_in_one_form(&self) -> bool {
        !matches!(self, Keys::Many(keys) if keys.len() < 2)
    }

    pub(super) fn iter(&self) -> Iter<'_> {
        let (one, many) = match self {
            Keys::None => (None, None),
            Keys::One(one) => (Some(one), None),
            Keys::Many(keys) => (None, Some(&**keys)),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

impl<'a> IntoIterator for &'a Keys {
    type Item = &'a Arc<str>;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl FromIterator<Arc<str>> for Keys {
    fn from_iter<I: IntoIterator<Item = Arc<str>>>(iter: I) -> Self {
        let mut keys: BTreeSet<Arc<str>> = iter.into_iter().collect();
        match keys.len() {
            0 => Keys::None,
            1 => keys.pop_first().map_or(Keys::None, Keys::One),
            _ => Keys::Many(Box::new(keys)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Arc<str> {
        k.into()
    }

    #[test]
    fn keys_keep_one_form_whatever_built_them() {
        let mut grown = Keys::default();
        assert!(grown.insert(key("b")));
        assert!(!grown.insert(key("b")));
        assert!(grown.insert(key("a")));
        assert!(grown.insert(key("c")));
        assert_eq!(
            grown.iter().map(|k| &**k).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert_eq!(grown.len(), 3);

        assert!(grown.remove("c"));
        assert!(!grown.remove("c"));
        assert!(grown.remove("a"));
        assert_eq!(grown, Keys::One(key("b")));
        assert!(grown.is_in_one_form());
        assert!(!Keys::Many(Box::new(BTreeSet::from([key("b")]))).is_in_one_form());
        assert!(grown.contains("b") && !grown.contains("a"));
        assert_eq!(grown, [key("b")].into_iter().collect());

        assert!(grown.remove("b"));
        assert_eq!(grown, Keys::None);
        assert!(grown.is_empty() && grown.iter().next().is_none());
        assert_eq!(grown, std::iter::empty().collect());
    }

    #[test]
    fn the_tables_check_refuses_a_set_of_one_kept_as_many() {
        use crate::{Command, Mode, Stamp};
        let mut table = super::super::LockTable::new();
        let stamp = Stamp { now: 1, epoch: 1 };
        let grant = Command::GrantAndAcquire {
            ttl_ms: 10_000,
            holder: "a".into(),
            key: "k".into(),
            wait_ms: 0,
            lock_delay_ms: 0,
            request_id: 0,
            mode: Mode::Exclusive,
        };
        table.apply(stamp, grant, &mut Vec::new()).unwrap();
        assert_eq!(table.check_invariants(), Ok(()));
        let lease = table.state.leases.values_mut().next().unwrap();
        lease.held = Keys::Many(Box::new(BTreeSet::from([key("k")])));
        assert!(table.check_invariants().is_err());
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn keys_take_24_bytes_and_a_lease_96() {
        assert_eq!(std::mem::size_of::<Keys>(), 24);
        assert_eq!(std::mem::size_of::<super::super::lock::Lease>(), 96);
    }
}
