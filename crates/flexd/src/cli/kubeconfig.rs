//! Reaching the cluster: the client of every command that asks the API server (`flexd migrate
//! --plan/--apply/--resume/--rollback`, `flexd preflight --cluster`), from their `--kubeconfig`
//! or, without it, KUBECONFIG, `~/.kube/config` or the pod's own service account.

use std::path::Path;

use anyhow::Context as _;

/// The client, and the API server's address for messages (without any credentials a URL may
/// carry).
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<(kube::Client, String)> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "finding the API server (--kubeconfig, KUBECONFIG, ~/.kube/config or in-cluster)",
        )?,
    };
    let server = address(&config.cluster_url);
    let client = kube::Client::try_from(config).context("making the API server client")?;
    Ok((client, server))
}

/// `https://host:port/path` of a server URL, leaving out a `user:password@` it may have.
fn address(url: &hyper::Uri) -> String {
    let authority = url
        .authority()
        .map(|a| a.as_str().rsplit('@').next().unwrap_or_default())
        .unwrap_or_default();
    let path = url.path();
    format!(
        "{}://{authority}{}",
        url.scheme_str().unwrap_or("https"),
        if path == "/" { "" } else { path }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_leaves_credentials_out() {
        for (url, address_) in [
            ("https://10.0.0.1:6443", "https://10.0.0.1:6443"),
            ("https://10.0.0.1:6443/", "https://10.0.0.1:6443"),
            (
                "http://127.0.0.1:8001/k8s/clusters/c-1",
                "http://127.0.0.1:8001/k8s/clusters/c-1",
            ),
            (
                "https://admin:s3cret@api.example:443",
                "https://api.example:443",
            ),
        ] {
            let url: hyper::Uri = url.parse().unwrap();
            assert_eq!(address(&url), address_);
        }
    }
}
