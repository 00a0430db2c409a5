//! Hostile edges, through the real binary: absurd thread counts, the (gid_t)-1 "owner",
//! connections that never speak HTTP/2, call-out cgroups left after a stop, and installs that
//! discovery would refuse. Real processes, real sockets, real cgroups.

use std::io::{Read as _, Write as _};
use std::ops::{Deref, DerefMut};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use test_support::serve::{
    identity_client, mount_capability, node_client, plugin_info, publish_request, Launch, Server,
};
use test_support::{eventually, examples, is_root, run_flexd as flexd, Sandbox};

/// A small tree whose modes and groups are recorded, to prove a refused pass changed nothing.
fn tree() -> (tempfile::TempDir, Vec<(PathBuf, u32, u32)>) {
    let dir = tempfile::tempdir().unwrap();
    for d in ["a", "a/b", "c"] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
    }
    for f in ["f", "a/g", "a/b/h", "c/i"] {
        let path = dir.path().join(f);
        std::fs::write(&path, b"x").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let state = snapshot(dir.path());
    (dir, state)
}

fn snapshot(root: &Path) -> Vec<(PathBuf, u32, u32)> {
    let mut all = vec![root.to_owned()];
    let mut i = 0;
    while i < all.len() {
        if all[i].is_dir() {
            let mut children: Vec<PathBuf> = std::fs::read_dir(&all[i])
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            children.sort();
            all.extend(children);
        }
        i += 1;
    }
    all.into_iter()
        .map(|p| {
            let meta = std::fs::symlink_metadata(&p).unwrap();
            (p, meta.mode(), meta.gid())
        })
        .collect()
}

#[test]
fn ownership_threads_beyond_the_cap_are_refused_and_below_it_clamped() {
    let (dir, before) = tree();
    let root = dir.path().to_str().unwrap();
    let out = flexd(&[
        "ownership",
        "apply",
        root,
        "--fs-group",
        "4321",
        "--threads",
        "100000",
    ]);
    // Bad usage, like every other bad flag value, with the range.
    test_support::assert_fails_saying(&out, 2, &["'--threads <THREADS>': 100000 is not in 0..=64"]);
    assert_eq!(
        snapshot(dir.path()),
        before,
        "a refused pass changed entries"
    );

    // The most the CLI accepts still runs with no more walkers than this machine can use.
    let gid = if is_root() {
        "4321".to_owned()
    } else {
        rustix::process::getegid().as_raw().to_string()
    };
    let out = flexd(&[
        "--output",
        "json",
        "ownership",
        "apply",
        root,
        "--fs-group",
        &gid,
        "--threads",
        "64",
    ]);
    assert!(out.status.success(), "{}", test_support::stderr_of(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let walkers = report["walkers"].as_u64().unwrap();
    assert!(
        (1..=(cores * 4).min(64)).contains(&walkers),
        "{walkers} walkers on {cores} cores"
    );
    assert_eq!(report["entries"], 8);
}

#[test]
fn numeric_flags_out_of_range_are_bad_usage_naming_the_range() {
    // Beyond what pids.max takes; once, a cgroup v1 cap of u32::MAX overflowed its `+ 1`.
    let out = flexd(&[
        "--driver-max-processes",
        "4294967295",
        "drivers",
        "--timeout",
        "1s",
    ]);
    test_support::assert_fails_saying(&out, 2, &["4294967295 is not in 0..=4194303"]);
    let out = test_support::clean_flexd()
        .env("FLEXD_DRIVER_MAX_PROCESSES", "5000000")
        .arg("drivers")
        .output()
        .unwrap();
    test_support::assert_fails_saying(&out, 2, &[]);
    for args in [
        ["--fs-group", "1", "--threads=-1"],
        ["--fs-group=-1", "--threads", "1"],
        ["--fs-group=x", "--threads", "1"],
    ] {
        let out = flexd(&[&["ownership", "apply", "/nonexistent"][..], &args].concat());
        test_support::assert_fails_saying(&out, 2, &["invalid value"]);
    }
}

#[test]
fn the_unset_gid_is_refused_and_nothing_changes() {
    let (dir, before) = tree();
    let out = flexd(&[
        "ownership",
        "apply",
        dir.path().to_str().unwrap(),
        "--fs-group",
        "4294967295",
    ]);
    test_support::assert_fails_saying(&out, 2, &["(gid_t)-1", "a group id is in 0..=4294967294"]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("group changes"));
    assert_eq!(
        snapshot(dir.path()),
        before,
        "a refused pass changed entries"
    );
}

#[test]
fn volume_mount_refuses_the_unset_gid_before_calling_the_driver() {
    let s = Sandbox::new();
    s.install_example("tmpfs/tmpfs", "acme~tmpfs");
    let target = s.path("target");
    let out = s.volume_mount("acme/tmpfs", &target, &["--fs-group", "4294967295"]);
    test_support::assert_fails_saying(&out, 2, &["(gid_t)-1"]);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(target.to_str().unwrap()),
        "the target was mounted"
    );
}

/// A running `flexd serve` (node mode) with the example tmpfs driver as acme/tmpfs.
struct Serve(Server);

impl Deref for Serve {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.0
    }
}

impl DerefMut for Serve {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.0
    }
}

impl Serve {
    /// Started with `env`; returns once the driver's CSI socket is there.
    fn start(env: &'static [(&'static str, &'static str)]) -> Self {
        Self::start_with_open_files(env, None)
    }

    /// Started with `env` and the soft and hard open-file limits given.
    fn start_with_open_files(
        env: &'static [(&'static str, &'static str)],
        open_files: Option<(u64, u64)>,
    ) -> Self {
        let sandbox = Sandbox::new();
        test_support::install_example(&sandbox.plugin(), "tmpfs/tmpfs", "acme~tmpfs");
        let launch = Launch {
            open_files,
            ..Launch::default()
        };
        let serve = Self(Server::serve_launched(sandbox, "node", env, launch));
        let socket = serve.socket();
        // flexd binds the registration socket just after the CSI one: a count of flexd's
        // sockets taken between the two would be one short for the rest of a test.
        let registration = serve
            .registration_dir
            .join("flexvolume-acme--tmpfs-reg.sock");
        eventually("the CSI and registration sockets appear", || {
            socket.exists() && registration.exists()
        });
        serve
    }

    fn socket(&self) -> PathBuf {
        self.csi_dir.join("flexvolume-acme--tmpfs/csi.sock")
    }

    /// The sockets flexd holds open (listeners and connections), from /proc.
    fn sockets(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|fds| {
                fds.flatten()
                    .filter(|fd| {
                        std::fs::read_link(fd.path())
                            .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
                    })
                    .count()
            })
            .unwrap_or(0)
    }
}

/// A real gRPC call on a fresh connection: GetPluginInfo answers with the driver's CSI name.
async fn plugin_name(socket: &Path) -> String {
    plugin_info(&mut identity_client(socket).await).await.name
}

/// Connects `n` clients that never send a byte.
fn silent_clients(socket: &Path, n: usize) -> Vec<UnixStream> {
    (0..n)
        .map(|_| {
            let stream = UnixStream::connect(socket).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(120)))
                .unwrap();
            stream
        })
        .collect()
}

/// Waits until the server closed `stream` (EOF, or a reset): never by the client's timeout.
fn closed_by_server(mut stream: UnixStream) {
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return,
            // The server may have sent something before closing; keep reading.
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("the server never closed a silent connection: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_after_the_preface_timeout_while_clients_are_served() {
    let serve = Serve::start(&[("FLEXD_PREFACE_TIMEOUT", "1")]);
    let socket = serve.socket();
    let silent = silent_clients(&socket, 250);
    // Meanwhile a real client is answered, more than once, on new connections.
    for _ in 0..3 {
        assert_eq!(plugin_name(&socket).await, "flexvolume-acme--tmpfs");
    }
    let closing = tokio::task::spawn_blocking(move || {
        for stream in silent {
            closed_by_server(stream);
        }
    });
    closing.await.unwrap();
    assert_eq!(plugin_name(&socket).await, "flexvolume-acme--tmpfs");
    assert!(serve.flexd_log().contains("no HTTP/2 preface in time"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_holds_at_most_its_connection_cap() {
    const CAP: usize = 20;
    let serve = Serve::start(&[
        ("FLEXD_PREFACE_TIMEOUT", "2"),
        ("FLEXD_MAX_CONNECTIONS", "20"),
    ]);
    let socket = serve.socket();
    // The sockets flexd holds with no client: one answered call, and its connection gone.
    let baseline = serve.sockets();
    assert_eq!(plugin_name(&socket).await, "flexvolume-acme--tmpfs");
    eventually("the answered client's connection is closed", || {
        serve.sockets() == baseline
    });
    let silent = silent_clients(&socket, 5 * CAP);
    // The silent clients are accepted CAP at a time: the count reaches the cap, never more,
    // until every one of them has been closed.
    let mut most = 0;
    let mut open: Vec<UnixStream> = silent;
    while !open.is_empty() {
        let held = serve.sockets().saturating_sub(baseline);
        assert!(held <= CAP, "flexd holds {held} connections, cap {CAP}");
        most = most.max(held);
        let mut still = Vec::new();
        for stream in open {
            stream.set_nonblocking(true).unwrap();
            let mut byte = [0u8; 1];
            match (&stream).read(&mut byte) {
                Ok(0) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                _ => still.push(stream),
            }
        }
        open = still;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(most, CAP, "the cap was never reached");
    assert!(serve.flexd_log().contains("connection cap reached"));
    assert_eq!(plugin_name(&socket).await, "flexvolume-acme--tmpfs");
}

/// flexd's resident memory now (VmRSS in /proc/<pid>/status).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// How much flexd's memory may grow while hostile clients send far more than this.
const RSS_GROWTH_BOUND: u64 = 32 << 20;

fn frame_header(len: usize, kind: u8, flags: u8, stream: u32) -> Vec<u8> {
    let mut header = (len as u32).to_be_bytes()[1..].to_vec();
    header.extend([kind, flags]);
    header.extend(stream.to_be_bytes());
    header
}

/// A raw HTTP/2 client past its preface and SETTINGS, that has then written `then`.
fn http2_client(socket: &Path, then: &[u8]) -> UnixStream {
    let mut stream = UnixStream::connect(socket).unwrap();
    // A server that neither reads nor closes fails the test instead of hanging it.
    stream
        .set_write_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame_header(0, 0x4, 0, 0)); // SETTINGS
    out.extend(then);
    stream.write_all(&out).unwrap();
    stream
}

/// Writes `chunk` again and again, `total` bytes in all, until the server closes the
/// connection: how much it took before then, or `None` if it took everything.
fn write_until_closed(stream: &mut UnixStream, chunk: &[u8], total: usize) -> Option<usize> {
    let mut sent = 0;
    while sent < total {
        match stream.write(chunk) {
            Ok(n) => sent += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                return Some(sent)
            }
            Err(e) => panic!("after {sent} bytes the server neither read nor closed: {e}"),
        }
    }
    None
}

/// A raw HTTP/2 client that has written `header`, then `payload` again and again (`total`
/// bytes in all) until flexd closed the connection: how much it took before then (`None`:
/// everything), and the client.
async fn flood(
    socket: &Path,
    header: Vec<u8>,
    payload: Vec<u8>,
    total: usize,
) -> (Option<usize>, UnixStream) {
    let socket = socket.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut client = http2_client(&socket, &header);
        let sent = write_until_closed(&mut client, &payload, total);
        (sent, client)
    })
    .await
    .unwrap()
}

/// Asserts that flexd's memory grew by less than [`RSS_GROWTH_BOUND`] since `before`.
fn assert_rss_bounded(serve: &Serve, before: u64) {
    let grown = rss_bytes(serve.pid()).saturating_sub(before);
    assert!(
        grown < RSS_GROWTH_BOUND,
        "flexd's RSS grew by {grown} bytes"
    );
}

/// A gRPC call while the attack's memory is measured: flexd still answers others.
async fn baseline_rss(serve: &Serve) -> u64 {
    assert_eq!(plugin_name(&serve.socket()).await, "flexvolume-acme--tmpfs");
    rss_bytes(serve.pid())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_header_block_of_empty_continuations_is_closed_and_holds_no_memory() {
    const FLOOD: usize = 200 << 20;
    let serve = Serve::start(&[]);
    let socket = serve.socket();
    let before = baseline_rss(&serve).await;
    // HEADERS without END_HEADERS, then empty CONTINUATION frames: 9 bytes each, no payload.
    let continuations = frame_header(0, 0x9, 0, 1).repeat(100_000);
    let (sent, client) = flood(&socket, frame_header(0, 0x1, 0, 1), continuations, FLOOD).await;
    let sent = sent.expect("flexd read 200 MiB of one header block and kept the connection");
    assert!(
        sent < FLOOD / 4,
        "flexd read {sent} bytes of one header block"
    );
    assert_rss_bounded(&serve, before);
    tokio::task::spawn_blocking(move || closed_by_server(client))
        .await
        .unwrap();
    assert_eq!(plugin_name(&socket).await, "flexvolume-acme--tmpfs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_frames_announced_above_the_frame_size_are_closed_on_their_header() {
    const CLIENTS: usize = 30;
    const EACH: usize = 4 << 20;
    let serve = Serve::start(&[]);
    let socket = serve.socket();
    let before = baseline_rss(&serve).await;
    // Each announces a 16 MiB DATA frame, then sends 4 MiB of it (120 MiB in all).
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let data = frame_header(0xff_ffff, 0x0, 0, 1);
        clients.push(flood(&socket, data, vec![0u8; 256 << 10], EACH).await);
    }
    // Every connection still open on the client's side: what flexd holds for them now.
    assert_rss_bounded(&serve, before);
    for (sent, _) in &clients {
        let sent = sent.expect("flexd read 4 MiB of a 16 MiB frame and kept the connection");
        assert!(sent < EACH, "flexd read {sent} bytes of an oversized frame");
    }
    assert_eq!(plugin_name(&socket).await, "flexvolume-acme--tmpfs");
    tokio::task::spawn_blocking(move || {
        for (_, client) in clients {
            closed_by_server(client);
        }
    })
    .await
    .unwrap();
}

/// `symbols` bytes of HPACK's longest Huffman code (30 bits each, the most decoding work per
/// byte sent), padded with ones.
fn worst_case_huffman(symbols: usize) -> Vec<u8> {
    let (mut out, mut bits, mut pending) = (Vec::new(), 0u64, 0u32);
    for _ in 0..symbols {
        bits = (bits << 30) | 0x3fff_fffe;
        pending += 30;
        while pending >= 8 {
            pending -= 8;
            out.push((bits >> pending) as u8);
        }
        bits &= (1 << pending) - 1;
    }
    if pending > 0 {
        out.push(((bits << (8 - pending)) as u8) | (0xff >> pending));
    }
    out
}

/// An HPACK integer with a 7-bit prefix, after the prefix's first bit `flag`.
fn hpack_integer(out: &mut Vec<u8>, flag: u8, mut value: usize) {
    if value < 0x7f {
        out.push(flag | value as u8);
        return;
    }
    out.push(flag | 0x7f);
    value -= 0x7f;
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The costliest header block flexd still decodes: one field whose value is ~60 KB of
/// worst-case Huffman, as HEADERS and CONTINUATION frames of at most 16 KiB on `stream`.
fn costliest_allowed_block(stream: u32) -> Vec<u8> {
    let value = worst_case_huffman(16_000);
    let mut block = vec![0x00, 0x01, b'x']; // literal, new name "x"
    hpack_integer(&mut block, 0x80, value.len()); // Huffman-coded value
    block.extend(value);
    let mut out = Vec::new();
    let chunks: Vec<&[u8]> = block.chunks(16_384).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let kind = if i == 0 { 0x1 } else { 0x9 };
        let flags = if i + 1 == chunks.len() { 0x4 } else { 0 };
        out.extend(frame_header(chunk.len(), kind, flags, stream));
        out.extend(*chunk);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn giant_and_worst_case_huffman_header_blocks_leave_other_clients_served() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let serve = Serve::start(&[]);
    let socket = serve.socket();
    let before = baseline_rss(&serve).await;
    // One 16 MiB HEADERS frame of worst-case Huffman: closed on its header.
    let headers = frame_header(0xff_ffff, 0x1, 0x4, 1);
    let (sent, client) = flood(&socket, headers, worst_case_huffman(500_000), 16 << 20).await;
    let sent = sent.expect("flexd read a 16 MiB HEADERS frame and kept the connection");
    assert!(
        sent < 16 << 20,
        "flexd read {sent} bytes of an oversized frame"
    );
    tokio::task::spawn_blocking(move || closed_by_server(client))
        .await
        .unwrap();
    // Four clients sending the costliest blocks flexd still takes, reconnecting whenever h2
    // has had enough of one connection, while a normal client keeps calling.
    let stop = Arc::new(AtomicBool::new(false));
    let blocks = Arc::new(AtomicUsize::new(0));
    let attackers: Vec<_> = (0..4)
        .map(|_| {
            let (socket, stop, blocks) = (socket.clone(), stop.clone(), blocks.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut client = http2_client(&socket, &[]);
                    let mut stream = 1;
                    while !stop.load(Ordering::Relaxed)
                        && client.write_all(&costliest_allowed_block(stream)).is_ok()
                    {
                        blocks.fetch_add(1, Ordering::Relaxed);
                        stream += 2;
                    }
                }
            })
        })
        .collect();
    test_support::eventually("the attackers are sending", || {
        blocks.load(Ordering::Relaxed) >= 8
    });
    for _ in 0..5 {
        assert_eq!(plugin_name(&socket).await, "flexvolume-acme--tmpfs");
    }
    stop.store(true, Ordering::Relaxed);
    for attacker in attackers {
        attacker.join().unwrap();
    }
    assert_rss_bounded(&serve, before);
    assert_eq!(plugin_name(&socket).await, "flexvolume-acme--tmpfs");
    // The attackers' blocks were within the limits, so decoded: the giant alone was refused.
    let refused = serve
        .flexd_log()
        .matches("past the advertised limits")
        .count();
    assert_eq!(refused, 1, "connections refused for their limits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_refuses_the_unset_gid_as_volume_mount_group() {
    let serve = Serve::start(&[]);
    let target = serve.path("target");
    let mut node = node_client(&serve.socket()).await;
    let mut request = publish_request("vol-1", &target, None);
    request.volume_capability = mount_capability("tmpfs", "4294967295");
    let status = node.node_publish_volume(request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("(gid_t)-1"), "{status:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(target.to_str().unwrap()));
}

/// This process's call-out cgroups directory, or why there is none (then the test skips).
fn callouts_dir() -> Result<PathBuf, String> {
    flexvolume_host::runner::process_cap()
        .map(Path::to_owned)
        .map_err(str::to_owned)
}

fn call_cgroups_of(base: &Path, pid: u32) -> Vec<String> {
    let prefix = format!("call-{pid}-");
    std::fs::read_dir(base)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_stopped_serve_leaves_none_of_its_call_out_cgroups() {
    let base = match callouts_dir() {
        Ok(base) => base,
        Err(why) => test_support::skip!(format!("no usable pids cgroup hierarchy here: {why}")),
    };
    let mut serve = Serve::start(&[]);
    let pid = serve.pid();
    // The driver's init ran in a call-out cgroup, now pooled.
    eventually("a call-out cgroup of flexd serve exists", || {
        !call_cgroups_of(&base, pid).is_empty()
    });
    assert!(serve.terminate().success());
    assert_eq!(
        call_cgroups_of(&base, pid),
        Vec::<String>::new(),
        "left behind in {}",
        base.display()
    );
}

/// More call-outs at once than flexd keeps idle cgroups for: the ones its pool has no room
/// for are retired off the call-outs' path, and a stop still leaves none behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_beyond_the_idle_pool_is_retired_and_a_stop_leaves_no_call_out_cgroups() {
    /// Above the 32 idle cgroups flexd keeps.
    const CALLS: usize = 48;
    let base = match callouts_dir() {
        Ok(base) => base,
        Err(why) => test_support::skip!(format!("no usable pids cgroup hierarchy here: {why}")),
    };
    // Each mount waits until every one has started, so that all run at once (each in a cgroup
    // of its own), with a deadline in case some never start.
    let started = tempfile::tempdir().unwrap();
    let cases = format!(
        "{}\nmount) : > \"{dir}/$(basename \"$2\")\"; i=0; while [ $(ls '{dir}' | wc -l) -lt {CALLS} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; echo '{{\"status\":\"Success\"}}';;",
        test_support::init_case(r#"{"attach":false}"#),
        dir = started.path().display()
    );
    let (mut server, node) = Server::acme_node("burst", &cases).await;
    let pid = server.pid();
    let volumes: Vec<_> = (0..CALLS)
        .map(|i| (format!("vol-{i}"), server.target(&format!("t{i}"))))
        .collect();
    test_support::serve::publish_all_at_once(&node, &volumes).await;
    let mounts_started = std::fs::read_dir(started.path()).unwrap().count();
    assert_eq!(mounts_started, CALLS, "mounts started");

    // The pool keeps 32; the others go, though no call-out waited for them.
    let (base_seen, pid_seen) = (base.clone(), pid);
    tokio::task::spawn_blocking(move || {
        eventually(
            "flexd to retire the cgroups its pool has no room for",
            || call_cgroups_of(&base_seen, pid_seen).len() <= 32,
        )
    })
    .await
    .unwrap();
    assert!(server.terminate().success());
    assert_eq!(
        call_cgroups_of(&base, pid),
        Vec::<String>::new(),
        "left behind in {}",
        base.display()
    );
}

#[test]
fn install_refuses_an_executable_symlinked_outside_the_plugin_dir_as_discovery_does() {
    let s = Sandbox::new();
    let plugin_dir = s.plugin();
    let run = |args: &[&str]| s.flexd(args);
    // A good version first.
    let good = s.path("good");
    std::fs::create_dir(&good).unwrap();
    std::fs::copy(examples().join("tmpfs/tmpfs"), good.join("tmpfs")).unwrap();
    let out = run(&["install", "--driver", "acme/tmpfs", good.to_str().unwrap()]);
    assert!(out.status.success(), "{}", test_support::stderr_of(&out));

    // A new version whose executable points outside the plugin dir.
    let outside = s.path("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::copy(examples().join("tmpfs/tmpfs"), outside.join("evil")).unwrap();
    let bad = s.path("bad");
    std::fs::create_dir(&bad).unwrap();
    std::os::unix::fs::symlink(outside.join("evil"), bad.join("tmpfs")).unwrap();
    let out = run(&["install", "--driver", "acme/tmpfs", bad.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "installed a symlink escaping the plugin dir"
    );
    let refused = test_support::stderr_of(&out);
    let live = plugin_dir.join("acme~tmpfs/tmpfs");
    let reason = format!(
        "{} resolves to {}, outside the plugin dir {}; refused",
        live.display(),
        outside.join("evil").canonicalize().unwrap().display(),
        plugin_dir.canonicalize().unwrap().display()
    );
    assert!(refused.contains(&reason), "{refused}\nwanted: {reason}");
    // The previous version is still there and answers init.
    assert!(!std::fs::symlink_metadata(&live)
        .unwrap()
        .file_type()
        .is_symlink());
    let out = run(&["call", "acme/tmpfs", "init"]);
    assert!(out.status.success(), "{}", test_support::stderr_of(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Success"));
    let leftovers: Vec<_> = std::fs::read_dir(&plugin_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("acme~tmpfs")]);

    // With --allow-symlinks the operator may; discovery (without it) then gives the very
    // reason the install gave.
    let out = run(&[
        "--allow-symlinks",
        "install",
        "--driver",
        "acme/tmpfs",
        bad.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", test_support::stderr_of(&out));
    let out = run(&["--output", "json", "drivers"]);
    let drivers: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let error = drivers[0]["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        refused.contains(&error) && error.contains(&reason),
        "discovery: {error}\ninstall: {refused}"
    );
}

/// `GET /healthz` on a new connection: the status line's code, or why there was none.
fn healthz(address: &str) -> Result<u16, String> {
    let mut stream = std::net::TcpStream::connect(address).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: flexd\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| e.to_string())?;
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no status line in {response:?}"))
}

/// The TCP connections flexd holds (listener included), from /proc/<pid>/net/tcp and its fds.
fn tcp_sockets(pid: u32) -> usize {
    let inodes: std::collections::HashSet<String> = ["tcp", "tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(format!("/proc/{pid}/net/{t}")).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|l| l.split_whitespace().nth(9).map(str::to_owned))
                .collect::<Vec<_>>()
        })
        .collect();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter(|t| {
                    let t = t.to_string_lossy();
                    t.strip_prefix("socket:[")
                        .and_then(|rest| rest.strip_suffix(']'))
                        .is_some_and(|inode| inodes.contains(inode))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Finding: 1,100 idle connections to the metrics port took every descriptor of a flexd
/// started with 1024 open files: /healthz went dark, CSI calls failed UNAVAILABLE, and the
/// accept loop logged "Too many open files" millions of times. Now flexd holds at most its
/// cap of them, answers /healthz and gRPC meanwhile, and logs a handful of lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_metrics_connections_leaves_health_and_csi_serving() {
    const FLOOD: usize = 1100;
    const MAX_METRICS_CONNECTIONS: usize = 64;
    // The clients need more descriptors than flexd may have.
    test_support::raise_open_files();
    let serve = Serve::start_with_open_files(&[], Some((1024, 1024)));
    let address = serve.metrics_address().to_owned();
    let socket = serve.socket();
    assert_eq!(healthz(&address), Ok(200));
    let rss_before = baseline_rss(&serve).await;
    let log_before = serve.flexd_log().len();

    let target = address.clone();
    let flood = tokio::task::spawn_blocking(move || {
        let target: std::net::SocketAddr = target.parse().unwrap();
        (0..FLOOD)
            .filter_map(|_| {
                std::net::TcpStream::connect_timeout(&target, Duration::from_secs(2)).ok()
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    eprintln!("{} of {FLOOD} idle connections made", flood.len());

    // While all of them are open: health answers, and so does the CSI socket.
    let started = std::time::Instant::now();
    let mut answer = Err(String::new());
    while started.elapsed() < Duration::from_secs(30) {
        let address = address.clone();
        answer = tokio::task::spawn_blocking(move || healthz(&address))
            .await
            .unwrap();
        if answer.is_ok() {
            break;
        }
    }
    let latency = started.elapsed();
    assert_eq!(answer, Ok(200), "/healthz under the flood");
    let grpc = tokio::time::timeout(Duration::from_secs(30), plugin_name(&socket)).await;
    assert_eq!(
        grpc.as_deref().ok(),
        Some("flexvolume-acme--tmpfs"),
        "a CSI call under the flood"
    );
    let held = tcp_sockets(serve.pid());
    assert!(
        held <= MAX_METRICS_CONNECTIONS + 1,
        "flexd holds {held} TCP sockets, more than its cap of {MAX_METRICS_CONNECTIONS} and the listener"
    );
    let logged = serve.flexd_log().len() - log_before;
    assert!(
        logged < 64 << 10,
        "flexd logged {logged} bytes during the flood"
    );
    let rss_grown = rss_bytes(serve.pid()).saturating_sub(rss_before);
    assert_rss_bounded(&serve, rss_before);
    eprintln!(
        "flood of {}: /healthz answered in {latency:?}, flexd held {held} TCP sockets, \
         logged {logged} bytes, RSS grew by {} KiB",
        flood.len(),
        rss_grown >> 10
    );
    drop(flood);
    assert_eq!(healthz(&address), Ok(200));
}

/// flexd raises its soft open-file limit to the hard one, and starts drivers with the limit
/// it was given: some close every descriptor up to the limit, or use select(2).
#[test]
fn the_open_file_limit_is_raised_for_flexd_and_put_back_for_drivers() {
    let sandbox = Sandbox::new();
    let seen = sandbox.path("driver-open-files");
    let dir = sandbox.plugin().join("acme~limits");
    std::fs::create_dir_all(&dir).unwrap();
    let driver = dir.join("limits");
    std::fs::write(
        &driver,
        format!(
            "#!/bin/sh\necho \"$(ulimit -Sn) $(ulimit -Hn)\" > {}\necho '{{\"status\":\"Success\",\"capabilities\":{{\"attach\":false}}}}'\n",
            seen.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&driver, std::fs::Permissions::from_mode(0o755)).unwrap();
    let launch = Launch {
        open_files: Some((256, 4096)),
        ..Launch::default()
    };
    let serve = Server::serve_launched(sandbox, "node", &[], launch);
    eventually("the driver's init ran", || {
        std::fs::read_to_string(&seen).is_ok_and(|s| s.ends_with('\n'))
    });
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "256 4096\n");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", serve.pid())).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert_eq!(
        open_files.split_whitespace().collect::<Vec<_>>()[3..5],
        ["4096", "4096"],
        "{open_files}"
    );
}
