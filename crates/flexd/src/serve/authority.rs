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

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The frame size every HTTP/2 peer accepts (h2's default SETTINGS_MAX_FRAME_SIZE).
const MAX_FRAME: usize = 16_384;
/// Bounds on what one connection may make us hold: a frame, a header block, the HPACK table.
const MAX_INPUT_FRAME: usize = 1 << 24;
const MAX_BLOCK: usize = 1 << 20;
const MAX_TABLE: usize = 1 << 16;
/// What an unusable authority becomes.
pub const REPLACEMENT: &str = "localhost";

/// Whether h2 accepts this `:authority` (it parses it as an [`http::uri::Authority`]).
fn acceptable(authority: &[u8]) -> bool {
    tonic::codegen::http::uri::Authority::try_from(authority).is_ok()
}

#[derive(Debug, PartialEq, Eq)]
enum Mode {
    Preface,
    Frames,
    /// Not HTTP/2 as gRPC speaks it, or a block that did not decode: left to h2.
    PassThrough,
}

/// A header block being collected (HEADERS, then CONTINUATION frames).
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    /// The frames as they came, in case the block must pass through unchanged.
    raw: Vec<u8>,
}

/// An accepted connection whose incoming header blocks carry an authority h2 accepts.
pub struct AuthorityFix<S> {
    inner: S,
    mode: Mode,
    /// Bytes read from the client, not yet processed.
    input: Vec<u8>,
    /// Bytes processed and ready for h2.
    output: Vec<u8>,
    output_pos: usize,
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
            block: None,
            decoder: Decoder::default(),
            eof: false,
        }
    }

    /// Moves everything complete from `input` to `output`.
    fn process(&mut self) {
        loop {
            match self.mode {
                Mode::PassThrough => {
                    self.output.append(&mut self.input);
                    return;
                }
                Mode::Preface => {
                    let n = self.input.len().min(PREFACE.len());
                    if self.input[..n] != PREFACE[..n] {
                        self.mode = Mode::PassThrough;
                        continue;
                    }
                    if n < PREFACE.len() {
                        return;
                    }
                    self.output.extend(self.input.drain(..PREFACE.len()));
                    self.mode = Mode::Frames;
                }
                Mode::Frames => {
                    if self.input.len() < FRAME_HEADER {
                        return;
                    }
                    let len = u32::from_be_bytes([0, self.input[0], self.input[1], self.input[2]])
                        as usize;
                    if len > MAX_INPUT_FRAME {
                        self.give_up();
                        continue;
                    }
                    if self.input.len() < FRAME_HEADER + len {
                        return;
                    }
                    let frame: Vec<u8> = self.input.drain(..FRAME_HEADER + len).collect();
                    self.frame(frame);
                }
            }
        }
    }

    /// Stops rewriting: whatever is collected goes to h2 as it came.
    fn give_up(&mut self) {
        if let Some(block) = self.block.take() {
            self.output.extend(block.raw);
        }
        self.mode = Mode::PassThrough;
    }

    fn frame(&mut self, frame: Vec<u8>) {
        let kind = frame[3];
        let flags = frame[4];
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEADER..];
        match (kind, self.block.is_some()) {
            (HEADERS, false) => {
                let mut body = payload;
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
                let fragment = body[..body.len() - pad].to_vec();
                self.block = Some(Block {
                    stream,
                    end_stream: flags & END_STREAM != 0,
                    priority,
                    fragment,
                    raw: frame.clone(),
                });
                if flags & END_HEADERS != 0 {
                    self.finish_block();
                }
            }
            (CONTINUATION, true) => {
                let Some(block) = self.block.as_mut() else {
                    return;
                };
                if block.stream != stream || block.fragment.len() + payload.len() > MAX_BLOCK {
                    block.raw.extend_from_slice(&frame);
                    return self.give_up();
                }
                block.fragment.extend_from_slice(payload);
                block.raw.extend_from_slice(&frame);
                if flags & END_HEADERS != 0 {
                    self.finish_block();
                }
            }
            // Anything else inside a header block is a protocol error h2 reports itself.
            (_, true) => {
                if let Some(block) = self.block.as_mut() {
                    block.raw.extend_from_slice(&frame);
                }
                self.give_up();
            }
            (_, false) => self.output.extend_from_slice(&frame),
        }
    }

    fn pass_bad(&mut self, frame: Vec<u8>) {
        self.output.extend_from_slice(&frame);
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
        let mut chunks = encoded.chunks(MAX_FRAME - 5).peekable();
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

fn write_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
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

/// A header field: name and value, as bytes.
pub type Field = (Vec<u8>, Vec<u8>);

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("header block does not decode: {0}")]
pub struct HpackError(&'static str);

/// HPACK decoding (RFC 7541) with the sender's dynamic table.
pub struct Decoder {
    table: std::collections::VecDeque<Field>,
    size: usize,
    max: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self {
            table: Default::default(),
            size: 0,
            max: 4096,
        }
    }
}

/// RFC 7541 Appendix A.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

fn integer(input: &[u8], pos: &mut usize, prefix: u8) -> Result<usize, HpackError> {
    let mask = (1u16 << prefix) as usize - 1;
    let first = *input.get(*pos).ok_or(HpackError("truncated integer"))? as usize & mask;
    *pos += 1;
    if first < mask {
        return Ok(first);
    }
    let mut value = mask;
    let mut shift = 0;
    loop {
        let byte = *input.get(*pos).ok_or(HpackError("truncated integer"))?;
        *pos += 1;
        if shift > 28 {
            return Err(HpackError("integer too large"));
        }
        value += ((byte & 0x7f) as usize) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
}

fn string(input: &[u8], pos: &mut usize) -> Result<Vec<u8>, HpackError> {
    let huffman = input.get(*pos).ok_or(HpackError("truncated string"))? & 0x80 != 0;
    let len = integer(input, pos, 7)?;
    let end = pos
        .checked_add(len)
        .filter(|e| *e <= input.len())
        .ok_or(HpackError("truncated string"))?;
    let raw = &input[*pos..end];
    *pos = end;
    if huffman {
        huffman_decode(raw)
    } else {
        Ok(raw.to_vec())
    }
}

fn huffman_decode(input: &[u8]) -> Result<Vec<u8>, HpackError> {
    static CODES: OnceLock<HashMap<(u8, u32), u8>> = OnceLock::new();
    let codes = CODES.get_or_init(|| {
        HUFFMAN
            .iter()
            .enumerate()
            .map(|(byte, &(code, len))| ((len, code), byte as u8))
            .collect()
    });
    let mut out = Vec::with_capacity(input.len() * 8 / 5);
    let (mut code, mut len) = (0u32, 0u8);
    for byte in input {
        for bit in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> bit) & 1);
            len += 1;
            if len >= 5 {
                if let Some(&symbol) = codes.get(&(len, code)) {
                    out.push(symbol);
                    code = 0;
                    len = 0;
                } else if len >= 30 {
                    return Err(HpackError("bad Huffman code"));
                }
            }
        }
    }
    // Padding: fewer than 8 bits, all ones (the EOS prefix).
    if len > 7 || code != (1u32 << len) - 1 {
        return Err(HpackError("bad Huffman padding"));
    }
    Ok(out)
}

impl Decoder {
    fn get(&self, index: usize) -> Result<Field, HpackError> {
        match index {
            0 => Err(HpackError("index 0")),
            1..=61 => {
                let (n, v) = STATIC[index - 1];
                Ok((n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            }
            _ => self
                .table
                .get(index - 62)
                .cloned()
                .ok_or(HpackError("index past the table")),
        }
    }

    fn evict(&mut self) {
        while self.size > self.max {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + 32,
                None => break,
            }
        }
    }

    fn insert(&mut self, field: Field) {
        self.size += field.0.len() + field.1.len() + 32;
        self.table.push_front(field);
        self.evict();
    }

    /// One header block, updating the table as the sender did.
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<Field>, HpackError> {
        let mut fields = Vec::new();
        let mut total = 0;
        let mut pos = 0;
        while pos < block.len() {
            let byte = block[pos];
            let field = if byte & 0x80 != 0 {
                self.get(integer(block, &mut pos, 7)?)?
            } else if byte & 0xe0 == 0x20 {
                let size = integer(block, &mut pos, 5)?;
                if size > MAX_TABLE {
                    return Err(HpackError("table size update too large"));
                }
                self.max = size;
                self.evict();
                continue;
            } else {
                let (prefix, index) = if byte & 0x40 != 0 {
                    (6, true)
                } else {
                    (4, false)
                };
                let name_index = integer(block, &mut pos, prefix)?;
                let name = if name_index == 0 {
                    string(block, &mut pos)?
                } else {
                    self.get(name_index)?.0
                };
                let value = string(block, &mut pos)?;
                if index {
                    self.insert((name.clone(), value.clone()));
                }
                (name, value)
            };
            total += field.0.len() + field.1.len() + 32;
            if total > MAX_BLOCK {
                return Err(HpackError("header list too large"));
            }
            fields.push(field);
        }
        Ok(fields)
    }
}

fn put_integer(out: &mut Vec<u8>, first: u8, prefix: u8, mut value: usize) {
    let mask = (1usize << prefix) - 1;
    if value < mask {
        out.push(first | value as u8);
        return;
    }
    out.push(first | mask as u8);
    value -= mask;
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The fields as literals without indexing (no Huffman, no dynamic table): any decoder reads
/// them with no state of its own.
pub fn encode(fields: &[Field]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0);
        put_integer(&mut out, 0, 7, name.len());
        out.extend_from_slice(name);
        put_integer(&mut out, 0, 7, value.len());
        out.extend_from_slice(value);
    }
    out
}

/// RFC 7541 Appendix B: the Huffman code (and its length in bits) of every byte.
#[rustfmt::skip]
const HUFFMAN: [(u32, u8); 256] = [
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28), (0xfffffe4, 28), (0xfffffe5, 28),
    (0xfffffe6, 28), (0xfffffe7, 28), (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28),
    (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28), (0xfffffed, 28), (0xfffffee, 28),
    (0xfffffef, 28), (0xffffff0, 28), (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),
    (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28), (0xffffff8, 28), (0xffffff9, 28),
    (0xffffffa, 28), (0xffffffb, 28), (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11), (0x3fa, 10), (0x3fb, 10),
    (0xf9, 8), (0x7fb, 11), (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),
    (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6), (0x1a, 6), (0x1b, 6),
    (0x1c, 6), (0x1d, 6), (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8),
    (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10), (0x1ffa, 13), (0x21, 6),
    (0x5d, 7), (0x5e, 7), (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),
    (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7), (0x67, 7), (0x68, 7),
    (0x69, 7), (0x6a, 7), (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7),
    (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7), (0xfc, 8), (0x73, 7),
    (0xfd, 8), (0x1ffb, 13), (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),
    (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5), (0x24, 6), (0x5, 5),
    (0x25, 6), (0x26, 6), (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7),
    (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5), (0x2b, 6), (0x76, 7),
    (0x2c, 6), (0x8, 5), (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),
    (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15), (0x7fc, 11), (0x3ffd, 14),
    (0x1ffd, 13), (0xffffffc, 28), (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23), (0x3fffd6, 22), (0x7fffda, 23),
    (0x7fffdb, 23), (0x7fffdc, 23), (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),
    (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23), (0xffffee, 24), (0x7fffe1, 23),
    (0x7fffe2, 23), (0x7fffe3, 23), (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23),
    (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24), (0x3fffda, 22), (0x1fffdd, 21),
    (0xfffe9, 20), (0x3fffdb, 22), (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),
    (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24), (0x1fffdf, 21), (0x3fffdf, 22),
    (0x7fffeb, 23), (0x7fffec, 23), (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21),
    (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23), (0xfffea, 20), (0x3fffe2, 22),
    (0x3fffe3, 22), (0x3fffe4, 22), (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19), (0x3fffe7, 22), (0x7ffff2, 23),
    (0x3fffe8, 22), (0x1ffffec, 25), (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27),
    (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25), (0x7fff2, 19), (0x1fffe3, 21),
    (0x3ffffe6, 26), (0x7ffffe0, 27), (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),
    (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26), (0xffffffd, 28), (0x7ffffe3, 27),
    (0x7ffffe4, 27), (0x7ffffe5, 27), (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21),
    (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23), (0x3fffea, 22), (0x3fffeb, 22),
    (0x1ffffee, 25), (0x1ffffef, 25), (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),
    (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26), (0x7ffffe7, 27), (0x7ffffe8, 27),
    (0x7ffffe9, 27), (0x7ffffea, 27), (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: &str, v: &str) -> Field {
        (n.as_bytes().to_vec(), v.as_bytes().to_vec())
    }

    #[test]
    fn rfc_7541_examples_decode() {
        // C.4: requests with Huffman coding, sharing one dynamic table.
        let mut d = Decoder::default();
        let first = hex("828684418cf1e3c2e5f23a6ba0ab90f4ff");
        assert_eq!(
            d.decode(&first).unwrap(),
            vec![
                field(":method", "GET"),
                field(":scheme", "http"),
                field(":path", "/"),
                field(":authority", "www.example.com"),
            ]
        );
        let second = hex("828684be5886a8eb10649cbf");
        assert_eq!(
            d.decode(&second).unwrap()[3..],
            [
                field(":authority", "www.example.com"),
                field("cache-control", "no-cache")
            ]
        );
        // An index past the table, a truncated string: errors, not panics.
        assert!(Decoder::default().decode(&[0xff, 0x80]).is_err());
        assert!(Decoder::default().decode(&[0x00, 0x05, b'a']).is_err());
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn encoded_fields_decode_back_with_long_values() {
        let fields = vec![field(":authority", ""), field("x", &"v".repeat(300))];
        assert_eq!(Decoder::default().decode(&encode(&fields)).unwrap(), fields);
    }

    #[test]
    fn only_authorities_h2_refuses_are_replaced() {
        for ok in ["localhost", "flexd:443", "unix"] {
            assert!(acceptable(ok.as_bytes()), "{ok}");
        }
        for bad in ["", "/run/csi.sock", "%2Frun%2Fcsi.sock"] {
            assert!(!acceptable(bad.as_bytes()), "{bad}");
        }
    }

    /// A client's bytes through the wrapper, as h2 would read them.
    async fn through(input: Vec<u8>) -> Vec<u8> {
        use tokio::io::AsyncReadExt as _;
        let (mut client, server) = tokio::io::duplex(1 << 20);
        tokio::io::AsyncWriteExt::write_all(&mut client, &input)
            .await
            .unwrap();
        drop(client);
        let mut fixed = AuthorityFix::new(server);
        let mut out = Vec::new();
        fixed.read_to_end(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn header_blocks_are_rewritten_and_other_frames_pass_untouched() {
        let mut input = PREFACE.to_vec();
        write_frame(&mut input, 0x4, 0, 0, &[]); // SETTINGS
        let block = encode(&[
            field(":method", "POST"),
            field(":authority", "/run/csi.sock"),
        ]);
        // Split across HEADERS + CONTINUATION, padded.
        let mut headers = vec![2u8];
        headers.extend_from_slice(&block[..4]);
        headers.extend_from_slice(&[0, 0]);
        write_frame(&mut input, HEADERS, PADDED, 1, &headers);
        write_frame(&mut input, CONTINUATION, END_HEADERS, 1, &block[4..]);
        write_frame(&mut input, 0x0, END_STREAM, 1, b"\0\0\0\0\0");
        let out = through(input).await;
        assert!(out.starts_with(PREFACE));
        let mut frames = Vec::new();
        let mut pos = PREFACE.len();
        while pos < out.len() {
            let len = u32::from_be_bytes([0, out[pos], out[pos + 1], out[pos + 2]]) as usize;
            frames.push((
                out[pos + 3],
                out[pos + 4],
                out[pos + 9..pos + 9 + len].to_vec(),
            ));
            pos += 9 + len;
        }
        assert_eq!(frames.len(), 3, "{frames:?}");
        assert_eq!((frames[1].0, frames[1].1), (HEADERS, END_HEADERS));
        assert_eq!(
            Decoder::default().decode(&frames[1].2).unwrap(),
            vec![field(":method", "POST"), field(":authority", "localhost")]
        );
        assert_eq!(frames[2], (0x0, END_STREAM, b"\0\0\0\0\0".to_vec()));
    }

    #[tokio::test]
    async fn what_is_not_http2_passes_as_it_came() {
        let input = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        assert_eq!(through(input.clone()).await, input);
        let mut bad = PREFACE.to_vec();
        write_frame(&mut bad, HEADERS, END_HEADERS, 1, &[0xff, 0x80]);
        assert_eq!(through(bad.clone()).await, bad);
    }
}
