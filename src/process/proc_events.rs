//! What processes do while tp is not their tracer: fork, exec and exit,
//! as the kernel's process events connector reports them (netlink,
//! `NETLINK_CONNECTOR`, `CN_IDX_PROC`).
//!
//! tp detaches from its targets after an attach, so ptrace's fork and exit
//! events (PTRACE_O_TRACEFORK, a wait status) are not tp's to have: staying
//! a target's tracer would stop it at every signal. The connector tells a
//! listener of every fork (parent and child), exec and exit (with the wait
//! status: "killed by SIGSEGV") on the machine as it happens, without
//! touching any process. It needs CAP_NET_ADMIN in the initial namespaces;
//! where tp cannot listen, [`Events::open`] says so and the session falls
//! back to what `/proc` shows (children found by the memory they share, an
//! exit without its status).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status.
    Code(i32),
    /// A signal killed it (`core`: it dumped core).
    Signal {
        /// The signal.
        signal: i32,
        /// It dumped core.
        core: bool,
    },
    /// It ended; how is not known (tp could not listen to the kernel).
    Unknown,
}

impl Ended {
    /// From a wait status (`exit_code` of the kernel's exit event).
    pub fn from_wait_status(status: i32) -> Ended {
        if status & 0x7f == 0 {
            Ended::Code((status >> 8) & 0xff)
        } else {
            Ended::Signal { signal: status & 0x7f, core: status & 0x80 != 0 }
        }
    }

    /// What follows "process 12" in a sentence: `exited with status 0`,
    /// `was killed by SIGSEGV (core dumped)`, `exited`.
    pub fn sentence(&self) -> String {
        match self {
            Ended::Signal { .. } => format!("was {}", self.describe()),
            _ => self.describe(),
        }
    }

    /// `exited with status 0`, `killed by SIGSEGV (core dumped)`, `exited`.
    pub fn describe(&self) -> String {
        match self {
            Ended::Code(c) => format!("exited with status {c}"),
            Ended::Signal { signal, core } => {
                format!("killed by {}{}", signal_name(*signal), if *core { " (core dumped)" } else { "" })
            }
            Ended::Unknown => "exited".into(),
        }
    }
}

/// `SIGSEGV` for 11; `signal 40` for one without a name.
pub fn signal_name(signal: i32) -> String {
    nix::sys::signal::Signal::try_from(signal).map_or_else(|_| format!("signal {signal}"), |s| s.as_str().to_string())
}

/// One thing a process did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Process `parent` forked process `child` (threads are not reported).
    Fork {
        /// The process that forked.
        parent: i32,
        /// The new process.
        child: i32,
    },
    /// Process `pid` exec'd another program.
    Exec {
        /// The process.
        pid: i32,
    },
    /// Process `pid` ended (its last thread exited).
    Exit {
        /// The process.
        pid: i32,
        /// How.
        how: Ended,
    },
}

/// A listener on the kernel's process events.
#[derive(Debug)]
pub struct Events {
    sock: OwnedFd,
    /// True once the kernel dropped events because tp read too slowly:
    /// what the events say is then incomplete.
    pub overrun: bool,
}

const NETLINK_CONNECTOR: i32 = 11;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const NLMSG_HDR: usize = 16;
const CN_MSG: usize = 20;
/// Where a `struct proc_event` starts in a message, and its data in it.
const EVENT: usize = NLMSG_HDR + CN_MSG;
const DATA: usize = EVENT + 16;
const WHAT_NONE: u32 = 0;
const WHAT_FORK: u32 = 1;
const WHAT_EXEC: u32 = 2;
const WHAT_EXIT: u32 = 0x8000_0000;

impl Events {
    /// Starts listening; an error says why tp cannot (not root, a
    /// container's namespace, a kernel without the connector).
    pub fn open() -> io::Result<Events> {
        // SAFETY: plain socket(2); the descriptor is owned right away.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                NETLINK_CONNECTOR,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nothing else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: zeroed sockaddr_nl is valid; fields set below.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        addr.nl_groups = CN_IDX_PROC;
        // SAFETY: bind(2) with a sockaddr_nl of the right size.
        let bound = unsafe {
            libc::bind(
                sock.as_raw_fd(),
                &addr as *const libc::sockaddr_nl as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if bound != 0 {
            return Err(io::Error::last_os_error());
        }
        // Room for bursts of forks (a server under load) between two reads.
        let size: libc::c_int = 8 << 20;
        // SAFETY: setsockopt(2) with an int option; the forced form needs
        // CAP_NET_ADMIN, which listening needs anyway.
        unsafe {
            let p = &size as *const libc::c_int as *const libc::c_void;
            let len = std::mem::size_of::<libc::c_int>() as u32;
            if libc::setsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, p, len) != 0 {
                libc::setsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, p, len);
            }
        }
        let mut msg = Vec::with_capacity(EVENT + 4);
        msg.extend_from_slice(&((EVENT + 4) as u32).to_ne_bytes());
        msg.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
        msg.extend_from_slice(&0u16.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
        msg.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel's
        msg.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
        msg.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
        msg.extend_from_slice(&0u32.to_ne_bytes()); // ack
        msg.extend_from_slice(&4u16.to_ne_bytes()); // len
        msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
        msg.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
        // SAFETY: send(2) of an initialized buffer.
        let sent = unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr() as *const libc::c_void, msg.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut events = Events { sock, overrun: false };
        events.await_ack()?;
        Ok(events)
    }

    /// The kernel answers the listen request with an empty event carrying
    /// its error: EPERM without CAP_NET_ADMIN, or outside the initial
    /// namespaces nothing at all.
    fn await_ack(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_millis(200);
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            match self.recv(&mut buf) {
                Ok(n) if n >= DATA + 4 && u32_at(&buf, EVENT) == WHAT_NONE => {
                    return match u32_at(&buf, DATA) {
                        0 => Ok(()),
                        err => Err(io::Error::from_raw_os_error(err as i32)),
                    };
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(io::ErrorKind::TimedOut, "the kernel did not answer (another namespace?)"))
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: recv(2) into a buffer we own, of its length.
        let n = unsafe { libc::recv(self.sock.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
    }

    /// Waits until the kernel has something to say, or `timeout`.
    pub fn wait(&self, timeout: std::time::Duration) {
        let mut fd = libc::pollfd { fd: self.sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: poll(2) on one pollfd we own, for at most `ms`.
        unsafe {
            libc::poll(&mut fd, 1, ms);
        }
    }

    /// Everything that happened since the last call, in order.
    pub fn poll(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let n = match self.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    self.overrun = true;
                    continue;
                }
                Err(_) => break,
            };
            out.extend(decode(&buf[..n]));
        }
        out
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4).map_or(0, |w| u32::from_ne_bytes(w.try_into().unwrap()))
}

/// The events in one datagram (one or more netlink messages).
fn decode(mut b: &[u8]) -> Vec<Event> {
    let mut out = Vec::new();
    while b.len() >= NLMSG_HDR {
        let len = (u32_at(b, 0) as usize).min(b.len());
        if len < NLMSG_HDR {
            break;
        }
        let msg = &b[..len];
        if msg.len() >= DATA + 16 {
            let d = |k: usize| u32_at(msg, DATA + 4 * k) as i32;
            match u32_at(msg, EVENT) {
                // Threads fork too (clone with CLONE_THREAD): only new processes count.
                WHAT_FORK if d(2) == d(3) && d(1) != d(3) => out.push(Event::Fork { parent: d(1), child: d(3) }),
                WHAT_EXEC => out.push(Event::Exec { pid: d(1) }),
                // A process ends when its last thread does; the leader's
                // exit (its TID is the PID) carries the process's status.
                WHAT_EXIT if d(0) == d(1) => out.push(Event::Exit { pid: d(1), how: Ended::from_wait_status(d(2)) }),
                _ => {}
            }
        }
        let step = len.next_multiple_of(4);
        if step >= b.len() {
            break;
        }
        b = &b[step..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(what: u32, data: &[u32]) -> Vec<u8> {
        let mut m = vec![0u8; DATA];
        m[..4].copy_from_slice(&((DATA + 4 * data.len()) as u32).to_ne_bytes());
        m[EVENT..EVENT + 4].copy_from_slice(&what.to_ne_bytes());
        for w in data {
            m.extend_from_slice(&w.to_ne_bytes());
        }
        m
    }

    #[test]
    fn decodes_forks_execs_and_exits() {
        let mut b = message(WHAT_FORK, &[10, 10, 11, 11]);
        b.extend(message(WHAT_FORK, &[10, 10, 12, 10])); // a thread
        b.extend(message(WHAT_EXEC, &[11, 11, 0, 0]));
        b.extend(message(WHAT_EXIT, &[11, 11, 11, 17, 10, 10])); // SIGSEGV
        b.extend(message(WHAT_EXIT, &[13, 11, 0, 17, 10, 10])); // a thread of 11
        b.extend(message(WHAT_EXIT, &[14, 14, 3 << 8, 17, 10, 10]));
        assert_eq!(
            decode(&b),
            [
                Event::Fork { parent: 10, child: 11 },
                Event::Exec { pid: 11 },
                Event::Exit { pid: 11, how: Ended::Signal { signal: 11, core: false } },
                Event::Exit { pid: 14, how: Ended::Code(3) },
            ]
        );
        assert!(decode(&b[..10]).is_empty());
    }

    #[test]
    fn describes_how_a_process_ended() {
        assert_eq!(Ended::from_wait_status(0).describe(), "exited with status 0");
        assert_eq!(Ended::from_wait_status(11 | 0x80).describe(), "killed by SIGSEGV (core dumped)");
        assert_eq!(Ended::from_wait_status(4).describe(), "killed by SIGILL");
        assert_eq!(Ended::Unknown.describe(), "exited");
        assert_eq!(Ended::from_wait_status(9).sentence(), "was killed by SIGKILL");
        assert_eq!(Ended::Code(1).sentence(), "exited with status 1");
        assert_eq!(signal_name(40), "signal 40");
    }
}
