//! memcached text protocol parser (memcached 1.6 `doc/protocol.txt`).
//!
//! `parse` looks at the start of a connection's read buffer and returns one frame and how many
//! bytes it used. The caller advances its buffer by `consumed`, then discards `swallow` further
//! bytes (a data block that we refuse without buffering it, e.g. an over-size value), which may
//! not have arrived yet. Errors that memcached answers and recovers from are frames carrying
//! their reply line; the connection stays in sync.

/// Size limits the parser enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A command line without `\n` longer than this closes the connection (memcached: 2048).
    pub max_line: usize,
    /// The same cap for `get`/`gets`/`gat`/`gats` lines, which may carry many keys.
    pub max_multiget_line: usize,
    /// Largest value a storage command may carry (`-I`); larger data blocks are swallowed.
    pub item_size_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_line: 2048, max_multiget_line: 2 * 1024 * 1024, item_size_max: 1024 * 1024 }
    }
}

/// Longest key memcached accepts.
pub const KEY_MAX: usize = 250;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

/// The keys of a retrieval line, validated by the parser; `iter` yields them in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyList<'a>(pub &'a [u8]);

impl<'a> KeyList<'a> {
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.0.split(|&b| b == b' ').filter(|k| !k.is_empty())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get`/`gets <key>+`
    Get { keys: KeyList<'a>, with_cas: bool },
    /// `gat`/`gats <exptime> <key>+`
    Gat { exptime: i64, keys: KeyList<'a>, with_cas: bool },
    /// `set|add|replace|append|prepend <key> <flags> <exptime> <bytes> [noreply]` and
    /// `cas <key> <flags> <exptime> <bytes> <cas> [noreply]` with their data block (without the
    /// trailing `\r\n`). `cas` is 0 for modes other than `Cas`.
    Store {
        mode: StoreMode,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        cas: u64,
        data: &'a [u8],
        noreply: bool,
    },
    /// A well-formed storage line whose `<bytes>` exceeds `item_size_max`. The data block plus
    /// `\r\n` is in `Parsed::swallow`. memcached answers `SERVER_ERROR object too large for
    /// cache` and, for `set`, deletes the old value.
    TooLarge { mode: StoreMode, key: &'a [u8], noreply: bool },
    /// `delete <key> [0] [noreply]`
    Delete { key: &'a [u8], noreply: bool },
    /// `incr|decr <key> <delta> [noreply]`
    Arith { key: &'a [u8], incr: bool, delta: u64, noreply: bool },
    /// `touch <key> <exptime> [noreply]`
    Touch { key: &'a [u8], exptime: i64, noreply: bool },
    /// `flush_all [delay] [noreply]`
    FlushAll { delay: i64, noreply: bool },
    /// `stats [args...]`: `args` is the rest of the line after `stats`, trimmed of spaces.
    Stats { args: &'a [u8] },
    /// `version`
    Version,
    /// `verbosity <level> [noreply]`
    Verbosity { level: u32, noreply: bool },
    /// `quit`
    Quit,
    /// `debug_advance_clock <seconds>`: test-only; the server answers `ERROR` unless it runs
    /// with a manual clock.
    DebugAdvanceClock { seconds: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    Request(Request<'a>),
    /// A complete reply line (without `\r\n`) for a request we reject, e.g. `ERROR` or
    /// `CLIENT_ERROR bad command line format`.
    Error(&'static str),
    /// The input cannot be recovered from (a line with no newline past the limit): close.
    Close,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<'a> {
    pub frame: Frame<'a>,
    /// Bytes of the buffer this frame used.
    pub consumed: usize,
    /// Bytes after `consumed` to discard unseen (a refused data block and its `\r\n`).
    pub swallow: usize,
}

/// More bytes are needed before anything can be decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Incomplete;

/// Parse one frame from the start of `buf`.
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Result<Parsed<'a>, Incomplete> {
    let _ = (buf, limits);
    Err(Incomplete)
}
