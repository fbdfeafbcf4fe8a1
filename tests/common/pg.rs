//! Postgres for tests: every call to [`fresh_database`] gets a new, empty database.
//!
//! Which server:
//! - `DATABASE_URL=postgres://…` set: that server (the databases are created on it and left
//!   there; CI servers are throwaway).
//! - otherwise: one throwaway server per test process, started on first use from the `initdb` and
//!   `postgres` found on `PATH` or under `/usr/lib/postgresql/*/bin`, in a temp dir, on a free
//!   port, with `fsync=off`. Postgres refuses to run as root, so when we are root its processes
//!   run as the `postgres` OS user.
//!
//! Cleanup: a child process is *not* killed when its parent exits, and a static's `Drop` never
//! runs, so a small watchdog shell (`sh`, beside the server) polls for this test process and,
//! within about half a second of its exit, stops the server and removes its directory. That poll
//! is about the process's lifetime, not a test wait.
//!
//! Databases are owned by a non-superuser role (`acp_test`) when the server lets us create it, so
//! the gateway runs with the roles it has in production: `acp_test` owns the tables, and is made
//! a member of the request role (`acp_gateway_request`) as an operator who provisions roles
//! would, so it needs no CREATEROLE to migrate.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::{Connection, Executor, PgConnection};
use tokio::sync::OnceCell;

/// The non-superuser role test databases belong to (its password is the same string).
pub const TEST_ROLE: &str = "acp_test";

/// The login test gateways' request work uses (`request_database_url`; docs/operations.md "Postgres roles
/// and row-level security"): a member of the request role and nothing else (its password is the
/// same string).
pub const WEB_ROLE: &str = "acp_test_web";

/// A server tests can create databases on.
#[derive(Debug)]
pub struct Server {
    /// A superuser (or at least `CREATEDB`) URL, without the database part.
    admin: ConnUrl,
    /// Whether [`TEST_ROLE`] exists there.
    has_test_role: bool,
    /// Whether [`WEB_ROLE`] exists there, a member of the request role.
    has_web_role: bool,
    /// The throwaway server and its watchdog, when we started them (never waited for: the
    /// watchdog outlives this process on purpose).
    _processes: Vec<std::process::Child>,
}

static SERVER: OnceCell<Server> = OnceCell::const_new();

/// The URL of a new, empty database (owned by [`TEST_ROLE`] when possible).
pub async fn fresh_database() -> String {
    let server = server().await;
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let mut admin = server.admin.connect("postgres").await;
    let owner = if server.has_test_role {
        format!(" OWNER {TEST_ROLE}")
    } else {
        String::new()
    };
    admin
        .execute(format!("CREATE DATABASE {name}{owner}").as_str())
        .await
        .expect("CREATE DATABASE");
    let _ = admin.close().await;
    if server.has_test_role {
        server.admin.with_user(TEST_ROLE, TEST_ROLE).url(&name)
    } else {
        server.admin.url(&name)
    }
}

/// A superuser connection URL to `database` on the test server (for tests that create roles).
pub async fn admin_url(database: &str) -> String {
    server().await.admin.url(database)
}

/// A URL to `database` on the test server as `user` with `password` (for tests that create roles).
pub async fn url_as(user: &str, password: &str, database: &str) -> String {
    server().await.admin.with_user(user, password).url(database)
}

/// The request login's URL (`request_database_url`) for `db_url`, a database on the shared server
/// as [`TEST_ROLE`]: [`WEB_ROLE`] on the same database, so that test gateways on Postgres do
/// request work as docs/operations.md tells operators to. `None` for any other URL.
pub async fn request_url(db_url: &str) -> Option<String> {
    if !db_url.starts_with("postgres") {
        return None;
    }
    let server = server().await;
    let given = ConnUrl::parse(db_url);
    let ours = server.admin.with_user(TEST_ROLE, TEST_ROLE);
    (server.has_web_role && given.host == ours.host && given.userinfo == ours.userinfo)
        .then(|| ours.with_user(WEB_ROLE, WEB_ROLE).url(database_of(db_url)))
}

/// The database name in a URL made by [`fresh_database`].
pub fn database_of(url: &str) -> &str {
    let path = url.rsplit('/').next().unwrap_or(url);
    path.split('?').next().unwrap_or(path)
}

/// The shared server, started on first use.
pub async fn server() -> &'static Server {
    SERVER.get_or_init(init).await
}

async fn init() -> Server {
    // The fast tier (`scripts/test.sh --fast`) runs the SQLite half: a test that reaches for
    // Postgres there is one its filter should have left out.
    assert!(
        std::env::var_os("ACP_TEST_NO_POSTGRES").is_none(),
        "this test needs Postgres, which the fast tier leaves out: name it *_postgres, or add its module to \
         the fast tier's --skip list in scripts/test.sh"
    );
    let (admin, processes) = match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres") => (ConnUrl::parse(&url), Vec::new()),
        _ => start_throwaway().await,
    };
    let mut conn = admin.connect("postgres").await;
    // Several test processes may share one server: creating the role must tolerate a race.
    let created = conn
        .execute(
            format!(
                "DO $$ BEGIN
                     IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{TEST_ROLE}') THEN
                         CREATE ROLE {TEST_ROLE} LOGIN NOSUPERUSER NOBYPASSRLS PASSWORD '{TEST_ROLE}';
                     END IF;
                 EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
                 END $$"
            )
            .as_str(),
        )
        .await;
    let mut has_web_role = false;
    if let Err(e) = &created {
        eprintln!("tests: cannot create role {TEST_ROLE} ({e}); test databases will belong to the DATABASE_URL user");
    } else if let Err(e) = provision_request_role(&mut conn, TEST_ROLE).await {
        eprintln!("tests: cannot provide role {REQUEST_ROLE} to {TEST_ROLE} ({e}); its migrations will try");
    } else {
        let web = conn
            .execute(
                format!(
                    "DO $$ BEGIN
                         IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{WEB_ROLE}') THEN
                             CREATE ROLE {WEB_ROLE} LOGIN NOINHERIT NOSUPERUSER NOBYPASSRLS PASSWORD '{WEB_ROLE}';
                         END IF;
                     EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
                     END $$"
                )
                .as_str(),
            )
            .await;
        match web {
            Ok(_) => match provision_request_role(&mut conn, WEB_ROLE).await {
                Ok(()) => has_web_role = true,
                Err(e) => {
                    eprintln!("tests: cannot grant {REQUEST_ROLE} to {WEB_ROLE} ({e}); request work shares the login")
                }
            },
            Err(e) => eprintln!("tests: cannot create role {WEB_ROLE} ({e}); request work shares the login"),
        }
    }
    let _ = conn.close().await;
    Server {
        admin,
        has_test_role: created.is_ok(),
        has_web_role,
        _processes: processes,
    }
}

/// What an operator who provisions the gateway's roles runs (docs/operations.md, "Postgres roles and
/// row-level security"), as a superuser: the request role, and `login` made a member, so that
/// `login` needs no CREATEROLE to migrate. Tolerates the role and the grant existing already, or
/// being made at the same moment by another test process sharing the server.
pub async fn provision_request_role(admin: &mut PgConnection, login: &str) -> Result<(), sqlx::Error> {
    admin
        .execute(
            format!(
                "DO $$ BEGIN
                     IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{REQUEST_ROLE}') THEN
                         CREATE ROLE {REQUEST_ROLE} NOLOGIN NOSUPERUSER NOBYPASSRLS NOINHERIT;
                     END IF;
                 EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
                 END $$;
                 DO $$ BEGIN
                     IF NOT pg_has_role('{login}', '{REQUEST_ROLE}', 'MEMBER') THEN
                         GRANT {REQUEST_ROLE} TO {login};
                     END IF;
                 EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
                 END $$"
            )
            .as_str(),
        )
        .await
        .map(|_| ())
}

/// The role the gateway's request work runs as (migration `…_request_role`).
pub const REQUEST_ROLE: &str = "acp_gateway_request";

/// `user`'s identity signed with `key`, as a request transaction names it in `acp_gateway.user`:
/// `<hex HMAC-SHA256(key, user)>:<user>`. Written here from the migration's definition, apart
/// from the store's code, so that tests check the one against the other.
pub fn signed_identity(key: &[u8], user: &str) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key length");
    mac.update(user.as_bytes());
    let tag = mac.finalize().into_bytes();
    let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}:{user}")
}

/// The database's identity key; `conn` must be the tables' owner (or a superuser).
pub async fn identity_key(conn: &mut PgConnection) -> Vec<u8> {
    sqlx::query_scalar("SELECT key FROM request_identity_key")
        .fetch_one(conn)
        .await
        .expect("read the identity key as its owner")
}

/// What a request transaction starts with: [`REQUEST_ROLE`], and a signed identity (`$1`).
pub const ACT_AS: &str =
    "SELECT set_config('role', 'acp_gateway_request', true), set_config('acp_gateway.user', $1, true)";

/// Makes the transaction open on `conn` (as the tables' owner) act as the gateway's request work
/// does for `user`: as [`REQUEST_ROLE`], with `user`'s signed identity, until it ends.
pub async fn act_for(conn: &mut PgConnection, user: &str) {
    let key = identity_key(&mut *conn).await;
    sqlx::query(ACT_AS)
        .bind(signed_identity(&key, user))
        .execute(conn)
        .await
        .expect("act as the request role");
}

/// A server of a test's own, for tests that need a cluster nobody has created roles on (the
/// shared one has [`REQUEST_ROLE`] from its first use); stopped with the test process as the
/// shared one is.
pub struct OwnServer {
    /// A superuser URL, without the database part.
    admin: ConnUrl,
    /// The server and its watchdog (see [`Server`]).
    _processes: Vec<std::process::Child>,
}

impl OwnServer {
    /// Starts it.
    pub async fn start() -> Self {
        let (admin, processes) = start_throwaway().await;
        Self {
            admin,
            _processes: processes,
        }
    }

    /// A superuser URL to `database`.
    pub fn admin_url(&self, database: &str) -> String {
        self.admin.url(database)
    }

    /// A URL to `database` as `user` with `password`.
    pub fn url_as(&self, user: &str, password: &str, database: &str) -> String {
        self.admin.with_user(user, password).url(database)
    }
}

/// A `postgres://` URL split into the parts tests change.
#[derive(Debug, Clone)]
struct ConnUrl {
    /// `postgres://` or `postgresql://`.
    scheme: String,
    /// `user[:password]`, percent-encoded as given, or empty.
    userinfo: String,
    /// `host[:port]`.
    host: String,
    /// `?…` or empty.
    query: String,
}

impl ConnUrl {
    fn parse(url: &str) -> Self {
        let (scheme, rest) = url
            .split_once("://")
            .unwrap_or_else(|| panic!("DATABASE_URL {url:?} is not a URL"));
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, format!("?{q}")),
            None => (rest, String::new()),
        };
        let authority = rest.split('/').next().unwrap_or(rest);
        let (userinfo, host) = match authority.rsplit_once('@') {
            Some((u, h)) => (u.to_string(), h.to_string()),
            None => (String::new(), authority.to_string()),
        };
        Self {
            scheme: format!("{scheme}://"),
            userinfo,
            host,
            query,
        }
    }

    fn with_user(&self, user: &str, password: &str) -> Self {
        Self {
            userinfo: format!("{user}:{password}"),
            ..self.clone()
        }
    }

    fn url(&self, database: &str) -> String {
        let at = if self.userinfo.is_empty() { "" } else { "@" };
        format!(
            "{}{}{at}{}/{database}{}",
            self.scheme, self.userinfo, self.host, self.query
        )
    }

    async fn connect(&self, database: &str) -> PgConnection {
        let url = self.url(database);
        PgConnection::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
    }
}

/// Starts the throwaway server and waits until it accepts connections (retrying with another
/// port if the one picked was taken meanwhile).
async fn start_throwaway() -> (ConnUrl, Vec<std::process::Child>) {
    let mut last_log = String::new();
    for _attempt in 0..3 {
        let (mut child, mut watchdog, port, dir) = tokio::task::spawn_blocking(spawn_server)
            .await
            .expect("server start task");
        let admin = ConnUrl::parse(&format!("postgres://postgres@127.0.0.1:{port}"));
        let url = admin.url("postgres");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match PgConnection::connect(&url).await {
                Ok(c) => {
                    let _ = c.close().await;
                    return (admin, vec![child, watchdog]);
                }
                Err(e) => {
                    if let Ok(Some(status)) = child.try_wait() {
                        last_log = format!("exited ({status}):\n{}", log_of(&dir));
                        let _ = std::fs::remove_dir_all(&dir);
                        let _ = watchdog.wait(); // it ends once the server is gone
                        break;
                    }
                    if Instant::now() > deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        let _ = watchdog.wait();
                        panic!(
                            "test postgres did not accept connections within 60 s ({e}):\n{}",
                            log_of(&dir)
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    panic!("test postgres did not start: {last_log}");
}

fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("postgres.log")).unwrap_or_else(|e| format!("(no log: {e})"))
}

/// A new, `initdb`ed cluster in a temp dir, owned by the OS user Postgres runs as (`postgres`
/// when we are root: it refuses to run as root).
pub struct Cluster {
    /// The cluster's directory (`data/` inside it; also its socket directory).
    pub dir: PathBuf,
    /// Where `initdb` and `postgres` are.
    bin: PathBuf,
    /// `(uid, gid)` the server runs as, when we are root.
    run_as: Option<(u32, u32)>,
}

impl Cluster {
    /// `initdb`s a cluster in a new temp dir whose name starts with `prefix`.
    pub fn init(prefix: &str) -> Self {
        let run_as = (effective_uid() == Some(0)).then(|| os_user("postgres"));
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("temp dir for postgres")
            .keep();
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown postgres temp dir");
        }
        let cluster = Self {
            dir,
            bin: postgres_bin_dir(),
            run_as,
        };
        let out = cluster
            .command("initdb")
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
                "-D",
            ])
            .arg(cluster.data())
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster
    }

    /// The data directory.
    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `program` (`initdb`, `postgres`) of this installation, run as the cluster's owner, in its
    /// directory, with no `PG*` variables of ours.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(self.bin.join(program));
        c.current_dir(&self.dir)
            .env_remove("PGDATA")
            .env_remove("PGPORT")
            .env_remove("PGHOST");
        if let Some((uid, gid)) = self.run_as {
            std::os::unix::process::CommandExt::uid(&mut c, uid);
            std::os::unix::process::CommandExt::gid(&mut c, gid);
            c.env("HOME", &self.dir)
                .env("USER", "postgres")
                .env("LOGNAME", "postgres");
        }
        c
    }

    /// Gives `path` to the cluster's owner (for files we create for the server).
    pub fn chown(&self, path: &Path) {
        if let Some((uid, gid)) = self.run_as {
            let _ = std::os::unix::fs::chown(path, Some(uid), Some(gid));
        }
    }
}

/// `initdb`s a cluster in a new temp dir and spawns `postgres` on a free port, plus its watchdog.
fn spawn_server() -> (std::process::Child, std::process::Child, u16, PathBuf) {
    let cluster = Cluster::init("pgtest-");
    let dir = cluster.dir.clone();
    let data = cluster.data();
    let port = free_port();
    let log = std::fs::File::create(dir.join("postgres.log")).expect("postgres log file");
    cluster.chown(&dir.join("postgres.log"));
    let child = cluster
        .command("postgres")
        .arg("-D")
        .arg(&data)
        .arg("-p")
        .arg(port.to_string())
        .arg("-k")
        .arg(&dir)
        .args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=200",
            "-c",
            "shared_buffers=256MB",
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log fd"))
        .stderr(log)
        .spawn()
        .expect("spawn postgres");
    // The watchdog: runs as us (so it can always see this process in /proc), stops the server
    // when this process is gone (immediate shutdown: the data is thrown away anyway), then
    // removes the directory. If the server dies by itself, the directory (and its log) stays
    // for diagnosis.
    let script = r#"
        while [ -e "/proc/$1" ] && kill -0 "$2" 2>/dev/null; do sleep 0.5; done
        if kill -0 "$2" 2>/dev/null; then
            kill -QUIT "$2"
            n=0
            while kill -0 "$2" 2>/dev/null && [ $n -lt 50 ]; do sleep 0.1; n=$((n+1)); done
            kill -KILL "$2" 2>/dev/null
            rm -rf "$3"
        fi
    "#;
    let watchdog = Command::new("sh")
        .args(["-c", script, "pg-watchdog"])
        .arg(std::process::id().to_string())
        .arg(child.id().to_string())
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn postgres watchdog");
    (child, watchdog, port, dir)
}

/// Where `initdb` and `postgres` are.
fn postgres_bin_dir() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .find(|d| d.join("initdb").is_file() && d.join("postgres").is_file());
    if let Some(d) = on_path {
        return d;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("postgres").is_file()).then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, d)| d).unwrap_or_else(|| {
        panic!(
            "Postgres tests need a server: set DATABASE_URL=postgres://… or install PostgreSQL \
             (`apt-get install postgresql`) so that `initdb` is on PATH or under /usr/lib/postgresql/*/bin"
        )
    })
}

/// This process's effective uid, from `/proc/self/status`.
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// `(uid, gid)` of an OS user, from `/etc/passwd`.
fn os_user(name: &str) -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 3 && f[0] == name)
        .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
        .unwrap_or_else(|| {
            panic!("running as root, Postgres needs a non-root OS user {name:?}; install the postgresql package, which creates it")
        })
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}
