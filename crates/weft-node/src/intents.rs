//! The write intents of this node's replicas, persisted (see
//! `weft_proto::intent` for what an intent is and who reads it).
//!
//! One small text file per replicated volume under the node's data
//! directory (`replicas/<volume>.intent`), replaced whole (written beside,
//! synced, renamed, directory synced): a region is on disk before the data
//! plane may write to it. Cleared regions are written lazily, at most once a
//! second, by the manager thread. The file also names the boot (the
//! kernel's boot id) it was last written under: a replica found under
//! another boot may have lost unflushed writes anywhere, so it reports
//! itself unclean (a full rebuild) until a primary writes to it. A clean
//! shutdown writes `boot shutdown` instead, after the last write was
//! flushed: found at the next start, under any boot, the replica is clean,
//! and the file is rewritten under the new boot before anything is served.
//!
//! What this does not do: decide what to mark (the data plane and the
//! primary's replicator do) or read the intent of another node.

use crate::admin_error::AdminError;
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::ops::{Range, RangeInclusive};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use weft_proto::intent::WriteIntent;
use weft_replication::RegionSet;

/// log2 of a region's size: 1 MiB, the pools' allocation unit.
pub(crate) const REGION_SHIFT: u32 = 20;

/// The largest replicated volume: its write intent numbers regions with
/// 32 bits (4 PiB in 1 MiB regions).
pub(crate) const REPLICATED_SIZE_MAX_BYTES: u64 = (u32::MAX as u64) << REGION_SHIFT;

/// Refuses a replicated volume larger than [`REPLICATED_SIZE_MAX_BYTES`].
pub(crate) fn check_replicated_size(volume: &str, size_bytes: u64) -> Result<(), AdminError> {
    if size_bytes > REPLICATED_SIZE_MAX_BYTES {
        return Err(AdminError::Invalid(format!(
            "volume {volume}: {size_bytes} bytes is more than a replicated volume can hold \
             ({REPLICATED_SIZE_MAX_BYTES} bytes); give a smaller size"
        )));
    }
    Ok(())
}

/// How often cleared regions are written, at most.
pub(crate) const PERSIST_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The boot a file names after a clean shutdown: valid under any boot.
const SHUT_DOWN: &str = "shutdown";

/// The boot a new replica's file names when it may lack writes: none.
const NEW_REPLICA: &str = "new-replica";

/// A replica's write intent and its file.
#[derive(Debug)]
pub(crate) struct IntentFile {
    path: PathBuf,
    intent: Arc<WriteIntent>,
    /// The regions the file holds (its rewrites serialised under it).
    persisted: Mutex<Vec<u32>>,
    /// The file records a clean shutdown: it is not written again.
    shut_down: AtomicBool,
    /// This node's kept regions as primary (`weft_replication::Run::kept`),
    /// written with the intent so that a region cleared from the intent
    /// while kept is never on disk in neither.
    kept: Mutex<RegionSet>,
    /// The kept regions changed since the file was last written.
    kept_changed: AtomicBool,
}

impl IntentFile {
    /// The intent of `volume` (`size_bytes`) as its file under `dir` holds
    /// it. A missing file is a new replica: nothing marked, clean. A file
    /// that cannot be read marks everything, unclean.
    pub(crate) fn open(dir: &Path, volume: &str, size_bytes: u64) -> IntentFile {
        let path = dir.join("replicas").join(format!("{volume}.intent"));
        let every_region = || (0..size_bytes.div_ceil(1 << REGION_SHIFT) as u32).collect();
        let mut shut_down = false;
        let regions = size_bytes.div_ceil(1 << REGION_SHIFT) as u32;
        let mut kept = RegionSet::new(regions);
        let (marked, unclean) = match fs::read_to_string(&path) {
            Ok(text) => match parse(&text) {
                Some((boot, marked, kept_ranges)) => {
                    shut_down = boot == SHUT_DOWN;
                    for region in kept_ranges.into_iter().flatten().filter(|&r| r < regions) {
                        kept.insert(region);
                    }
                    (marked, !shut_down && boot != current_boot())
                }
                None => {
                    log::warn!("{}: unreadable, every region is marked", path.display());
                    (every_region(), true)
                }
            },
            Err(error) if error.kind() == io::ErrorKind::NotFound => (Vec::new(), false),
            Err(error) => {
                log::warn!("{}: {error}; every region is marked", path.display());
                (every_region(), true)
            }
        };
        // A crash from now on must not pass for the clean shutdown.
        let rewritten = !shut_down || write_file(&path, &current_boot(), &marked, &kept).is_ok();
        if !rewritten {
            log::warn!(
                "{}: cannot be written; the replica counts as unclean",
                path.display()
            );
        }
        let intent = WriteIntent::new(size_bytes, REGION_SHIFT, marked, unclean || !rewritten);
        let persisted = intent.marked();
        IntentFile {
            path,
            intent: Arc::new(intent),
            persisted: Mutex::new(persisted),
            shut_down: AtomicBool::new(false),
            kept: Mutex::new(kept),
            kept_changed: AtomicBool::new(false),
        }
    }

    /// The same file for the replica grown to `size_bytes`: its marked
    /// regions and standing kept, more regions to mark. The data plane
    /// checks the new intent once the exports are updated.
    pub(crate) fn resized(&self, size_bytes: u64) -> IntentFile {
        let persisted = self
            .persisted
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let intent = WriteIntent::new(
            size_bytes,
            REGION_SHIFT,
            self.intent.marked(),
            self.intent.unclean(),
        );
        let mut kept = RegionSet::new(intent.regions());
        for region in self.kept_regions().iter().filter(|&r| r < intent.regions()) {
            kept.insert(region);
        }
        IntentFile {
            path: self.path.clone(),
            intent: Arc::new(intent),
            persisted: Mutex::new(persisted.clone()),
            shut_down: AtomicBool::new(self.shut_down.load(Ordering::Acquire)),
            kept: Mutex::new(kept),
            kept_changed: AtomicBool::new(self.kept_changed.load(Ordering::Acquire)),
        }
    }

    /// The kept regions (as last set; see `kept`).
    pub(crate) fn kept_regions(&self) -> RegionSet {
        self.kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Adds `region` to the kept regions. One the file holds marked is
    /// written with the next write of the file, which is no later than its
    /// clearing (the caller keeps it first); any other (a region resynced
    /// from another copy's intent) is written now: the replicas are told to
    /// clean it next, and then no intent holds it.
    pub(crate) fn keep(&self, region: u32) -> io::Result<()> {
        let mut persisted = self
            .persisted
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let added = {
            let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
            region < kept.capacity() && kept.insert(region)
        };
        if !added {
            return Ok(());
        }
        self.kept_changed.store(true, Ordering::Release);
        if persisted.binary_search(&region).is_ok() || self.shut_down.load(Ordering::Acquire) {
            return Ok(());
        }
        let marked = self.intent.marked();
        self.write(&marked)?;
        *persisted = marked;
        Ok(())
    }

    /// Empties the kept regions (written lazily: more kept regions than
    /// needed only cost a larger rebuild).
    pub(crate) fn forget_kept(&self) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if !kept.is_empty() {
            *kept = RegionSet::new(kept.capacity());
            self.kept_changed.store(true, Ordering::Release);
        }
    }

    /// After the last write was flushed (a clean shutdown): records that
    /// the replica holds every write it acknowledged, under any boot.
    /// False if it is unclean (it stays so).
    pub(crate) fn mark_shut_down(&self) -> io::Result<bool> {
        let persisted = self
            .persisted
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.intent.unclean() {
            return Ok(false);
        }
        write_file(&self.path, SHUT_DOWN, &persisted, &self.kept_regions())?;
        self.shut_down.store(true, Ordering::Release);
        Ok(true)
    }

    /// The live intent the data plane checks.
    pub(crate) fn intent(&self) -> &Arc<WriteIntent> {
        &self.intent
    }

    /// Marks `regions` durably (and the replica clean: it is written under
    /// this boot), then in the live intent. Regions the file still holds
    /// (cleared since, not yet persisted cleared) cost no write.
    pub(crate) fn mark(&self, regions: Range<u32>) -> io::Result<()> {
        let mut persisted = self
            .persisted
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let on_disk = regions.clone().all(|r| persisted.binary_search(&r).is_ok());
        if !on_disk || self.intent.unclean() {
            let mut marked = self.intent.marked();
            marked.extend(regions.clone().filter(|r| !self.intent.is_marked(*r)));
            marked.sort_unstable();
            marked.dedup();
            self.write(&marked)?;
            *persisted = marked;
        }
        self.intent.mark(regions);
        self.intent.set_clean();
        Ok(())
    }

    /// Writes the file again if regions were cleared since the last time
    /// (never after the clean shutdown was recorded: that stays).
    pub(crate) fn persist_cleared(&self) -> io::Result<()> {
        let cleared = self.intent.take_cleared();
        if !self.kept_changed.swap(false, Ordering::AcqRel) && !cleared {
            return Ok(());
        }
        let mut persisted = self
            .persisted
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.shut_down.load(Ordering::Acquire) {
            return Ok(());
        }
        // Unclean stays unclean: the file keeps its old boot until a write.
        if self.intent.unclean() {
            return Ok(());
        }
        let marked = self.intent.marked();
        self.write(&marked)?;
        *persisted = marked;
        Ok(())
    }

    /// Writes `marked` (read before this call) and the kept regions as they
    /// are now: a region the primary kept before it cleared it is in one.
    fn write(&self, marked: &[u32]) -> io::Result<()> {
        write_file(&self.path, &current_boot(), marked, &self.kept_regions())
    }

    /// Forgets the file (the replica is deleted).
    pub(crate) fn remove(&self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// The write intent of this node's replica of `volume`, loaded from `dir`
/// at first use (none outside a cluster: no replicas there).
pub(crate) fn intent_of(
    intents: &mut BTreeMap<String, Arc<IntentFile>>,
    dir: Option<&Path>,
    volume: &str,
    size_bytes: u64,
) -> Option<Arc<WriteIntent>> {
    let dir = dir?;
    let file = intents
        .entry(volume.to_string())
        .or_insert_with(|| Arc::new(IntentFile::open(dir, volume, size_bytes)));
    if u64::from(file.intent().regions()) < size_bytes.div_ceil(1 << REGION_SHIFT) {
        // The copy grew (its primary asked, or its node caught up with the
        // record): every byte of it stays covered.
        *file = Arc::new(file.resized(size_bytes));
    }
    Some(Arc::clone(file.intent()))
}

/// A replica of this node that may have lost writes in a power loss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UncleanReplica {
    /// Its volume.
    pub volume: String,
    /// The last epoch this node served the volume as primary (0: never).
    pub served_epoch: u64,
}

/// The replicas under `data_dir` whose write intent was last written under
/// another boot of the machine, without a clean shutdown since: a power
/// loss (or a crash of the machine) may have lost their unflushed writes. The node takes
/// them out of the in-sync set before it joins its cluster again.
pub fn replicas_after_power_loss(data_dir: &Path) -> Vec<UncleanReplica> {
    let Ok(entries) = fs::read_dir(data_dir.join("replicas")) else {
        return Vec::new();
    };
    let boot = current_boot();
    let mut unclean = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(volume) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".intent"))
        else {
            continue;
        };
        let written = fs::read_to_string(&path).ok();
        let same_boot = written
            .as_deref()
            .and_then(parse)
            .is_some_and(|(written_boot, _, _)| written_boot == boot || written_boot == SHUT_DOWN);
        if !same_boot {
            unclean.push(UncleanReplica {
                volume: volume.to_string(),
                served_epoch: served_epoch(
                    &data_dir.join("replicas").join(format!("{volume}.epoch")),
                ),
            });
        }
    }
    unclean.sort_by(|a, b| a.volume.cmp(&b.volume));
    unclean
}

/// Writes the intent file of a replica just created for a member that may
/// have missed writes (added to the volume, or whose copy was lost): it
/// names no boot this machine has, so the replica reports itself unclean
/// and is rebuilt in full, whatever a primary thinks it copied before.
pub(crate) fn create_unclean(dir: &Path, volume: &str) -> io::Result<()> {
    let path = dir.join("replicas").join(format!("{volume}.intent"));
    write_file(&path, NEW_REPLICA, &[], &RegionSet::new(0))
}

/// Replaces the intent file at `path` whole (written beside, synced,
/// renamed, directory synced): written under `boot`, holding `marked`.
fn write_file(path: &Path, boot: &str, marked: &[u32], kept: &RegionSet) -> io::Result<()> {
    let dir = path.parent().expect("under replicas/");
    fs::create_dir_all(dir)?;
    let list: Vec<String> = marked.iter().map(u32::to_string).collect();
    let mut text = format!("boot {boot}\nmarked {}\n", list.join(","));
    if !kept.is_empty() {
        text.push_str(&format!("kept {}\n", ranges(kept)));
    }
    let beside = path.with_extension("intent.new");
    let mut file = fs::File::create(&beside)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    fs::rename(&beside, path)?;
    fs::File::open(dir)?.sync_all()
}

/// The last epoch this node served a volume in, from its file (0: none).
pub(crate) fn served_epoch(path: &Path) -> u64 {
    fs::read_to_string(path)
        .ok()
        .and_then(|text| text.lines().next()?.trim().parse().ok())
        .unwrap_or(0)
}

/// The boot, the marked regions and the kept ranges a file holds.
fn parse(text: &str) -> Option<(String, Vec<u32>, Vec<RangeInclusive<u32>>)> {
    let mut lines = text.lines();
    let boot = lines.next()?.strip_prefix("boot ")?.to_string();
    let list = lines.next()?.strip_prefix("marked ")?;
    let marked = list
        .split(',')
        .filter(|item| !item.is_empty())
        .map(|item| item.parse().ok())
        .collect::<Option<Vec<u32>>>()?;
    let kept = match lines.next() {
        Some(line) => parse_ranges(line.strip_prefix("kept ")?)?,
        None => Vec::new(),
    };
    Some((boot, marked, kept))
}

/// `set` as ranges: `0-3,7,9-12`.
fn ranges(set: &RegionSet) -> String {
    let mut items: Vec<String> = Vec::new();
    let mut run: Option<(u32, u32)> = None;
    let mut close = |(first, last): (u32, u32)| {
        items.push(if first == last {
            first.to_string()
        } else {
            format!("{first}-{last}")
        });
    };
    for region in set.iter() {
        run = match run {
            Some((first, last)) if last + 1 == region => Some((first, region)),
            Some(done) => {
                close(done);
                Some((region, region))
            }
            None => Some((region, region)),
        };
    }
    if let Some(done) = run {
        close(done);
    }
    items.join(",")
}

fn parse_ranges(text: &str) -> Option<Vec<RangeInclusive<u32>>> {
    text.split(',')
        .filter(|item| !item.is_empty())
        .map(|item| match item.split_once('-') {
            Some((first, last)) => Some(first.parse().ok()?..=last.parse().ok()?),
            None => item.parse().ok().map(|region| region..=region),
        })
        .collect()
}

fn current_boot() -> String {
    fs::read_to_string(BOOT_ID)
        .map(|id| id.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weft-intents-{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn marked_regions_survive_a_restart_and_cleared_ones_are_written_lazily() {
        let dir = dir("restart");
        let file = IntentFile::open(&dir, "db1", 8 << 20);
        assert!(file.intent().marked().is_empty() && !file.intent().unclean());
        file.mark(2..4).unwrap();
        file.mark(3..5).unwrap();
        assert_eq!(file.intent().marked(), vec![2, 3, 4]);
        let again = IntentFile::open(&dir, "db1", 8 << 20);
        assert_eq!(again.intent().marked(), vec![2, 3, 4]);
        assert!(!again.intent().unclean(), "same boot");
        again.intent().clean([3]);
        again.persist_cleared().unwrap();
        let third = IntentFile::open(&dir, "db1", 8 << 20);
        assert_eq!(third.intent().marked(), vec![2, 4]);
        third.remove();
        assert!(IntentFile::open(&dir, "db1", 8 << 20)
            .intent()
            .marked()
            .is_empty());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn replicas_written_under_another_boot_are_found_with_their_served_epoch() {
        let dir = dir("power");
        let file = IntentFile::open(&dir, "same", 4 << 20);
        file.mark(0..1).unwrap();
        fs::write(dir.join("replicas/old.intent"), "boot other\nmarked 1\n").unwrap();
        fs::write(dir.join("replicas/old.epoch"), "7\n").unwrap();
        assert_eq!(
            replicas_after_power_loss(&dir),
            vec![UncleanReplica {
                volume: "old".into(),
                served_epoch: 7
            }]
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_from_another_boot_is_unclean_until_a_write_and_a_bad_one_marks_everything() {
        let dir = dir("boot");
        fs::create_dir_all(dir.join("replicas")).unwrap();
        fs::write(dir.join("replicas/db1.intent"), "boot other\nmarked 1\n").unwrap();
        let file = IntentFile::open(&dir, "db1", 4 << 20);
        assert!(file.intent().unclean());
        assert!(!file.intent().covers(1 << 20, 4096));
        file.mark(1..2).unwrap();
        assert!(file.intent().covers(1 << 20, 4096), "clean once written");
        assert!(!IntentFile::open(&dir, "db1", 4 << 20).intent().unclean());
        fs::write(dir.join("replicas/db1.intent"), "garbage").unwrap();
        let bad = IntentFile::open(&dir, "db1", 4 << 20);
        assert_eq!(bad.intent().marked(), vec![0, 1, 2, 3]);
        assert!(bad.intent().unclean());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_clean_shutdown_is_clean_under_any_boot_until_the_node_starts_again() {
        let dir = dir("shutdown");
        let file = IntentFile::open(&dir, "db1", 4 << 20);
        file.mark(1..2).unwrap();
        assert!(file.mark_shut_down().unwrap());
        let path = dir.join("replicas/db1.intent");
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "boot shutdown\nmarked 1\n"
        );
        assert!(
            replicas_after_power_loss(&dir).is_empty(),
            "clean, whatever the boot"
        );
        let again = IntentFile::open(&dir, "db1", 4 << 20);
        assert!(!again.intent().unclean());
        assert_eq!(again.intent().marked(), vec![1]);
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with(&format!("boot {}\n", current_boot())),
            "{text}"
        );
        // An unclean replica stays unclean through a clean shutdown.
        fs::write(&path, "boot other\nmarked 1\n").unwrap();
        let unclean = IntentFile::open(&dir, "db1", 4 << 20);
        assert!(!unclean.mark_shut_down().unwrap());
        assert_eq!(replicas_after_power_loss(&dir).len(), 1);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn kept_regions_are_written_with_the_intent_and_survive_a_restart() {
        let dir = dir("kept");
        let file = IntentFile::open(&dir, "db1", 16 << 20);
        file.mark(2..3).unwrap();
        let path = dir.join("replicas/db1.intent");
        file.keep(2).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.ends_with("marked 2\n"),
            "marked on disk: kept lazily: {text}"
        );
        file.keep(9).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.ends_with("marked 2\nkept 2,9\n"),
            "unmarked: kept at once: {text}"
        );
        for region in [3, 4, 5] {
            file.keep(region).unwrap();
        }
        file.intent().clean([2]);
        file.persist_cleared().unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("marked \nkept 2-5,9\n"), "{text}");
        let again = IntentFile::open(&dir, "db1", 16 << 20);
        assert_eq!(
            again.kept_regions().iter().collect::<Vec<_>>(),
            [2, 3, 4, 5, 9]
        );
        again.mark(7..8).unwrap();
        assert!(fs::read_to_string(&path)
            .unwrap()
            .ends_with("marked 7\nkept 2-5,9\n"));
        again.forget_kept();
        again.persist_cleared().unwrap();
        assert!(fs::read_to_string(&path).unwrap().ends_with("marked 7\n"));
        let _ = fs::remove_dir_all(&dir);
    }
}
