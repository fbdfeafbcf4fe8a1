//! One push to one device: the message encrypted for the device's keys (RFC 8291), the VAPID
//! token that names this gateway to the push service (RFC 8292), and the request.

use base64::Engine as _;
use web_push_native::p256;

use super::{B64, Push, Subscription, TTL};

impl Push {
    /// One push; the push service's status.
    pub(super) async fn send(
        &self,
        sub: &Subscription,
        payload: Vec<u8>,
        topic: &str,
        urgent: bool,
    ) -> Result<u16, PushFailed> {
        let (public, auth) = device_keys(&sub.p256dh, &sub.auth)?;
        let endpoint: http::Uri = sub
            .endpoint
            .parse()
            .map_err(|e: http::uri::InvalidUri| PushFailed::Endpoint(e.to_string()))?;
        let request = web_push_native::WebPushBuilder::new(endpoint, public, auth)
            .with_valid_duration(TTL)
            .build(payload)
            .map_err(|e| PushFailed::Build(e.to_string()))?;
        let (parts, body) = request.into_parts();
        let mut headers = parts.headers;
        headers.insert(http::header::AUTHORIZATION, self.vapid(&sub.endpoint)?);
        if let Ok(topic) = http::HeaderValue::from_str(topic) {
            headers.insert("Topic", topic);
        }
        headers.insert(
            "Urgency",
            http::HeaderValue::from_static(if urgent { "high" } else { "normal" }),
        );
        let res = self
            .http
            .post(sub.endpoint.as_str())
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| PushFailed::Send(e.without_url()))?;
        Ok(res.status().as_u16())
    }
}

impl Push {
    /// The VAPID `Authorization` for `endpoint` (RFC 8292): a JWT whose `aud` is the push
    /// service's origin, with its port when not the scheme's default (web-push-native's own drops
    /// the port, so a push service on a port of its own refused every push), `sub` the operator's
    /// contact, signed with the gateway's key, and that key.
    fn vapid(&self, endpoint: &str) -> Result<http::HeaderValue, PushFailed> {
        use web_push_native::jwt_simple::algorithms::ECDSAP256KeyPairLike as _;
        let url = url::Url::parse(endpoint).map_err(|e| PushFailed::Endpoint(e.to_string()))?;
        let claims = web_push_native::jwt_simple::claims::Claims::create(TTL.into())
            .with_audience(url.origin().ascii_serialization())
            .with_subject(&self.config.contact);
        let token = self
            .keypair
            .sign(claims)
            .map_err(|e| PushFailed::Vapid(format!("cannot sign the token: {e}")))?;
        http::HeaderValue::try_from(format!("vapid t={token}, k={}", self.public_key))
            .map_err(|e| PushFailed::Vapid(format!("header: {e}")))
    }
}

/// Why a push did not reach the push service.
#[derive(Debug, thiserror::Error)]
pub(super) enum PushFailed {
    /// The device's keys do not work.
    #[error(transparent)]
    Device(#[from] BadDeviceKeys),
    /// Its endpoint is not a URL.
    #[error("endpoint: {0}")]
    Endpoint(String),
    /// The message could not be encrypted for it.
    #[error("cannot build the push: {0}")]
    Build(String),
    /// The VAPID token or header could not be made.
    #[error("VAPID: {0}")]
    Vapid(String),
    /// The push service did not answer (the error carries no URL: endpoints are capabilities).
    #[error(transparent)]
    Send(reqwest::Error),
}

/// Which of a device's keys is unusable.
#[derive(Debug, thiserror::Error)]
pub enum BadDeviceKeys {
    /// `keys.p256dh` is not base64url.
    #[error("keys.p256dh is not base64url")]
    P256dhEncoding,
    /// `keys.p256dh` is not a point of P-256.
    #[error("keys.p256dh is not a P-256 public key")]
    P256dhKey,
    /// `keys.auth` is not base64url.
    #[error("keys.auth is not base64url")]
    AuthEncoding,
    /// `keys.auth` is not 16 bytes.
    #[error("keys.auth must be 16 bytes")]
    AuthLength,
}

/// A device's public key and auth secret, from their base64url forms.
pub(super) fn device_keys(p256dh: &str, auth: &str) -> Result<(p256::PublicKey, web_push_native::Auth), BadDeviceKeys> {
    let key = B64
        .decode(p256dh.trim_end_matches('='))
        .map_err(|_| BadDeviceKeys::P256dhEncoding)?;
    let public = p256::PublicKey::from_sec1_bytes(&key).map_err(|_| BadDeviceKeys::P256dhKey)?;
    let auth = B64
        .decode(auth.trim_end_matches('='))
        .map_err(|_| BadDeviceKeys::AuthEncoding)?;
    let auth: [u8; 16] = auth.try_into().map_err(|_| BadDeviceKeys::AuthLength)?;
    Ok((public, web_push_native::Auth::from(auth)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use web_push_native::p256::elliptic_curve::sec1::ToEncodedPoint;

    #[test]
    fn device_keys_are_checked_before_use() {
        let secret = p256::SecretKey::from_slice(&[9u8; 32]).expect("scalar");
        let public = B64.encode(secret.public_key().to_encoded_point(false).as_bytes());
        let auth = B64.encode([1u8; 16]);
        assert!(device_keys(&public, &auth).is_ok());
        let refused = |p256dh: &str, auth: &str| device_keys(p256dh, auth).err().map(|e| e.to_string());
        assert_eq!(
            refused(&public, &B64.encode([1u8; 15])).as_deref(),
            Some("keys.auth must be 16 bytes")
        );
        assert_eq!(
            refused("AAAA", &auth).as_deref(),
            Some("keys.p256dh is not a P-256 public key")
        );
        assert_eq!(refused("*", &auth).as_deref(), Some("keys.p256dh is not base64url"));
    }
}
