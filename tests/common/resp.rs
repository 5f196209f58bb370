//! A small blocking RESP client for tests: sends commands as multibulk arrays and parses RESP2
//! and RESP3 replies. Every read has a timeout, so a missing reply fails the test.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    /// A bulk string; None is RESP2's null bulk.
    Bulk(Option<Vec<u8>>),
    /// An array; None is RESP2's null array.
    Array(Option<Vec<Reply>>),
    /// RESP3 null.
    Null,
    /// RESP3 map, as its pairs.
    Map(Vec<(Reply, Reply)>),
    /// RESP3 set.
    Set(Vec<Reply>),
    Double(String),
    Bool(bool),
    Verbatim(Vec<u8>),
    /// RESP3 push (pub/sub messages and confirmations).
    Push(Vec<Reply>),
}

impl Reply {
    pub fn bulk(s: &str) -> Reply {
        Reply::Bulk(Some(s.as_bytes().to_vec()))
    }

    pub fn array(items: Vec<Reply>) -> Reply {
        Reply::Array(Some(items))
    }

    pub fn bulks(items: &[&str]) -> Reply {
        Reply::Array(Some(items.iter().map(|s| Reply::bulk(s)).collect()))
    }
}

pub struct Resp {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Resp {
    pub fn connect(addr: SocketAddr) -> Resp {
        let s = TcpStream::connect(addr).expect("connect to the RESP port");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s.set_nodelay(true).expect("nodelay");
        Resp {
            reader: BufReader::new(s.try_clone().expect("clone")),
            writer: s,
        }
    }

    /// A client on an already connected socket (its timeouts stay as they are).
    pub fn from_stream(s: TcpStream) -> Resp {
        Resp {
            reader: BufReader::new(s.try_clone().expect("clone")),
            writer: s,
        }
    }

    /// Changes how long a reply may take (10 s unless changed).
    pub fn set_read_timeout(&self, timeout: Duration) {
        self.writer
            .set_read_timeout(Some(timeout))
            .expect("set the read timeout");
    }

    pub fn encode(args: &[&[u8]]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    pub fn send(&mut self, args: &[&[u8]]) {
        self.writer.write_all(&Resp::encode(args)).expect("send");
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).expect("send");
    }

    /// Sends a command given as space-separated words and reads its reply.
    pub fn cmd(&mut self, line: &str) -> Reply {
        let words: Vec<&[u8]> = line.split_whitespace().map(str::as_bytes).collect();
        self.call(&words)
    }

    pub fn call(&mut self, args: &[&[u8]]) -> Reply {
        self.send(args);
        self.read()
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        let n = self.reader.read_line(&mut l).expect("read a reply line");
        assert!(n > 0, "connection closed while waiting for a reply");
        assert!(l.ends_with("\r\n"), "reply line without CRLF: {l:?}");
        l.truncate(l.len() - 2);
        l
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0; n + 2];
        self.reader.read_exact(&mut b).expect("read a bulk");
        assert_eq!(&b[n..], b"\r\n", "bulk not followed by CRLF");
        b.truncate(n);
        b
    }

    pub fn read(&mut self) -> Reply {
        let l = self.line();
        let (t, rest) = l.split_at(1);
        let num = |r: &str| {
            r.parse::<i64>()
                .unwrap_or_else(|_| panic!("bad length in {l:?}"))
        };
        match t {
            "+" => Reply::Simple(rest.to_string()),
            "-" => Reply::Error(rest.to_string()),
            ":" => Reply::Int(num(rest)),
            "$" => match num(rest) {
                -1 => Reply::Bulk(None),
                n => Reply::Bulk(Some(self.bytes(n as usize))),
            },
            "*" => match num(rest) {
                -1 => Reply::Array(None),
                n => Reply::Array(Some((0..n).map(|_| self.read()).collect())),
            },
            "_" => Reply::Null,
            ">" => Reply::Push((0..num(rest)).map(|_| self.read()).collect()),
            "%" => Reply::Map((0..num(rest)).map(|_| (self.read(), self.read())).collect()),
            "~" => Reply::Set((0..num(rest)).map(|_| self.read()).collect()),
            "," => Reply::Double(rest.to_string()),
            "#" => Reply::Bool(rest == "t"),
            "=" => Reply::Verbatim(self.bytes(num(rest) as usize)),
            _ => panic!("unknown reply type in {l:?}"),
        }
    }
}
