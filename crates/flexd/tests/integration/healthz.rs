//! `/healthz` of a real `flexd serve` tells the truth: 503 with the reason while a driver that
//! should be served is not, 200 once it is again.

use std::path::Path;

use test_support::serve::Server;
use test_support::{eventually, install_example, install_exe};

/// `/healthz`'s status code and body.
fn healthz(server: &Server) -> (u16, String) {
    let response = server.http_get("/healthz");
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (code, body)
}

/// Polls `/healthz` until it answers `code`; its body then.
fn wait_health(server: &Server, code: u16) -> String {
    let mut body = String::new();
    eventually(&format!("/healthz answering {code}"), || {
        let (got, text) = healthz(server);
        body = text;
        got == code
    });
    body
}

fn install_tmpfs(plugin_dir: &Path) {
    install_example(plugin_dir, "tmpfs/tmpfs", "acme~tmpfs");
}

#[test]
fn healthz_is_unhealthy_while_a_drivers_socket_is_gone() {
    let server = Server::start(install_tmpfs);
    assert_eq!(wait_health(&server, 200), "ok\n");
    let socket = server.csi_dir.join("flexvolume-acme--tmpfs/csi.sock");
    std::fs::remove_file(&socket).unwrap();
    let body = wait_health(&server, 503);
    assert!(
        body.starts_with("unhealthy: driver acme/tmpfs: socket ")
            && body.contains(&socket.display().to_string())
            && body.contains("is gone"),
        "{body}"
    );
    // The registration socket is counted too.
    let registration = server
        .registration_dir
        .join("flexvolume-acme--tmpfs-reg.sock");
    std::fs::remove_file(&registration).unwrap();
    let registration = registration.display().to_string();
    eventually("/healthz naming the registration socket", || {
        let (code, body) = healthz(&server);
        code == 503 && body.contains(&registration)
    });
}

#[test]
fn healthz_is_unhealthy_while_a_driver_cannot_be_served_and_recovers() {
    let server = Server::start(|plugin_dir| {
        install_tmpfs(plugin_dir);
        // Something that is not a socket where the driver's socket goes: flexd refuses it.
        // (A directory with something in it, which the sweep of stale sockets leaves alone.)
        let obstacle = plugin_dir.join("../plugins/flexvolume-acme--tmpfs/csi.sock");
        std::fs::create_dir_all(&obstacle).unwrap();
        std::fs::write(obstacle.join("file"), "not a socket").unwrap();
    });
    let body = wait_health(&server, 503);
    assert!(
        body.contains("driver acme/tmpfs: not served:") && body.contains("not a socket"),
        "{body}"
    );
    // The obstacle goes and the driver is updated: flexd serves it, and is healthy again.
    std::fs::remove_dir_all(server.csi_dir.join("flexvolume-acme--tmpfs/csi.sock")).unwrap();
    let exe = server.plugin_dir.join("acme~tmpfs/tmpfs");
    let script = std::fs::read_to_string(&exe).unwrap();
    install_exe(&exe, &format!("{script}\n# updated\n"));
    assert_eq!(wait_health(&server, 200), "ok\n");
}
