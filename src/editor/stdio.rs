//! The editor's end: `connect`'s stdin and stdout. When they are pipes (as every editor starts an
//! agent) they are read and written without blocking, on the runtime's own threads; tokio's
//! `stdin()`/`stdout()` hand every read and write to a blocking thread and back, a hop each way
//! per frame. Anything else (a terminal, a file) falls back to those.

use std::fs::File;
use std::os::fd::AsFd;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::unix::pipe;

pub type Reader = Pin<Box<dyn AsyncRead + Send>>;
pub type Writer = Pin<Box<dyn AsyncWrite + Send>>;

/// The editor's input.
pub fn input() -> Reader {
    let pipe = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| pipe::Receiver::from_file(File::from(fd)).ok());
    match pipe {
        Some(pipe) => Box::pin(pipe),
        None => Box::pin(tokio::io::stdin()),
    }
}

/// The editor's output.
pub fn output() -> Writer {
    let pipe = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| pipe::Sender::from_file(File::from(fd)).ok());
    match pipe {
        Some(pipe) => Box::pin(pipe),
        None => Box::pin(tokio::io::stdout()),
    }
}

/// Writes `frames` to the editor, one line each, in one write.
pub async fn write_lines<'a>(out: &mut Writer, frames: impl IntoIterator<Item = &'a str>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    for frame in frames {
        buf.extend_from_slice(frame.as_bytes());
        buf.push(b'\n');
    }
    if buf.is_empty() {
        return Ok(());
    }
    out.write_all(&buf).await?;
    out.flush().await
}
