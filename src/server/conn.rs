//! One client connection: its socket and bounded buffers.
//!
//! The read buffer is a zero-filled `Vec` with `[rpos, rend)` the unparsed bytes, so reads go
//! straight into it without unsafe code; it grows up to `read_cap` (enough for the largest
//! request) and, once empty, shrinks back if it grew past `READ_KEEP`. The write buffer holds
//! encoded replies not yet sent; past `WRITE_HIGH` pending bytes the connection stops taking
//! requests until the client reads.

use std::io::{self, Read, Write};

use mio::net::TcpStream;

use super::stats::Counters;

/// Initial read buffer size, and what an emptied one larger than `READ_KEEP` goes back to.
const READ_INITIAL: usize = 16 * 1024;
/// A read buffer grown past `READ_INITIAL` is kept, once empty, up to this size (as `wbuf` is up
/// to `WRITE_KEEP`); a larger one goes back to `READ_INITIAL`. Why: a client storing values a
/// little over 16 KiB grew the buffer for every request (a realloc that copied what was read
/// and zeroed the rest) and replaced it by a fresh zeroed one after it: 3.3% of the server's
/// samples with 16 clients SETting 20 KiB values under a 1 GiB cap (perf, `--sync never`).
const READ_KEEP: usize = 64 * 1024;
/// Above this much unsent output, stop parsing requests until the client catches up.
pub const WRITE_HIGH: usize = 4 * 1024 * 1024;
/// Writes one connection may have waiting for the writer; past this it stops taking requests
/// until some commit (a pipelining client cannot queue unbounded work in memory).
pub const MAX_INFLIGHT: usize = 128;
/// A multi-key reply paused at `WRITE_HIGH` resumes once the unsent output is below this, so
/// each resumption (which parses the request again) sends at least this much.
pub const RESUME_BELOW: usize = WRITE_HIGH / 2;
thread_local! {
    /// The worker's buffer for `fill_tls` (made once per thread, not zeroed per read).
    static TLS_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// What `fill_tls` reads from the socket at once: a whole TLS record (16 KiB of plain text and
/// its overhead) fits.
const TLS_READ: usize = 17 * 1024;
/// Write buffers larger than this are released once flushed.
const WRITE_KEEP: usize = 256 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Memcache,
    Resp,
}

pub struct Conn {
    pub stream: TcpStream,
    pub proto: Proto,
    /// Distinguishes this connection from earlier ones that used the same slab slot, so a late
    /// write completion never reaches the wrong client.
    pub epoch: u32,
    rbuf: Vec<u8>,
    rpos: usize,
    rend: usize,
    read_cap: usize,
    pub wbuf: Vec<u8>,
    wpos: usize,
    /// Bytes still to discard from the input (a refused data block).
    pub swallow: usize,
    /// Writes sent to the writer whose completions have not come back.
    pub inflight: usize,
    /// The socket may have more bytes to read (we stopped before WouldBlock).
    pub readable: bool,
    /// The peer closed its sending side.
    pub eof: bool,
    /// The poller reported the peer's close: read until EOF, never stop at a short read.
    pub hup: bool,
    /// Close once the pending output is flushed (quit, fatal protocol error).
    pub closing: bool,
    /// The socket failed: close now.
    pub broken: bool,
    /// WRITABLE interest is registered.
    pub want_write: bool,
    /// Queued for processing in the current event-loop pass.
    pub dirty: bool,
    /// The client's address, for log lines.
    pub peer: Option<std::net::SocketAddr>,
    /// memcached ASCII authentication or SASL (`auth_file`) succeeded on this connection.
    pub mc_authed: bool,
    /// The user who authenticated may only read (`auth_readonly`): writes are refused.
    pub mc_readonly: bool,
    /// The memcached port's connection speaks the binary protocol (decided by its first byte).
    pub mc_binary: Option<bool>,
    /// A binary `SASL_AUTH` without data is waiting for its `SASL_STEP`.
    pub sasl_continue: bool,
    /// When the client last sent bytes (for `idle_timeout`).
    pub last_active: std::time::Instant,
    /// A memcached `get`/`gets` whose reply was paused at `WRITE_HIGH`: the offset in its key
    /// list of the next key to answer; 0 when none is paused. The request stays in the input.
    pub get_resume: usize,
    /// A request waits for a reader thread to bring its values into memory (`cold.rs`).
    pub cold_wait: bool,
    /// Requests in a row that waited so (see `worker::COLD_TRIES`).
    pub cold_tries: u8,
    /// Reads on the worker's ring not yet back (`uring.rs`); the wait ends at zero.
    pub cold_reads: u16,
    /// What the reader thread read for it, for its next run.
    pub fetched: Vec<crate::storage::resident::Fetched>,
    /// RESP state (protocol version, authentication, name); unused on the memcached port.
    pub resp: super::resp::Session,
    resp_bufs: super::resp::ArgBufs,
    /// Meta writes in flight: what their replies echo.
    pub meta_echo: super::meta::EchoQueue,
    /// The TLS session of a connection to a TLS port: the socket carries its records, and
    /// `rbuf`/`wbuf` hold the plain text on either side of it.
    pub tls: Option<Box<rustls::ServerConnection>>,
    /// Records read from the socket that rustls would not take yet (its plain text buffer was
    /// full because `rbuf` was): fed to it before the socket is read again. Usually empty.
    tls_in: Vec<u8>,
    /// A key dump answered in chunks (`dump.rs`): where it stands. Its request stays in the
    /// input until it ends.
    pub dump: Option<super::dump::Cursor>,
}

impl Conn {
    pub fn new(stream: TcpStream, proto: Proto, epoch: u32, read_cap: usize) -> Conn {
        Conn {
            stream,
            proto,
            epoch,
            rbuf: vec![0; READ_INITIAL.min(read_cap)],
            rpos: 0,
            rend: 0,
            read_cap,
            wbuf: Vec::new(),
            wpos: 0,
            swallow: 0,
            inflight: 0,
            readable: true,
            eof: false,
            hup: false,
            closing: false,
            broken: false,
            want_write: false,
            dirty: false,
            peer: None,
            mc_authed: false,
            mc_readonly: false,
            mc_binary: None,
            sasl_continue: false,
            last_active: std::time::Instant::now(),
            get_resume: 0,
            cold_wait: false,
            cold_tries: 0,
            cold_reads: 0,
            fetched: Vec::new(),
            resp: super::resp::Session::default(),
            resp_bufs: super::resp::ArgBufs::default(),
            meta_echo: Default::default(),
            tls: None,
            tls_in: Vec::new(),
            dump: None,
        }
    }

    /// The unparsed input.
    pub fn input(&self) -> &[u8] {
        &self.rbuf[self.rpos..self.rend]
    }

    /// The unparsed input, the output buffer and the RESP session, borrowed together.
    pub fn resp_io(
        &mut self,
    ) -> (
        &[u8],
        &mut Vec<u8>,
        &mut super::resp::ArgBufs,
        &mut super::resp::Session,
    ) {
        (
            &self.rbuf[self.rpos..self.rend],
            &mut self.wbuf,
            &mut self.resp_bufs,
            &mut self.resp,
        )
    }

    /// The unparsed input fills the buffer to its cap: a request this large can never complete.
    pub fn input_full(&self) -> bool {
        self.rend - self.rpos >= self.read_cap
    }

    /// The unparsed input, the output buffer and the meta echo queue, borrowed together.
    pub fn io(&mut self) -> (&[u8], &mut Vec<u8>, &mut super::meta::EchoQueue) {
        (
            &self.rbuf[self.rpos..self.rend],
            &mut self.wbuf,
            &mut self.meta_echo,
        )
    }

    /// `io`, and the connection's key dump in progress.
    pub fn io_dump(
        &mut self,
    ) -> (
        &[u8],
        &mut Vec<u8>,
        &mut super::meta::EchoQueue,
        &mut Option<super::dump::Cursor>,
    ) {
        (
            &self.rbuf[self.rpos..self.rend],
            &mut self.wbuf,
            &mut self.meta_echo,
            &mut self.dump,
        )
    }

    pub fn consume(&mut self, n: usize) {
        self.rpos += n;
        debug_assert!(self.rpos <= self.rend);
        if self.rpos == self.rend {
            self.rpos = 0;
            self.rend = 0;
            if self.rbuf.len() > READ_KEEP {
                self.rbuf = vec![0; READ_INITIAL.min(self.read_cap)];
            }
        }
    }

    /// Discards as much of a pending swallow as is buffered.
    pub fn swallow_buffered(&mut self) {
        let n = self.swallow.min(self.rend - self.rpos);
        self.swallow -= n;
        self.consume(n);
    }

    /// Too much is waiting (unsent replies, or writes not yet committed) to take more requests.
    pub fn backlogged(&self) -> bool {
        self.pending_output() >= WRITE_HIGH || self.inflight >= MAX_INFLIGHT
    }

    /// Before the next request of a pass (`left` more allowed): discards what is buffered of a
    /// refused data block, then says why to stop, if it must. `resuming`: a multi-key reply is
    /// paused, and goes on only once most of the output has been read.
    pub fn why_stop(&mut self, left: usize, resuming: bool) -> Option<super::worker::Stop> {
        use super::worker::Stop;
        if self.swallow > 0 {
            self.swallow_buffered();
            if self.swallow > 0 {
                return Some(Stop::NeedInput);
            }
        }
        if left == 0 {
            Some(Stop::Budget)
        } else if self.backlogged() || (resuming && self.pending_output() >= RESUME_BELOW) {
            Some(Stop::Blocked)
        } else {
            None
        }
    }

    /// Unsent output bytes.
    pub fn pending_output(&self) -> usize {
        self.wbuf.len() - self.wpos
    }

    /// Whether reading more now is allowed: the input buffer has room and the client is keeping
    /// up with its replies.
    pub fn may_read(&self) -> bool {
        !self.eof
            && !self.broken
            && !self.closing
            && self.rend - self.rpos < self.read_cap
            && self.pending_output() < WRITE_HIGH
    }

    /// Makes room at the end of the read buffer (compacting, then growing up to the cap).
    fn make_room(&mut self) {
        if self.rend == self.rbuf.len() {
            if self.rpos > 0 {
                self.rbuf.copy_within(self.rpos..self.rend, 0);
                self.rend -= self.rpos;
                self.rpos = 0;
            } else {
                let grown = (self.rbuf.len() * 2).clamp(READ_INITIAL, self.read_cap);
                self.rbuf.resize(grown, 0);
            }
        }
    }

    /// Reads until the socket would block, the peer closes, or the buffer is at its cap.
    pub fn fill(&mut self, counters: &Counters) {
        if self.tls.is_some() {
            return self.fill_tls(counters);
        }
        while self.may_read() {
            self.make_room();
            match self.stream.read(&mut self.rbuf[self.rend..]) {
                Ok(0) => {
                    self.eof = true;
                    self.readable = false;
                }
                Ok(n) => {
                    self.last_active = std::time::Instant::now();
                    let space = self.rbuf.len() - self.rend;
                    self.rend += n;
                    Counters::add(&counters.bytes_read, n as u64);
                    if n < space && !self.hup {
                        // A short read drained the socket: bytes arriving later raise a new
                        // edge-triggered event, so skip the read that would only say WouldBlock.
                        self.readable = false;
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.broken = true;
                    return;
                }
            }
        }
    }

    /// `fill` over TLS: moves decrypted bytes into the read buffer while it has room, and
    /// reads records from the socket until it would block. Plain text rustls still holds when
    /// the buffer is full keeps `readable` set, so a later pass takes it (no socket event will
    /// come for it).
    ///
    /// The socket is read into a buffer of ours and the records handed to rustls from it
    /// (rather than rustls reading the socket itself), so a short read tells that the socket
    /// is drained, as in `fill`: the read that would only say WouldBlock is skipped, one
    /// syscall of the three a request cost.
    fn fill_tls(&mut self, counters: &Counters) {
        let mut buf = TLS_BUF.with(std::cell::Cell::take);
        buf.resize(TLS_READ, 0);
        self.fill_tls_with(counters, &mut buf);
        TLS_BUF.with(|b| b.set(buf));
    }

    fn fill_tls_with(&mut self, counters: &Counters, buf: &mut [u8]) {
        let mut socket_eof = false;
        let mut drained = false;
        loop {
            while self.may_read() {
                self.make_room();
                let Some(tls) = self.tls.as_mut() else { return };
                match tls.reader().read(&mut self.rbuf[self.rend..]) {
                    Ok(0) => {
                        // close_notify: the client is done sending.
                        self.eof = true;
                        self.readable = false;
                        return;
                    }
                    Ok(n) => {
                        self.last_active = std::time::Instant::now();
                        self.rend += n;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        // The socket closed without close_notify (or mid-record).
                        self.eof = true;
                        self.readable = false;
                        return;
                    }
                }
            }
            if !self.may_read() {
                return;
            }
            if !self.tls_in.is_empty() {
                let held = std::mem::take(&mut self.tls_in);
                if !self.feed_tls(&held) {
                    return;
                }
                if self.tls_in.len() == held.len() {
                    // rustls takes none of it although its plain text was drained: a record
                    // it cannot buffer. Nothing later can change that.
                    self.broken = true;
                    return;
                }
                continue;
            }
            if socket_eof {
                self.eof = true;
                self.readable = false;
                return;
            }
            if drained {
                self.readable = false;
                return;
            }
            let n = match self.stream.read(buf) {
                Ok(0) => {
                    socket_eof = true;
                    continue;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.broken = true;
                    return;
                }
            };
            Counters::add(&counters.bytes_read, n as u64);
            drained = n < buf.len() && !self.hup;
            if !self.feed_tls(&buf[..n]) {
                return;
            }
        }
    }

    /// Hands records read from the socket to rustls and processes them; what rustls does not
    /// take (its plain text buffer is full) waits in `tls_in`. False when the session failed
    /// (the connection is closing).
    fn feed_tls(&mut self, mut records: &[u8]) -> bool {
        let Some(tls) = self.tls.as_mut() else {
            return false;
        };
        while !records.is_empty() {
            match tls.read_tls(&mut records) {
                Ok(0) => break,
                Ok(_) => {}
                Err(_) => break,
            }
            if let Err(e) = tls.process_new_packets() {
                // A bad record or a failed handshake: the alert rustls queued goes out with the
                // next flush, then the connection closes.
                log::debug!("TLS from {:?}: {e}", self.peer);
                self.closing = true;
                self.eof = true;
                self.readable = false;
                return false;
            }
        }
        if !records.is_empty() {
            self.tls_in.extend_from_slice(records);
        }
        true
    }

    /// `flush` over TLS: hands the pending output to rustls (which holds a bounded amount of
    /// plain text) and writes its records until done or the socket would block.
    fn flush_tls(&mut self, counters: &Counters) -> bool {
        loop {
            let Some(tls) = self.tls.as_mut() else {
                return false;
            };
            let mut taken = 0;
            if self.wpos < self.wbuf.len() {
                match tls.writer().write(&self.wbuf[self.wpos..]) {
                    Ok(n) => taken = n,
                    Err(_) => {
                        self.broken = true;
                        return false;
                    }
                }
                self.wpos += taken;
            }
            if taken == 0 && !tls.wants_write() {
                // rustls holds all the plain text it will (before the handshake ends, say):
                // the rest waits in `wbuf` for the next flush.
                return self.wpos < self.wbuf.len();
            }
            while tls.wants_write() {
                match tls.write_tls(&mut self.stream) {
                    Ok(0) => {
                        self.broken = true;
                        return false;
                    }
                    Ok(n) => Counters::add(&counters.bytes_written, n as u64),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        self.broken = true;
                        return false;
                    }
                }
            }
            if self.wpos >= self.wbuf.len() {
                break;
            }
        }
        self.wbuf.clear();
        self.wpos = 0;
        if self.wbuf.capacity() > WRITE_KEEP {
            self.wbuf = Vec::new();
        }
        false
    }

    /// Writes pending output until done or the socket would block; returns true when some
    /// output is still pending.
    pub fn flush(&mut self, counters: &Counters) -> bool {
        if self.tls.is_some() {
            return self.flush_tls(counters);
        }
        while self.wpos < self.wbuf.len() {
            match self.stream.write(&self.wbuf[self.wpos..]) {
                Ok(0) => {
                    self.broken = true;
                    return false;
                }
                Ok(n) => {
                    self.wpos += n;
                    Counters::add(&counters.bytes_written, n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.broken = true;
                    return false;
                }
            }
        }
        self.wbuf.clear();
        self.wpos = 0;
        if self.wbuf.capacity() > WRITE_KEEP {
            self.wbuf = Vec::new();
        }
        false
    }
}
