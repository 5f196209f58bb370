//! Time source. Nothing below `main` reads the system time directly: the server gets a `Clock`,
//! and tests run it manually (frozen, advanced on command) so expiry is tested without sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug)]
pub enum Clock {
    /// Wall-clock time.
    System,
    /// A frozen clock in unix milliseconds, moved only by `advance`.
    Manual(AtomicU64),
}

impl Clock {
    pub fn manual(start_ms: u64) -> Clock {
        Clock::Manual(AtomicU64::new(start_ms))
    }

    /// Unix time in milliseconds.
    pub fn now_ms(&self) -> u64 {
        match self {
            Clock::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            Clock::Manual(ms) => ms.load(Ordering::Acquire),
        }
    }

    /// Moves a manual clock forward; returns false for the system clock, which cannot move.
    pub fn advance(&self, ms: u64) -> bool {
        match self {
            Clock::System => false,
            Clock::Manual(now) => {
                now.fetch_add(ms, Ordering::AcqRel);
                true
            }
        }
    }

    pub fn is_manual(&self) -> bool {
        matches!(self, Clock::Manual(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let c = Clock::manual(1_000);
        assert_eq!(c.now_ms(), 1_000);
        assert!(c.advance(2_500));
        assert_eq!(c.now_ms(), 3_500);
    }

    #[test]
    fn system_clock_cannot_be_advanced() {
        let c = Clock::System;
        assert!(!c.advance(1));
        assert!(c.now_ms() > 1_600_000_000_000);
    }
}
