//! Postgres's wall between users, set up: the request role every request transaction switches
//! to ([`ACT_FOR_USER`]), the signed identity it names ([`RequestIdentity`]), and the check at
//! start-up that both work ([`check_roles`]).

use std::fmt::Write as _;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use sqlx::postgres::PgPool;

use super::StoreError;

/// The first statement of every request transaction: the request role, and the user it acts for
/// (`$1`, a [`RequestIdentity::sign`]ed name). `set_config('role', …, true)` is `SET LOCAL ROLE`
/// (the same check that the login role may, the same end with the transaction), but a
/// function, so both fit in one statement with a bound parameter.
pub(super) const ACT_FOR_USER: &str =
    "SELECT set_config('role', 'acp_gateway_request', true), set_config('acp_gateway.user', $1, true)";

/// Signs the identity a request transaction names in `acp_gateway.user`, which the policies
/// check through the database function `request_owner()`: `<hex HMAC-SHA256(key, user)>:<user>`,
/// keyed with the database's own random key (table `request_identity_key`, read once at start-up
/// as its owner). A statement of request work that names another user cannot sign the name.
#[derive(Clone)]
pub(crate) struct RequestIdentity {
    /// HMAC-SHA256 already keyed: signing clones it, so the key schedule is done once.
    keyed: Hmac<Sha256>,
}

impl RequestIdentity {
    /// Signs with `key`.
    pub(crate) fn new(key: &[u8]) -> Self {
        Self {
            keyed: <Hmac<Sha256> as Mac>::new_from_slice(key)
                .unwrap_or_else(|_| unreachable!("HMAC takes any key length")),
        }
    }

    /// `user`'s signed identity.
    pub(crate) fn sign(&self, user: &str) -> String {
        let tag = self.keyed.clone().chain_update(user.as_bytes()).finalize().into_bytes();
        let mut signed = String::with_capacity(2 * tag.len() + 1 + user.len());
        for b in tag {
            let _ = write!(signed, "{b:02x}");
        }
        signed.push(':');
        signed.push_str(user);
        signed
    }
}

impl std::fmt::Debug for RequestIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestIdentity")
    }
}

/// Reads the identity key, says (once, at start-up) what would weaken the wall, and proves that
/// request work works: a transaction that switches to the request role and names a user must
/// come back as that role, with the database agreeing on the user (the same signature on both
/// sides). `requests` is request work's own login (`request_database_url`), checked to be no
/// more than a way into the request role; without one, request work shares `pool`'s login and
/// that is warned about.
pub(super) async fn check_roles(pool: &PgPool, requests: Option<&PgPool>) -> Result<RequestIdentity, StoreError> {
    let (login, key, login_bypasses, member_by_grant, request_bypasses): (String, Vec<u8>, bool, bool, bool) =
        sqlx::query_as(
            "WITH RECURSIVE granted(role) AS (
                 SELECT m.roleid FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member
                 WHERE r.rolname = current_user
                 UNION
                 SELECT m.roleid FROM pg_auth_members m JOIN granted g ON m.member = g.role
             )
             SELECT current_user::text, k.key,
                    login.rolsuper OR login.rolbypassrls,
                    EXISTS (SELECT 1 FROM granted WHERE role = request.oid),
                    request.rolsuper OR request.rolbypassrls OR pg_has_role(request.oid, c.relowner, 'USAGE')
             FROM request_identity_key k, pg_roles login, pg_roles request, pg_class c
             WHERE login.rolname = current_user AND request.rolname = 'acp_gateway_request'
               AND c.oid = 'sessions'::regclass",
        )
        .fetch_one(pool)
        .await?;
    if login_bypasses {
        tracing::warn!(
            role = %login,
            "the database role is a superuser or has BYPASSRLS: request work still runs as \
             acp_gateway_request, under row-level security, but system work and any statement that \
             resets the role can do whatever this role can; run the gateway as an ordinary role that owns its tables"
        );
    }
    if !member_by_grant {
        tracing::warn!(
            role = %login,
            "the database role can switch to acp_gateway_request only because it is a superuser; \
             GRANT acp_gateway_request TO it, or request work fails once it is not one"
        );
    }
    if request_bypasses {
        tracing::error!(
            "the role acp_gateway_request is a superuser, has BYPASSRLS or has the privileges of the tables' \
             owner: row-level security does not apply to request work. As a superuser: ALTER ROLE \
             acp_gateway_request NOSUPERUSER NOBYPASSRLS NOINHERIT, and revoke its memberships"
        );
    }
    match requests {
        Some(requests) => check_request_login(requests, &login).await?,
        None => tracing::warn!(
            role = %login,
            "request work logs in as the tables' owner: a request statement that reset its role \
             (SQL injection, which parameterised statements rule out) would act as the owner. Set \
             ACP_GATEWAY_REQUEST_DATABASE_URL to a login that is only a member of acp_gateway_request \
             (docs/operations.md, \"Postgres roles and row-level security\")"
        ),
    }
    let identity = RequestIdentity::new(&key);
    let probe = "acp-gateway start-up check";
    let mut tx = requests.unwrap_or(pool).begin().await?;
    let switched = sqlx::query(ACT_FOR_USER)
        .bind(identity.sign(probe))
        .execute(&mut *tx)
        .await;
    if let Err(e) = switched {
        let who: String = match requests {
            Some(r) => sqlx::query_scalar("SELECT current_user::text").fetch_one(r).await?,
            None => login,
        };
        return Err(StoreError::Roles(format!(
            "{who} cannot switch to role acp_gateway_request ({e}); as a superuser, run: \
             GRANT acp_gateway_request TO {who}"
        )));
    }
    let (role, user): (String, Option<String>) = sqlx::query_as("SELECT current_user::text, request_owner()")
        .fetch_one(&mut *tx)
        .await?;
    tx.rollback().await?;
    if role != "acp_gateway_request" || user.as_deref() != Some(probe) {
        return Err(StoreError::Roles(format!(
            "a request transaction ran as {role} for {user:?}, not as acp_gateway_request for {probe:?}"
        )));
    }
    Ok(identity)
}

/// Refuses a request login (`request_database_url`) that could do more than switch to the
/// request role: the tables' owner or a role with its privileges, a superuser, `BYPASSRLS`, or
/// one that may read the identity key; warns when it may create objects in the tables' schema
/// (where a statement that reset its role could put a function or table in the owner's path).
async fn check_request_login(requests: &PgPool, owner_login: &str) -> Result<(), StoreError> {
    let (login, database, owner, superuser, bypasses, owns, key, create): (
        String,
        String,
        String,
        bool,
        bool,
        bool,
        bool,
        bool,
    ) = sqlx::query_as(
        "SELECT current_user::text, current_database()::text, pg_get_userbyid(c.relowner)::text,
                    r.rolsuper, r.rolbypassrls,
                    pg_has_role(current_user, c.relowner, 'USAGE'),
                    has_table_privilege(current_user, 'request_identity_key', 'SELECT'),
                    has_schema_privilege(current_user, c.relnamespace, 'CREATE')
             FROM pg_class c, pg_roles r
             WHERE c.oid = 'sessions'::regclass AND r.rolname = current_user",
    )
    .fetch_one(requests)
    .await
    .map_err(|e| {
        StoreError::Roles(format!(
            "request_database_url (ACP_GATEWAY_REQUEST_DATABASE_URL) must name the database that DATABASE_URL \
                 names, migrated: {e}"
        ))
    })?;
    let wrong = [
        (superuser, "is a superuser"),
        (bypasses, "has BYPASSRLS"),
        (
            login == owner_login || owns,
            "is (or has the privileges of) the tables' owner",
        ),
        (key, "may read request_identity_key"),
    ];
    if let Some((_, what)) = wrong.iter().find(|(bad, _)| *bad) {
        return Err(StoreError::Roles(format!(
            "the login of request_database_url (ACP_GATEWAY_REQUEST_DATABASE_URL), {login}, {what}: request work \
             must log in as a role that can do nothing but switch to acp_gateway_request (tables' owner: {owner}, \
             database {database}). As a superuser: CREATE ROLE acp_gateway_web LOGIN NOINHERIT PASSWORD '...'; \
             GRANT acp_gateway_request TO acp_gateway_web"
        )));
    }
    if create {
        tracing::warn!(
            role = %login,
            "the request login may CREATE in the tables' schema; as its owner: REVOKE CREATE ON SCHEMA public FROM PUBLIC"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::RequestIdentity;

    /// RFC 4231, test case 2: real HMAC-SHA256 (what the migration's `request_owner()` checks),
    /// hex, then the name.
    #[test]
    fn identities_are_hmac_sha256_then_the_name() {
        let signed = RequestIdentity::new(b"Jefe").sign("what do ya want for nothing?");
        assert_eq!(
            signed,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843:what do ya want for nothing?"
        );
    }
}
