//! Wire protocols. Parsers are pure functions from bytes to a request plus the number of bytes
//! consumed; needing more bytes is `Incomplete`, never an I/O error. Encoders append replies to a
//! connection's output buffer.

pub mod binary;
pub mod memcache;
pub mod resp;
