//! Many NodePublishVolume calls at once, for different volumes, against a real `flexd serve`:
//! their call-outs run at the same time (asserted as overlap, never as a speed), and every
//! volume is published exactly once.

use test_support::serve::{node_client, publish_all_at_once, unpublish_request, Server};

/// Volumes published at once.
const CALLS: usize = 32;
/// Call-outs that must have been running at one moment: far below CALLS, so a loaded machine
/// that starts them late still passes, while serialized call-outs (one or two at a time) fail.
const MIN_OVERLAP: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_of_different_volumes_run_their_call_outs_at_once_each_exactly_once() {
    let server = Server::start(|_| {});
    let events = server.path("events.log");
    // Each mount logs its start and end (nanoseconds, one O_APPEND write per line) around a
    // pause long enough for the others to start; it mounts nothing (publish needs a Success).
    let cases = format!(
        "{}\nmount) echo \"$(date +%s%N) start $2\" >> '{ev}'; sleep 1; echo \"$(date +%s%N) end $2\" >> '{ev}'; echo '{{\"status\":\"Success\"}}';;\nunmount) echo '{{\"status\":\"Success\"}}';;",
        test_support::init_case(r#"{"attach":false}"#),
        ev = events.display()
    );
    server.driver("acme~slow", &cases);
    let sock = server.socket("flexvolume-acme--slow");
    let node = node_client(&sock).await;

    let volumes: Vec<_> = (0..CALLS)
        .map(|i| (format!("vol-{i}"), server.target(&format!("t{i}"))))
        .collect();
    publish_all_at_once(&node, &volumes).await;

    // Exactly once: one mount call-out per target, one record per volume.
    let mounts = server.calls_of("mount");
    for (_, target) in &volumes {
        let n = mounts
            .iter()
            .filter(|c| c[1] == target.display().to_string())
            .count();
        assert_eq!(n, 1, "{} mounted {n} times", target.display());
    }
    let records = server.records();
    assert_eq!(records.len(), CALLS, "{records:?}");
    for (id, _) in &volumes {
        assert_eq!(
            records.iter().filter(|r| r["volume_name"] == *id).count(),
            1,
            "{id}"
        );
    }

    // Overlap: the most call-outs running at one moment.
    let text = std::fs::read_to_string(&events).unwrap();
    let mut edges: Vec<(u128, i32)> = text
        .lines()
        .map(|l| {
            let mut f = l.split(' ');
            let at: u128 = f.next().unwrap().parse().unwrap();
            (at, if f.next() == Some("start") { 1 } else { -1 })
        })
        .collect();
    assert_eq!(edges.len(), 2 * CALLS, "{text}");
    // Ends before starts at the same instant: touching is not overlapping.
    edges.sort();
    let (mut running, mut most) = (0, 0);
    for (_, step) in edges {
        running += step;
        most = most.max(running);
    }
    assert!(
        most >= MIN_OVERLAP as i32,
        "at most {most} of {CALLS} call-outs ran at once:\n{text}"
    );

    for (id, target) in &volumes {
        node.clone()
            .node_unpublish_volume(unpublish_request(id, target))
            .await
            .expect("unpublish");
    }
    assert!(server.records().is_empty());
}
