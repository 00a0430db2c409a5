//! HPACK (RFC 7541): decoding with the sender's dynamic table and Huffman codes, and encoding
//! as literals only, so the receiver's table never depends on the sender's. Pure: bytes in,
//! header fields out.

use std::sync::OnceLock;

use super::authority::{MAX_DECODED_LIST, MAX_TABLE};

/// A header field: name and value, as bytes.
pub type Field = (Vec<u8>, Vec<u8>);

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("header block does not decode: {0}")]
pub struct HpackError(pub(super) &'static str);

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
pub(super) const STATIC: [(&str, &str); 61] = [
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

pub(super) fn integer(input: &[u8], pos: &mut usize, prefix: u8) -> Result<usize, HpackError> {
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

pub(super) fn string(input: &[u8], pos: &mut usize) -> Result<Vec<u8>, HpackError> {
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
pub(super) struct Canonical {
    /// Per code length: the first code of that length, how many there are, and where their
    /// symbols start in `symbols`.
    first: [u32; 31],
    count: [u32; 31],
    offset: [usize; 31],
    symbols: [u8; 256],
}

pub(super) fn canonical() -> &'static Canonical {
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

pub(super) fn huffman_decode(input: &[u8]) -> Result<Vec<u8>, HpackError> {
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

pub(super) fn put_integer(out: &mut Vec<u8>, first: u8, prefix: u8, mut value: usize) {
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
pub(super) const HUFFMAN: [(u32, u8); 256] = [
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
