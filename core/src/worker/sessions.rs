//! The worker's sessions end: the session id a request names, freeing a
//! closed session, expiring a single-session worker, and reaping sessions
//! whose controller went silent.

use std::time::{Duration, Instant};

use tonic::codegen::http;

use super::{lock, Session, Shared};
use crate::client::Client;
use crate::dispatch::Task;
use crate::error::{Error, Result};
use crate::future::Event;
use crate::transport::{SessionId, SESSION};

/// The session id a request's headers name.
pub(super) fn session_id(headers: &http::HeaderMap) -> Result<SessionId> {
    headers
        .get(SESSION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| Error::unauthenticated("the request names no session"))
        .and_then(|text| {
            SessionId::parse(text).map_err(|e| Error::unauthenticated(e.message().to_string()))
        })
}

pub(super) fn unknown_session() -> Error {
    Error::unauthenticated("unknown session (it was closed, timed out, or the worker restarted)")
}

/// Frees a session taken out of the worker's table — closed, timed out, or
/// the worker stopping — on a thread of its own (never a network thread, nor
/// under the table's lock): its programs that have not started fail, its
/// buffers, executables, streams and host callback calls go, and once the
/// executions already running finished, every language executor frees what
/// the session's programs left behind (`LanguageExecutor::session_ended`:
/// objects, parked results) and the allocator gives the memory back. Returns
/// the thread (`None` if none could start: then the session is dropped
/// without telling the executors).
pub(super) fn end_session(
    client: &Client,
    id: SessionId,
    session: Session,
) -> Option<std::thread::JoinHandle<()>> {
    session.scope.end();
    let client = client.clone();
    let free = move || {
        let key = session.scope.key();
        // One marker per stream, behind the session's executions.
        let drained: Vec<Event> = session
            .streams
            .values()
            .map(|stream| {
                let done = Event::new();
                let marked = done.clone();
                let task = Task {
                    deps: Vec::new(),
                    completion: done.clone(),
                    run: Box::new(move |_| marked.set_if_pending(Ok(()))),
                    waiter_first: false,
                    hands_off: false,
                };
                client.0.local.dispatcher.submit(stream, task);
                done
            })
            .collect();
        // Waiting host callback calls fail now, so their executions finish.
        drop(session);
        for event in drained {
            // Failed only when the client is gone: nothing runs then either.
            let _ = event.wait();
        }
        // The protocol's own leftovers first: objects' destructors run
        // before the executors collect what they held.
        if std::panic::catch_unwind(|| crate::languages::colocated::end_session(key)).is_err() {
            tracing::error!(session = %id, "freeing the session's colocated objects panicked");
        }
        for executor in crate::executor::Languages::of(&client).all() {
            let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                executor.session_ended(key)
            }));
            if ended.is_err() {
                tracing::error!(session = %id, "a language executor panicked freeing the session");
            }
        }
        crate::executor::release_freed_memory();
        tracing::debug!(session = %id, "session freed");
    };
    match std::thread::Builder::new()
        .name("colocated-session-end".into())
        .spawn(free)
    {
        Ok(thread) => Some(thread),
        Err(e) => {
            tracing::error!(session = %id, "no thread to free the session: {e}");
            None
        }
    }
}

/// Waits until the threads of `end_session` finished, or `deadline`.
pub(super) fn wait_ended(ending: Vec<std::thread::JoinHandle<()>>, deadline: Instant) {
    for thread in ending {
        while !thread.is_finished() {
            if Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Expires a single-session worker once its session ended, or when none
/// opened within `deadline`.
pub(super) async fn end_single_session(shared: std::sync::Weak<Shared>, deadline: Duration) {
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let opened = shared.idle.opened() > 0;
        let open = !lock(&shared.sessions).is_empty();
        if opened && !open {
            tracing::info!("the session ended: this single-session worker should stop");
        } else if !opened && started.elapsed() >= deadline {
            tracing::info!(
                ?deadline,
                "no session opened: this single-session worker should stop"
            );
        } else {
            continue;
        }
        shared.idle.expire();
        return;
    }
}

/// Closes sessions whose controller stopped sending heartbeats.
pub(super) async fn reap_sessions(shared: std::sync::Weak<Shared>) {
    loop {
        let Some(period) = shared.upgrade().map(|s| s.heartbeat_interval) else {
            return;
        };
        tokio::time::sleep(period).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if let Some(children) = &shared.children {
            // Reaps the session workers that exited.
            children.live();
        }
        let timed_out: Vec<(SessionId, Session)> = {
            let mut sessions = lock(&shared.sessions);
            let expired: Vec<SessionId> = sessions
                .iter()
                .filter(|(_, session)| session.last_seen.elapsed() > shared.session_timeout)
                .map(|(id, _)| *id)
                .collect();
            expired
                .iter()
                .filter_map(|id| sessions.remove_entry(id))
                .collect()
        };
        // Taken out under the lock, freed outside it.
        for (id, session) in timed_out {
            tracing::info!(session = %id, client = %session.client_name, "session timed out; freeing it");
            let _ = end_session(&shared.client, id, session);
        }
    }
}
