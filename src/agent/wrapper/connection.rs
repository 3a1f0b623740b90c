//! The wrapper's connections to the broker, shared by the reporter, the watcher, the keyboard
//! router and the scenario agent: connecting as the agent (retried until a broker answers, never
//! restarting one stopped on purpose), the pause between failed calls, and what a refusal means.
//!
//! Invariant: nothing here gives up on a broker that may come back while the agent runs; a
//! departing agent ([`connect_to_leave`]) stops waiting when the broker was stopped on purpose
//! or has not answered for [`LEAVE_PATIENCE`].

use crate::client::{Client, ClientError};
use crate::config::Paths;
use std::time::Duration;

/// A connection to the broker acting as the agent (its secret sent with every request),
/// retried until the broker answers (it is started when none runs).
pub(crate) async fn connect(paths: &Paths, secret: &str) -> Client {
    // Never restarts a broker stopped on purpose: waits until someone starts one.
    let mut client = Client::connect_when_available(paths).await;
    client.set_secret(secret.to_string());
    client
}

/// How long an exiting agent keeps trying to reach the broker to deregister. Past it, the
/// wrapper exits without deregistering: the next broker prunes its dead pid.
pub(crate) const LEAVE_PATIENCE: Duration = Duration::from_secs(10);

/// The longest one attempt may take: longer than the client's wait for a broker it starts
/// (an attempt under way is not cut off while it holds the start-up lock or its broker is
/// coming up), but bounded, since another process may hold that lock for ever.
const LEAVE_ATTEMPT_LIMIT: Duration = Duration::from_secs(20);

/// The connection for an exiting agent's deregistration: None when the broker was stopped on
/// purpose (waiting for a new one would keep a finished agent alive) or cannot be reached or
/// started: no attempt begins after [`LEAVE_PATIENCE`] (its database unreadable, say). The
/// next broker prunes the dead pid either way.
pub(crate) async fn connect_to_leave(paths: &Paths, secret: &str) -> Option<Client> {
    let deadline = tokio::time::Instant::now() + LEAVE_PATIENCE;
    let mut delay = Duration::from_millis(20);
    loop {
        match tokio::time::timeout(LEAVE_ATTEMPT_LIMIT, Client::connect_unless_stopped(paths)).await {
            Ok(Ok(mut client)) => {
                client.set_secret(secret.to_string());
                return Some(client);
            }
            Ok(Err(error)) if error.downcast_ref::<crate::client::StoppedOnPurpose>().is_some() => return None,
            Ok(Err(error)) => tracing::warn!("cannot reach the broker ({error:#})"),
            Err(_) => tracing::warn!("the broker did not answer within {} s", LEAVE_ATTEMPT_LIMIT.as_secs()),
        }
        if tokio::time::Instant::now() + delay >= deadline {
            tracing::warn!(
                "no broker answered within {} s: leaving without deregistering (the next broker prunes this agent)",
                LEAVE_PATIENCE.as_secs()
            );
            return None;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}

/// How long an exiting wrapper waits for blocking work still under way (a wait for the
/// broker's start-up lock held by another process, say) before it exits anyway.
pub(crate) const EXIT_GRACE: Duration = Duration::from_secs(1);

/// Pauses between failed calls to the broker that did answer (a refused status report, a
/// failed acknowledgement): doubling from 50 ms to 5 s, so a persistent refusal does not
/// become a busy loop. Reset by a success.
pub(crate) struct Backoff {
    delay: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(50);
    const LONGEST: Duration = Duration::from_secs(5);

    pub fn reset(&mut self) {
        self.delay = Self::FIRST;
    }

    /// The pause to take now; the next one is twice as long (up to [`Self::LONGEST`]).
    fn next_delay(&mut self) -> Duration {
        let delay = self.delay;
        self.delay = (self.delay * 2).min(Self::LONGEST);
        delay
    }

    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { delay: Self::FIRST }
    }
}

/// The broker no longer knows the agent (deregistered, or its id taken): 404 or 409.
pub(crate) fn is_gone(error: &ClientError) -> bool {
    error.status().is_some_and(|status| status.as_u16() == 404 || status.as_u16() == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_longest_and_resets() {
        let mut backoff = Backoff::default();
        let delays: Vec<Duration> = (0..10).map(|_| backoff.next_delay()).collect();
        assert_eq!(delays[0], Backoff::FIRST);
        assert_eq!(delays[1], Backoff::FIRST * 2);
        assert!(delays.windows(2).all(|pair| pair[1] >= pair[0]));
        assert_eq!(*delays.last().unwrap(), Backoff::LONGEST);
        backoff.reset();
        assert_eq!(backoff.next_delay(), Backoff::FIRST);
    }
}
