//! A seeded pseudo-random sequence for unit tests (xorshift64): the same numbers every run, so
//! a failure repeats, and no dependency.

pub struct Xorshift(pub u64);

impl Xorshift {
    /// The next number of the sequence (the seed must not be 0).
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// The next number, below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
