//! A client's host events for JavaScript: core's stream of them (a link
//! that broke and came back, a session lost for good, a new session that
//! replaced a lost one) handed to the event loop, where `index.js` emits
//! them as the client's `hostDisconnected`, `hostReconnected`, `hostLost`
//! and `hostReopened` events; and the counters of them (`hostStats`).
//!
//! Core tells events on a thread of the client's own; they reach the event
//! loop through a threadsafe function called without waiting, which does not
//! keep the process alive. The listener is removed from core once the client
//! is closed (after the losses the close caused were told) or collected.

use std::sync::{Arc, Mutex};

use colocated_core as core;
use napi::bindgen_prelude::{Function, Object, ToNapiValue, Unknown};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{sys, Env, JsValue, Status};
use napi_derive::napi;

use crate::errors::to_js;

/// A host event on its way to the event loop, where it is `{host, kind,
/// error}`: the host's index, core's name of the event (`'disconnected'`,
/// `'reconnected'`, `'lost'`, `'reopened'`), and for a disconnect or a loss
/// its error (a `ColocatedError`).
pub struct Heard {
    host: u32,
    kind: &'static str,
    error: Option<core::Error>,
}

impl Heard {
    fn of(event: &core::HostEvent) -> Heard {
        Heard {
            host: u32::try_from(event.host).unwrap_or(u32::MAX),
            kind: event.kind.name(),
            error: event.error.clone(),
        }
    }
}

impl ToNapiValue for Heard {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        let env = Env::from_raw(env);
        let mut object = Object::new(&env)?;
        object.set("host", val.host)?;
        object.set("kind", val.kind)?;
        if let Some(err) = &val.error {
            object.set(
                "error",
                napi::JsError::from(to_js(&env, err)).into_unknown(env),
            )?;
        }
        Ok(object.raw())
    }
}

/// The JavaScript function that hears a client's host events.
type Teller = ThreadsafeFunction<Heard, Unknown<'static>, Heard, Status, false, true>;

/// What core's listener holds: the way to the event loop, and what it told.
struct Listening {
    teller: Teller,
    /// Held while an event is handed over, so that the events thread and
    /// the JavaScript thread (catching up, closing) keep one order.
    state: Mutex<Told>,
}

/// What a listener told, and what it still has to tell before it goes.
struct Told {
    /// Per host: whether the loss of its current session was told (a
    /// session is lost once; a new one is told by `reopened`).
    lost: Vec<bool>,
    /// Set once the client closed.
    closing: Option<Closing>,
}

/// A closed client's listener waiting for the losses still to tell.
struct Closing {
    /// The hosts whose loss is still to be told.
    hosts: Vec<usize>,
    /// Held for its drop, which removes the listener, once `hosts` is empty.
    _registration: Registration,
}

impl Listening {
    /// What it told, locked.
    fn told(&self) -> std::sync::MutexGuard<'_, Told> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs on core's events thread: hands `event` to the event loop
    /// without waiting.
    fn tell(&self, event: &core::HostEvent) {
        let done = {
            let mut told = self.told();
            let new = match event.kind {
                core::HostEventKind::Lost => {
                    // A session is lost once: told once.
                    let seen = told
                        .lost
                        .get_mut(event.host)
                        .map(|l| std::mem::replace(l, true));
                    seen != Some(true)
                }
                core::HostEventKind::Reopened => {
                    if let Some(lost) = told.lost.get_mut(event.host) {
                        *lost = false;
                    }
                    true
                }
                core::HostEventKind::Disconnected | core::HostEventKind::Reconnected => true,
            };
            if new {
                self.hand_over(Heard::of(event));
            }
            let closing = told.closing.as_mut();
            match closing {
                Some(c) if event.kind == core::HostEventKind::Lost => {
                    c.hosts.retain(|host| *host != event.host);
                    if c.hosts.is_empty() {
                        told.closing.take()
                    } else {
                        None
                    }
                }
                _ => None,
            }
        };
        // Out of the lock: this removes the listener from core.
        drop(done);
    }

    /// Hands `heard` to the event loop, without waiting.
    fn hand_over(&self, heard: Heard) {
        // A closed environment refuses it: nobody is left to hear it.
        let _ = self
            .teller
            .call(heard, ThreadsafeFunctionCallMode::NonBlocking);
    }
}

/// A listener registered with core: removed from it when dropped.
struct Registration {
    client: core::Client,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.client.remove_host_listener(self.id);
    }
}

/// The host listener of one `Client` object.
pub(crate) struct HostListener {
    listening: Arc<Listening>,
    registration: Registration,
}

impl HostListener {
    /// Registers `tell` (`({host, kind, error}) => void`) with `client`; it
    /// hears every host event from now on, after the loss of each host
    /// whose session is lost already (core tells those first).
    pub(crate) fn new(
        client: &core::Client,
        tell: Function<Heard, Unknown<'static>>,
    ) -> core::Result<HostListener> {
        let teller = tell
            .build_threadsafe_function::<Heard>()
            .callee_handled::<false>()
            .weak::<true>()
            .build()
            .map_err(|e| core::Error::internal(format!("cannot listen to host events: {e}")))?;
        let hosts = client.hosts();
        let listening = Arc::new(Listening {
            teller,
            state: Mutex::new(Told {
                lost: vec![false; hosts.len()],
                closing: None,
            }),
        });
        let heard = listening.clone();
        let id = client.on_host_event(move |event| heard.tell(event))?;
        let listener = HostListener {
            listening,
            registration: Registration {
                client: client.clone(),
                id,
            },
        };
        Ok(listener)
    }

    /// Closes the client (`core::Client::close`), and removes the listener
    /// once it has told the loss of every worker host's session: at once if
    /// it has, else once the losses still on their way (those the close
    /// causes among them) are told.
    pub(crate) fn close(self, client: &core::Client) {
        let remote: Vec<usize> = client
            .hosts()
            .iter()
            .filter(|h| h.is_remote())
            .map(|h| h.index())
            .collect();
        let now = {
            let mut told = self.listening.told();
            let hosts: Vec<usize> = remote
                .into_iter()
                .filter(|&host| told.lost.get(host) == Some(&false))
                .collect();
            if hosts.is_empty() {
                Some(self.registration)
            } else {
                told.closing = Some(Closing {
                    hosts,
                    _registration: self.registration,
                });
                None
            }
        };
        client.close();
        // Every loss was told: nothing more will come.
        drop(now);
    }
}

/// How often each event happened to a host since the client started.
#[napi(object)]
pub struct HostStats {
    /// Links that broke (`hostDisconnected`).
    pub disconnects: f64,
    /// Links that came back, their session resumed (`hostReconnected`).
    pub reconnects: f64,
    /// Sessions lost for good (`hostLost`).
    pub sessions_lost: f64,
    /// Sessions opened to replace a lost one (`hostReopened`).
    pub sessions_reopened: f64,
}

impl From<core::HostStats> for HostStats {
    fn from(stats: core::HostStats) -> HostStats {
        HostStats {
            disconnects: stats.disconnects as f64,
            reconnects: stats.reconnects as f64,
            sessions_lost: stats.sessions_lost as f64,
            sessions_reopened: stats.sessions_reopened as f64,
        }
    }
}
