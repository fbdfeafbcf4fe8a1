//! The web UI's view of the caller's workspace (`/api/fs/*`): the directories its cwd picker
//! shows, a new folder, and the text of a file a tool call names.
//!
//! Every path is resolved the way a session's `cwd` is (`Tenancy::resolve`: absolute, `.`, `..`
//! and symlinks resolved, inside one of the caller's workspace roots). A path outside them gets
//! one answer, `403` naming the roots, whether it exists or not, so these routes tell nobody what
//! lies outside their own roots. What is opened is checked again through the open descriptor
//! (`/proc/self/fd`), so a symlink swapped in after the check cannot lead outside either; a new
//! folder is made one component at a time below an opened directory, never following a link.
//! The filesystem work runs on the blocking pool.

use crate::tenancy::Tenancy;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use serde::Deserialize;
use serde_json::{Value, json};
use tower_http::set_header::SetResponseHeaderLayer;

use super::auth::Caller;
use crate::gateway::Gateway;
use crate::tenancy::Sight;

/// Most directories one listing returns (the smallest names; `truncated` says there were more).
const MAX_ENTRIES: usize = 1000;

/// Most bytes of a file's text returned (`truncated` says there was more).
const MAX_TEXT: usize = 1 << 20;

/// How much of a file is looked at for a NUL byte (what `git` and `grep` call binary).
const BINARY_PROBE: usize = 8 << 10;

pub(super) fn router() -> Router<Gateway> {
    Router::new()
        .route("/api/fs/dirs", get(list_dirs).post(make_dir))
        .route("/api/fs/file", get(read_file))
        // Directory listings and file contents are the user's own: no cache keeps them.
        .layer(SetResponseHeaderLayer::overriding(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        ))
}

/// Why a filesystem call failed, as the caller may see it.
#[derive(Debug, thiserror::Error)]
enum FsError {
    /// Outside the caller's roots (or not resolvable, which is answered the same way).
    #[error("this path is outside your workspace roots")]
    Outside { roots: Vec<String> },
    #[error("{0}")]
    BadRequest(String),
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotADirectory,
    #[error("not a regular file")]
    NotAFile,
    #[error("already exists")]
    Exists,
    #[error("permission denied")]
    Denied,
    #[error("not a text file (binary or not UTF-8)")]
    Binary,
    /// Logged where it is made; the caller gets a generic message.
    #[error("cannot read the workspace")]
    Internal,
}

impl FsError {
    fn status_code(&self) -> StatusCode {
        match self {
            FsError::Outside { .. } | FsError::Denied => StatusCode::FORBIDDEN,
            FsError::BadRequest(_) | FsError::NotADirectory | FsError::NotAFile => StatusCode::BAD_REQUEST,
            FsError::NotFound => StatusCode::NOT_FOUND,
            FsError::Exists => StatusCode::CONFLICT,
            FsError::Binary => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            FsError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// An I/O error on a path inside the roots.
    fn io(e: &io::Error, what: &str) -> Self {
        match e.kind() {
            io::ErrorKind::NotFound => FsError::NotFound,
            io::ErrorKind::NotADirectory => FsError::NotADirectory,
            io::ErrorKind::IsADirectory => FsError::NotAFile,
            io::ErrorKind::AlreadyExists => FsError::Exists,
            io::ErrorKind::PermissionDenied => FsError::Denied,
            _ => {
                tracing::warn!(error = %e, what, "workspace call failed");
                FsError::Internal
            }
        }
    }
}

impl IntoResponse for FsError {
    fn into_response(self) -> Response {
        let body = match &self {
            FsError::Outside { roots } => json!({ "error": self.to_string(), "roots": roots }),
            _ => json!({ "error": self.to_string() }),
        };
        (self.status_code(), Json(body)).into_response()
    }
}

/// The caller's roots and a path resolved inside them, in sight of the caller's agents.
struct Resolved {
    roots: Vec<PathBuf>,
    /// What the caller's agents can see: the sandbox's rule, so that a root above the data
    /// directory (`/`) does not serve what the sandbox hides (the gateway's secrets, other
    /// users' homes, the configuration file).
    sight: Sight,
    path: PathBuf,
}

impl Resolved {
    /// `path` (default: the first root) resolved for `user`.
    fn new(tenancy: &Tenancy, user: &str, path: Option<&str>) -> Result<Self, FsError> {
        let roots = tenancy.roots(user).map_err(|e| {
            tracing::warn!(user = %user, error = %e, "cannot set up the user's workspace roots");
            FsError::Internal
        })?;
        let sight = tenancy.sight(Some(user));
        let Some(path) = path.filter(|p| !p.is_empty()) else {
            let path = roots[0].clone();
            return Ok(Self { roots, sight, path });
        };
        if !Path::new(path).is_absolute() {
            return Err(FsError::BadRequest(String::from("path must be absolute")));
        }
        crate::tenancy::check_length(path).map_err(|e| FsError::BadRequest(e.to_string()))?;
        // Every refusal of the resolver (outside, hidden, or not resolvable: a dangling link, a
        // file in the middle) is the same answer, so nothing outside the roots can be probed.
        // The roots and sight this request already holds, not read again.
        match crate::tenancy::resolve_within(&roots, &sight, path) {
            Ok(path) => Ok(Self { roots, sight, path }),
            Err(_) => Err(outside(&roots)),
        }
    }

    fn inside(&self, path: &Path) -> bool {
        self.roots.iter().any(|r| path.starts_with(r)) && self.sight.sees(path)
    }
}

fn outside(roots: &[PathBuf]) -> FsError {
    FsError::Outside {
        roots: roots.iter().map(|r| r.display().to_string()).collect(),
    }
}

/// `path` as a JSON string, or a `400` when it is not UTF-8.
fn utf8(path: &Path) -> Result<String, FsError> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| FsError::BadRequest(String::from("the path is not UTF-8")))
}

/// Where the kernel says an open descriptor is: its path with every link resolved at open time.
fn opened_path(fd: &impl AsRawFd) -> io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Opens `path` with `flags` once what it leads to is known to be inside the roots. An `O_PATH`
/// handle comes first (it opens nothing: no FIFO or device is touched); where it points is
/// checked, then that same object is opened through the handle, so a link swapped in between
/// the two steps changes nothing.
fn open_inside(r: &Resolved, flags: OFlag) -> Result<File, FsError> {
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((flags | OFlag::O_PATH).bits())
        .open(&r.path)
        .map_err(|e| FsError::io(&e, "open"))?;
    let real = opened_path(&handle).map_err(|e| FsError::io(&e, "read /proc/self/fd"))?;
    if !r.inside(&real) {
        tracing::warn!(path = %r.path.display(), real = %real.display(), "path left the workspace roots after it was checked");
        return Err(outside(&r.roots));
    }
    // A device, FIFO or socket is never opened (opening some has effects: a watchdog arms);
    // `fstat` of the handle says what it is without opening it.
    let kind = handle.metadata().map_err(|e| FsError::io(&e, "stat"))?.file_type();
    if !kind.is_file() && !kind.is_dir() {
        return Err(FsError::NotAFile);
    }
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((flags | OFlag::O_NOCTTY | OFlag::O_NONBLOCK).bits())
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
        .map_err(|e| FsError::io(&e, "open"))
}

/// Runs filesystem work on the blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, FsError> + Send + 'static) -> Result<T, FsError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        tracing::error!(error = %e, "workspace task failed");
        Err(FsError::Internal)
    })
}

#[derive(Deserialize)]
struct DirsQuery {
    path: Option<String>,
    /// `1` or `true`: include names that start with a dot.
    hidden: Option<String>,
}

/// `GET /api/fs/dirs?path=ABS[&hidden=1]`: the directories inside `path` (default: the first
/// workspace root), for the cwd picker.
async fn list_dirs(
    State(tenancy): State<Arc<Tenancy>>,
    Caller(who): Caller,
    Query(q): Query<DirsQuery>,
) -> Result<Json<Value>, FsError> {
    let hidden = q.hidden.as_deref().is_some_and(|h| h == "1" || h == "true");
    blocking(move || {
        let r = Resolved::new(&tenancy, &who.user, q.path.as_deref())?;
        list(&r, hidden)
    })
    .await
    .map(Json)
}

fn list(r: &Resolved, hidden: bool) -> Result<Value, FsError> {
    let dir = open_inside(r, OFlag::O_DIRECTORY)?;
    // Read through the descriptor, so the listing is of the directory that was checked.
    let entries =
        std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())).map_err(|e| FsError::io(&e, "list"))?;
    // The MAX_ENTRIES smallest names, without holding a huge directory's names in memory.
    let mut kept: BinaryHeap<(SortKey, String)> = BinaryHeap::new();
    let mut truncated = false;
    for entry in entries {
        let Ok(entry) = entry else { continue };
        let Ok(name) = entry.file_name().into_string() else {
            continue; // not UTF-8: not something a cwd can be
        };
        if name.starts_with('.') && !hidden {
            continue;
        }
        let key = SortKey::new(&name);
        if kept.len() >= MAX_ENTRIES && kept.peek().is_some_and(|(max, _)| key >= *max) {
            truncated = true;
            continue;
        }
        let Ok(kind) = entry.file_type() else { continue };
        let joined = r.path.join(&name);
        let path = if kind.is_dir() {
            joined
        } else if kind.is_symlink() {
            // Followed only to a directory inside the roots; named by where it leads.
            match std::fs::canonicalize(&joined) {
                Ok(target) if r.inside(&target) && target.is_dir() => target,
                _ => continue,
            }
        } else {
            continue;
        };
        let Some(path) = path.to_str().map(str::to_string) else {
            continue;
        };
        kept.push((key, path));
        if kept.len() > MAX_ENTRIES {
            kept.pop();
            truncated = true;
        }
    }
    let entries: Vec<Value> = kept
        .into_sorted_vec()
        .into_iter()
        .map(|(SortKey(_, name), path)| json!({ "name": name, "path": path }))
        .collect();
    let parent = if r.roots.contains(&r.path) {
        None
    } else {
        r.path.parent().filter(|p| r.inside(p)).and_then(Path::to_str)
    };
    Ok(json!({
        "path": utf8(&r.path)?,
        "parent": parent,
        "roots": r.roots.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "entries": entries,
        "truncated": truncated,
    }))
}

/// How names are ordered: case-insensitively, then exactly.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SortKey(String, String);

impl SortKey {
    fn new(name: &str) -> Self {
        Self(name.to_lowercase(), name.to_string())
    }
}

#[derive(Deserialize)]
struct MkdirBody {
    path: String,
}

/// `POST /api/fs/dirs` `{"path": ABS}`: makes the directory (and missing parents) `0700`;
/// `201 {"path"}`, `409` when it exists. Cookie callers pass the same-origin check of every
/// cookie-authenticated route (`Caller`), and a JSON body is something no cross-site form sends.
async fn make_dir(
    State(tenancy): State<Arc<Tenancy>>,
    Caller(who): Caller,
    body: Result<Json<MkdirBody>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), FsError> {
    let Json(body) = body.map_err(|e| FsError::BadRequest(format!("expected a JSON body {{\"path\": ...}}: {e}")))?;
    let user = who.user.clone();
    let made = blocking(move || {
        if body.path.is_empty() {
            return Err(FsError::BadRequest(String::from("path is required")));
        }
        let r = Resolved::new(&tenancy, &user, Some(&body.path))?;
        mkdir(&r)
    })
    .await?;
    tracing::info!(user = %who.user, path = %made, "workspace directory created");
    Ok((StatusCode::CREATED, Json(json!({ "path": made }))))
}

/// Most folders one request makes (one inside another).
const MAX_NEW_LEVELS: usize = 32;

fn mkdir(r: &Resolved) -> Result<String, FsError> {
    let path = utf8(&r.path)?;
    // The deepest part that exists is resolved already (the resolver followed its links);
    // what is missing is made below it, one name at a time, never through a link.
    let mut existing = r.path.as_path();
    let mut missing = Vec::new();
    while std::fs::symlink_metadata(existing).is_err() {
        let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
            return Err(outside(&r.roots));
        };
        missing.push(name.to_owned());
        existing = parent;
    }
    if missing.is_empty() {
        return Err(FsError::Exists);
    }
    if missing.len() > MAX_NEW_LEVELS {
        return Err(FsError::BadRequest(format!(
            "at most {MAX_NEW_LEVELS} new folders are made at once"
        )));
    }
    let base = Resolved {
        roots: r.roots.clone(),
        sight: r.sight.clone(),
        path: existing.to_path_buf(),
    };
    let mut dir: OwnedFd = open_inside(&base, OFlag::O_DIRECTORY)?.into();
    for name in missing.iter().rev() {
        let mode = Mode::from_bits_truncate(0o700);
        match nix::sys::stat::mkdirat(dir.as_fd(), name.as_os_str(), mode) {
            Ok(()) | Err(nix::Error::EEXIST) => {}
            Err(e) => return Err(FsError::io(&io::Error::from(e), "mkdir")),
        }
        let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
        dir = nix::fcntl::openat(dir.as_fd(), name.as_os_str(), flags, Mode::empty()).map_err(|e| match e {
            // A link put where the new directory should be: not followed.
            nix::Error::ELOOP | nix::Error::ENOTDIR => FsError::Exists,
            e => FsError::io(&io::Error::from(e), "open new directory"),
        })?;
    }
    Ok(path)
}

#[derive(Deserialize)]
struct FileQuery {
    path: Option<String>,
}

/// `GET /api/fs/file?path=ABS`: a text file inside the roots, for the file viewer: at most
/// [`MAX_TEXT`] bytes of it; `415` for a binary file.
async fn read_file(
    State(tenancy): State<Arc<Tenancy>>,
    Caller(who): Caller,
    Query(q): Query<FileQuery>,
) -> Result<Json<Value>, FsError> {
    blocking(move || {
        let Some(path) = q.path.filter(|p| !p.is_empty()) else {
            return Err(FsError::BadRequest(String::from("path is required")));
        };
        let r = Resolved::new(&tenancy, &who.user, Some(&path))?;
        read_text(&r)
    })
    .await
    .map(Json)
}

fn read_text(r: &Resolved) -> Result<Value, FsError> {
    // Non-blocking open: a FIFO put there must not hold a thread.
    let file = open_inside(r, OFlag::empty())?;
    let meta = file.metadata().map_err(|e| FsError::io(&e, "stat"))?;
    if !meta.is_file() {
        return Err(FsError::NotAFile);
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(MAX_TEXT).min(MAX_TEXT + 1));
    file.take(MAX_TEXT as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| FsError::io(&e, "read"))?;
    let truncated = bytes.len() > MAX_TEXT;
    bytes.truncate(MAX_TEXT);
    if bytes[..bytes.len().min(BINARY_PROBE)].contains(&0) {
        return Err(FsError::Binary);
    }
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        // Cut in the middle of a character by the limit: keep the whole ones.
        Err(e) if truncated && e.utf8_error().error_len().is_none() => {
            let valid = e.utf8_error().valid_up_to();
            let mut bytes = e.into_bytes();
            bytes.truncate(valid);
            String::from_utf8(bytes).map_err(|_| FsError::Binary)?
        }
        Err(_) => return Err(FsError::Binary),
    };
    Ok(json!({
        "path": utf8(&r.path)?,
        "text": text,
        "size": meta.len(),
        "truncated": truncated,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_case_insensitively_then_exactly() {
        let mut names = vec!["b", "B", "a", "Zeta", "alpha"];
        names.sort_by_key(|n| SortKey::new(n));
        assert_eq!(names, ["a", "alpha", "B", "b", "Zeta"]);
    }

    #[test]
    fn errors_map_to_statuses() {
        assert_eq!(outside(&[]).status_code(), StatusCode::FORBIDDEN);
        assert_eq!(FsError::NotFound.status_code(), StatusCode::NOT_FOUND);
        assert_eq!(FsError::Binary.status_code(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(
            FsError::io(&io::Error::from(io::ErrorKind::NotADirectory), "t").status_code(),
            StatusCode::BAD_REQUEST
        );
    }
}
