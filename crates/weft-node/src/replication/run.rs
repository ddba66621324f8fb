//! A volume's primary file on this node (`replicas/<volume>.epoch`): the
//! last epoch this node served the volume in as primary, and its run as
//! primary (`weft_replication::Run`): the epoch the run began in and the
//! members found to need a full rebuild within it, by node name (the core
//! numbers members by their place in the record, which changes with them).
//! Replaced whole (written beside, synced, renamed, directory synced).
//!
//! What this does not do: the run's kept regions (the intent file holds
//! them, so that a region leaves the intent and enters them at once).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The file and what it holds.
#[derive(Debug)]
pub(crate) struct RunFile {
    path: PathBuf,
    /// The last epoch served (0: never).
    pub(crate) served: u64,
    /// The epoch the run began in (0: not known, as in a file of a version
    /// that did not write it: the next run is a new one).
    pub(crate) first_epoch: u64,
    /// Members to rebuild in full.
    pub(crate) full: Vec<String>,
}

impl RunFile {
    /// The file at `path`, as written (nothing served if missing or unreadable).
    pub(crate) fn load(path: &Path) -> RunFile {
        let text = fs::read_to_string(path).unwrap_or_default();
        let mut lines = text.lines();
        let served = lines
            .next()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(0);
        let mut file = RunFile {
            path: path.to_path_buf(),
            served,
            first_epoch: 0,
            full: Vec::new(),
        };
        for line in lines {
            if let Some(epoch) = line.strip_prefix("run ") {
                file.first_epoch = epoch.trim().parse().unwrap_or(0);
            } else if let Some(nodes) = line.strip_prefix("full ") {
                file.full = nodes
                    .split(',')
                    .filter(|n| !n.is_empty())
                    .map(String::from)
                    .collect();
            }
        }
        file
    }

    /// Serves `epoch` from now on (written before anything is fenced);
    /// `continued`: taken from this node's own record of the epoch before
    /// (the run goes on, if its beginning is known), else a new run. Whether
    /// the run went on.
    pub(crate) fn serve(&mut self, epoch: u64, continued: bool) -> io::Result<bool> {
        let goes_on = continued && self.first_epoch != 0 && self.first_epoch <= epoch;
        if !goes_on {
            self.first_epoch = epoch;
            self.full.clear();
        }
        self.served = epoch;
        self.write()?;
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
        let dir = self.path.parent().expect("under replicas/");
        fs::create_dir_all(dir)?;
        let mut text = format!("{}\nrun {}\n", self.served, self.first_epoch);
        if !self.full.is_empty() {
            text.push_str(&format!("full {}\n", self.full.join(",")));
        }
        let beside = self.path.with_extension("epoch.new");
        let mut file = fs::File::create(&beside)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        fs::rename(&beside, &self.path)?;
        fs::File::open(dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weft-run-{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir.join("replicas").join("db1.epoch")
    }

    #[test]
    fn a_run_goes_on_across_restarts_only_from_the_nodes_own_epochs() {
        let path = path("goes-on");
        let mut file = RunFile::load(&path);
        assert_eq!((file.served, file.first_epoch), (0, 0));
        assert!(!file.serve(3, false).unwrap(), "promoted: a new run");
        file.add_full("n2").unwrap();
        let mut again = RunFile::load(&path);
        assert_eq!((again.served, again.first_epoch), (3, 3));
        assert_eq!(again.full, vec!["n2".to_string()]);
        assert!(again.serve(4, true).unwrap(), "its own next epoch");
        assert_eq!(fs::read_to_string(&path).unwrap(), "4\nrun 3\nfull n2\n");
        again.all_in_sync().unwrap();
        assert!(!RunFile::load(&path).serve(7, false).unwrap());
        assert_eq!(fs::read_to_string(&path).unwrap(), "7\nrun 7\n");
        let _ = fs::remove_dir_all(path.parent().unwrap().parent().unwrap());
    }

    #[test]
    fn a_file_without_its_run_begins_a_new_one() {
        let path = path("old");
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, "5\n").unwrap();
        let mut file = RunFile::load(&path);
        assert_eq!(file.served, 5);
        assert!(!file.serve(6, true).unwrap());
        assert_eq!(file.first_epoch, 6);
        let _ = fs::remove_dir_all(path.parent().unwrap().parent().unwrap());
    }
}
