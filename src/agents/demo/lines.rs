//! The demo agent's input: one line at a time, lines over the cap skipped without buffering them.

use std::io;

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// Outcome of reading one input line.
pub(super) enum Line {
    /// A full line (possibly without a final newline at EOF) is in the buffer.
    Complete,
    /// The line exceeded the cap and was discarded.
    TooLong,
    /// End of input.
    Eof,
}

/// Reads one `\n`-terminated line into `line`, discarding (not buffering) lines over `max` bytes.
pub(super) async fn read_line_capped<R: AsyncBufRead + Unpin>(
    r: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> io::Result<Line> {
    line.clear();
    let mut too_long = false;
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => Line::TooLong,
                (false, true) => Line::Eof,
                (false, false) => Line::Complete,
            });
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if !too_long {
            if line.len() + take > max.saturating_add(1) {
                too_long = true;
                line.clear();
            } else {
                line.extend_from_slice(buf.get(..take).unwrap_or_default());
            }
        }
        r.consume(take);
        if done {
            return Ok(if too_long { Line::TooLong } else { Line::Complete });
        }
    }
}
