//! The health of `flexd serve`, as `/healthz` answers it.
//!
//! `/healthz` answers 200 `ok` while flexd does its job, and 503 with the reasons when it
//! cannot without a restart: the driver watcher died (installs and removals go unseen), or a
//! driver that should be served is not (its endpoint could not start, its server stopped, its
//! socket was removed). The serving loop re-checks every second ([`Health::set_problems`]).

use std::sync::Mutex;

use hyper::StatusCode;

/// Why flexd is unhealthy, as of the last check; no problems means healthy.
#[derive(Default)]
pub struct Health {
    problems: Mutex<Vec<String>>,
}

impl Health {
    pub fn set_problems(&self, problems: Vec<String>) {
        if let Ok(mut current) = self.problems.lock() {
            *current = problems;
        }
    }

    /// `/healthz`'s status and body.
    pub fn report(&self) -> (StatusCode, String) {
        let problems = match self.problems.lock() {
            Ok(problems) => problems.clone(),
            Err(_) => vec!["the health state is unreadable (a thread panicked)".to_owned()],
        };
        if problems.is_empty() {
            (StatusCode::OK, "ok\n".to_owned())
        } else {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("unhealthy: {}\n", problems.join("; ")),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_says_every_problem_and_recovers() {
        let health = Health::default();
        assert_eq!(health.report().0, StatusCode::OK);
        health.set_problems(vec![
            "the driver watcher stopped".to_owned(),
            "b".to_owned(),
        ]);
        let (status, body) = health.report();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "unhealthy: the driver watcher stopped; b\n");
        health.set_problems(Vec::new());
        assert_eq!(health.report().0, StatusCode::OK);
    }
}
