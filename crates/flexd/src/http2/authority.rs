//! Any `:authority` a gRPC client sends over a Unix socket.
//!
//! A gRPC client on a Unix socket has no host name to send, and clients disagree on what to
//! put in the HTTP/2 `:authority` pseudo-header instead: `localhost` (grpc-go, kubelet), an
//! empty value, the socket path percent-encoded (`%2Frun%2Fcsi.sock`, grpcio >= 1.57's
//! default) or raw (`/run/csi.sock`, grpc-java, `csc`). The HTTP/2 layer under tonic (h2)
//! parses the authority as a URI authority while decoding HEADERS and resets the stream
//! before flexd sees the request when it is empty or not a host; neither h2 nor hyper has an
//! option to accept it.
//!
//! So each accepted connection is wrapped: [`AuthorityFix`] reads the client's frames before
//! h2 does, decodes every header block with the client's HPACK state, replaces an authority
//! h2 would refuse by `localhost` (the socket's own host, which is what it names), and hands
//! h2 the block re-encoded without the dynamic table (literals only, so h2's HPACK state never
//! depends on the client's). All other frames pass through untouched; the write side is not
//! touched at all. Anything that is not HTTP/2 with prior knowledge, or a header block that
//! does not decode, is passed through as it came, and h2 rejects it as it always did.
//!
//! Reading before h2 means h2's own guards (frame size, CONTINUATION flood, header list size)
//! come too late for what the wrapper holds, so it applies the same limits itself, on each
//! frame's header: see [`Violation`]. A violation closes that connection (every read fails and
//! hyper drops it). No GOAWAY: the write half belongs to h2, which may be mid-frame, and a
//! client past limits it was told in SETTINGS gets no more than h2 would give it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::hpack::{encode, Decoder};
use super::PREFACE;

pub(super) const FRAME_HEADER: usize = 9;
pub(super) const HEADERS: u8 = 0x1;
pub(super) const CONTINUATION: u8 = 0x9;
pub(super) const END_STREAM: u8 = 0x1;
pub(super) const END_HEADERS: u8 = 0x4;
pub(super) const PADDED: u8 = 0x8;
pub(super) const PRIORITY: u8 = 0x20;

/// SETTINGS_MAX_FRAME_SIZE flexd advertises (the endpoint sets it on the server; it is also
/// hyper's default). A client may send no larger frame, so the rewriter refuses one on its
/// header, as h2 does, before reading its payload.
pub const MAX_FRAME_SIZE: u32 = 16_384;
/// SETTINGS_MAX_HEADER_LIST_SIZE flexd advertises (set on the server; hyper's default). h2
/// refuses a stream whose decoded header list is larger, and the connection past four times
/// this (its "abuse" limit).
pub const MAX_HEADER_LIST_SIZE: u32 = 16_384;
/// The decoded header list (RFC 7541 sizes: name + value + 32 per field) past which a block is
/// not rewritten: h2's own connection-ending limit, four times the advertised list size.
pub(super) const MAX_DECODED_LIST: usize = 4 * MAX_HEADER_LIST_SIZE as usize;
/// The bytes of one header block as received, its 9-byte frame headers counted (a flood of
/// empty CONTINUATION frames adds nothing else). The same bound as the decoded list: a block
/// of literals is never larger encoded than decoded, and decoding it stays cheap (a few
/// milliseconds of worst-case Huffman at most).
pub(super) const MAX_BLOCK_BYTES: usize = MAX_DECODED_LIST;
/// Frames in one header block: HEADERS and the CONTINUATION frames h2 itself allows at the
/// advertised sizes (at least 5; a quarter more than the list size needs in full frames).
pub(super) const MAX_BLOCK_FRAMES: usize = 1 + {
    let full = MAX_HEADER_LIST_SIZE / MAX_FRAME_SIZE;
    let allowed = full + full / 4;
    if allowed < 5 {
        5
    } else {
        allowed as usize
    }
};
/// The HPACK dynamic table a client may ask for: SETTINGS_HEADER_TABLE_SIZE's default, which
/// flexd (h2) does not raise.
pub(super) const MAX_TABLE: usize = 4096;
/// What an unusable authority becomes.
pub const REPLACEMENT: &str = "localhost";

/// Whether h2 accepts this `:authority` (it parses it as an [`http::uri::Authority`]).
pub(super) fn acceptable(authority: &[u8]) -> bool {
    tonic::codegen::http::uri::Authority::try_from(authority).is_ok()
}

/// A client past one of HTTP/2's limits: its connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("a frame of {0} bytes, above the advertised SETTINGS_MAX_FRAME_SIZE")]
    FrameTooLarge(usize),
    #[error("a header block of more than {MAX_BLOCK_FRAMES} frames")]
    TooManyBlockFrames,
    #[error("a header block of more than {MAX_BLOCK_BYTES} bytes")]
    BlockTooLarge,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Preface,
    Frames,
    /// Not HTTP/2 as gRPC speaks it, or a block that did not decode: left to h2.
    PassThrough,
    /// Past a limit: every read fails, and h2 (hyper) drops the connection.
    Refused(Violation),
}

/// A header block being collected (HEADERS, then CONTINUATION frames).
pub(super) struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    /// The frames as they came (headers included), in case the block must pass through
    /// unchanged; its length is what [`MAX_BLOCK_BYTES`] bounds.
    raw: Vec<u8>,
    frames: usize,
}

/// An accepted connection whose incoming header blocks carry an authority h2 accepts.
///
/// What it holds per connection is bounded by HTTP/2's own limits, checked on each frame's
/// header before its payload is read: a header block at most [`MAX_BLOCK_BYTES`] (and its
/// rewrite), the unread part of one frame, and a [`MAX_TABLE`] HPACK table. Other frames
/// (DATA above all) are streamed through as they arrive, never collected whole.
pub struct AuthorityFix<S> {
    inner: S,
    mode: Mode,
    /// Bytes read from the client, not yet processed.
    input: Vec<u8>,
    /// Bytes processed and ready for h2.
    output: Vec<u8>,
    output_pos: usize,
    /// Payload bytes of the frame being streamed through still to come.
    streaming: usize,
    block: Option<Block>,
    decoder: Decoder,
    eof: bool,
}

impl<S> AuthorityFix<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            mode: Mode::Preface,
            input: Vec::new(),
            output: Vec::new(),
            output_pos: 0,
            streaming: 0,
            block: None,
            decoder: Decoder::default(),
            eof: false,
        }
    }

    /// Moves everything complete from `input` to `output` (a streamed frame's payload as far
    /// as it came), or refuses the connection.
    fn process(&mut self) {
        let input = std::mem::take(&mut self.input);
        let mut pos = 0;
        if let Err(violation) = self.process_from(&input, &mut pos) {
            self.refuse(violation);
            return;
        }
        // Back into its buffer, less what was processed (one move, not one per frame).
        self.input = input;
        self.input.drain(..pos);
    }

    fn process_from(&mut self, input: &[u8], pos: &mut usize) -> Result<(), Violation> {
        loop {
            let rest = &input[*pos..];
            match self.mode {
                Mode::Refused(_) => return Ok(()),
                Mode::PassThrough => {
                    self.output.extend_from_slice(rest);
                    *pos = input.len();
                    return Ok(());
                }
                Mode::Preface => {
                    let n = rest.len().min(PREFACE.len());
                    if rest[..n] != PREFACE[..n] {
                        self.mode = Mode::PassThrough;
                        continue;
                    }
                    if n < PREFACE.len() {
                        return Ok(());
                    }
                    self.output.extend_from_slice(PREFACE);
                    *pos += PREFACE.len();
                    self.mode = Mode::Frames;
                }
                Mode::Frames if self.streaming > 0 => {
                    let n = self.streaming.min(rest.len());
                    self.output.extend_from_slice(&rest[..n]);
                    *pos += n;
                    self.streaming -= n;
                    if self.streaming > 0 {
                        return Ok(());
                    }
                }
                Mode::Frames => {
                    if rest.len() < FRAME_HEADER {
                        return Ok(());
                    }
                    let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
                    if len > MAX_FRAME_SIZE as usize {
                        return Err(Violation::FrameTooLarge(len));
                    }
                    let kind = rest[3];
                    if kind != HEADERS && kind != CONTINUATION && self.block.is_none() {
                        // Not part of a header block: h2's as it comes.
                        self.output.extend_from_slice(&rest[..FRAME_HEADER]);
                        *pos += FRAME_HEADER;
                        self.streaming = len;
                        continue;
                    }
                    if rest.len() < FRAME_HEADER + len {
                        return Ok(());
                    }
                    self.frame(&rest[..FRAME_HEADER + len])?;
                    *pos += FRAME_HEADER + len;
                }
            }
        }
    }

    /// Closes the connection for `violation`: nothing more reaches h2.
    fn refuse(&mut self, violation: Violation) {
        tracing::debug!(%violation, "HTTP/2 client past the advertised limits; connection closed");
        self.input = Vec::new();
        self.output = Vec::new();
        self.output_pos = 0;
        self.block = None;
        self.mode = Mode::Refused(violation);
    }

    /// Stops rewriting: whatever is collected goes to h2 as it came.
    fn give_up(&mut self) {
        if let Some(block) = self.block.take() {
            self.output.extend(block.raw);
        }
        self.mode = Mode::PassThrough;
    }

    /// One whole frame of (or inside) a header block.
    fn frame(&mut self, frame: &[u8]) -> Result<(), Violation> {
        let kind = frame[3];
        let flags = frame[4];
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEADER..];
        match (kind, self.block.as_mut()) {
            (HEADERS, None) => self.start_block(frame),
            (CONTINUATION, Some(block)) => {
                if block.frames >= MAX_BLOCK_FRAMES {
                    return Err(Violation::TooManyBlockFrames);
                }
                if block.raw.len() + frame.len() > MAX_BLOCK_BYTES {
                    return Err(Violation::BlockTooLarge);
                }
                block.raw.extend_from_slice(frame);
                block.frames += 1;
                if block.stream != stream {
                    self.give_up();
                    return Ok(());
                }
                block.fragment.extend_from_slice(payload);
                if flags & END_HEADERS != 0 {
                    self.finish_block();
                }
            }
            // Anything else inside a header block is a protocol error h2 reports itself.
            (_, Some(block)) => {
                block.raw.extend_from_slice(frame);
                self.give_up();
            }
            // A CONTINUATION outside a block: h2's protocol error too.
            (_, None) => self.output.extend_from_slice(frame),
        }
        Ok(())
    }

    /// A HEADERS frame: the block it starts, finished at once when it ends there.
    fn start_block(&mut self, frame: &[u8]) {
        let flags = frame[4];
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let mut body = &frame[FRAME_HEADER..];
        let mut pad = 0;
        if flags & PADDED != 0 {
            let Some((&n, rest)) = body.split_first() else {
                return self.pass_bad(frame);
            };
            pad = n as usize;
            body = rest;
        }
        let mut priority = None;
        if flags & PRIORITY != 0 {
            if body.len() < 5 {
                return self.pass_bad(frame);
            }
            priority = Some([body[0], body[1], body[2], body[3], body[4]]);
            body = &body[5..];
        }
        if pad > body.len() {
            return self.pass_bad(frame);
        }
        self.block = Some(Block {
            stream,
            end_stream: flags & END_STREAM != 0,
            priority,
            fragment: body[..body.len() - pad].to_vec(),
            raw: frame.to_vec(),
            frames: 1,
        });
        if flags & END_HEADERS != 0 {
            self.finish_block();
        }
    }

    fn pass_bad(&mut self, frame: &[u8]) {
        self.output.extend_from_slice(frame);
        self.mode = Mode::PassThrough;
    }

    fn finish_block(&mut self) {
        let Some(block) = self.block.take() else {
            return;
        };
        let Ok(mut headers) = self.decoder.decode(&block.fragment) else {
            self.output.extend(block.raw);
            self.mode = Mode::PassThrough;
            return;
        };
        for (name, value) in &mut headers {
            if name == b":authority" && !acceptable(value) {
                tracing::debug!(authority = %String::from_utf8_lossy(value), "gRPC client sent an authority h2 refuses; serving it as localhost");
                *value = REPLACEMENT.as_bytes().to_vec();
            }
        }
        let encoded = encode(&headers);
        let mut chunks = encoded.chunks(MAX_FRAME_SIZE as usize - 5).peekable();
        let mut first = true;
        // An empty block is still one HEADERS frame.
        let empty: &[u8] = &[];
        let mut next = chunks.next().or(Some(empty));
        while let Some(chunk) = next {
            next = chunks.next();
            let last = next.is_none();
            let mut flags = if last { END_HEADERS } else { 0 };
            let mut payload = Vec::with_capacity(chunk.len() + 5);
            let kind = if first {
                if block.end_stream {
                    flags |= END_STREAM;
                }
                if let Some(p) = block.priority {
                    flags |= PRIORITY;
                    payload.extend_from_slice(&p);
                }
                HEADERS
            } else {
                CONTINUATION
            };
            payload.extend_from_slice(chunk);
            write_frame(&mut self.output, kind, flags, block.stream, &payload);
            first = false;
        }
    }
}

pub(super) fn write_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if let Mode::Refused(violation) = &this.mode {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    violation.clone(),
                )));
            }
            if this.output_pos < this.output.len() {
                let n = buf.remaining().min(this.output.len() - this.output_pos);
                buf.put_slice(&this.output[this.output_pos..this.output_pos + n]);
                this.output_pos += n;
                if this.output_pos == this.output.len() {
                    this.output.clear();
                    this.output_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // Whatever is left unprocessed (a truncated frame) goes to h2 as it is.
                if !this.input.is_empty() {
                    this.give_up();
                    this.output.append(&mut this.input);
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    if read.filled().is_empty() {
                        this.eof = true;
                    } else {
                        this.input.extend_from_slice(read.filled());
                        this.process();
                    }
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityFix<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
