//! An asynchronous I/O job on one namespace, for engines that submit and
//! reap separately (fio's external I/O engine, `crates/weft-fio`): each I/O
//! goes in with the caller's token and comes back, in any order, with its
//! result and a read's data. One controller, one I/O queue, one thread.
//!
//! The target is named `nvme-tcp://HOST[:PORT]/NQN`, optionally followed by
//! `?nsid=N` (without it, the subsystem's lowest active namespace: a weft
//! volume's only one). The host NQN is `$WEFT_HOSTNQN` if set, else the
//! Linux host's own (`/etc/nvme/hostnqn`, as nvme-cli sends it) when the file
//! exists, so a target's host allow-list applies as it would to the kernel's
//! initiator; else a new one per connection.
//!
//! A connection that fails (the target stops answering for [`IO_TIMEOUT`],
//! its keep-alive fails, the connection breaks) fails every I/O in flight
//! ([`Outcome::Lost`]) and every one after.
//!
//! What this does not do: retry, reconnect, or split an I/O larger than the
//! target's transfer size (the caller gets an error naming the limit).

use crate::{read_write, set_cdw, sqe, ConnectOptions, Controller, InitiatorError, Queue};
use crate::{Namespace, TargetUrl, UrlError};
use thiserror::Error;
use weft_proto::command::io_opcode;
use weft_proto::host::{DataTransfer, SubmitError};
use weft_proto::status::Status;

/// Where the Linux host keeps its NQN.
const HOST_NQN_FILE: &str = "/etc/nvme/hostnqn";
/// The environment variable that names the host NQN instead.
const HOST_NQN_VARIABLE: &str = "WEFT_HOSTNQN";
/// Commands a job keeps in flight at most (more are answered [`Submitted::Busy`]).
const QUEUE_ENTRIES: u16 = 128;
/// A target that sends nothing this long while I/O waits has failed (the
/// Linux host's default I/O timeout).
pub const IO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// One I/O of a job.
#[derive(Debug, Clone, Copy)]
pub enum JobIo<'a> {
    /// Read `len` bytes at byte `offset`.
    Read {
        /// Byte offset.
        offset: u64,
        /// Length in bytes.
        len: u32,
    },
    /// Write `data` at byte `offset`.
    Write {
        /// Byte offset.
        offset: u64,
        /// The data (copied at submission).
        data: &'a [u8],
    },
    /// Deallocate `len` bytes at byte `offset` (Dataset Management).
    Trim {
        /// Byte offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// Flush: everything completed before is durable.
    Flush,
}

/// How an I/O ended.
#[derive(Debug, Clone, Copy)]
pub enum Outcome<'a> {
    /// Done; a read's data (empty for other I/O).
    Done(&'a [u8]),
    /// The target failed it.
    Failed(Status),
    /// The connection failed with it in flight (the target may or may not have done it).
    Lost,
}

/// Whether an I/O was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    /// In flight: its completion comes from [`Job::reap`].
    Queued,
    /// The queue is full: reap first.
    Busy,
}

/// Why a job cannot start or an I/O cannot be sent.
#[derive(Debug, Error)]
pub enum JobError {
    /// The name is not a target.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// `?nsid=` is not a number.
    #[error("\"{0}\" is not a namespace ID (expected ?nsid=N after the NQN, N from 1)")]
    Nsid(String),
    /// The subsystem has no namespace.
    #[error("{nqn} has no active namespace")]
    NoNamespace {
        /// The subsystem.
        nqn: String,
    },
    /// The initiator failed (connect, identify, the connection).
    #[error(transparent)]
    Initiator(#[from] InitiatorError),
    /// An I/O not in whole blocks.
    #[error("an I/O at byte {offset} of {len} bytes is not in whole {block_size}-byte blocks (set bs and offsets to multiples of it)")]
    Misaligned {
        /// Byte offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// The namespace's block size.
        block_size: u32,
    },
    /// An I/O larger than one command may move.
    #[error(
        "an I/O of {len} bytes is larger than the target's transfer size of {max} bytes (lower bs)"
    )]
    TooLarge {
        /// Length in bytes.
        len: u64,
        /// The target's largest transfer.
        max: u32,
    },
    /// The connection failed earlier.
    #[error("the connection to the target failed: {0}")]
    Broken(String),
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    token: u64,
    /// A read's length (its data is handed over at completion).
    read_len: Option<u32>,
}

/// A connected job.
#[derive(Debug)]
pub struct Job {
    /// Kept for its keep-alive (and the association of `queue`).
    controller: Controller,
    queue: Queue,
    namespace: Namespace,
    transfer_bytes_max: u32,
    /// By CID.
    pending: Vec<Option<Pending>>,
    /// Why the connection failed, once it has.
    broken: Option<String>,
}

impl Job {
    /// Connects to the namespace `target` names, with one I/O queue.
    pub fn open(target: &str) -> Result<Job, JobError> {
        let (controller, namespace) = connect(target, ConnectOptions::default())?;
        let queue = controller.open_io_queue(1)?;
        queue.set_io_timeout(Some(IO_TIMEOUT))?;
        Ok(Job {
            transfer_bytes_max: controller.info.transfer_bytes_max,
            controller,
            queue,
            namespace,
            pending: vec![None; usize::from(QUEUE_ENTRIES)],
            broken: None,
        })
    }

    /// The namespace's size in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        capacity_bytes(&self.namespace)
    }

    /// Queues `io` (sent by [`Job::transmit`] or [`Job::reap`]).
    pub fn submit(&mut self, token: u64, io: JobIo<'_>) -> Result<Submitted, JobError> {
        if let Some(why) = &self.broken {
            return Err(JobError::Broken(why.clone()));
        }
        let Some(cid) = self.queue.free_cid() else {
            return Ok(Submitted::Busy);
        };
        let nsid = self.namespace.nsid.0;
        let (command, transfer, read_len) = match io {
            JobIo::Read { offset, len } => {
                let blocks = self.blocks(offset, u64::from(len))?;
                let command = read_write(io_opcode::READ, nsid, self.lba(offset), blocks);
                (command, DataTransfer::FromController(len), Some(len))
            }
            JobIo::Write { offset, data } => {
                let blocks = self.blocks(offset, data.len() as u64)?;
                self.queue.buffer(cid)[..data.len()].copy_from_slice(data);
                let command = read_write(io_opcode::WRITE, nsid, self.lba(offset), blocks);
                (command, DataTransfer::ToController(data.len() as u32), None)
            }
            JobIo::Trim { offset, len } => {
                let blocks = self.trim_blocks(offset, len)?;
                let slba = self.lba(offset);
                // Figure "Dataset Management - Range Definition": attributes, length, starting LBA.
                let range = &mut self.queue.buffer(cid)[..16];
                range[..4].fill(0);
                range[4..8].copy_from_slice(&blocks.to_le_bytes());
                range[8..16].copy_from_slice(&slba.to_le_bytes());
                let mut command = sqe(io_opcode::DATASET_MANAGEMENT, nsid);
                set_cdw(&mut command, 11, 1 << 2); // AD: deallocate; NR 0 = one range
                (command, DataTransfer::ToController(16), None)
            }
            JobIo::Flush => (sqe(io_opcode::FLUSH, nsid), DataTransfer::None, None),
        };
        match self.queue.submit(command, transfer) {
            Ok(submitted) => {
                debug_assert_eq!(submitted.0, cid, "the CID next_cid announced");
                self.pending[usize::from(cid)] = Some(Pending { token, read_len });
                Ok(Submitted::Queued)
            }
            Err(SubmitError::QueueFull) => Ok(Submitted::Busy),
            Err(error) => Err(JobError::Broken(self.fail(&error.to_string()))),
        }
    }

    /// Sends what was submitted.
    pub fn transmit(&mut self) -> Result<(), JobError> {
        if let Some(why) = &self.broken {
            return Err(JobError::Broken(why.clone()));
        }
        let sent = self.queue.transmit();
        sent.map_err(|error| JobError::Broken(self.fail(&error.to_string())))
    }

    /// Sends what was submitted and hands over between `min` and `max`
    /// completions to `each` (token, outcome); blocks until `min` are in
    /// (fewer if fewer are in flight). Once the connection fails, every
    /// I/O in flight comes back [`Outcome::Lost`].
    pub fn reap(
        &mut self,
        min: usize,
        max: usize,
        mut each: impl FnMut(u64, Outcome<'_>),
    ) -> usize {
        if let Err(error) = self.queue.transmit() {
            self.fail(&error.to_string());
        }
        let mut reaped = 0;
        while reaped < max {
            if self.broken.is_some() {
                return reaped + self.lose_pending(max - reaped, &mut each);
            }
            let completion = match self.queue.poll_completion() {
                Some(completion) => completion,
                None if reaped < min && self.queue.outstanding() > 0 => match self.wait() {
                    Ok(completion) => completion,
                    Err(why) => {
                        self.fail(&why);
                        continue;
                    }
                },
                None => break,
            };
            let cid = completion.cid.0;
            let Some(pending) = self
                .pending
                .get_mut(usize::from(cid))
                .and_then(Option::take)
            else {
                continue; // not one of ours (the queue admits no other)
            };
            let outcome = match pending.read_len {
                _ if !completion.status.is_success() => Outcome::Failed(completion.status),
                // A read answered with less than it asked for: the rest of
                // the buffer holds an older command's bytes.
                Some(len) if completion.received_bytes != len => {
                    Outcome::Failed(Status::DATA_TRANSFER_ERROR)
                }
                Some(len) => Outcome::Done(&self.queue.buffer(cid)[..len as usize]),
                None => Outcome::Done(&[]),
            };
            each(pending.token, outcome);
            reaped += 1;
        }
        reaped
    }

    /// The next completion, unless the connection or its keep-alive failed.
    fn wait(&mut self) -> Result<weft_proto::host::HostCompletion, String> {
        if let Some(why) = self.controller.keep_alive_failure() {
            return Err(why);
        }
        self.queue.wait().map_err(|error| error.to_string())
    }

    /// Notes the connection failed (the first reason stays); returns it.
    fn fail(&mut self, why: &str) -> String {
        self.broken.get_or_insert_with(|| why.to_string()).clone()
    }

    /// Hands over up to `max` I/Os in flight as lost.
    fn lose_pending(&mut self, max: usize, each: &mut impl FnMut(u64, Outcome<'_>)) -> usize {
        let mut lost = 0;
        for pending in self.pending.iter_mut() {
            if lost == max {
                break;
            }
            if let Some(pending) = pending.take() {
                each(pending.token, Outcome::Lost);
                lost += 1;
            }
        }
        lost
    }

    fn block_bytes(&self) -> u64 {
        u64::from(self.namespace.block_size)
    }

    fn lba(&self, offset: u64) -> u64 {
        offset / self.block_bytes()
    }

    fn aligned(&self, offset: u64, len: u64) -> Result<(), JobError> {
        let block = self.block_bytes();
        if len == 0 || !offset.is_multiple_of(block) || !len.is_multiple_of(block) {
            return Err(JobError::Misaligned {
                offset,
                len,
                block_size: self.namespace.block_size,
            });
        }
        Ok(())
    }

    /// The blocks of a read or write (at most one command's transfer).
    fn blocks(&self, offset: u64, len: u64) -> Result<u32, JobError> {
        self.aligned(offset, len)?;
        if len > u64::from(self.transfer_bytes_max) {
            return Err(JobError::TooLarge {
                len,
                max: self.transfer_bytes_max,
            });
        }
        Ok((len / self.block_bytes()) as u32)
    }

    /// The blocks of a trim (one range: a 32-bit block count).
    fn trim_blocks(&self, offset: u64, len: u64) -> Result<u32, JobError> {
        self.aligned(offset, len)?;
        let blocks = len / self.block_bytes();
        u32::try_from(blocks).map_err(|_| JobError::TooLarge { len, max: u32::MAX })
    }
}

/// The size in bytes of the namespace `target` names (connects, asks, disconnects).
pub fn probe_capacity_bytes(target: &str) -> Result<u64, JobError> {
    let options = ConnectOptions {
        keep_alive: None,
        ..ConnectOptions::default()
    };
    let (_controller, namespace) = connect(target, options)?;
    Ok(capacity_bytes(&namespace))
}

fn capacity_bytes(namespace: &Namespace) -> u64 {
    namespace.blocks * u64::from(namespace.block_size)
}

fn connect(target: &str, options: ConnectOptions) -> Result<(Controller, Namespace), JobError> {
    let (url_text, nsid) = split_nsid(target)?;
    let url = TargetUrl::parse(url_text)?;
    let options = with_host_nqn(options);
    let mut controller = Controller::connect(&url, options, 1)?;
    let namespace = match nsid {
        Some(nsid) => controller.namespace(nsid)?,
        None => controller
            .namespaces()?
            .into_iter()
            .min_by_key(|namespace| namespace.nsid.0)
            .ok_or(JobError::NoNamespace { nqn: url.nqn })?,
    };
    Ok((controller, namespace))
}

/// `URL?nsid=N` into the URL and N.
fn split_nsid(target: &str) -> Result<(&str, Option<u32>), JobError> {
    let Some((url, nsid)) = target.split_once("?nsid=") else {
        return Ok((target, None));
    };
    match nsid.parse::<u32>() {
        Ok(nsid) if nsid > 0 => Ok((url, Some(nsid))),
        _ => Err(JobError::Nsid(nsid.to_string())),
    }
}

fn with_host_nqn(options: ConnectOptions) -> ConnectOptions {
    let configured = std::env::var(HOST_NQN_VARIABLE)
        .ok()
        .or_else(|| std::fs::read_to_string(HOST_NQN_FILE).ok())
        .map(|text| text.trim().to_string())
        .filter(|nqn| !nqn.is_empty());
    ConnectOptions {
        host_nqn: configured.unwrap_or(options.host_nqn),
        io_queue_entries: QUEUE_ENTRIES,
        ..options
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_may_name_its_namespace() {
        let url = "nvme-tcp://127.0.0.1:4420/nqn.2026-11.io.weft:vol:db1";
        assert_eq!(split_nsid(url).unwrap(), (url, None));
        let with = format!("{url}?nsid=3");
        assert_eq!(split_nsid(&with).unwrap(), (url, Some(3)));
        for bad in ["0", "x", "", "-1"] {
            let error = split_nsid(&format!("{url}?nsid={bad}")).unwrap_err();
            assert!(error.to_string().contains("?nsid=N"), "{error}");
        }
    }
}
