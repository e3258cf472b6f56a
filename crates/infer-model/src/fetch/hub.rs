//! Models from the Hugging Face hub, as llama.cpp's `-hf user/repo[:quant]`
//! and Ollama's `pull hf.co/user/repo[:quant]` take them.
//!
//! A reference names a repository and, after a colon, a quantization
//! (`unsloth/gemma-3-270m-it-GGUF:Q8_0`; default [`DEFAULT_QUANT`]). The
//! repository's files come from the hub's API
//! (`GET {endpoint}/api/models/{repo}/tree/main?recursive=true`, whose LFS
//! entries carry each file's size and SHA-256); the GGUF file whose name
//! holds the quantization as a word (`…-Q4_K_M.gguf`, in any case, not
//! `…-Q4_K_M_L.gguf`) is downloaded from `{endpoint}/{repo}/resolve/main/{file}`
//! ([`super::hub_download`]: resumable, checked against that SHA-256) into
//! `CACHE/hf/{owner}/{repo}/{file}`; llama.cpp's `--hf-file` names the file
//! instead. A file found there with a sidecar that vouches for it is used
//! without asking the hub.
//!
//! Environment, as `huggingface_hub` reads it: `HF_ENDPOINT` (default
//! `https://huggingface.co`), `HF_TOKEN` (sent as a bearer token to the
//! endpoint, for gated and private repositories; never to the host a
//! download is redirected to).

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::hub_download::{download, Progress};
use super::verify;
use crate::error::{Error, Result};

/// The environment variable of the hub's address.
pub const ENDPOINT_ENV: &str = "HF_ENDPOINT";
/// The environment variable of the hub's access token.
pub const TOKEN_ENV: &str = "HF_TOKEN";
/// The hub's address without [`ENDPOINT_ENV`].
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The quantization picked when a reference names none (llama.cpp's default).
pub const DEFAULT_QUANT: &str = "Q4_K_M";
/// The revision files are taken from.
const REVISION: &str = "main";
/// The cache's folder of hub models.
const HUB_DIR: &str = "hf";

/// A model on the hub: `owner/name`, and the quantization asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubRef {
    /// `owner/name`.
    pub repo: String,
    /// The quantization after the colon, as written; `None`: [`DEFAULT_QUANT`].
    pub quant: Option<String>,
    /// The file of the repository asked for by name (llama.cpp's
    /// `--hf-file`), which overrides the quantization.
    pub file: Option<String>,
}

/// The prefixes a hub reference may be written with (Ollama's `hf.co/`, a
/// web address).
const PREFIXES: [&str; 4] = ["https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "hf.co/"];

/// `text` without one of [`PREFIXES`].
fn strip_prefix(text: &str) -> &str {
    PREFIXES.iter().find_map(|p| text.strip_prefix(p)).unwrap_or(text)
}

impl HubRef {
    /// Reads `owner/name[:quant]`, also with Ollama's `hf.co/` or a
    /// `https://huggingface.co/` prefix.
    ///
    /// # Errors
    /// [`Error::Download`] for anything else, saying what is expected.
    pub fn parse(text: &str) -> Result<HubRef> {
        let bad = |why: &str| {
            Error::Download(format!(
                "'{text}' is not a Hugging Face model ({why}; give owner/repo or owner/repo:QUANT)"
            ))
        };
        let s = strip_prefix(text.trim());
        let (repo, quant) = match s.split_once(':') {
            Some((r, q)) => (r, Some(q)),
            None => (s, None),
        };
        let Some((owner, name)) = repo.split_once('/') else { return Err(bad("no '/' between owner and repository")) };
        let word = |w: &str| {
            !w.is_empty()
                && !w.starts_with('.')
                && w.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        };
        if !word(owner) || !word(name) {
            return Err(bad("owner and repository are letters, digits, '-', '_' and '.'"));
        }
        if let Some(q) = quant {
            if !word(q) {
                return Err(bad("the quantization after ':' is a name such as Q4_K_M"));
            }
        }
        Ok(HubRef { repo: repo.to_string(), quant: quant.map(str::to_string), file: None })
    }

    /// The same repository with its file named (llama.cpp's `--hf-file`),
    /// taken instead of the quantization.
    pub fn with_file(self, file: &str) -> HubRef {
        HubRef { file: Some(file.trim().to_string()), ..self }
    }

    /// Whether `text` is written as a hub reference (`owner/name` or
    /// `owner/name:quant`, with or without a prefix `parse` takes; one
    /// slash, no `.gguf` ending) rather than a path.
    pub fn looks_like(text: &str) -> bool {
        // The prefix goes first: `hf.co/owner/name` has two slashes.
        let s = strip_prefix(text.trim());
        let repo = s.split(':').next().unwrap_or("");
        repo.matches('/').count() == 1
            && !s.starts_with(['.', '/', '~'])
            && !s.to_ascii_lowercase().ends_with(".gguf")
            && HubRef::parse(text).is_ok()
    }

    /// The quantization to pick.
    pub fn quant(&self) -> &str {
        self.quant.as_deref().unwrap_or(DEFAULT_QUANT)
    }

    /// `owner/name:QUANT`, or `owner/name/FILE` when a file is named.
    pub fn display(&self) -> String {
        match &self.file {
            Some(f) => format!("{}/{f}", self.repo),
            None => format!("{}:{}", self.repo, self.quant()),
        }
    }
}

/// One file of a repository, as the hub lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubFile {
    /// Its path in the repository.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256 (the LFS object id), lower-case hex.
    pub sha256: String,
}

/// An entry of the hub's tree listing (other fields are ignored).
#[derive(Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    lfs: Option<LfsInfo>,
}

#[derive(Deserialize)]
struct LfsInfo {
    oid: String,
    size: u64,
}

/// The hub's address: `$HF_ENDPOINT` or [`DEFAULT_ENDPOINT`], without a
/// final `/`.
pub fn endpoint() -> String {
    let e = std::env::var(ENDPOINT_ENV).ok().filter(|e| !e.trim().is_empty());
    e.as_deref().unwrap_or(DEFAULT_ENDPOINT).trim().trim_end_matches('/').to_string()
}

/// `$HF_TOKEN`, when set.
fn token() -> Option<String> {
    std::env::var(TOKEN_ENV).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
}

/// The HTTP client: redirects followed (a token is not sent on), statuses
/// read by the caller, 30 s to connect and 60 s for a response's headers
/// (ureq has no idle timeout for a body, only a total one, which a large
/// download must not have).
pub(super) fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(10)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .user_agent(concat!("infer/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// A GET of `url` with the token, when there is one.
pub(super) fn get(agent: &ureq::Agent, url: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
    let req = agent.get(url);
    match token() {
        Some(t) => req.header("Authorization", format!("Bearer {t}")),
        None => req,
    }
}

/// What a failed status means, for messages about `what` at `url`.
pub(super) fn status_error(status: u16, what: &str, url: &str) -> Error {
    let why = match status {
        401 | 403 => {
            format!("the hub refused access ({status}): a gated or private repository needs a token in ${TOKEN_ENV}")
        }
        404 => "not found (404)".to_string(),
        s => format!("HTTP status {s}"),
    };
    Error::Download(format!("{what}: {why} ({url})"))
}

/// `text` with the characters a URL path cannot hold percent-encoded (`/`
/// kept).
fn url_path(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The LFS files of the repository `repo` on the hub at `endpoint`.
///
/// # Errors
/// [`Error::Download`]: the hub cannot be reached, answers with an error
/// status (a missing repository is a 404), or with something other than
/// its tree listing.
pub fn list_files(endpoint: &str, repo: &str) -> Result<Vec<HubFile>> {
    let url = format!("{endpoint}/api/models/{}/tree/{REVISION}?recursive=true", url_path(repo));
    let what = format!("listing the files of {repo}");
    let mut resp = get(&agent(), &url).call().map_err(|e| Error::Download(format!("{what}: {e} ({url})")))?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(status_error(status, &format!("{what} on the hub"), &url));
    }
    let body = resp.body_mut().read_to_string().map_err(|e| Error::Download(format!("{what}: {e} ({url})")))?;
    let entries: Vec<TreeEntry> = serde_json::from_str(&body)
        .map_err(|e| Error::Download(format!("{what}: the hub's answer is not a file listing: {e} ({url})")))?;
    Ok(entries
        .into_iter()
        .filter(|e| e.kind == "file")
        .filter_map(|e| {
            let lfs = e.lfs?;
            let hex = lfs.oid.len() == 64 && lfs.oid.bytes().all(|b| b.is_ascii_hexdigit());
            hex.then(|| HubFile { path: e.path, size: lfs.size, sha256: lfs.oid.to_ascii_lowercase() })
        })
        .collect())
}

/// Whether the file name `name` holds `quant` as a word: in any case, with
/// no letter, digit or `_` right before or after it (`Q4_K` is not in
/// `…-Q4_K_M.gguf`).
pub fn names_quant(name: &str, quant: &str) -> bool {
    let (name, quant) = (name.to_ascii_lowercase(), quant.to_ascii_lowercase());
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    name.match_indices(&quant)
        .any(|(i, m)| !is_word(name[..i].chars().last()) && !is_word(name[i + m.len()..].chars().next()))
}

/// The file name at the end of a repository path.
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The GGUF model files of a listing: `.gguf` files but projectors
/// (`mmproj…`).
fn model_files(files: &[HubFile]) -> Vec<&HubFile> {
    files
        .iter()
        .filter(|f| {
            let name = file_name(&f.path).to_ascii_lowercase();
            name.ends_with(".gguf") && !name.starts_with("mmproj")
        })
        .collect()
}

/// Whether the repository path `path` names a `.gguf` file (any case).
fn is_gguf_name(path: &str) -> bool {
    file_name(path).to_ascii_lowercase().ends_with(".gguf")
}

/// A split GGUF part's name (`…-00001-of-00003.gguf`).
fn is_split(name: &str) -> bool {
    let stem = name.trim_end_matches(".gguf");
    let parts: Vec<&str> = stem.rsplitn(3, '-').collect();
    parts.len() == 3 && parts[1] == "of" && parts[0].len() == 5 && parts[0].bytes().all(|b| b.is_ascii_digit())
}

/// Whether the repository path `path` is the file `want`: the same path, or
/// the same file name.
fn is_file(path: &str, want: &str) -> bool {
    path == want || file_name(path) == want
}

/// The file of `files` (the listing of `r`'s repository) that `r` asks for.
///
/// # Errors
/// [`Error::Download`] when no GGUF file names the quantization (the
/// message lists the quantizations there are), more than one does, the
/// file named is not there (or its name is in more than one folder), or
/// the file is split into parts.
pub fn pick<'a>(files: &'a [HubFile], r: &HubRef) -> Result<&'a HubFile> {
    let ggufs = model_files(files);
    // Sorted: the hub lists a repository's files in no promised order.
    let names = |list: &[&HubFile]| {
        let mut v: Vec<&str> = list.iter().map(|f| f.path.as_str()).collect();
        v.sort_unstable();
        v.join(", ")
    };
    let not_a_gguf = |file: &str| {
        Error::Download(format!(
            "{}: {file} is not a GGUF file, which infer loads (its GGUF files: {})",
            r.repo,
            if ggufs.is_empty() { "none".to_string() } else { names(&ggufs) }
        ))
    };
    if let Some(want) = &r.file {
        let exact: Vec<&HubFile> = files.iter().filter(|f| f.path == *want).collect();
        let found: Vec<&HubFile> =
            if exact.is_empty() { files.iter().filter(|f| is_file(&f.path, want)).collect() } else { exact };
        return match found.as_slice() {
            [f] if is_split(file_name(&f.path)) => Err(Error::Download(format!(
                "{}: {} is one part of a split GGUF, which infer cannot load yet",
                r.repo, f.path
            ))),
            [f] if !is_gguf_name(&f.path) => Err(not_a_gguf(&f.path)),
            [f] => Ok(*f),
            // A file that is not a GGUF may be in the repository but not
            // in the listing, which names large (LFS) files only.
            [] if !is_gguf_name(want) => Err(not_a_gguf(want)),
            [] => Err(Error::Download(format!(
                "{} has no file {want} (its GGUF files: {})",
                r.repo,
                if ggufs.is_empty() { "none".to_string() } else { names(&ggufs) }
            ))),
            many => Err(Error::Download(format!(
                "{}: more than one folder has a file {want} ({}); give its path in the repository",
                r.repo,
                names(many)
            ))),
        };
    }
    if ggufs.is_empty() {
        return Err(Error::Download(format!("{} has no GGUF file", r.repo)));
    }
    let quant = r.quant();
    let matching: Vec<&HubFile> = ggufs.iter().copied().filter(|f| names_quant(file_name(&f.path), quant)).collect();
    match matching.as_slice() {
        [f] if is_split(file_name(&f.path)) => Err(Error::Download(format!(
            "{}: {} is one part of a split GGUF, which infer cannot load yet",
            r.display(),
            f.path
        ))),
        [f] => Ok(*f),
        // Without a quantization asked for, a repository of one file.
        [] if r.quant.is_none() && ggufs.len() == 1 => Ok(ggufs[0]),
        [] => {
            let list: Vec<&str> = ggufs.iter().map(|f| file_name(&f.path)).collect();
            Err(Error::Download(format!(
                "{} has no GGUF file of quantization {quant} (its files: {}); name one as {}:QUANT, or a file with \
                 -hff NAME",
                r.repo,
                list.join(", "),
                r.repo
            )))
        }
        many if many.iter().all(|f| is_split(file_name(&f.path))) => Err(Error::Download(format!(
            "{}: the {quant} model is split into {} parts, which infer cannot load yet",
            r.display(),
            many.len()
        ))),
        many => Err(Error::Download(format!(
            "{}: more than one file is {quant} ({}); name the one you want with -hff NAME (--hf-file)",
            r.display(),
            names(many)
        ))),
    }
}

/// The folder of `repo`'s files in the cache `dir`.
pub fn repo_dir(dir: &Path, repo: &str) -> PathBuf {
    let mut p = dir.join(HUB_DIR);
    for part in repo.split('/') {
        p.push(part);
    }
    p
}

/// Where the repository file `file` of `repo` is cached in `dir`.
///
/// # Errors
/// [`Error::Download`] for a repository path that would leave its folder
/// (`..`, an absolute path).
pub fn cache_path(dir: &Path, repo: &str, file: &str) -> Result<PathBuf> {
    let rel = Path::new(file);
    if file.is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(Error::Download(format!("{repo}: the hub lists a file with an unusable path '{file}'")));
    }
    Ok(repo_dir(dir, repo).join(rel))
}

/// A hub model in the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedHubModel {
    /// `owner/name`.
    pub repo: String,
    /// The file's path in the repository.
    pub file: String,
    /// Where it is.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// Whether its sidecar vouches for its content (else it is checked
    /// against the hub when used).
    pub verified: bool,
    /// Whether this is an incomplete download (`path` is then the
    /// `.partial` file, `size` the bytes it has; `file` is the name the
    /// finished file will have), which the next fetch of the file resumes.
    pub partial: bool,
}

/// The hub models in the cache `dir`, sorted by repository and file.
pub fn cached_models(dir: &Path) -> Vec<CachedHubModel> {
    let mut found = Vec::new();
    let Ok(owners) = std::fs::read_dir(dir.join(HUB_DIR)) else { return found };
    // Links are not followed (a link to a folder elsewhere would list, and
    // `infer rm` remove, files outside the cache): `DirEntry::file_type`
    // does not follow them.
    let is_real_dir = |e: &std::fs::DirEntry| e.file_type().is_ok_and(|t| t.is_dir());
    for owner in owners.flatten().filter(is_real_dir) {
        let Ok(repos) = std::fs::read_dir(owner.path()) else { continue };
        for repo in repos.flatten().filter(is_real_dir) {
            let name = format!("{}/{}", owner.file_name().to_string_lossy(), repo.file_name().to_string_lossy());
            collect_ggufs(&repo.path(), &repo.path(), &name, &mut found);
        }
    }
    found.sort_by(|a, b| (&a.repo, &a.file).cmp(&(&b.repo, &b.file)));
    found
}

/// The `.gguf` files under `folder` (recursively), as files of `repo`, and
/// the incomplete downloads of such files (`.gguf.partial`): regular files
/// only, in real folders (symbolic links are neither followed nor listed).
fn collect_ggufs(root: &Path, folder: &Path, repo: &str, found: &mut Vec<CachedHubModel>) {
    let Ok(entries) = std::fs::read_dir(folder) else { return };
    for e in entries.flatten() {
        let path = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if meta.is_dir() {
            collect_ggufs(root, &path, repo, found);
            continue;
        }
        let rel = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().replace('\\', "/");
        let (file, partial) = match rel.strip_suffix(".partial") {
            Some(f) => (f.to_string(), true),
            None => (rel, false),
        };
        if meta.is_file() && file.ends_with(".gguf") {
            let verified = !partial && verify::vouched_sha256(&path).is_some();
            found.push(CachedHubModel { repo: repo.to_string(), file, path, size: meta.len(), verified, partial });
        }
    }
}

/// The cached file of `r` in `dir` whose sidecar vouches for it, when
/// there is exactly one: the named file, else the one of `r`'s
/// quantization (Q4_K_M when none is given, whatever else is cached, so
/// that a reference means the same file with or without the cache).
pub fn find_cached(dir: &Path, r: &HubRef) -> Option<PathBuf> {
    let cached =
        cached_models(dir).into_iter().filter(|m| m.repo.eq_ignore_ascii_case(&r.repo) && m.verified && !m.partial);
    let found: Vec<CachedHubModel> = match &r.file {
        Some(want) => cached.filter(|m| is_file(&m.file, want)).collect(),
        None => cached.filter(|m| names_quant(file_name(&m.file), r.quant())).collect(),
    };
    match found.as_slice() {
        [m] => Some(m.path.clone()),
        _ => None,
    }
}

/// The path of `r`'s model in the cache `dir`: a cached copy its sidecar
/// vouches for, else downloaded from the hub at `endpoint` (listing, pick,
/// resumable download checked against the hub's SHA-256), `on_progress`
/// told of the bytes as they come.
///
/// # Errors
/// [`Error::Download`] from the listing, the pick and the download (see
/// [`list_files`], [`pick`], [`super::hub_download::download`]).
pub fn ensure_hub_model(
    dir: &Path,
    endpoint: &str,
    r: &HubRef,
    on_progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf> {
    if r.file.as_deref().is_some_and(|f| f.trim().is_empty()) {
        return Err(Error::Download(format!(
            "{}: the file name given with -hff/--hf-file is empty; name one of the repository's GGUF files",
            r.repo
        )));
    }
    if let Some(path) = find_cached(dir, r) {
        return Ok(path);
    }
    let files = list_files(endpoint, &r.repo).map_err(|e| match unverified_cached(dir, r) {
        // Offline with a copy that nothing vouches for (placed by hand):
        // the error says it is there and how to use it as it is.
        Some(p) => Error::Download(format!(
            "{e}; {} is in the cache but unverified (no sidecar vouches for it; the hub is asked to check it), use \
             it as a file with -m {}",
            p.display(),
            p.display()
        )),
        None => e,
    })?;
    let file = pick(&files, r)?;
    let dest = cache_path(dir, &r.repo, &file.path)?;
    let _guard = super::FETCH_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let _file_lock = lock_across_processes(&dest)?;
    if verify::check_cached_as(&dest, file.size, &file.sha256)? != verify::CacheState::Verified {
        let url = format!("{endpoint}/{}/resolve/{REVISION}/{}", url_path(&r.repo), url_path(&file.path));
        download(&url, &dest, file.size, &file.sha256, on_progress)?;
    }
    // Done: the lock goes (while held). A process that waited on it finds
    // the file verified and writes nothing; one that comes later finds it
    // in the cache without locking. After a failed download it stays.
    let _ = std::fs::remove_file(lock_path(&dest));
    Ok(dest)
}

/// The one cached, complete file of `r` that no sidecar vouches for (a
/// file placed in the cache by hand), if there is exactly one.
fn unverified_cached(dir: &Path, r: &HubRef) -> Option<PathBuf> {
    let found: Vec<CachedHubModel> = cached_models(dir)
        .into_iter()
        .filter(|m| m.repo.eq_ignore_ascii_case(&r.repo) && !m.verified && !m.partial)
        .filter(|m| match &r.file {
            Some(want) => is_file(&m.file, want),
            None => names_quant(file_name(&m.file), r.quant()),
        })
        .collect();
    match found.as_slice() {
        [m] => Some(m.path.clone()),
        _ => None,
    }
}

/// `<dest>.lock`, where processes fetching `dest` wait for each other: the
/// one that downloads holds it, the next finds the file verified (two that
/// both wrote the `.partial` file broke each other's download).
fn lock_path(dest: &Path) -> PathBuf {
    super::with_suffix(dest, ".lock")
}

/// Waits for, then holds, an exclusive lock of [`lock_path`] (released
/// when the file is dropped, or by the system when the process ends).
///
/// # Errors
/// [`Error::Io`] when the lock file cannot be made or locked.
fn lock_across_processes(dest: &Path) -> Result<std::fs::File> {
    let path = lock_path(dest);
    let io = |source| Error::Io { path: path.clone(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut o = std::fs::OpenOptions::new();
    o.create(true).truncate(false).write(true);
    // Never through a link (a link there would create or lock its target).
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut o, libc::O_NOFOLLOW);
    let f = o.open(&path).map_err(io)?;
    f.lock().map_err(io)?;
    Ok(f)
}

/// Holds the lock of `dest`'s download ([`lock_path`]) when there is one
/// and no process holds it: `Ok(None)` when there is none, `Ok(Some(file))`
/// held until the file is dropped.
///
/// # Errors
/// [`Error::Download`] when another process holds it (it is downloading
/// `dest`), naming the file and the lock; [`Error::Io`] when the lock
/// cannot be opened or tried.
fn hold_free_lock(dest: &Path) -> Result<Option<std::fs::File>> {
    let path = lock_path(dest);
    let f = match std::fs::OpenOptions::new().write(true).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::Io { path, source }),
    };
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Download(format!(
            "{} is being downloaded by another process (it holds {}); let it finish or stop it, then remove it",
            dest.display(),
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(source)) => Err(Error::Io { path, source }),
    }
}

/// Removes the cached files of `r` from `dir` (with their sidecars),
/// incomplete downloads (`.partial`) and download locks (`.lock`); all of
/// the repository's when `r` names no quantization. Returns the files
/// removed (a download's `.partial` file by its own name).
///
/// # Errors
/// [`Error::Download`] when nothing matches, or a download of one of the
/// files is running (its lock is held by another process: nothing is
/// removed); [`Error::Io`] when a file cannot be removed.
pub fn remove_cached(dir: &Path, r: &HubRef) -> Result<Vec<PathBuf>> {
    // A repository (or owner) folder that is a symbolic link: the link
    // goes, never what it points to.
    for link in [repo_dir(dir, &r.repo), dir.join(HUB_DIR).join(r.repo.split('/').next().unwrap_or_default())] {
        if std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()) {
            std::fs::remove_file(&link).map_err(|source| Error::Io { path: link.clone(), source })?;
            return Ok(vec![link]);
        }
    }
    let of_repo: Vec<CachedHubModel> =
        cached_models(dir).into_iter().filter(|m| m.repo.eq_ignore_ascii_case(&r.repo)).collect();
    if of_repo.is_empty() {
        return Err(Error::Download(format!("{} is not in the cache (`infer models` lists what is)", r.repo)));
    }
    let matching: Vec<CachedHubModel> =
        of_repo.into_iter().filter(|m| r.quant.is_none() || names_quant(file_name(&m.file), r.quant())).collect();
    if matching.is_empty() {
        return Err(Error::Download(format!(
            "{} has no cached {} file (`infer models` lists what is)",
            r.repo,
            r.quant()
        )));
    }
    // The finished file's path of each entry (a partial download's too).
    let dest = |m: &CachedHubModel| m.path.with_file_name(file_name(&m.file));
    // Every lock first: a running download keeps everything in place.
    let mut dests: Vec<PathBuf> = matching.iter().map(dest).collect();
    // Once each: a second lock of one file by this process would wait for the first.
    dests.dedup();
    let mut locks = Vec::new();
    for dest in &dests {
        locks.push(hold_free_lock(dest)?);
    }
    for dest in &dests {
        verify::remove_cached(dest)?;
        let _ = std::fs::remove_file(super::hub_download::partial_path(dest));
        // Removed while held: a download that starts now makes a new one.
        let _ = std::fs::remove_file(lock_path(dest));
    }
    drop(locks);
    let matching: Vec<PathBuf> = matching.into_iter().map(|m| m.path).collect();
    // Empty folders go too (best effort).
    let repo = repo_dir(dir, &r.repo);
    if std::fs::remove_dir(&repo).is_ok() {
        let _ = repo.parent().map(std::fs::remove_dir);
    }
    Ok(matching)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> HubFile {
        HubFile { path: path.into(), size: 1, sha256: "0".repeat(64) }
    }

    #[test]
    fn references_parse_as_llama_cpp_and_ollama_write_them() {
        let r = HubRef::parse("unsloth/gemma-3-270m-it-GGUF:Q8_0").unwrap();
        assert_eq!((r.repo.as_str(), r.quant()), ("unsloth/gemma-3-270m-it-GGUF", "Q8_0"));
        let r = HubRef::parse("hf.co/bartowski/SmolLM2-135M-Instruct-GGUF").unwrap();
        assert_eq!((r.repo.as_str(), r.quant()), ("bartowski/SmolLM2-135M-Instruct-GGUF", "Q4_K_M"));
        for bad in ["noslash", "a/", "/b", "a/b/c", "a/b:", "a/b:Q4 K", "../x"] {
            assert!(HubRef::parse(bad).is_err(), "{bad}");
        }
        assert!(HubRef::looks_like("unsloth/gemma-3-270m-it-GGUF"));
        assert!(!HubRef::looks_like("models/x.gguf"));
        assert!(!HubRef::looks_like("./a/b"));
        assert!(!HubRef::looks_like("a/b/c"));
        // A prefix is not a folder: these have one slash once it is gone.
        for s in ["hf.co/a/b", "huggingface.co/a/b:Q8_0", "https://huggingface.co/a/b"] {
            assert!(HubRef::looks_like(s), "{s}");
        }
        assert!(!HubRef::looks_like("hf.co/a/b/c"));
        assert!(!HubRef::looks_like("hf.co/a/b.gguf"));
    }

    #[test]
    fn the_quantization_is_a_word_of_the_file_name() {
        assert!(names_quant("gemma-3-270m-it-Q4_K_M.gguf", "q4_k_m"));
        assert!(names_quant("model.Q8_0.gguf", "Q8_0"));
        assert!(!names_quant("gemma-3-270m-it-Q4_K_M.gguf", "Q4_K"));
        assert!(!names_quant("x-IQ4_XS.gguf", "Q4_XS"));
        assert!(names_quant("x-UD-Q4_K_XL.gguf", "Q4_K_XL"));
    }

    #[test]
    fn pick_finds_the_one_file_or_says_what_there_is() {
        let files = [file("m-Q4_K_M.gguf"), file("m-Q8_0.gguf"), file("mmproj-m-Q8_0.gguf"), file("README.md")];
        let r = |s: &str| HubRef::parse(s).unwrap();
        assert_eq!(pick(&files, &r("a/m")).unwrap().path, "m-Q4_K_M.gguf");
        assert_eq!(pick(&files, &r("a/m:q8_0")).unwrap().path, "m-Q8_0.gguf");
        let e = pick(&files, &r("a/m:Q2_K")).unwrap_err().to_string();
        assert!(e.contains("no GGUF file of quantization Q2_K") && e.contains("m-Q8_0.gguf"), "{e}");
        assert!(!e.contains("mmproj"), "{e}");
        let one = [file("only.gguf")];
        assert_eq!(pick(&one, &r("a/m")).unwrap().path, "only.gguf");
        let split = [file("Q4_K_M/m-Q4_K_M-00001-of-00002.gguf"), file("Q4_K_M/m-Q4_K_M-00002-of-00002.gguf")];
        assert!(pick(&split, &r("a/m")).unwrap_err().to_string().contains("split into 2 parts"));
        assert!(pick(&[file("README.md")], &r("a/m")).unwrap_err().to_string().contains("has no GGUF file"));
        // Two files of one quantization: -hff names one.
        let two = [file("m-Q4_K_M.gguf"), file("m-v2-Q4_K_M.gguf")];
        let e = pick(&two, &r("a/m")).unwrap_err().to_string();
        assert!(e.contains("more than one file is Q4_K_M") && e.contains("-hff NAME"), "{e}");
        let f = |s: &str, name: &str| r(s).with_file(name);
        assert_eq!(pick(&two, &f("a/m", "m-v2-Q4_K_M.gguf")).unwrap().path, "m-v2-Q4_K_M.gguf");
        // The file wins over the quantization; a file in a folder by its name or path.
        assert_eq!(pick(&files, &f("a/m:Q8_0", "m-Q4_K_M.gguf")).unwrap().path, "m-Q4_K_M.gguf");
        let nested = [file("sub/x.gguf"), file("y.gguf")];
        assert_eq!(pick(&nested, &f("a/m", "x.gguf")).unwrap().path, "sub/x.gguf");
        assert_eq!(pick(&nested, &f("a/m", "sub/x.gguf")).unwrap().path, "sub/x.gguf");
        let e = pick(&nested, &f("a/m", "z.gguf")).unwrap_err().to_string();
        assert!(e.contains("has no file z.gguf (its GGUF files: sub/x.gguf, y.gguf)"), "{e}");
        let e = pick(&[file("a/x.gguf"), file("b/x.gguf")], &f("a/m", "x.gguf")).unwrap_err().to_string();
        assert!(e.contains("more than one folder"), "{e}");
        assert_eq!(f("a/m", "x.gguf").display(), "a/m/x.gguf");
    }

    #[test]
    fn cache_paths_stay_in_the_repository_folder() {
        let dir = Path::new("/c");
        assert_eq!(cache_path(dir, "a/b", "sub/x.gguf").unwrap(), Path::new("/c/hf/a/b/sub/x.gguf"));
        assert!(cache_path(dir, "a/b", "../x.gguf").is_err());
        assert!(cache_path(dir, "a/b", "/etc/x").is_err());
        assert_eq!(url_path("a b/c+d.gguf"), "a%20b/c%2Bd.gguf");
    }
}
