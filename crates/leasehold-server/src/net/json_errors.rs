//! hyper's own answers to requests it cannot parse, given the JSON error
//! body every other answer has.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// hyper answers an HTTP/1 request it cannot parse (a bad
/// `Transfer-Encoding`, headers too large, a URI too long) by itself,
/// before the router sees it, with a status and an empty body. This puts
/// the JSON error body every other answer has into that response. It
/// rewrites only a write that is a whole response head with an error
/// status, `content-length: 0` and no `content-type` (the router never
/// sends an error like that), and leaves HTTP/2 connections alone. It
/// reports itself as not vectored, so hyper hands it each response head
/// in one piece.
pub(super) struct JsonParseErrors<S> {
    inner: S,
    /// The first bytes read, to tell HTTP/2's preface (`PRI * HTTP/2.0`).
    first: Vec<u8>,
    /// A rewritten response, and how much of it is written.
    pending: Option<(Vec<u8>, usize)>,
}

impl<S> JsonParseErrors<S> {
    pub(super) fn new(inner: S) -> JsonParseErrors<S> {
        JsonParseErrors {
            inner,
            first: Vec::with_capacity(3),
            pending: None,
        }
    }

    fn http2(&self) -> bool {
        self.first.starts_with(b"PRI")
    }
}

/// The response `head` with a JSON error body, if it is one of hyper's own
/// bodiless error answers.
fn with_json_body(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head.strip_suffix(b"\r\n\r\n")?).ok()?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next()?;
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))?;
    let code: u16 = status.get(..3)?.parse().ok()?;
    let headers: Vec<&str> = lines.collect();
    let named = |h: &str, name: &str| {
        h.split_once(':')
            .is_some_and(|(n, _)| n.trim().eq_ignore_ascii_case(name))
    };
    let empty = headers.iter().any(|h| {
        named(h, "content-length") && h.split_once(':').is_some_and(|(_, v)| v.trim() == "0")
    });
    if !(400..600).contains(&code) || !empty || headers.iter().any(|h| named(h, "content-type")) {
        return None;
    }
    let message = match code {
        431 => "the request's headers are too large".to_string(),
        414 => "the request's URI is too long".to_string(),
        _ => "the request is not valid HTTP/1.1 (a malformed request line or header; the only Transfer-Encoding accepted is chunked): fix the client's request".to_string(),
    };
    let body = serde_json::json!({
        "error": { "code": "invalid_argument", "message": message }
    })
    .to_string();
    let mut out = format!(
        "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for h in headers.iter().filter(|h| !named(h, "content-length")) {
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    out.push_str(&body);
    Some(out.into_bytes())
}

impl<S: AsyncWrite + Unpin> JsonParseErrors<S> {
    /// Writes out a rewritten response, if one is waiting.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while let Some((bytes, written)) = &mut self.pending {
            if *written == bytes.len() {
                self.pending = None;
                break;
            }
            match Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()))
                }
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonParseErrors<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if self.first.len() < 3 {
            let want = 3 - self.first.len();
            let new = &buf.filled()[before..];
            let take = new.len().min(want);
            let head = new[..take].to_vec();
            self.first.extend_from_slice(&head);
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonParseErrors<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.drain(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
        if !self.http2() {
            if let Some(rewritten) = with_json_body(buf) {
                // Taken whole; written out here or by the next flush.
                self.pending = Some((rewritten, 0));
                if let Poll::Ready(Err(e)) = self.drain(cx) {
                    return Poll::Ready(Err(e));
                }
                return Poll::Ready(Ok(buf.len()));
            }
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut self.inner).poll_shutdown(cx),
            other => other,
        }
    }
}
