//! Blocking clients of both protocols that never panic on what a server sends (a damaged
//! store's answers are data for the judge), the write load, and the read-back.

use std::io::{self, BufRead, BufReader, Read as _, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::model::{History, OpKind, Read, Rng, chunk, value};

/// Read and write timeout of every socket: a server that stops answering fails the read.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Most operations one load connection sends (the stop flag normally ends it first).
const MAX_OPS: usize = 200_000;
/// Share of the load's operations that are deletes, in percent.
const DELETE_PCT: u64 = 8;
/// Of the operations on a key whose value is surely there and under `APPEND_MAX` bytes.
const APPEND_PCT: u64 = 40;
const APPEND_MAX: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// memcached text protocol.
    Mc,
    Resp,
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

pub struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
    proto: Proto,
}

impl Conn {
    pub fn open(addr: SocketAddr, proto: Proto) -> io::Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(Conn {
            r: BufReader::with_capacity(64 * 1024, s.try_clone()?),
            w: s,
            proto,
        })
    }

    /// One line without its CRLF; EOF is an error.
    fn line(&mut self) -> io::Result<String> {
        let mut l = Vec::new();
        (&mut self.r).take(64 * 1024).read_until(b'\n', &mut l)?;
        if !l.ends_with(b"\r\n") {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed or line cut short",
            ));
        }
        l.truncate(l.len() - 2);
        Ok(String::from_utf8_lossy(&l).into_owned())
    }

    fn block(&mut self, n: usize) -> io::Result<Vec<u8>> {
        let mut b = vec![0; n + 2];
        self.r.read_exact(&mut b)?;
        if &b[n..] != b"\r\n" {
            return Err(bad(format!("data block of {n} bytes not followed by CRLF")));
        }
        b.truncate(n);
        Ok(b)
    }

    fn resp_send(&mut self, args: &[&[u8]]) -> io::Result<()> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.w.write_all(&out)
    }

    /// A set; Ok(Err(reply)) is a refusal.
    pub fn set(&mut self, key: &str, val: &[u8]) -> io::Result<Result<(), String>> {
        self.store("set", b"SET", key, val)
    }

    /// An append to a value that is there.
    pub fn append(&mut self, key: &str, val: &[u8]) -> io::Result<Result<(), String>> {
        self.store("append", b"APPEND", key, val)
    }

    /// memcached's `verb` or RESP's `cmd` of `val` under `key`: Ok(Ok) on STORED, +OK or an
    /// integer (APPEND's new length), else the reply as a refusal.
    fn store(
        &mut self,
        verb: &str,
        cmd: &[u8],
        key: &str,
        val: &[u8],
    ) -> io::Result<Result<(), String>> {
        let l = match self.proto {
            Proto::Mc => {
                let mut req = format!("{verb} {key} 0 0 {}\r\n", val.len()).into_bytes();
                req.extend_from_slice(val);
                req.extend_from_slice(b"\r\n");
                self.w.write_all(&req)?;
                self.line()?
            }
            Proto::Resp => {
                self.resp_send(&[cmd, key.as_bytes(), val])?;
                self.line()?
            }
        };
        Ok(
            if l == "STORED" || l == "+OK" || (cmd == b"APPEND" && l.starts_with(':')) {
                Ok(())
            } else {
                Err(l)
            },
        )
    }

    pub fn delete(&mut self, key: &str) -> io::Result<Result<(), String>> {
        match self.proto {
            Proto::Mc => {
                self.w.write_all(format!("delete {key}\r\n").as_bytes())?;
                let l = self.line()?;
                Ok(if l == "DELETED" || l == "NOT_FOUND" {
                    Ok(())
                } else {
                    Err(l)
                })
            }
            Proto::Resp => {
                self.resp_send(&[b"DEL", key.as_bytes()])?;
                let l = self.line()?;
                Ok(if l == ":0" || l == ":1" {
                    Ok(())
                } else {
                    Err(l)
                })
            }
        }
    }

    /// A get; Ok(Err(reply)) is an error reply.
    pub fn get(&mut self, key: &str) -> io::Result<Result<Option<Vec<u8>>, String>> {
        match self.proto {
            Proto::Mc => {
                self.w.write_all(format!("get {key}\r\n").as_bytes())?;
                let l = self.line()?;
                if l == "END" {
                    return Ok(Ok(None));
                }
                let f: Vec<&str> = l.split(' ').collect();
                if f.len() != 4 || f[0] != "VALUE" || f[1] != key {
                    return Ok(Err(l));
                }
                let n: usize = f[3]
                    .parse()
                    .map_err(|_| bad(format!("bad length in {l:?}")))?;
                let v = self.block(n)?;
                let end = self.line()?;
                if end != "END" {
                    return Err(bad(format!("{end:?} after the value instead of END")));
                }
                Ok(Ok(Some(v)))
            }
            Proto::Resp => {
                self.resp_send(&[b"GET", key.as_bytes()])?;
                let l = self.line()?;
                if l == "$-1" || l == "_" {
                    return Ok(Ok(None));
                }
                if let Some(n) = l.strip_prefix('$') {
                    let n: usize = n.parse().map_err(|_| bad(format!("bad length in {l:?}")))?;
                    return Ok(Ok(Some(self.block(n)?)));
                }
                Ok(Err(l))
            }
        }
    }
}

/// What one load connection did.
pub struct LoadLog {
    pub histories: Vec<History>,
    /// Refusals before the cut (none expected: the file system works until then).
    pub early_refusals: Vec<String>,
    pub refusals: usize,
}

/// Writes successive versions of `keys` (this connection's own) until `stop`, the server goes
/// away, or MAX_OPS; one request at a time, every reply's arrival recorded.
pub fn load(
    addr: SocketAddr,
    proto: Proto,
    keys: Vec<String>,
    seed: u64,
    stop: &AtomicBool,
    cut_at: &dyn Fn() -> Option<Instant>,
) -> LoadLog {
    let mut log = LoadLog {
        histories: keys.into_iter().map(History::new).collect(),
        early_refusals: Vec::new(),
        refusals: 0,
    };
    let Ok(mut c) = Conn::open(addr, proto) else {
        return log;
    };
    let mut rng = Rng(seed);
    for _ in 0..MAX_OPS {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let k = rng.below(log.histories.len() as u64) as usize;
        let h = &mut log.histories[k];
        // Appends go to values known to be there, and stop growing them past APPEND_MAX.
        let append = h.sure_len().is_some_and(|n| n < APPEND_MAX) && rng.pct(APPEND_PCT);
        let kind = if append {
            OpKind::Append
        } else if rng.pct(DELETE_PCT) {
            OpKind::Delete
        } else {
            OpKind::Set
        };
        let i = h.push(kind);
        let res = match kind {
            OpKind::Set => c.set(&h.key, &value(&h.key, h.ops[i].version)),
            OpKind::Append => c.append(&h.key, &chunk(&h.key, h.ops[i].version)),
            OpKind::Delete => c.delete(&h.key),
        };
        match res {
            Ok(Ok(())) => h.ops[i].acked_at = Some(Instant::now()),
            Ok(Err(reply)) => {
                h.ops[i].refused = true;
                log.refusals += 1;
                if cut_at().is_none() && log.early_refusals.len() < 5 {
                    log.early_refusals.push(format!("{}: {reply}", h.key));
                }
            }
            Err(_) => break,
        }
    }
    log
}

/// Reads every key through `proto`; a connection that breaks is opened again for the next
/// key (a server that died fails every read after).
pub fn read_back(addr: SocketAddr, proto: Proto, keys: &[&str]) -> Vec<Read> {
    let mut conn: Option<Conn> = None;
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        if conn.is_none() {
            match Conn::open(addr, proto) {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    out.push(Read::Failed(format!("connect: {e}")));
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        match c.get(key) {
            Ok(Ok(None)) => out.push(Read::Absent),
            Ok(Ok(Some(v))) => out.push(Read::Value(v)),
            Ok(Err(reply)) => out.push(Read::Failed(reply)),
            Err(e) => {
                out.push(Read::Failed(e.to_string()));
                conn = None;
            }
        }
    }
    out
}
