//! What the kernel says about this test process (which is also the in-process gateway): its open
//! file descriptors and the state of its TCP sockets, from `/proc`.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

/// How many file descriptors this process has open.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(Iterator::count).unwrap_or(0)
}

/// What each open file descriptor points at (`socket:[123]`, `pipe:[45]`, a path…), sorted.
pub fn fd_targets() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|t| t.display().to_string())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// How many of this process's file descriptors refer to the socket with this inode.
pub fn fds_on_socket(inode: u64) -> usize {
    let want = format!("socket:[{inode}]");
    fd_targets().iter().filter(|t| **t == want).count()
}

/// One row of `/proc/net/tcp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSocket {
    /// Local address.
    pub local: SocketAddr,
    /// Peer address.
    pub remote: SocketAddr,
    /// TCP state (1 established, 4 FIN_WAIT1, 6 TIME_WAIT, 7 close, 8 CLOSE_WAIT, 10 listen…).
    pub state: u8,
    /// Bytes written and not yet acknowledged by the peer.
    pub tx_queue: u64,
    /// Bytes received and not yet read by the application.
    pub rx_queue: u64,
    /// Socket inode (0 once no process holds it, e.g. an orphan in FIN_WAIT).
    pub inode: u64,
}

/// The IPv4 TCP sockets of this network namespace.
pub fn tcp_sockets() -> Vec<TcpSocket> {
    let text = std::fs::read_to_string("/proc/self/net/tcp").unwrap_or_default();
    text.lines().skip(1).filter_map(parse_tcp_line).collect()
}

/// The socket from `local` to `remote`, if the kernel still has one.
pub fn tcp_socket(local: SocketAddr, remote: SocketAddr) -> Option<TcpSocket> {
    tcp_sockets()
        .into_iter()
        .find(|s| s.local == local && s.remote == remote)
}

fn parse_tcp_line(line: &str) -> Option<TcpSocket> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let (tx, rx) = f.get(4)?.split_once(':')?;
    Some(TcpSocket {
        local: parse_addr(f.get(1)?)?,
        remote: parse_addr(f.get(2)?)?,
        state: u8::from_str_radix(f.get(3)?, 16).ok()?,
        tx_queue: u64::from_str_radix(tx, 16).ok()?,
        rx_queue: u64::from_str_radix(rx, 16).ok()?,
        inode: f.get(9)?.parse().ok()?,
    })
}

/// `0100007F:1F90` (address in host byte order as hex, port in hex) → `127.0.0.1:8080`.
fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let ip = u32::from_str_radix(ip, 16).ok()?;
    let port = u16::from_str_radix(port, 16).ok()?;
    Some(SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::from(ip.to_le_bytes()),
        port,
    )))
}

/// Every process id whose command line contains `needle`, with that command line (for messages).
pub fn describe_processes(needle: &str) -> Vec<String> {
    super::processes_matching(needle)
        .into_iter()
        .map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            format!("{pid}: {}", String::from_utf8_lossy(&cmd).replace('\0', " ").trim())
        })
        .collect()
}
