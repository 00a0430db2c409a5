//! Gathering [`ClusterFacts`] for `flexd preflight --cluster`: the only part of it that asks the
//! API server, and only reads (`GET /version`, a list of pods in kube-system). Nothing here
//! fails: what cannot be had is kept with why, and becomes a finding that says so. No message
//! carries the kubeconfig's credentials: the server's address is printed without any, and kube's
//! errors hold none.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use flexd::preflight::{
    ApiFailure, ClusterFacts, ControllerManagers, ServerVersion, KCM_NAMESPACE, KCM_SELECTORS,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

/// How long one request may take: an API server that does not answer in it is out of reach.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub async fn gather(kubeconfig: Option<&Path>) -> ClusterFacts {
    let (client, server) = match crate::cli::kubeconfig::client(kubeconfig).await {
        Ok(client) => client,
        Err(e) => {
            return ClusterFacts {
                version: Err(ApiFailure {
                    server: None,
                    reason: one_line(e.chain()),
                }),
                controller_managers: ControllerManagers::NotAsked,
            }
        }
    };
    let version = match answer(client.apiserver_version()).await {
        Ok(info) => ServerVersion {
            git_version: info.git_version,
            major: info.major,
            minor: info.minor,
        },
        Err(reason) => {
            return ClusterFacts {
                version: Err(ApiFailure {
                    server: Some(server),
                    reason,
                }),
                controller_managers: ControllerManagers::NotAsked,
            }
        }
    };
    tracing::debug!(?version, %server, "the API server's version");
    ClusterFacts {
        version: Ok(version),
        controller_managers: controller_managers(&client).await,
    }
}

/// The pods of kube-system with any of [`KCM_SELECTORS`]' labels, each once, in name order.
async fn controller_managers(client: &kube::Client) -> ControllerManagers {
    let pods: Api<Pod> = Api::namespaced(client.clone(), KCM_NAMESPACE);
    let mut found: Vec<Pod> = Vec::new();
    for selector in KCM_SELECTORS {
        let listed = tokio::time::timeout(
            REQUEST_TIMEOUT,
            pods.list(&ListParams::default().labels(selector)),
        )
        .await;
        let list = match listed {
            Ok(Ok(list)) => list,
            Ok(Err(kube::Error::Api(status))) if status.code == 403 => {
                return ControllerManagers::Forbidden {
                    reason: status.message,
                }
            }
            Ok(Err(e)) => return ControllerManagers::Failed { reason: reason(e) },
            Err(_) => {
                return ControllerManagers::Failed {
                    reason: no_answer(),
                }
            }
        };
        for pod in list.items {
            if !found.iter().any(|p| p.metadata.name == pod.metadata.name) {
                found.push(pod);
            }
        }
    }
    found.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let names: Vec<&str> = found
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    tracing::debug!(?names, "kube-controller-manager pods");
    ControllerManagers::Found(found)
}

/// A request's answer within [`REQUEST_TIMEOUT`], or why there is none.
async fn answer<T>(request: impl Future<Output = Result<T, kube::Error>>) -> Result<T, String> {
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(answered) => answered.map_err(reason),
        Err(_) => Err(no_answer()),
    }
}

fn no_answer() -> String {
    format!(
        "no answer in {}",
        humantime::format_duration(REQUEST_TIMEOUT)
    )
}

/// A kube error in a line: the API server's own message for its refusals (`Unauthorized`),
/// else the error and its causes (`tcp connect error: Connection refused`).
fn reason(e: kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => one_line(anyhow::Error::new(other).chain()),
    }
}

/// An error and its causes joined with `: `, each cause left out when the text before already
/// ends with it (kube's and hyper's errors repeat their source in their own message).
fn one_line<'a>(chain: impl Iterator<Item = &'a (dyn std::error::Error + 'static)>) -> String {
    let mut line = String::new();
    for cause in chain {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{message}")]
    struct Layer {
        message: &'static str,
        #[source]
        source: Option<Box<Layer>>,
    }

    fn layers(messages: &[&'static str]) -> anyhow::Error {
        let mut error = None;
        for message in messages.iter().rev() {
            error = Some(Layer {
                message,
                source: error.map(Box::new),
            });
        }
        anyhow::Error::new(error.unwrap())
    }

    #[test]
    fn causes_a_message_already_ends_with_are_said_once() {
        let e = layers(&[
            "ServiceError: client error (Connect)",
            "client error (Connect)",
            "tcp connect error",
            "Connection refused (os error 111)",
        ]);
        assert_eq!(
            one_line(e.chain()),
            "ServiceError: client error (Connect): tcp connect error: Connection refused (os \
             error 111)"
        );
        let e = layers(&["reading kubeconfig /k: No such file", "No such file"]);
        assert_eq!(one_line(e.chain()), "reading kubeconfig /k: No such file");
    }
}
