//! The rewriter and the codec on the RFC's examples and on hostile frames.

use std::io;

use super::authority::{
    acceptable, write_frame, AuthorityFix, Violation, CONTINUATION, END_HEADERS, END_STREAM,
    FRAME_HEADER, HEADERS, MAX_BLOCK_BYTES, MAX_BLOCK_FRAMES, MAX_DECODED_LIST, MAX_FRAME_SIZE,
    PADDED,
};
use super::hpack::{encode, huffman_decode, Decoder, Field, HpackError, HUFFMAN};
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
