//! A volume's primary files on this node: `replicas/<volume>.epoch`, the
//! last epoch this node served the volume in as primary (one line, as
//! every version wrote it), and `replicas/<volume>.run`, its run as primary
//! (`weft_replication::Run`): the volume's id (a volume deleted and made
//! again under its name is another volume), the epoch the run began in
//! and the members found to need a full rebuild within it, by node name
//! (the core numbers members by their place in the record, which changes
//! with them). Each is replaced whole (written beside, synced, renamed,
//! directory synced).
//!
//! What this does not do: the run's kept regions (the intent file holds
//! them, so that a region leaves the intent and enters them at once).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The run file and what it holds.
#[derive(Debug)]
pub(crate) struct RunFile {
    path: PathBuf,
    volume_id: String,
    /// The epoch the run began in (0: none known, as for a file missing,
    /// unreadable or of another volume: the next run is a new one).
    pub(crate) first_epoch: u64,
    /// Members to rebuild in full.
    pub(crate) full: Vec<String>,
}

impl RunFile {
    /// The run of `volume` (id `volume_id`) under `dir`, as written.
    pub(crate) fn load(dir: &Path, volume: &str, volume_id: &str) -> RunFile {
        let path = dir.join("replicas").join(format!("{volume}.run"));
        let text = fs::read_to_string(&path).unwrap_or_default();
        let mut file = RunFile {
            path,
            volume_id: volume_id.to_string(),
            first_epoch: 0,
            full: Vec::new(),
        };
        let mut lines = text.lines();
        if lines.next().and_then(|l| l.strip_prefix("volume ")) != Some(volume_id) {
            return file;
        }
        for line in lines {
            if let Some(epoch) = line.strip_prefix("run ") {
                file.first_epoch = epoch.trim().parse().unwrap_or(0);
            } else if let Some(nodes) = line.strip_prefix("full ") {
                let nodes = nodes.split(',').filter(|n| !n.is_empty());
                file.full = nodes.map(String::from).collect();
            }
        }
        file
    }

    /// Serves `epoch` from now on (written before the served epoch, and
    /// before anything is fenced); `continued`: taken from this node's own
    /// record of the epoch before, so the run goes on if its beginning is
    /// known; else a new run. Whether the run went on.
    pub(crate) fn begin(&mut self, epoch: u64, continued: bool) -> io::Result<bool> {
        let goes_on = continued && self.first_epoch != 0 && self.first_epoch <= epoch;
        if !goes_on {
            self.first_epoch = epoch;
            self.full.clear();
            self.write()?;
        }
        Ok(goes_on)
    }

    /// Records, durably, that `node` is to be rebuilt in full.
    pub(crate) fn add_full(&mut self, node: &str) -> io::Result<()> {
        if self.full.iter().any(|n| n == node) {
            return Ok(());
        }
        self.full.push(node.to_string());
        self.write()
    }

    /// Every member is in sync again: none to rebuild in full.
    pub(crate) fn all_in_sync(&mut self) -> io::Result<()> {
        if self.full.is_empty() {
            return Ok(());
        }
        self.full.clear();
        self.write()
    }

    fn write(&self) -> io::Result<()> {
        let mut text = format!("volume {}\nrun {}\n", self.volume_id, self.first_epoch);
        if !self.full.is_empty() {
            text.push_str(&format!("full {}\n", self.full.join(",")));
        }
        replace(&self.path, &text)
    }
}

/// Records that this node serves `volume` under `epoch` (`replicas/<volume>.epoch`).
pub(crate) fn write_served_epoch(dir: &Path, volume: &str, epoch: u64) -> io::Result<()> {
    let path = dir.join("replicas").join(format!("{volume}.epoch"));
    replace(&path, &format!("{epoch}\n"))
}

/// Forgets the primary files of `volume` (its copy here is deleted).
pub(crate) fn remove_files(dir: &Path, volume: &str) {
    for extension in ["epoch", "run"] {
        let _ = fs::remove_file(dir.join("replicas").join(format!("{volume}.{extension}")));
    }
}

fn replace(path: &Path, text: &str) -> io::Result<()> {
    let dir = path.parent().expect("under replicas/");
    fs::create_dir_all(dir)?;
    let mut beside = path.as_os_str().to_owned();
    beside.push(".new");
    let beside = PathBuf::from(beside);
    let mut file = fs::File::create(&beside)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    fs::rename(&beside, path)?;
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weft-run-{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_run_goes_on_across_restarts_only_from_the_nodes_own_epochs() {
        let dir = dir("goes-on");
        let mut file = RunFile::load(&dir, "db1", "aa01");
        assert_eq!(file.first_epoch, 0);
        assert!(!file.begin(3, true).unwrap(), "no run known: a new one");
        file.add_full("n2").unwrap();
        let mut again = RunFile::load(&dir, "db1", "aa01");
        assert_eq!(again.first_epoch, 3);
        assert_eq!(again.full, vec!["n2".to_string()]);
        assert!(again.begin(4, true).unwrap(), "its own next epoch");
        let path = dir.join("replicas/db1.run");
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "volume aa01\nrun 3\nfull n2\n"
        );
        again.all_in_sync().unwrap();
        assert!(!RunFile::load(&dir, "db1", "aa01").begin(7, false).unwrap());
        assert_eq!(fs::read_to_string(&path).unwrap(), "volume aa01\nrun 7\n");
        write_served_epoch(&dir, "db1", 7).unwrap();
        let served = crate::intents::served_epoch(&dir.join("replicas/db1.epoch"));
        assert_eq!(served, 7);
        remove_files(&dir, "db1");
        assert!(!path.exists());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_run_of_another_volume_of_that_name_is_not_taken() {
        let dir = dir("other");
        RunFile::load(&dir, "db1", "aa01").begin(5, false).unwrap();
        let mut file = RunFile::load(&dir, "db1", "bb02");
        assert_eq!(file.first_epoch, 0);
        assert!(!file.begin(6, true).unwrap());
        assert_eq!(file.first_epoch, 6);
        let _ = fs::remove_dir_all(&dir);
    }
}
