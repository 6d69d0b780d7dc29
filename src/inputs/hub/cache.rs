//! The Hugging Face cache layout, as huggingface_hub writes it (so either tool reuses the other's
//! downloads):
//!
//! ```text
//! <cache>/<models|datasets>--<org>--<name>/refs/<revision>          commit hash
//!                                      /snapshots/<commit>/<file>    symlink → ../../blobs/<etag>
//!                                      /blobs/<etag>                 the bytes
//!                                      /blobs/<etag>.incomplete      a download in progress
//! <cache>/.locks/<models|datasets>--<org>--<name>/<etag>.lock        one downloader per blob
//! ```
//!
//! hf-hub 0.5 supplies the repo naming (`Repo::folder_name`); it has no resolution of commit
//! revisions, no HF_HUB_CACHE, no relative links and no lock path, which are written here.

use std::path::{Path, PathBuf};

use hf_hub::Repo;

/// One repository's corner of the cache.
pub struct CacheRepo {
    root: PathBuf,
    locks: PathBuf,
    revision: String,
}

/// Whether a revision is a full commit hash (then it needs no ref file).
pub fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

impl CacheRepo {
    pub fn new(cache_dir: &Path, repo: &Repo) -> Self {
        let folder = repo.folder_name();
        Self {
            root: cache_dir.join(&folder),
            locks: cache_dir.join(".locks").join(folder),
            revision: repo.revision().to_string(),
        }
    }

    /// The commit the revision points at in the cache, if any.
    pub fn commit(&self) -> Option<String> {
        if is_commit(&self.revision) {
            return Some(self.revision.clone());
        }
        let c = std::fs::read_to_string(self.root.join("refs").join(&self.revision)).ok()?;
        let c = c.trim();
        (!c.is_empty()).then(|| c.to_string())
    }

    /// The snapshot path of `filename` when the cache has it (the link resolves).
    pub fn cached(&self, filename: &str) -> Option<PathBuf> {
        let p = self.snapshot(&self.commit()?, filename);
        p.exists().then_some(p)
    }

    pub fn snapshot(&self, commit: &str, filename: &str) -> PathBuf {
        self.root.join("snapshots").join(commit).join(filename)
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.root.join("blobs").join(etag)
    }

    pub fn incomplete(&self, etag: &str) -> PathBuf {
        self.root.join("blobs").join(format!("{etag}.incomplete"))
    }

    pub fn lock(&self, etag: &str) -> PathBuf {
        self.locks.join(format!("{etag}.lock"))
    }

    /// Points `snapshots/<commit>/<filename>` at `blobs/<etag>` (relative link, replaced
    /// atomically) and records `refs/<revision>` = commit.
    pub fn link(&self, commit: &str, filename: &str, etag: &str) -> std::io::Result<PathBuf> {
        let pointer = self.snapshot(commit, filename);
        let dir = pointer.parent().expect("snapshot path has a parent");
        std::fs::create_dir_all(dir)?;
        // snapshots/<commit>/<a>/<b>/file → ../../../../blobs/<etag>
        let depth = 2 + filename.matches('/').count();
        let target = PathBuf::from("../".repeat(depth)).join("blobs").join(etag);
        let tmp = dir.join(format!(
            ".{}.{}.tmp",
            pointer.file_name().unwrap().to_string_lossy(),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp);
        symlink_or_copy(&target, &self.blob(etag), &tmp)?;
        std::fs::rename(&tmp, &pointer)?;
        if !is_commit(&self.revision) {
            let r = self.root.join("refs").join(&self.revision);
            std::fs::create_dir_all(r.parent().expect("ref path has a parent"))?;
            let tmp = r.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, commit)?;
            std::fs::rename(&tmp, &r)?;
        }
        Ok(pointer)
    }
}

#[cfg(unix)]
fn symlink_or_copy(target: &Path, _blob: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

/// Where symlinks are not available, huggingface_hub copies the blob; so do we.
#[cfg(not(unix))]
fn symlink_or_copy(_target: &Path, blob: &Path, link: &Path) -> std::io::Result<()> {
    std::fs::copy(blob, link).map(|_| ())
}

/// The blob a snapshot entry stands for (its resolved link target), or the file itself.
pub fn blob_of(pointer: &Path) -> PathBuf {
    std::fs::canonicalize(pointer).unwrap_or_else(|_| pointer.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hf_hub::RepoType;

    #[test]
    fn links_are_relative_and_refs_recorded() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repo::with_revision("org/name".into(), RepoType::Dataset, "main".into());
        let c = CacheRepo::new(tmp.path(), &repo);
        let commit = "0123456789abcdef0123456789abcdef01234567";
        assert!(c.cached("sub/dir/f.parquet").is_none());
        std::fs::create_dir_all(c.blob("e").parent().unwrap()).unwrap();
        std::fs::write(c.blob("e"), b"bytes").unwrap();
        let p = c.link(commit, "sub/dir/f.parquet", "e").unwrap();
        assert_eq!(
            std::fs::read_link(&p).unwrap(),
            PathBuf::from("../../../../blobs/e")
        );
        assert_eq!(c.cached("sub/dir/f.parquet").unwrap(), p);
        assert_eq!(std::fs::read(&p).unwrap(), b"bytes");
        assert!(tmp.path().join("datasets--org--name/refs/main").is_file());
        assert_eq!(c.commit().unwrap(), commit);
        // A commit revision needs no ref.
        let pinned = Repo::with_revision("org/name".into(), RepoType::Dataset, commit.into());
        assert_eq!(
            CacheRepo::new(tmp.path(), &pinned).cached("sub/dir/f.parquet"),
            Some(p)
        );
        assert_eq!(
            c.lock("e"),
            tmp.path().join(".locks/datasets--org--name/e.lock")
        );
    }
}
