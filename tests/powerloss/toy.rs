//! A toy store that acknowledges writes it never syncs: it speaks memcached text `set`,
//! `append`, `get` and `delete`, appends each write as a record to `toy.log` in its directory, answers before
//! any fsync, and reloads the log when it starts. The power-loss harness must catch it losing
//! acknowledged writes.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

struct Store {
    items: HashMap<String, Vec<u8>>,
    log: File,
}

pub struct Toy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// Replays `S <key> <len>\n<data>\n` and `D <key>\n` records up to the first incomplete one.
fn replay(bytes: &[u8]) -> HashMap<String, Vec<u8>> {
    let mut items = HashMap::new();
    let mut rest = bytes;
    while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
        let head = String::from_utf8_lossy(&rest[..nl]).into_owned();
        let body = &rest[nl + 1..];
        let f: Vec<&str> = head.split(' ').collect();
        match f.as_slice() {
            ["D", key] => {
                items.remove(*key);
                rest = body;
            }
            ["S", key, len] => {
                let Ok(n) = len.parse::<usize>() else { break };
                if body.len() < n + 1 || body[n] != b'\n' {
                    break;
                }
                items.insert(key.to_string(), body[..n].to_vec());
                rest = &body[n + 1..];
            }
            _ => break,
        }
    }
    items
}

impl Toy {
    /// Starts on `port` (0: any free one) with its log in `dir`.
    pub fn start(dir: &Path, port: u16) -> io::Result<Toy> {
        let path = dir.join("toy.log");
        let mut bytes = Vec::new();
        if let Ok(mut f) = File::open(&path) {
            f.read_to_end(&mut bytes)?;
        }
        let log = OpenOptions::new().create(true).append(true).open(&path)?;
        let store = Arc::new(Mutex::new(Store {
            items: replay(&bytes),
            log,
        }));
        let listener = TcpListener::bind(("127.0.0.1", port))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (st, stp) = (store.clone(), stop.clone());
        let accept = std::thread::spawn(move || {
            let mut conns = Vec::new();
            while !stp.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let (st, stp) = (st.clone(), stp.clone());
                        conns.push(std::thread::spawn(move || serve(s, &st, &stp)));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => break,
                }
            }
            for c in conns {
                let _ = c.join();
            }
        });
        Ok(Toy {
            addr,
            stop,
            threads: vec![accept],
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and closes the log (as a killed process would).
    pub fn kill(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Toy {
    fn drop(&mut self) {
        self.kill();
    }
}

fn serve(s: TcpStream, store: &Mutex<Store>, stop: &AtomicBool) {
    if s.set_read_timeout(Some(Duration::from_millis(50))).is_err() {
        return;
    }
    let Ok(mut w) = s.try_clone() else { return };
    let mut r = BufReader::new(s);
    let mut line = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) if line.ends_with(b"\n") => {}
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(_) => return,
        }
        let text = String::from_utf8_lossy(&line).trim_end().to_string();
        line.clear();
        let f: Vec<&str> = text.split(' ').collect();
        let reply: Vec<u8> = match f.as_slice() {
            [verb @ ("set" | "append"), key, _flags, _exp, len] => {
                let Ok(n) = len.parse::<usize>() else { return };
                let mut data = vec![0; n + 2];
                // The data block may arrive in pieces; read it whole (bounded by `stop`).
                let mut got = 0;
                while got < data.len() {
                    match r.read(&mut data[got..]) {
                        Ok(0) => return,
                        Ok(k) => got += k,
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                            ) =>
                        {
                            if stop.load(Ordering::Relaxed) {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
                }
                data.truncate(n);
                let mut st = store.lock().unwrap_or_else(|e| e.into_inner());
                if *verb == "append" {
                    // Logged as the whole new value, like a set.
                    let Some(old) = st.items.get(*key) else {
                        if w.write_all(b"NOT_STORED\r\n").is_err() {
                            return;
                        }
                        continue;
                    };
                    data = [&old[..], &data[..]].concat();
                }
                let n = data.len();
                let mut rec = format!("S {key} {n}\n").into_bytes();
                rec.extend_from_slice(&data);
                rec.push(b'\n');
                // No fsync: the bug the harness must catch.
                match st.log.write_all(&rec) {
                    Ok(()) => {
                        st.items.insert(key.to_string(), data);
                        b"STORED\r\n".to_vec()
                    }
                    Err(e) => format!("SERVER_ERROR {e}\r\n").into_bytes(),
                }
            }
            ["delete", key] => {
                let mut st = store.lock().unwrap_or_else(|e| e.into_inner());
                match st.log.write_all(format!("D {key}\n").as_bytes()) {
                    Ok(()) if st.items.remove(*key).is_some() => b"DELETED\r\n".to_vec(),
                    Ok(()) => b"NOT_FOUND\r\n".to_vec(),
                    Err(e) => format!("SERVER_ERROR {e}\r\n").into_bytes(),
                }
            }
            ["get", key] => {
                let st = store.lock().unwrap_or_else(|e| e.into_inner());
                let mut out = Vec::new();
                if let Some(v) = st.items.get(*key) {
                    out.extend_from_slice(format!("VALUE {key} 0 {}\r\n", v.len()).as_bytes());
                    out.extend_from_slice(v);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"END\r\n");
                out
            }
            _ => b"ERROR\r\n".to_vec(),
        };
        if w.write_all(&reply).is_err() {
            return;
        }
    }
}
