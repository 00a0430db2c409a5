//! CSI ListVolumes (docs/csi.md#list-volumes): the volumes flexd's records know for the driver
//! (provisioned, attached), a page at a time, read from the records a page at a time too
//! ([`super::pagination`], [`PAGE_LIMIT`]): memory follows the page, not the number of
//! records. For a driver that
//! attaches, the nodes each is published on: the nodes its attach records name, each checked
//! with the driver's `isattached`, as kube-controller-manager's `VerifyVolumesAreAttached` did
//! about once a minute. The external-attacher's reconciler lists as often, and re-attaches a
//! volume whose VolumeAttachment says attached while the listing does not.
//!
//! What a check's answer does to a recorded node is [`published`]; how long the checks of one
//! listing may take is [`check_budget`]. At most [`CHECKS_AT_ONCE`] `isattached` run at once
//! per driver, whatever the number of listings. No lock is held while the driver is asked, and
//! none to mark a volume found detached: one write from the version the listing read, which
//! loses to any call on the volume since.

use std::sync::Arc;
use std::time::Duration;

use flexvolume_host::controller_records::Stored;
use flexvolume_host::lifecycle::{KnownVolume, LifecycleError};
use flexvolume_host::state::{Progress, VolumeRecord};
use flexvolume_host::{CallOutKind, Plugin};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use super::calls::VolumeCalls;
use super::pagination;
use flexd::errors::message_of;
use flexd::proto::csi::{list_volumes_response, ListVolumesRequest, ListVolumesResponse, Volume};

/// How many `isattached` call-outs of one driver run at once, across every listing (the runner
/// itself does not limit concurrent call-outs). A check holds its slot until its call-out ends,
/// even one the listing stopped waiting for, so a hanging driver never has more than this many
/// of them running.
pub const CHECKS_AT_ONCE: usize = 8;

/// The most volumes one ListVolumes answers, whatever `max_entries` asks: the records read for
/// one answer, and the `isattached` checks made for it.
pub const PAGE_LIMIT: usize = 500;

/// What the driver's `isattached` said of one recorded attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    Attached,
    NotAttached,
    /// `Not supported`: the driver cannot tell (Kubernetes then assumes attached).
    NotSupported,
    /// The call-out failed or timed out (its message, redacted by the runner).
    Failed(String),
    /// The listing's budget ran out before the driver answered.
    NoAnswerInTime,
}

/// Whether the node of an attach record (at `progress`) is reported published, given what
/// `isattached` said. The driver's word decides when it has one: "not attached" drops the node
/// (the CO then re-attaches), "attached" reports it, even for an attach that did not finish.
/// Without one (`Not supported`, a failure, no answer in time) the record decides: an attach
/// that finished is kept, since a flaky driver must not make the CO re-attach, and drivers
/// without `isattached` have only the records to go by (kube-controller-manager assumes
/// attached too); one that did not finish, or that was found detached before, is not reported.
pub fn published(progress: Progress, check: &Check) -> bool {
    match check {
        Check::Attached => true,
        Check::NotAttached => false,
        Check::NotSupported | Check::Failed(_) | Check::NoAnswerInTime => {
            progress == Progress::Mounted
        }
    }
}

/// The client's deadline for this call, from gRPC's `grpc-timeout` header (csi-attacher sends
/// its `--timeout`); `None` when it sent none or one that does not parse.
pub fn client_deadline(metadata: &MetadataMap) -> Option<Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    // At most 8 digits, then the unit (gRPC over HTTP/2).
    if !(2..=9).contains(&value.len()) || !value.is_ascii() {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// How long the `isattached` checks of one listing may take: until a tenth of the client's
/// deadline is left, and at least 2 s of it (half of a short one), to answer before the client
/// gives up (which would waste every check) on a loaded node too; and never longer than one
/// `isattached` call-out may run (its timeout and kill grace, and a second), so a listing
/// without a deadline ends too.
pub fn check_budget(client: Option<Duration>, call_out: Duration) -> Duration {
    let cap = call_out + Duration::from_secs(1);
    match client {
        Some(deadline) => {
            let reserve = (deadline / 10).max(Duration::from_secs(2).min(deadline / 2));
            (deadline - reserve).min(cap)
        }
        None => cap,
    }
}

pub async fn list_volumes(
    calls: &VolumeCalls,
    checks_at_once: &Arc<Semaphore>,
    request: Request<ListVolumesRequest>,
) -> Result<Response<ListVolumesResponse>, Status> {
    let started = Instant::now();
    let deadline = client_deadline(request.metadata());
    let req = request.into_inner();
    let size = pagination::page_size(req.max_entries)?
        .unwrap_or(PAGE_LIMIT)
        .min(PAGE_LIMIT);
    let from = pagination::resume_after(&req.starting_token)?;
    let plugin = calls.ready_plugin()?;
    let driver = calls.driver.name.clone();
    let lifecycle = calls.lifecycle.clone();
    let page = tokio::task::spawn_blocking(move || {
        // Records with nothing to list (a provision in flight) are read but not answered: read
        // on until the page is full or the records end.
        let mut page = lifecycle.volume_page(&driver, from.as_deref(), size)?;
        while page.volumes.len() < size {
            let Some(from) = page.next.take() else { break };
            let more = lifecycle.volume_page(&driver, Some(&from), size - page.volumes.len())?;
            page.volumes.extend(more.volumes);
            page.unreadable.extend(more.unreadable);
            page.next = more.next;
        }
        Ok::<_, LifecycleError>(page)
    })
    .await
    .map_err(|e| Status::internal(format!("operation did not finish: {e}")))?
    .map_err(|e| super::grpc_code::from_lifecycle(&e))?;
    for error in &page.unreadable {
        tracing::warn!(driver = %calls.driver.name, error = %error, "a controller record is left out of ListVolumes");
    }
    let next_token = page
        .next
        .as_deref()
        .map(pagination::token_after)
        .unwrap_or_default();
    // CSI: a plugin with LIST_VOLUMES_PUBLISHED_NODES gives every entry a status.
    let nodes = if plugin.capabilities.attach {
        let runner = &calls.lifecycle.runner;
        let budget = check_budget(
            deadline,
            runner.timeout_for(CallOutKind::IsAttached) + runner.kill_grace,
        );
        let nodes = published_nodes(
            calls,
            &plugin,
            checks_at_once,
            &page.volumes,
            started + budget,
        )
        .await;
        Some(nodes)
    } else {
        None
    };
    tracing::debug!(driver = %calls.driver.name, entries = page.volumes.len(), last_page = next_token.is_empty(), "ListVolumes");
    let entries = page
        .volumes
        .into_iter()
        .enumerate()
        .map(|(i, volume)| list_volumes_response::Entry {
            volume: Some(Volume {
                capacity_bytes: i64::try_from(volume.capacity_bytes()).unwrap_or(i64::MAX),
                volume_context: volume.options().into_iter().collect(),
                volume_id: volume.id,
            }),
            status: nodes
                .as_ref()
                .map(|nodes| list_volumes_response::VolumeStatus {
                    published_node_ids: nodes[i].clone(),
                }),
        })
        .collect();
    Ok(Response::new(ListVolumesResponse {
        entries,
        next_token,
    }))
}

/// The published nodes of each volume of the page, in its order: each attach record checked
/// with `isattached` (see [`published`]); records found detached are marked so (see
/// [`flexvolume_host::controller_records::ControllerRecords::mark_detached`]).
async fn published_nodes(
    calls: &VolumeCalls,
    plugin: &Arc<Plugin>,
    checks_at_once: &Arc<Semaphore>,
    volumes: &[KnownVolume],
    until: Instant,
) -> Vec<Vec<String>> {
    let records: Vec<&VolumeRecord> = volumes.iter().flat_map(|v| &v.attachments).collect();
    let checks = check_all(calls, plugin, checks_at_once, &records, until).await;
    let mut gone: Vec<(Stored, Vec<String>)> = Vec::new();
    let mut checked = records.iter().zip(&checks);
    let mut nodes = Vec::with_capacity(volumes.len());
    let mut unanswered = Vec::new();
    for volume in volumes {
        let mut published_here = Vec::new();
        let mut gone_here = Vec::new();
        for (record, check) in checked.by_ref().take(volume.attachments.len()) {
            if *check == Check::NoAnswerInTime {
                unanswered.push(format!("{}@{}", record.volume_name, record.node));
            }
            report(calls, record, check);
            if published(record.progress, check) {
                published_here.push(record.node.clone());
            } else if *check == Check::NotAttached && record.progress == Progress::Mounted {
                gone_here.push(record.node.clone());
            }
        }
        if !gone_here.is_empty() {
            gone.push((volume.seen.clone(), gone_here));
        }
        nodes.push(published_here);
    }
    if !unanswered.is_empty() {
        // One line per listing: a hanging driver leaves every check unanswered.
        let shown = unanswered
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        let more = if unanswered.len() > 5 { ", …" } else { "" };
        tracing::warn!(driver = %calls.driver.name, unanswered = unanswered.len(), attachments = %format!("{shown}{more}"), "isattached did not answer before ListVolumes had to: the attach records decide");
    }
    mark_gone(calls, gone, until).await;
    nodes
}

/// Logs what a check found that an operator should know of.
fn report(calls: &VolumeCalls, record: &VolumeRecord, check: &Check) {
    let (driver, volume, node) = (&calls.driver.name, &record.volume_name, &record.node);
    match check {
        Check::Attached => {}
        Check::NotAttached if record.progress == Progress::Mounted => {
            tracing::warn!(driver = %driver, volume = %volume, node = %node, "isattached says the volume is no longer attached to the node: it is not listed as published there, so the CO attaches it again")
        }
        Check::NotAttached => {}
        Check::NotSupported => {
            tracing::debug!(driver = %driver, volume = %volume, node = %node, "isattached is not supported: the attach record decides")
        }
        Check::Failed(error) => {
            tracing::warn!(driver = %driver, volume = %volume, node = %node, error = %error, "isattached failed: the attach record decides (a failing driver must not make the CO re-attach)")
        }
        // Counted by the caller, in one line.
        Check::NoAnswerInTime => {}
    }
}

/// Runs `isattached` for every record, [`CHECKS_AT_ONCE`] at a time, until `until`: a record
/// whose check has not answered by then is [`Check::NoAnswerInTime`]. Slots are taken in the
/// records' order, so with more checks than slots the page's first entries are checked first.
/// Checks still waiting for a slot at
/// `until` never run; those running finish in the background, holding their slots.
async fn check_all(
    calls: &VolumeCalls,
    plugin: &Arc<Plugin>,
    checks_at_once: &Arc<Semaphore>,
    records: &[&VolumeRecord],
    until: Instant,
) -> Vec<Check> {
    let mut checks = vec![Check::NoAnswerInTime; records.len()];
    let (answers, mut answered) = tokio::sync::mpsc::unbounded_channel();
    let launch = async move {
        for (i, record) in records.iter().enumerate() {
            let slot = tokio::time::timeout_at(until, checks_at_once.clone().acquire_owned()).await;
            let Ok(Ok(slot)) = slot else {
                break;
            };
            let lifecycle = calls.lifecycle.clone();
            let plugin = plugin.clone();
            let record = (*record).clone();
            let answers = answers.clone();
            tokio::spawn(async move {
                let answer = tokio::task::spawn_blocking(move || {
                    let _slot = slot;
                    let spec = record.spec()?;
                    lifecycle.attached_answer(&plugin, &spec, &record.node)
                })
                .await;
                let check = match answer {
                    Ok(Ok(Some(true))) => Check::Attached,
                    Ok(Ok(Some(false))) => Check::NotAttached,
                    Ok(Ok(None)) => Check::NotSupported,
                    Ok(Err::<_, LifecycleError>(e)) => Check::Failed(message_of(&e)),
                    Err(e) => Check::Failed(format!("the check did not finish: {e}")),
                };
                // The listing may have answered already: nobody to tell.
                let _ = answers.send((i, check));
            });
        }
    };
    let collect = async {
        while let Some((i, check)) = answered.recv().await {
            checks[i] = check;
        }
    };
    // `collect` ends when every check has answered (the last sender gone) or at `until`.
    let _ = tokio::join!(launch, tokio::time::timeout_at(until, collect));
    checks
}

/// Marks the attach records found detached, each volume's with one write from the version the
/// listing read (see [`flexvolume_host::controller_records::ControllerRecords::mark_detached`]):
/// no lock taken, and a volume a call changed since is left to that call. Waited for until
/// `until` at most; the writes still running then finish on their own.
async fn mark_gone(calls: &VolumeCalls, gone: Vec<(Stored, Vec<String>)>, until: Instant) {
    if gone.is_empty() {
        return;
    }
    let lifecycle = calls.lifecycle.clone();
    let driver = calls.driver.name.clone();
    let marking = tokio::task::spawn_blocking(move || {
        for (seen, nodes) in gone {
            if let Err(e) = lifecycle.controller_records.mark_detached(&seen, &nodes) {
                tracing::warn!(driver = %driver, volume = %seen.record.volume, nodes = ?nodes, error = %message_of(&e), "cannot record that the volume was found detached: the next ControllerPublish will not attach it again");
            }
        }
    });
    match tokio::time::timeout_at(until, marking).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(driver = %calls.driver.name, error = %e, "marking volumes found detached did not finish")
        }
        Err(_) => {
            tracing::debug!(driver = %calls.driver.name, "marking volumes found detached goes on after the listing answered")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drivers_word_decides_and_without_it_the_record() {
        use Progress::{Mounted, Mounting};
        let failed = Check::Failed("boom".into());
        let cases = [
            (Mounted, Check::Attached, true),
            (Mounted, Check::NotAttached, false),
            (Mounted, Check::NotSupported, true),
            (Mounted, failed.clone(), true),
            (Mounted, Check::NoAnswerInTime, true),
            (Mounting, Check::Attached, true),
            (Mounting, Check::NotAttached, false),
            (Mounting, Check::NotSupported, false),
            (Mounting, failed, false),
            (Mounting, Check::NoAnswerInTime, false),
        ];
        for (progress, check, expected) in cases {
            assert_eq!(
                published(progress, &check),
                expected,
                "{progress:?} {check:?}"
            );
        }
    }

    #[test]
    fn the_clients_deadline_is_read_from_grpc_timeout() {
        let with = |value: &str| {
            let mut metadata = MetadataMap::new();
            metadata.insert("grpc-timeout", value.parse().unwrap());
            client_deadline(&metadata)
        };
        assert_eq!(client_deadline(&MetadataMap::new()), None);
        assert_eq!(with("15S"), Some(Duration::from_secs(15)));
        assert_eq!(with("133000m"), Some(Duration::from_secs(133)));
        assert_eq!(with("2M"), Some(Duration::from_secs(120)));
        assert_eq!(with("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(with("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(with("5n"), Some(Duration::from_nanos(5)));
        for bad in ["S", "15", "15s", "123456789S", "-1S", "1.5S", "x"] {
            assert_eq!(with(bad), None, "{bad}");
        }
    }

    #[test]
    fn checks_end_before_the_client_gives_up_and_within_one_call_out() {
        let call_out = Duration::from_secs(123);
        assert_eq!(
            check_budget(Some(Duration::from_secs(15)), call_out),
            Duration::from_secs(13)
        );
        assert_eq!(
            check_budget(Some(Duration::from_secs(133)), call_out),
            Duration::from_millis(119_700)
        );
        assert_eq!(
            check_budget(Some(Duration::from_secs(3)), call_out),
            Duration::from_millis(1_500)
        );
        assert_eq!(check_budget(None, call_out), Duration::from_secs(124));
        assert_eq!(
            check_budget(Some(Duration::from_secs(3600)), call_out),
            Duration::from_secs(124)
        );
        assert_eq!(check_budget(Some(Duration::ZERO), call_out), Duration::ZERO);
    }
}
