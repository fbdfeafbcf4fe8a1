//! A TCP proxy a test can cut: every connection through it reset at once (as a restarted
//! server's are), and the next few new ones reset as soon as they open (as a server coming up
//! may do), to show what a client of the other end does about it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A proxy in front of one address.
pub struct TcpProxy {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: CancellationToken,
}

struct State {
    /// Cancelled to reset every connection open now; replaced by a fresh one.
    cut: CancellationToken,
    /// How many new connections are reset as soon as they are accepted.
    reset_next: u32,
    /// Until when every new connection is reset (the other end is unreachable).
    down_until: Option<std::time::Instant>,
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(Mutex::new(State {
            cut: CancellationToken::new(),
            reset_next: 0,
            down_until: None,
        }));
        let stop = CancellationToken::new();
        let (st, stopped) = (state.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = stopped.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((client, _)) = accepted else { continue };
                let cut = {
                    let mut s = st.lock().expect("proxy state");
                    if s.reset_next > 0 {
                        s.reset_next -= 1;
                        reset(client);
                        continue;
                    }
                    if s.down_until.is_some_and(|t| std::time::Instant::now() < t) {
                        reset(client);
                        continue;
                    }
                    s.cut.clone()
                };
                tokio::spawn(forward(client, upstream, cut));
            }
        });
        Self { addr, state, stop }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Resets every connection through it, and the next `then` new connections as they open.
    pub fn reset_all(&self, then: u32) {
        let mut s = self.state.lock().expect("proxy state");
        s.reset_next = then;
        std::mem::replace(&mut s.cut, CancellationToken::new()).cancel();
    }
}

impl TcpProxy {
    /// Resets every connection through it, and every new one for `down`.
    pub fn down_for(&self, down: std::time::Duration) {
        let mut s = self.state.lock().expect("proxy state");
        s.down_until = Some(std::time::Instant::now() + down);
        std::mem::replace(&mut s.cut, CancellationToken::new()).cancel();
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.state.lock().expect("proxy state").cut.cancel();
    }
}

async fn forward(mut client: TcpStream, upstream: SocketAddr, cut: CancellationToken) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        reset(client);
        return;
    };
    tokio::select! {
        () = cut.cancelled() => {
            reset(client);
            reset(server);
        }
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
    }
}

/// Closes `s` with a reset (RST), not an orderly FIN.
fn reset(s: TcpStream) {
    let _ = s.set_zero_linger();
    drop(s);
}
