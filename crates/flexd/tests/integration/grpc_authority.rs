//! Every gRPC client reaches a real `flexd serve` over its Unix socket, whatever HTTP/2
//! `:authority` it sends: `localhost` (grpc-go, kubelet), empty, the socket path
//! percent-encoded (grpcio >= 1.57's default) or raw (grpc-java, `csc`). The first test speaks
//! HTTP/2 itself, byte by byte, so each authority is exactly the one under test; the second
//! uses Python's grpcio (installed from PyPI when absent, skipped loudly when that fails).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use test_support::serve::Server;

const CSI_NAME: &str = "flexvolume-acme--tmpfs";

/// `flexd serve --mode both` (the shared harness) with the example tmpfs driver, and its socket.
struct Serve {
    _server: Server,
    socket: PathBuf,
}

fn serve() -> Serve {
    let server = Server::start_in_mode("both", |plugins| {
        test_support::ok(&test_support::install_driver(
            plugins,
            "acme/tmpfs",
            &test_support::driver_source("tmpfs/tmpfs"),
        ));
    });
    let socket = server.socket(CSI_NAME);
    Serve {
        _server: server,
        socket,
    }
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// A header field as an HPACK literal without indexing (no Huffman): exactly these bytes.
fn literal(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0);
    for s in [name, value] {
        assert!(s.len() < 127);
        out.push(s.len() as u8);
        out.extend(s.as_bytes());
    }
}

/// One GetPluginInfo over raw HTTP/2 with this `:authority`; the response's gRPC message, or
/// what went wrong.
fn get_plugin_info(socket: &Path, authority: &str) -> Result<Vec<u8>, String> {
    let mut s = UnixStream::connect(socket).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut block = Vec::new();
    for (n, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/csi.v1.Identity/GetPluginInfo"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        literal(&mut block, n, v);
    }
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    out.extend(frame(0x1, 0x4, 1, &block)); // HEADERS, END_HEADERS
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0])); // DATA: an empty message, END_STREAM
    s.write_all(&out).map_err(|e| e.to_string())?;
    let mut message = Vec::new();
    loop {
        let mut head = [0u8; 9];
        s.read_exact(&mut head)
            .map_err(|e| format!("connection ended: {e}"))?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0; len];
        s.read_exact(&mut payload).map_err(|e| e.to_string())?;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        match kind {
            0x4 if flags & 0x1 == 0 => {
                s.write_all(&frame(0x4, 0x1, 0, &[])).unwrap(); // SETTINGS ACK
            }
            0x0 if stream == 1 => {
                message.extend(&payload);
                if flags & 0x1 != 0 {
                    return Ok(message);
                }
            }
            0x1 if stream == 1 && flags & 0x1 != 0 => return Ok(message),
            0x3 if stream == 1 => return Err(format!("stream reset: {payload:?}")),
            0x7 => return Err(format!("GOAWAY: {payload:?}")),
            _ => {}
        }
    }
}

fn percent_encoded(path: &Path) -> String {
    path.to_string_lossy()
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn every_authority_a_grpc_client_sends_reaches_flexd() {
    let server = serve();
    let path = server.socket.to_string_lossy().into_owned();
    for authority in [
        "localhost".to_owned(),
        String::new(),
        percent_encoded(&server.socket),
        path.clone(),
    ] {
        let message = get_plugin_info(&server.socket, &authority)
            .unwrap_or_else(|e| panic!("authority {authority:?}: {e}"));
        assert!(
            message
                .windows(CSI_NAME.len())
                .any(|w| w == CSI_NAME.as_bytes()),
            "authority {authority:?}: GetPluginInfo answered {message:?}"
        );
    }
}

const GRPCIO_CLIENT: &str = r#"
import sys, grpc
socket, authority = sys.argv[1], sys.argv[2]
options = [] if authority == "-" else [("grpc.default_authority", authority)]
channel = grpc.insecure_channel("unix:" + socket, options=options)
call = channel.unary_unary("/csi.v1.Identity/GetPluginInfo")
sys.stdout.write(call(b"", timeout=20).hex())
"#;

fn grpcio_available() -> bool {
    let import = || {
        Command::new("python3")
            .args(["-c", "import grpc"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if import() {
        return true;
    }
    let _ = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "grpcio"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    import()
}

#[test]
fn python_grpcio_reaches_flexd_with_its_default_authority_and_others() {
    if !grpcio_available() {
        test_support::skip!("python3 with grpcio is not available (pip install grpcio failed)");
    }
    let server = serve();
    let path = server.socket.to_string_lossy().into_owned();
    // "-": grpcio's own default (the percent-encoded socket path since 1.57).
    for authority in ["-", "localhost", path.as_str()] {
        let out = test_support::output_ok(
            Command::new("python3").args(["-c", GRPCIO_CLIENT, &path, authority]),
            format_args!("grpcio with authority {authority:?}"),
        );
        let hex: String = CSI_NAME.bytes().map(|b| format!("{b:02x}")).collect();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&hex),
            "grpcio with authority {authority:?}: {:?}",
            out.stdout
        );
    }
}
