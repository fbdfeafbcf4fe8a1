//! Web Push (RFC 8030) to the devices a user opted in: when one of their sessions asks for a
//! permission or a form (elicitation), or a turn ends or fails, and no tab of theirs shows that
//! session, each of their devices gets a push, encrypted for it (RFC 8291, `aes128gcm`) and signed
//! with the gateway's VAPID key (RFC 8292, its `aud` the push service's origin, port included).
//! The payload holds the session's id, the kind of event and what the agent asks (a tool call's
//! title, a form's message), never transcript text; the session's title (the first words of its
//! first prompt) only for a device whose user chose that when opting it in (`titles`). One `Topic` per session, so a push service keeps only the
//! newest; at most one push per session in `[push] min_interval_secs` (a permission request or
//! elicitation always goes). Subscriptions the push service says are gone (404, 410) are dropped.
//!
//! The VAPID key is derived from the gateway's secrets key (generated once into the data
//! directory `0600`, or configured), so every replica that shares it signs with the same key and
//! any replica can push. Subscriptions are kept per user, sealed like agent keys
//! ([`crate::store::sealed_list`]).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
// Tokio's clock, so that tests can pause it and step the rate limit through its interval.
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use web_push_native::jwt_simple::algorithms::ES256KeyPair;
use web_push_native::p256;
use web_push_native::p256::elliptic_curve::sec1::ToEncodedPoint;

use crate::infra::config::PushConfig;
use crate::infra::sealing::Sealer;
use crate::store::sealed_list::SealedList;
use crate::store::{SealedRows, Store};
use service::device_keys;

mod service;

/// Most devices one user opts in.
pub const MAX_DEVICES: usize = 10;
/// How long a push service may keep an undelivered push.
const TTL: Duration = Duration::from_secs(3600);
/// How long a push service gets to answer.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Rate-limit entries kept before old ones are pruned.
const LIMITER_PRUNE_AT: usize = 10_000;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// One opted-in device (the browser's `PushSubscription`).
#[derive(Clone, Serialize, Deserialize)]
pub struct Subscription {
    /// Ours, for the list and removal.
    pub id: String,
    /// The push service's URL for this device (a capability: kept sealed, never listed).
    pub endpoint: String,
    /// The device's P-256 key, base64url (uncompressed point).
    pub p256dh: String,
    /// Its 16-byte auth secret, base64url.
    pub auth: String,
    /// What the user calls it ("Pixel 8", from the browser's user agent).
    pub label: String,
    /// When it was added (epoch ms).
    #[serde(rename = "createdAt")]
    pub created_at: i64,
    /// Whether its pushes carry the session's title (the first words of a prompt): the user's
    /// choice when opting the device in, off unless chosen.
    #[serde(default)]
    pub titles: bool,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// A device as its user sees it in the list.
#[derive(Debug, Clone, Serialize)]
pub struct Device {
    /// Its id.
    pub id: String,
    /// Its label.
    pub label: String,
    /// The push service's host (which vendor), not the endpoint.
    pub service: String,
    /// When it was added (epoch ms).
    #[serde(rename = "createdAt")]
    pub created_at: i64,
    /// Whether its pushes carry the session's title (the first words of a prompt): the user's
    /// choice when opting the device in, off unless chosen.
    #[serde(default)]
    pub titles: bool,
}

/// What happened in a session, as a push says it.
pub use crate::session::Attention as Event;

/// Its name in a push's payload.
fn kind(event: Event) -> &'static str {
    match event {
        Event::Permission => "permission",
        Event::Elicitation => "elicitation",
        Event::TurnEnded => "turn_ended",
        Event::TurnFailed => "turn_failed",
    }
}

/// Whether it always goes, whatever the rate limit.
fn urgent(event: Event) -> bool {
    matches!(event, Event::Permission | Event::Elicitation)
}

/// Why a subscription was refused; the message says what is wrong.
pub type PushError = crate::store::sealed_list::ListError;

/// What `subscribe` answers when the operator turned push off.
const OFF: &str = "this gateway does not send push notifications ([push] enabled = false)";

/// A session of a user: (owner, session id).
type SessionOf = (Arc<str>, Arc<str>);

/// Pushes to users' devices.
pub struct Push {
    devices: SealedList,
    /// Where session titles are read.
    store: Arc<dyn Store>,
    keypair: ES256KeyPair,
    /// The VAPID public key, base64url (what browsers take as `applicationServerKey`).
    public_key: String,
    config: PushConfig,
    http: reqwest::Client,
    /// When each (user, session) was last pushed.
    last: Mutex<HashMap<SessionOf, Instant>>,
    /// Sending tasks.
    tracker: tokio_util::task::TaskTracker,
}

impl std::fmt::Debug for Push {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Push")
            .field("public_key", &self.public_key)
            .finish_non_exhaustive()
    }
}

/// The VAPID key pair derived from the secrets key.
fn vapid_keypair(sealer: &Sealer) -> (ES256KeyPair, String) {
    let mut seed = sealer.derive("web push VAPID key");
    loop {
        if let Ok(secret) = p256::SecretKey::from_slice(&seed)
            && let Ok(pair) = ES256KeyPair::from_bytes(&seed)
        {
            let public = B64.encode(secret.public_key().to_encoded_point(false).as_bytes());
            return (pair, public);
        }
        // Not a scalar below the curve's order (odds about 2^-32): hash again.
        seed = sha2::Digest::finalize(sha2::Digest::chain_update(sha2::Sha256::default(), seed)).into();
    }
}

impl Push {
    /// Pushes as `config` says, subscriptions kept in `store`, the VAPID key derived from
    /// `sealer`'s key; sending tasks tracked by `tracker`.
    pub fn new(
        config: PushConfig,
        store: Arc<dyn Store>,
        rows: SealedRows,
        sealer: Sealer,
        tracker: tokio_util::task::TaskTracker,
    ) -> Self {
        let (keypair, public_key) = vapid_keypair(&sealer);
        let http = reqwest::Client::builder()
            .timeout(SEND_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Self {
            devices: SealedList::new(rows, sealer, "/push", "subscriptions", "your push subscriptions"),
            store,
            keypair,
            public_key,
            config,
            http,
            last: Mutex::default(),
            tracker,
        }
    }

    /// Whether users may opt in.
    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// The VAPID public key (base64url, uncompressed P-256 point).
    pub fn public_key(&self) -> &str {
        &self.public_key
    }

    async fn subscriptions(&self, owner: &str) -> Result<Vec<Subscription>, PushError> {
        self.devices.read(owner).await.map_err(PushError::Unavailable)
    }

    /// Opts a device in (again: the same endpoint replaces its entry); its id.
    pub async fn subscribe(
        &self,
        owner: &str,
        endpoint: &str,
        p256dh: &str,
        auth: &str,
        label: &str,
        titles: bool,
    ) -> Result<String, PushError> {
        if !self.enabled() {
            return Err(PushError::Off(OFF));
        }
        let url = url::Url::parse(endpoint).map_err(|e| PushError::Invalid(format!("endpoint: {e}")))?;
        let http_ok = self.config.allow_http_endpoints && url.scheme() == "http";
        if url.scheme() != "https" && !http_ok {
            return Err(PushError::Invalid(
                "endpoint must be an https:// URL (a browser's push service)".into(),
            ));
        }
        let host = url.host_str().unwrap_or_default();
        if endpoint.len() > 2048 || host.is_empty() {
            return Err(PushError::Invalid("endpoint is not a push service URL".into()));
        }
        // With any host allowed (`endpoint_hosts = []`), still never this host, its network or
        // a cloud's metadata service named by address: the gateway, not a sandbox, would post
        // there. (A name that resolves to one is the operator's to keep out with the list.)
        if self.config.endpoint_hosts.is_empty() && is_internal(&url) {
            return Err(PushError::Invalid(format!(
                "endpoint host {host:?} is a loopback, private or link-local address; name it in [push] endpoint_hosts to allow it"
            )));
        }
        if !self.config.endpoint_allowed(host) {
            return Err(PushError::Invalid(format!(
                "endpoint host {host:?} is not a push service this gateway sends to ([push] endpoint_hosts: {:?})",
                self.config.endpoint_hosts
            )));
        }
        device_keys(p256dh, auth).map_err(|e| PushError::Invalid(e.to_string()))?;
        let label: String = label.chars().filter(|c| !c.is_control()).take(80).collect();
        let mut list = self.subscriptions(owner).await?;
        list.retain(|s| s.endpoint != endpoint);
        if list.len() >= MAX_DEVICES {
            return Err(PushError::Invalid(format!(
                "you already have {MAX_DEVICES} devices opted in; remove one first"
            )));
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        list.push(Subscription {
            id: id.clone(),
            endpoint: endpoint.to_string(),
            p256dh: p256dh.to_string(),
            auth: auth.to_string(),
            label,
            created_at: crate::store::now_micros() / 1000,
            titles,
        });
        self.devices.write(owner, &list).await.map_err(PushError::Unavailable)?;
        Ok(id)
    }

    /// `owner`'s devices.
    pub async fn devices(&self, owner: &str) -> Result<Vec<Device>, PushError> {
        Ok(self
            .subscriptions(owner)
            .await?
            .into_iter()
            .map(|s| Device {
                service: url::Url::parse(&s.endpoint)
                    .ok()
                    .and_then(|u| u.host_str().map(str::to_string))
                    .unwrap_or_default(),
                id: s.id,
                label: s.label,
                created_at: s.created_at,
                titles: s.titles,
            })
            .collect())
    }

    /// Opts device `id` out; whether there was one.
    pub async fn unsubscribe(&self, owner: &str, id: &str) -> Result<bool, PushError> {
        let mut list = self.subscriptions(owner).await?;
        let before = list.len();
        list.retain(|s| s.id != id);
        if list.len() == before {
            return Ok(false);
        }
        self.devices.write(owner, &list).await.map_err(PushError::Unavailable)?;
        Ok(true)
    }

    /// Whether `event` of `session` may be pushed now (and notes that it is).
    fn due(&self, owner: &Arc<str>, session: &Arc<str>, event: Event) -> bool {
        let now = Instant::now();
        let every = Duration::from_secs(self.config.min_interval_secs);
        let mut last = self.last.lock();
        if last.len() >= LIMITER_PRUNE_AT {
            last.retain(|_, at| now.duration_since(*at) < every);
        }
        let key = (owner.clone(), session.clone());
        if !urgent(event) && last.get(&key).is_some_and(|at| now.duration_since(*at) < every) {
            return false;
        }
        last.insert(key, now);
        true
    }

    /// Pushes `event` of `owner`'s session to their devices (on a task of its own), with the
    /// session's title and `asked`, what the agent asks (a permission's tool call title, a
    /// form's message), cut short.
    pub fn notify(self: &Arc<Self>, owner: &Arc<str>, session: &Arc<str>, event: Event, asked: Option<String>) {
        if !self.enabled() || !self.due(owner, session, event) {
            return;
        }
        let (me, owner, session) = (self.clone(), owner.clone(), session.clone());
        self.tracker.spawn(async move {
            // The devices first: a user with none costs this one read.
            let list = match me.subscriptions(&owner).await {
                Ok(list) if list.is_empty() => return,
                Ok(list) => list,
                Err(e) => {
                    tracing::warn!(user = &*owner, error = %e, "cannot read push subscriptions");
                    return;
                }
            };
            // The title is read only when a device of the user's chose to show it.
            let title = if list.iter().any(|s| s.titles) {
                match me.store.get_session(&owner, &session).await {
                    Ok(Some(record)) => record.title,
                    _ => None,
                }
            } else {
                None
            };
            let cut = |s: String| -> String { s.chars().take(200).collect() };
            let payload = |title: Option<&String>| {
                serde_json::json!({
                    "sessionId": &*session,
                    "kind": kind(event),
                    "title": title.cloned().map(cut),
                    "asked": asked.clone().map(cut),
                })
                .to_string()
                .into_bytes()
            };
            let payloads = Payloads {
                plain: payload(None),
                titled: payload(title.as_ref()),
            };
            let topic: String = session.chars().filter(char::is_ascii_alphanumeric).take(32).collect();
            me.send_all(&owner, &list, &payloads, &topic, urgent(event)).await;
        });
    }

    async fn send_all(&self, owner: &str, list: &[Subscription], payloads: &Payloads, topic: &str, urgent: bool) {
        let mut gone = Vec::new();
        for sub in list {
            let payload = if sub.titles { &payloads.titled } else { &payloads.plain };
            match self.send(sub, payload.clone(), topic, urgent).await {
                Ok(status) if status == 404 || status == 410 => {
                    tracing::info!(user = owner, device = %sub.id, status, "push subscription gone; dropped");
                    gone.push(sub.id.clone());
                }
                Ok(status) if (200..300).contains(&status) => {
                    metrics::counter!(crate::infra::metrics::PUSHES, "outcome" => "sent").increment(1);
                }
                Ok(status) => {
                    metrics::counter!(crate::infra::metrics::PUSHES, "outcome" => "refused").increment(1);
                    tracing::warn!(user = owner, device = %sub.id, status, "push service refused a push");
                }
                Err(e) => {
                    metrics::counter!(crate::infra::metrics::PUSHES, "outcome" => "failed").increment(1);
                    tracing::warn!(user = owner, device = %sub.id, error = %e, "push failed");
                }
            }
        }
        if !gone.is_empty() {
            metrics::counter!(crate::infra::metrics::PUSHES, "outcome" => "gone").increment(gone.len() as u64);
            // Read again: a device may have been added meanwhile.
            if let Ok(mut now) = self.subscriptions(owner).await {
                now.retain(|s| !gone.contains(&s.id));
                if let Err(e) = self.devices.write(owner, &now).await {
                    tracing::warn!(user = owner, error = %e, "cannot drop gone push subscriptions");
                }
            }
        }
    }
}

/// What one event pushes: without the session's title, and with it (for devices that chose it).
struct Payloads {
    /// For devices that did not choose titles.
    plain: Vec<u8>,
    /// For devices that did.
    titled: Vec<u8>,
}

/// Whether `url` names this host or a private network by address (or `localhost`).
fn is_internal(url: &url::Url) -> bool {
    use std::net::IpAddr;
    let internal = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || (v4.octets()[0] == 100 && (64..128).contains(&v4.octets()[1]))
        }
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_unique_local()
                || v6.is_unicast_link_local()
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| v4.is_loopback() || v4.is_private() || v4.is_link_local())
        }
    };
    match url.host() {
        Some(url::Host::Ipv4(ip)) => internal(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => internal(IpAddr::V6(ip)),
        Some(url::Host::Domain(name)) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            name == "localhost" || name.ends_with(".localhost")
        }
        None => true,
    }
}

impl crate::session::Notifier for Push {
    fn notify(self: Arc<Self>, owner: &Arc<str>, session: &Arc<str>, what: Event, asked: Option<String>) {
        Push::notify(&self, owner, session, what, asked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rate limit of one session's pushes, stepped through with paused time: a turn's end
    /// goes at most once per `min_interval_secs` per session, other sessions are counted apart,
    /// and what needs an answer (a permission, a form) always goes.
    #[tokio::test]
    async fn pushes_of_a_session_are_spaced_by_the_interval_but_requests_always_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("push.db").display());
        let database = crate::store::open(&url, None).await.expect("store");
        let config = PushConfig {
            min_interval_secs: 10,
            ..PushConfig::default()
        };
        let push = Push::new(
            config,
            database.sessions,
            SealedRows::new(database.db),
            Sealer::new(&[3; 32]),
            tokio_util::task::TaskTracker::new(),
        );
        // The store is open: from here the clock moves only when the test moves it.
        tokio::time::pause();
        let (alice, one, two): (Arc<str>, Arc<str>, Arc<str>) = ("alice".into(), "s1".into(), "s2".into());
        assert!(push.due(&alice, &one, Event::TurnEnded), "the first goes");
        assert!(
            !push.due(&alice, &one, Event::TurnEnded),
            "the second within the interval does not"
        );
        assert!(
            push.due(&alice, &two, Event::TurnEnded),
            "another session is counted apart"
        );
        assert!(push.due(&alice, &one, Event::Permission), "a permission always goes");
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(
            !push.due(&alice, &one, Event::TurnFailed),
            "9.999 s after the permission: not yet"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(push.due(&alice, &one, Event::TurnFailed), "10 s after: it goes");
        assert!(push.due(&alice, &one, Event::Elicitation), "a form always goes");
    }

    #[test]
    fn internal_hosts_are_known_by_address() {
        for internal in [
            "https://127.0.0.1/x",
            "https://10.1.2.3/x",
            "https://169.254.169.254/latest",
            "https://[::1]/x",
            "https://[fd00::1]/x",
            "https://[::ffff:192.168.1.1]/x",
            "https://100.64.0.1/x",
            "https://localhost:8080/x",
            "https://a.localhost/x",
        ] {
            assert!(is_internal(&url::Url::parse(internal).expect("url")), "{internal}");
        }
        for public in [
            "https://fcm.googleapis.com/x",
            "https://8.8.8.8/x",
            "https://[2001:4860::8888]/x",
        ] {
            assert!(!is_internal(&url::Url::parse(public).expect("url")), "{public}");
        }
    }

    #[test]
    fn the_vapid_key_is_the_same_for_the_same_secrets_key_and_not_for_another() {
        let (_, a) = vapid_keypair(&Sealer::new(&[1; 32]));
        let (_, b) = vapid_keypair(&Sealer::new(&[1; 32]));
        let (_, c) = vapid_keypair(&Sealer::new(&[2; 32]));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(
            B64.decode(&a).expect("base64url").len(),
            65,
            "an uncompressed P-256 point"
        );
    }
}
