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
use std::sync::OnceLock;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The HTTP/2 client preface (RFC 9113 §3.4): the 24 bytes every gRPC client sends first.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

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
const MAX_DECODED_LIST: usize = 4 * MAX_HEADER_LIST_SIZE as usize;
/// The bytes of one header block as received, its 9-byte frame headers counted (a flood of
/// empty CONTINUATION frames adds nothing else). The same bound as the decoded list: a block
/// of literals is never larger encoded than decoded, and decoding it stays cheap (a few
/// milliseconds of worst-case Huffman at most).
const MAX_BLOCK_BYTES: usize = MAX_DECODED_LIST;
/// Frames in one header block: HEADERS and the CONTINUATION frames h2 itself allows at the
/// advertised sizes (at least 5; a quarter more than the list size needs in full frames).
const MAX_BLOCK_FRAMES: usize = 1 + {
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
const MAX_TABLE: usize = 4096;
/// What an unusable authority becomes.
pub const REPLACEMENT: &str = "localhost";

/// Whether h2 accepts this `:authority` (it parses it as an [`http::uri::Authority`]).
fn acceptable(authority: &[u8]) -> bool {
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
enum Mode {
    Preface,
    Frames,
    /// Not HTTP/2 as gRPC speaks it, or a block that did not decode: left to h2.
    PassThrough,
    /// Past a limit: every read fails, and h2 (hyper) drops the connection.
    Refused(Violation),
}

/// A header block being collected (HEADERS, then CONTINUATION frames).
struct Block {
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

/// The Huffman code read canonically (RFC 7541's code is canonical: within a length, codes
/// are consecutive in symbol order), so a bit costs a comparison, not a table lookup.
struct Canonical {
    /// Per code length: the first code of that length, how many there are, and where their
    /// symbols start in `symbols`.
    first: [u32; 31],
    count: [u32; 31],
    offset: [usize; 31],
    symbols: [u8; 256],
}

fn canonical() -> &'static Canonical {
    static CANONICAL: OnceLock<Canonical> = OnceLock::new();
    CANONICAL.get_or_init(|| {
        let mut order: Vec<u8> = (0..=255).collect();
        order.sort_by_key(|&s| (HUFFMAN[s as usize].1, HUFFMAN[s as usize].0));
        let mut table = Canonical {
            first: [0; 31],
            count: [0; 31],
            offset: [0; 31],
            symbols: [0; 256],
        };
        for (i, &symbol) in order.iter().enumerate() {
            let (code, len) = HUFFMAN[symbol as usize];
            let len = len as usize;
            if table.count[len] == 0 {
                table.first[len] = code;
                table.offset[len] = i;
            }
            table.count[len] += 1;
            table.symbols[i] = symbol;
        }
        table
    })
}

fn huffman_decode(input: &[u8]) -> Result<Vec<u8>, HpackError> {
    let table = canonical();
    let mut out = Vec::with_capacity(input.len() * 8 / 5);
    let (mut code, mut len) = (0u32, 0usize);
    for byte in input {
        for bit in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> bit) & 1);
            len += 1;
            let index = code.wrapping_sub(table.first[len]);
            if index < table.count[len] {
                out.push(table.symbols[table.offset[len] + index as usize]);
                code = 0;
                len = 0;
            } else if len >= 30 {
                return Err(HpackError("bad Huffman code"));
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
            if total > MAX_DECODED_LIST {
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

    /// A client's bytes through the wrapper with the client still connected: what h2 reads
    /// before the wrapper waits for more (`Ok`), or the error that closes the connection.
    async fn read_while_open(input: Vec<u8>) -> Result<Vec<u8>, io::Error> {
        use tokio::io::AsyncReadExt as _;
        let (mut client, server) = tokio::io::duplex(1 << 20);
        tokio::io::AsyncWriteExt::write_all(&mut client, &input)
            .await
            .unwrap();
        let mut fixed = AuthorityFix::new(server);
        let mut out = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let wait = std::time::Duration::from_millis(200);
            match tokio::time::timeout(wait, fixed.read(&mut chunk)).await {
                Err(_) => return Ok(out),
                Ok(Ok(0)) => panic!("end of stream with the client connected"),
                Ok(Ok(n)) => out.extend_from_slice(&chunk[..n]),
                Ok(Err(e)) => return Err(e),
            }
        }
    }

    fn preface_and_settings() -> Vec<u8> {
        let mut input = PREFACE.to_vec();
        write_frame(&mut input, 0x4, 0, 0, &[]);
        input
    }

    fn refused_for(result: Result<Vec<u8>, io::Error>, expected: Violation) {
        let error = result.expect_err("the connection was not refused");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        let violation = error.get_ref().and_then(|e| e.downcast_ref::<Violation>());
        assert_eq!(violation, Some(&expected), "{error}");
    }

    #[tokio::test]
    async fn a_frame_above_the_advertised_size_is_refused_on_its_header() {
        for kind in [0x0, HEADERS] {
            let mut input = preface_and_settings();
            // The header alone: 16 MiB announced, none of it sent.
            input.extend_from_slice(&[0xff, 0xff, 0xff, kind, 0, 0, 0, 0, 1]);
            refused_for(
                read_while_open(input).await,
                Violation::FrameTooLarge(0xff_ffff),
            );
        }
        let mut input = preface_and_settings();
        let largest = (MAX_FRAME_SIZE as usize + 1).to_be_bytes();
        input.extend_from_slice(&largest[largest.len() - 3..]);
        input.extend_from_slice(&[0x0, 0, 0, 0, 0, 1]);
        refused_for(
            read_while_open(input).await,
            Violation::FrameTooLarge(MAX_FRAME_SIZE as usize + 1),
        );
    }

    #[tokio::test]
    async fn data_is_streamed_through_before_its_frame_is_complete() {
        let mut input = preface_and_settings();
        let settings_end = input.len();
        let announced = MAX_FRAME_SIZE.to_be_bytes();
        input.extend_from_slice(&announced[1..]);
        input.extend_from_slice(&[0x0, 0, 0, 0, 0, 1]);
        input.extend_from_slice(&[7u8; 100]);
        let out = read_while_open(input.clone()).await.unwrap();
        assert_eq!(out, input, "h2 got {} of {} bytes", out.len(), input.len());
        assert!(out.len() > settings_end + FRAME_HEADER);
    }

    #[tokio::test]
    async fn a_header_block_of_too_many_frames_is_refused_even_when_they_are_empty() {
        let block = encode(&[field(":method", "POST"), field(":authority", "")]);
        // The most CONTINUATION frames h2 allows: rewritten as usual.
        let mut input = preface_and_settings();
        write_frame(&mut input, HEADERS, 0, 1, &block);
        for _ in 2..MAX_BLOCK_FRAMES {
            write_frame(&mut input, CONTINUATION, 0, 1, &[]);
        }
        write_frame(&mut input, CONTINUATION, END_HEADERS, 1, &[]);
        let out = read_while_open(input).await.unwrap();
        let rewritten = encode(&[field(":method", "POST"), field(":authority", "localhost")]);
        assert!(out.ends_with(&rewritten), "{out:?}");
        // One more, and the connection is closed.
        let mut input = preface_and_settings();
        write_frame(&mut input, HEADERS, 0, 1, &block);
        for _ in 0..MAX_BLOCK_FRAMES {
            write_frame(&mut input, CONTINUATION, 0, 1, &[]);
        }
        refused_for(read_while_open(input).await, Violation::TooManyBlockFrames);
    }

    #[tokio::test]
    async fn a_header_block_of_too_many_bytes_is_refused_frame_headers_counted() {
        let full = vec![0u8; MAX_FRAME_SIZE as usize];
        let mut start = preface_and_settings();
        write_frame(&mut start, HEADERS, 0, 1, &full);
        write_frame(&mut start, CONTINUATION, 0, 1, &full);
        write_frame(&mut start, CONTINUATION, 0, 1, &full);
        let so_far = 3 * (FRAME_HEADER + full.len());
        // The largest last frame that fits, headers counted: h2 is given nothing yet.
        let fits = MAX_BLOCK_BYTES - so_far - FRAME_HEADER;
        let mut input = start.clone();
        write_frame(&mut input, CONTINUATION, 0, 1, &full[..fits]);
        let out = read_while_open(input).await.unwrap();
        assert_eq!(out.len(), PREFACE.len() + FRAME_HEADER, "{}", out.len());
        // One byte more: the payloads alone would still fit, the block does not.
        assert!(3 * full.len() + fits < MAX_BLOCK_BYTES);
        let mut input = start;
        write_frame(&mut input, CONTINUATION, 0, 1, &full[..fits + 1]);
        refused_for(read_while_open(input).await, Violation::BlockTooLarge);
    }

    #[test]
    fn a_header_list_decoding_past_h2s_limit_does_not_decode() {
        // Each byte names a static field: a small block, a large list.
        let block = vec![0x82; MAX_DECODED_LIST / 40 + 1];
        assert_eq!(
            Decoder::default().decode(&block),
            Err(HpackError("header list too large"))
        );
        assert!(Decoder::default()
            .decode(&block[..MAX_DECODED_LIST / 50])
            .is_ok());
    }

    /// The Huffman code of `input`, padded with ones (RFC 7541 5.2).
    fn huffman_encode(input: &[u8]) -> Vec<u8> {
        let (mut out, mut bits, mut pending) = (Vec::new(), 0u64, 0u32);
        for &byte in input {
            let (code, len) = HUFFMAN[byte as usize];
            bits = (bits << len) | u64::from(code);
            pending += u32::from(len);
            while pending >= 8 {
                pending -= 8;
                out.push((bits >> pending) as u8);
            }
        }
        if pending > 0 {
            out.push(((bits << (8 - pending)) as u8) | (0xff >> pending));
        }
        out
    }

    #[test]
    fn every_byte_decodes_from_its_huffman_code() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(huffman_decode(&huffman_encode(&all)).unwrap(), all);
        for byte in 0..=255u8 {
            assert_eq!(huffman_decode(&huffman_encode(&[byte])).unwrap(), [byte]);
        }
        // EOS (30 ones) inside a string, and padding that is not all ones, are errors.
        assert!(huffman_decode(&[0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(huffman_decode(&[0x00]).is_err());
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
