//! Dynamic discovery through the real filesystem and real inotify: each scenario asserts the
//! exact events seen. Intervals are short to keep the suite quick; waits for events are long
//! (seconds) so a loaded machine does not make them flaky.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use flexvolume_host::prober::{EventKind, ProbeEvent, Prober, ProberConfig};
use flexvolume_host::LayoutPolicy;

const INTERVAL: Duration = Duration::from_millis(300);
const PATIENCE: Duration = Duration::from_secs(15);

struct Harness {
    _sandbox: test_support::Sandbox,
    plugin: PathBuf,
    prober: Option<Prober>,
    events: Receiver<ProbeEvent>,
}

impl Harness {
    fn start(setup: impl FnOnce(&Path)) -> Self {
        Self::start_with(setup, |_| {})
    }

    fn start_with(setup: impl FnOnce(&Path), configure: impl FnOnce(&mut ProberConfig)) -> Self {
        let sandbox = test_support::Sandbox::new();
        let plugin = sandbox.plugin();
        setup(&plugin);
        let mut config = ProberConfig::new(plugin.clone());
        config.probe_interval = INTERVAL;
        configure(&mut config);
        let (prober, events) = Prober::start(config).unwrap();
        Self {
            _sandbox: sandbox,
            plugin,
            prober: Some(prober),
            events,
        }
    }

    /// The next event, which must be `kind` for `driver`.
    fn expect(&self, kind: EventKind, driver: &str) -> ProbeEvent {
        self.expect_because(kind, driver, "")
    }

    /// [`Harness::expect`], saying `why` when it is not.
    fn expect_because(&self, kind: EventKind, driver: &str, why: &str) -> ProbeEvent {
        let e = self.next();
        assert_eq!((e.kind, e.driver.as_str()), (kind, driver), "{why}");
        e
    }

    fn next(&self) -> ProbeEvent {
        match self.events.recv_timeout(PATIENCE) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => panic!("no event within {PATIENCE:?}"),
            Err(e) => panic!("prober gone: {e}"),
        }
    }

    /// Asserts nothing is reported for `intervals` probe intervals.
    fn quiet(&self, intervals: u32) {
        if let Ok(e) = self.events.recv_timeout(INTERVAL * intervals) {
            panic!("unexpected event {:?} {}", e.kind, e.driver);
        }
    }

    /// All events until none comes for 3 intervals.
    fn drain(&self) -> Vec<ProbeEvent> {
        let mut seen = Vec::new();
        while let Ok(e) = self.events.recv_timeout(INTERVAL * 3) {
            seen.push(e);
        }
        seen
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(p) = self.prober.take() {
            p.stop();
        }
    }
}

/// A driver whose init reports `attach` (the version marker of these tests).
fn script(attach: bool) -> String {
    test_support::init_only_script(attach)
}

const BROKEN: &str = "#!/bin/sh\necho 'usage: broken'\nexit 1\n";

/// Writes an executable atomically (a staged dot-file renamed over the target).
fn install(plugin: &Path, dir_name: &str, body: &str) {
    std::fs::create_dir_all(plugin.join(dir_name)).unwrap();
    test_support::install_exe(&test_support::executable_of(plugin, dir_name), body);
}

fn attach_of(e: &ProbeEvent) -> bool {
    e.plugin
        .as_ref()
        .expect("a ready event carries the plugin")
        .capabilities
        .attach
}

#[test]
fn s1_a_driver_present_before_start_is_one_add_then_silence() {
    let h = Harness::start(|p| install(p, "acme~drv", &script(false)));
    let e = h.expect(EventKind::Add, "acme/drv");
    assert_eq!(
        e.path.as_deref(),
        Some(h.plugin.join("acme~drv/drv").as_path())
    );
    assert!(!attach_of(&e));
    h.quiet(4);
}

#[test]
fn s2_install_update_subdir_and_remove() {
    let h = Harness::start(|_| {});
    std::fs::create_dir(h.plugin.join("acme~drv")).unwrap();
    install(&h.plugin, "acme~drv", &script(false));
    h.expect_because(
        EventKind::Add,
        "acme/drv",
        "mkdir then the executable: one add",
    );
    h.quiet(3);

    std::fs::write(h.plugin.join("acme~drv/helper.conf"), "x").unwrap();
    assert_eq!(h.next().kind, EventKind::Update);
    h.quiet(3);

    std::fs::create_dir(h.plugin.join("acme~drv/sub")).unwrap();
    std::fs::remove_dir(h.plugin.join("acme~drv/sub")).unwrap();
    let seen = h.drain();
    assert!(
        !seen.is_empty(),
        "a subdirectory created and removed is a change"
    );
    assert!(
        seen.iter().all(|e| e.kind == EventKind::Update),
        "{:?}",
        seen.iter().map(|e| e.kind).collect::<Vec<_>>()
    );

    std::fs::remove_file(h.plugin.join("acme~drv/drv")).unwrap();
    std::fs::remove_file(h.plugin.join("acme~drv/helper.conf")).unwrap();
    std::fs::remove_dir(h.plugin.join("acme~drv")).unwrap();
    let seen = h.drain();
    let kinds: Vec<EventKind> = seen.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == EventKind::Remove).count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(kinds.last(), Some(&EventKind::Remove), "{kinds:?}");
}

/// Installs a driver whose `init` takes a second, and returns once that `init` is running.
fn install_slow_and_wait_for_its_init(h: &Harness, dir_name: &str) {
    let started = h
        .plugin
        .parent()
        .unwrap()
        .join(format!("{dir_name}.init-started"));
    let body = format!(
        "#!/bin/sh\ncase \"$1\" in init) touch '{}'; sleep 1; echo '{{\"status\":\"Success\"}}';; \
         *) echo '{{\"status\":\"Not supported\"}}'; exit 1;; esac\n",
        started.display()
    );
    install(&h.plugin, dir_name, &body);
    test_support::wait_for_path(&started);
}

/// A change made and undone while the driver's `init` runs (a scratch file written and removed)
/// leaves the directory as the probe saw it when it ended: one event, not an add then an update.
#[test]
fn s2b_a_change_undone_while_init_runs_is_one_event() {
    let h = Harness::start(|_| {});
    install_slow_and_wait_for_its_init(&h, "acme~slow");
    let scratch = h.plugin.join("acme~slow/scratch");
    std::fs::write(&scratch, "x").unwrap();
    std::fs::remove_file(&scratch).unwrap();
    h.expect(EventKind::Add, "acme/slow");
    h.quiet(5);
}

/// The other side of the rule above: an upgrade that lands while the old version's `init` runs
/// is reported, even though the probe already saw the new file when it ended.
#[test]
fn s2c_an_upgrade_during_init_is_reported() {
    let h = Harness::start(|_| {});
    install_slow_and_wait_for_its_init(&h, "acme~up");
    install(&h.plugin, "acme~up", &script(true));
    let first = h.next();
    assert_eq!(first.kind, EventKind::Add);
    if !attach_of(&first) {
        let second = h.next();
        assert_eq!(second.kind, EventKind::Update);
        assert!(
            attach_of(&second),
            "the upgrade's capabilities were reported"
        );
    }
    h.quiet(4);
}

#[test]
fn s3_empty_dir_is_silent_and_a_removed_plugin_dir_comes_back() {
    let h = Harness::start(|_| {});
    h.quiet(4);
    std::fs::remove_dir(&h.plugin).unwrap();
    test_support::eventually("the plugin dir to be recreated", || h.plugin.is_dir());
    // Give the prober a moment to watch it again, then install into it.
    std::thread::sleep(INTERVAL);
    install(&h.plugin, "acme~back", &script(false));
    h.expect(EventKind::Add, "acme/back");
}

#[test]
fn s3b_drivers_in_a_removed_plugin_dir_are_removed() {
    let h = Harness::start(|p| install(p, "acme~drv", &script(false)));
    assert_eq!(h.next().kind, EventKind::Add);
    std::fs::remove_dir_all(&h.plugin).unwrap();
    h.expect(EventKind::Remove, "acme/drv");
}

#[test]
fn s4_a_file_ten_directories_deep_is_seen() {
    let h = Harness::start(|p| install(p, "acme~drv", &script(false)));
    assert_eq!(h.next().kind, EventKind::Add);
    let mut dir = h.plugin.join("acme~drv");
    for i in 0..10 {
        dir = dir.join(format!("level{i}"));
        std::fs::create_dir(&dir).unwrap();
    }
    h.drain();
    std::fs::write(dir.join("deep.txt"), "x").unwrap();
    h.expect(EventKind::Update, "acme/drv");
}

#[test]
fn s5_install_then_update_within_100ms_reports_the_final_version() {
    let h = Harness::start(|_| {});
    install(&h.plugin, "acme~drv", &script(false));
    std::thread::sleep(Duration::from_millis(50));
    install(&h.plugin, "acme~drv", &script(true));
    let written = Instant::now();
    let mut last = h.next();
    while let Ok(e) = h.events.recv_timeout(INTERVAL * 3) {
        last = e;
    }
    assert!(
        attach_of(&last),
        "the final version (attach=true) must be reported: no lost update"
    );
    assert!(matches!(last.kind, EventKind::Add | EventKind::Update));
    let _ = written;
}

#[test]
fn s6_an_atomic_install_is_exactly_one_event_never_a_failure() {
    let h = Harness::start(|p| install(p, "acme~drv", &script(false)));
    assert_eq!(h.next().kind, EventKind::Add);
    // cp to .drv (written in several chunks, as cp does), then mv over.
    let dir = h.plugin.join("acme~drv");
    let staged = dir.join(".drv");
    let body = script(true);
    let mut f = std::fs::File::create(&staged).unwrap();
    for chunk in body.as_bytes().chunks(8) {
        std::io::Write::write_all(&mut f, chunk).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(f);
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&staged, dir.join("drv")).unwrap();
    let seen = h.drain();
    let kinds: Vec<EventKind> = seen.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, vec![EventKind::Update]);
    assert!(attach_of(&seen[0]));
}

#[test]
fn s7_a_failed_driver_never_blocks_a_valid_one_and_is_retried_only_when_touched() {
    let h = Harness::start(|p| {
        install(p, "acme~bad", BROKEN);
        install(p, "acme~good", &script(false));
    });
    let first = h.next();
    let second = h.next();
    assert_eq!(
        (first.kind, first.driver.as_str()),
        (EventKind::Failed, "acme/bad")
    );
    assert!(
        first.error.as_deref().unwrap().contains("init failed"),
        "{:?}",
        first.error
    );
    assert_eq!(
        (second.kind, second.driver.as_str()),
        (EventKind::Add, "acme/good")
    );
    h.quiet(5); // not retried on a timer
    install(&h.plugin, "acme~bad", &script(false));
    h.expect_because(EventKind::Add, "acme/bad", "fixed: now ready");
}

#[test]
fn s8_five_drivers_in_a_burst_are_five_adds() {
    let h = Harness::start(|_| {});
    for i in 0..5 {
        install(&h.plugin, &format!("acme~d{i}"), &script(false));
    }
    let mut names: Vec<String> = (0..5)
        .map(|_| h.next())
        .map(|e| {
            assert_eq!(e.kind, EventKind::Add);
            e.driver
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["acme/d0", "acme/d1", "acme/d2", "acme/d3", "acme/d4"]
    );
    h.quiet(3);
}

#[test]
fn s9_a_symlinked_driver_dir_outside_is_refused_by_default_and_not_watched_when_allowed() {
    let outside = tempfile::tempdir().unwrap();
    install(outside.path(), "acme~ext", &script(false));
    let target = outside.path().join("acme~ext");

    let h = Harness::start(|p| std::os::unix::fs::symlink(&target, p.join("acme~ext")).unwrap());
    let e = h.next();
    assert_eq!(e.kind, EventKind::Failed);
    assert!(e.error.unwrap().contains("outside the plugin dir"));

    let allowed = Harness::start_with(
        |p| std::os::unix::fs::symlink(&target, p.join("acme~ext")).unwrap(),
        |c| {
            c.layout_policy = LayoutPolicy {
                allow_symlinks: true,
            }
        },
    );
    assert_eq!(allowed.next().kind, EventKind::Add);
    // Documented: changes inside a symlinked directory's target are not watched.
    std::fs::write(target.join("helper"), "x").unwrap();
    allowed.quiet(4);
}

#[test]
fn a_hung_init_does_not_delay_another_driver() {
    let h = Harness::start_with(
        |_| {},
        |c| {
            c.runner = c
                .runner
                .clone()
                .with_timeout_for_all(Duration::from_secs(30));
        },
    );
    install(&h.plugin, "acme~hang", "#!/bin/sh\nsleep 30\n");
    std::thread::sleep(INTERVAL);
    install(&h.plugin, "acme~quick", &script(false));
    h.expect(EventKind::Add, "acme/quick");
}

#[test]
fn over_the_watch_limit_changes_are_still_found_by_rescans() {
    // Room for the plugin dir and one driver dir only.
    let h = Harness::start_with(
        |p| install(p, "acme~a", &script(false)),
        |c| c.watch_limit = Some(2),
    );
    assert_eq!(h.next().kind, EventKind::Add);
    install(&h.plugin, "acme~b", &script(false));
    h.expect(EventKind::Add, "acme/b");
    // acme~b could not be watched: a change in it is found by the periodic rescan.
    std::fs::write(h.plugin.join("acme~b/helper"), "x").unwrap();
    h.expect(EventKind::Update, "acme/b");
    h.quiet(4);
}

#[test]
fn reprobe_all_retries_a_failed_driver() {
    let h = Harness::start(|p| install(p, "acme~bad", BROKEN));
    assert_eq!(h.next().kind, EventKind::Failed);
    h.quiet(3);
    h.prober.as_ref().unwrap().reprobe_all();
    assert_eq!(
        h.next().kind,
        EventKind::Failed,
        "an explicit re-probe runs init again"
    );
}

#[test]
fn a_storm_is_coalesced_and_its_final_state_reported() {
    let h = Harness::start(|p| install(p, "acme~drv", &script(false)));
    assert_eq!(h.next().kind, EventKind::Add);
    let data = h.plugin.join("acme~drv/data");
    let start = Instant::now();
    let mut writes = 0;
    while start.elapsed() < INTERVAL * 6 {
        std::fs::write(&data, writes.to_string()).unwrap();
        writes += 1;
    }
    // The last change of the storm: a new version of the driver.
    install(&h.plugin, "acme~drv", &script(true));
    let seen = h.drain();
    assert!(seen.iter().all(|e| e.kind == EventKind::Update));
    // At most one processing per interval (plus the leading edge and the last trailing one).
    assert!(
        seen.len() <= 9,
        "{} updates for {writes} writes",
        seen.len()
    );
    assert!(
        attach_of(seen.last().unwrap()),
        "the final version is reported"
    );
}
