//! Models from Hugging Face on the command line: `infer pull
//! user/repo[:quant]` (Ollama's `pull`), `-hf user/repo[:quant]` on every
//! command that loads a model (llama.cpp's), and `infer rm`.
//!
//! The hub client is `infer_model::fetch::hub`; this module draws its
//! progress bar and says what was fetched.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use infer_model::fetch::hub::{self, HubRef};
use infer_model::fetch::hub_download::Progress;

use crate::common::CliResult;

/// Options of `infer pull`.
#[derive(Args, Debug)]
pub struct PullArgs {
    /// A Hugging Face repository and quantization, `user/repo[:QUANT]` (default quantization Q4_K_M; Ollama's
    /// `hf.co/` prefix is taken), or a known model's name (`infer models`).
    #[arg(value_name = "USER/REPO[:QUANT]|NAME")]
    pub model: String,
    /// The file of the repository to take, by name or path in it (llama.cpp's -hff), instead of the
    /// quantization's file.
    #[arg(long = "hf-file", value_name = "FILE")]
    pub hf_file: Option<String>,
}

/// Options of `infer rm`.
#[derive(Args, Debug)]
pub struct RmArgs {
    /// What to remove from the cache: `user/repo:QUANT` (one file), `user/repo` (all of the repository's files) or
    /// a known model's name.
    #[arg(value_name = "USER/REPO[:QUANT]|NAME", required = true)]
    pub models: Vec<String>,
}

/// `infer pull`: fetches the model into the cache (a verified copy already
/// there is kept) and prints its path.
pub fn pull(a: PullArgs) -> CliResult {
    let known = infer_model::fetch::find_model(&a.model).is_some();
    let path = match &a.hf_file {
        Some(f) if known => {
            return Err(format!("--hf-file {f}: {} is a known model, not a Hugging Face repository", a.model).into())
        }
        Some(f) => fetch(&HubRef::parse(&a.model)?.with_file(f))?,
        None if known => infer_model::fetch::ensure_model(&a.model)?,
        None => fetch(&HubRef::parse(&a.model)?)?,
    };
    let mut out = crate::output::Out::new();
    writeln!(out, "{}", path.display())?;
    out.flush()?;
    Ok(())
}

/// `infer rm`: removes models from the cache, with their sidecars and
/// partial downloads, naming each file removed.
pub fn rm(a: RmArgs) -> CliResult {
    let dir = infer_model::fetch::cache_dir();
    for name in &a.models {
        let removed = match infer_model::fetch::find_model(name) {
            Some(m) => {
                let path = dir.join(m.file);
                if !path.exists() {
                    return Err(format!("{} is not in the cache (`infer models` lists what is)", m.name).into());
                }
                infer_model::fetch::verify::remove_cached(&path)?;
                vec![path]
            }
            None => hub::remove_cached(&dir, &HubRef::parse(name)?)?,
        };
        for p in removed {
            eprintln!("removed {}", p.display());
        }
    }
    Ok(())
}

/// The cached path of the hub model `r`, downloaded first when it is not
/// in the cache, with a progress bar on stderr (on a terminal) and, after a
/// download, a `download:` line.
///
/// # Errors
/// The hub client's: listing, pick, download, checksum.
pub fn fetch(r: &HubRef) -> CliResult<PathBuf> {
    let dir = infer_model::fetch::cache_dir();
    if let Some(path) = hub::find_cached(&dir, r) {
        return Ok(path);
    }
    let endpoint = hub::endpoint();
    // On a terminal only (indicatif hides it elsewhere), so that a failure
    // is one line.
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template("{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.set_message(format!("fetching {} from {endpoint}", r.display()));
    let t0 = Instant::now();
    let mut first: Option<u64> = None;
    let mut last = 0;
    let mut on_progress = |p: Progress| {
        first.get_or_insert(p.done);
        last = p.done;
        pb.set_length(p.total);
        pb.set_position(p.done);
    };
    let result = hub::ensure_hub_model(&dir, &endpoint, r, &mut on_progress);
    pb.finish_and_clear();
    let path = result?;
    if let Some(first) = first {
        let secs = t0.elapsed().as_secs_f64();
        let got = last.saturating_sub(first);
        eprintln!(
            "download: {:.1} MB in {secs:.1} s ({:.1} MB/s){}, sha256 checked: {}",
            got as f64 / 1e6,
            got as f64 / 1e6 / secs.max(1e-9),
            if first > 0 { format!(", resumed at {:.1} MB", first as f64 / 1e6) } else { String::new() },
            path.display()
        );
    }
    Ok(path)
}
