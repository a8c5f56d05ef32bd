//! Taking a std lock whatever a panicking holder left behind. The network layer catches a
//! panicking request instead of letting it take the broker down; the locks that request held
//! are then poisoned, and the rest of the broker carries on with the state as it was left
//! rather than failing every later request that touches it.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub trait MutexExt<T: ?Sized> {
    /// `lock()`, taking the guard even when a previous holder panicked.
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> MutexExt<T> for Mutex<T> {
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub trait RwLockExt<T: ?Sized> {
    /// `read()`, taking the guard even when a previous writer panicked.
    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T>;
    /// `write()`, taking the guard even when a previous holder panicked.
    fn write_unpoisoned(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockExt<T> for RwLock<T> {
    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_unpoisoned(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_recovered_with_its_state() {
        let m = Mutex::new(1);
        let l = RwLock::new(2);
        let _ = std::panic::catch_unwind(|| {
            let mut g = m.lock_unpoisoned();
            let mut w = l.write_unpoisoned();
            *g = 3;
            *w = 4;
            panic!("poison both");
        });
        assert!(m.is_poisoned() && l.is_poisoned());
        assert_eq!(*m.lock_unpoisoned(), 3);
        assert_eq!(*l.read_unpoisoned(), 4);
        *l.write_unpoisoned() = 5;
        assert_eq!(*l.read_unpoisoned(), 5);
    }
}
