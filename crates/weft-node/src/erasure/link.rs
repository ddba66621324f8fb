//! One member of an erasure-coded volume as its primary reaches it: a
//! thread that owns an NVMe/TCP controller and I/O queue to the member's
//! shard volume (its node's replica subsystem), takes the primary's fences
//! (connecting anew for each), and runs its reads, writes (FUA when asked)
//! and flushes, several at once, answering each as it completes.
//!
//! A connection that fails answers every op on it as failed and is dropped:
//! the primary faults the member and fences it again later, which connects
//! again.
//!
//! What this does not do: retry an op, or decide anything about the member
//! (the primary does).

use super::server::Event;
use crate::link_keys::{LinkKeys, Peer};
use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Duration;
use weft_control::Store;
use weft_ec::{FromMember, MemberControl, MemberOp, ToMember};
use weft_initiator::{read_write, set_cdw, ConnectOptions, Controller, Queue, TargetUrl};
use weft_proto::command::io_opcode;
use weft_proto::fence::FenceToken;
use weft_proto::host::{DataTransfer, HostCompletion};
use weft_proto::intent;
use weft_replication::{Epoch, Token};

/// How long a fence may take to connect to a member that is late.
const CONNECT_PATIENCE: Duration = Duration::from_millis(1500);
const CONNECT_RETRY: Duration = Duration::from_millis(100);
/// A member that does not answer an op within this long has its
/// connection dropped (the primary faults it sooner).
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// FUA: CDW12 bit 30.
const FUA: u32 = 1 << 30;
/// Ops on a member's queue at once (more wait in the link's backlog).
const IN_FLIGHT_MAX: usize = 32;

/// Where a member is and how to reach it.
pub(crate) struct MemberTarget {
    /// Its place in the stripe.
    pub member: usize,
    /// Its node.
    pub node: String,
    /// This node.
    pub me: String,
    /// The store, to find the node's address.
    pub store: Arc<dyn Store>,
    /// The replica subsystem's NQN.
    pub nqn: String,
    /// The connection's options (this node's host NQN).
    pub options: ConnectOptions,
    /// The links' secrets.
    pub keys: LinkKeys,
    /// The shard volume's block size.
    pub block_size: u32,
}

struct Session {
    _controller: Controller,
    queue: Queue,
    token: Token,
    /// Ops on the queue, by command id, with a read's length.
    ops: BTreeMap<u16, (MemberOp, Option<u32>)>,
    /// Ops waiting for room on the queue, in order.
    backlog: VecDeque<ToMember>,
    transfer_bytes_max: usize,
}

/// Why an op did not go out.
enum SubmitError {
    /// This op cannot be carried (answered failed; the session goes on).
    Op(MemberOp, String),
    /// The connection failed (every op of the session fails).
    Connection(String),
}

/// Runs the member's link until the primary drops its sender.
pub(crate) fn run(target: MemberTarget, inbox: Receiver<ToMember>, events: Sender<Event>) {
    let mut session: Option<Session> = None;
    let answer = |reply: FromMember| {
        let _ = events.send(Event::Member {
            member: target.member,
            reply,
        });
    };
    loop {
        let message = match &session {
            Some(s) if !s.ops.is_empty() => match inbox.try_recv() {
                Ok(message) => Some(message),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => return,
            },
            _ => match inbox.recv() {
                Ok(message) => Some(message),
                Err(_) => return,
            },
        };
        if let Some(message) = message {
            match message {
                ToMember::Fence { token } => {
                    if let Some(old) = session.take() {
                        fail_all(old, &answer);
                    }
                    match fence(&target, token) {
                        Ok(Ok(new)) => {
                            session = Some(new);
                            answer(FromMember::Fenced { token });
                        }
                        Ok(Err(current)) => answer(FromMember::Refused { token, current }),
                        Err(error) => {
                            log::info!("member {} on node {}: {error}", target.member, target.node);
                            let current = Token::default();
                            answer(FromMember::Refused { token, current });
                        }
                    }
                }
                ToMember::Read { token, op, .. }
                | ToMember::Write { token, op, .. }
                | ToMember::Flush { token, op }
                | ToMember::Control { token, op, .. }
                    if session.as_ref().is_none_or(|s| s.token != token) =>
                {
                    answer(FromMember::Failed { token, op })
                }
                io => {
                    let s = session.as_mut().expect("a session");
                    s.backlog.push_back(io);
                    if let Err(error) = send_backlog(s, target.block_size, &answer) {
                        log::info!("member {} on node {}: {error}", target.member, target.node);
                        fail_all(session.take().expect("a session"), &answer);
                    }
                }
            }
            // Take every message waiting before waiting for the member.
            continue;
        }
        let Some(s) = session.as_mut() else {
            continue;
        };
        let done = s.queue.wait().map_err(|e| e.to_string()).and_then(|done| {
            complete(s, done, &answer);
            send_backlog(s, target.block_size, &answer)
        });
        if let Err(error) = done {
            log::info!("member {} on node {}: {error}", target.member, target.node);
            fail_all(session.take().expect("a session"), &answer);
        }
    }
}

/// Answers the op a completion ends.
fn complete(s: &mut Session, done: HostCompletion, answer: &impl Fn(FromMember)) {
    let Some((op, read)) = s.ops.remove(&done.cid.0) else {
        return;
    };
    let token = s.token;
    let reply = if done.status.is_success() {
        match read {
            // All of it, or the member is not trusted with it.
            Some(len) if done.received_bytes == len => {
                let data = s.queue.buffer(done.cid.0)[..len as usize].to_vec();
                FromMember::Read { token, op, data }
            }
            Some(_) => FromMember::Failed { token, op },
            None => FromMember::Written { token, op },
        }
    } else if done.status == weft_proto::status::Status::RESERVATION_CONFLICT {
        // Fenced by another session: a newer primary (the record tells
        // this one it is deposed), or none since the member restarted
        // (faulted, fenced again later).
        let current = Token::default();
        FromMember::Refused { token, current }
    } else {
        FromMember::Failed { token, op }
    };
    answer(reply);
}

/// Answers every op of a session that ended as failed.
fn fail_all(session: Session, answer: &impl Fn(FromMember)) {
    let waiting = session.backlog.into_iter().filter_map(|io| match io {
        ToMember::Read { op, .. }
        | ToMember::Write { op, .. }
        | ToMember::Flush { op, .. }
        | ToMember::Control { op, .. } => Some(op),
        ToMember::Fence { .. } => None,
    });
    for op in session.ops.into_values().map(|(op, _)| op).chain(waiting) {
        answer(FromMember::Failed {
            token: session.token,
            op,
        });
    }
}

/// Sends what waits while the queue has room (at most [`IN_FLIGHT_MAX`]
/// ops at once, which bounds the queue's buffers too).
fn send_backlog(
    s: &mut Session,
    block_size: u32,
    answer: &impl Fn(FromMember),
) -> Result<(), String> {
    while s.ops.len() < IN_FLIGHT_MAX && s.queue.free_cid().is_some() {
        let Some(io) = s.backlog.pop_front() else {
            break;
        };
        match submit(s, io, block_size) {
            Ok(()) => {}
            Err(SubmitError::Op(op, why)) => {
                log::warn!("a member op not sent: {why}");
                answer(FromMember::Failed { token: s.token, op });
            }
            Err(SubmitError::Connection(why)) => return Err(why),
        }
    }
    s.queue.transmit().map_err(|e| e.to_string())
}

/// Queues a read, a write or a flush on the session (answering it failed
/// if it cannot be carried).
fn submit(session: &mut Session, io: ToMember, block_size: u32) -> Result<(), SubmitError> {
    let block = u64::from(block_size);
    let (op, command, transfer, read) = match io {
        ToMember::Read {
            op, offset, len, ..
        } => {
            if let Err(why) = check(offset, len as usize, block, session.transfer_bytes_max) {
                return Err(SubmitError::Op(op, why));
            }
            let blocks = (u64::from(len) / block) as u32;
            let command = read_write(io_opcode::READ, 1, offset / block, blocks);
            (op, command, DataTransfer::FromController(len), Some(len))
        }
        ToMember::Write {
            op,
            offset,
            data,
            fua,
            ..
        } => {
            if let Err(why) = check(offset, data.len(), block, session.transfer_bytes_max) {
                return Err(SubmitError::Op(op, why));
            }
            let blocks = (data.len() as u64 / block) as u32;
            let mut command = read_write(io_opcode::WRITE, 1, offset / block, blocks);
            if fua {
                let cdw12 = u32::from_le_bytes(command[48..52].try_into().expect("4 bytes"));
                set_cdw(&mut command, 12, cdw12 | FUA);
            }
            let cid = session.queue.free_cid().expect("room, checked");
            session.queue.buffer(cid)[..data.len()].copy_from_slice(&data);
            (
                op,
                command,
                DataTransfer::ToController(data.len() as u32),
                None,
            )
        }
        ToMember::Flush { op, .. } => (
            op,
            weft_initiator::sqe(io_opcode::FLUSH, 1),
            DataTransfer::None,
            None,
        ),
        ToMember::Control { op, control, .. } => {
            let (command, transfer) = control_command(session, op, &control)?;
            (op, command, transfer, None)
        }
        ToMember::Fence { .. } => unreachable!("fences are taken apart"),
    };
    let cid = session
        .queue
        .submit(command, transfer)
        .map_err(|e| SubmitError::Connection(e.to_string()))?;
    session.ops.insert(cid.0, (op, read));
    Ok(())
}

/// A control as the member's node takes it: the replica subsystem's
/// vendor commands Grow and Snapshot (`weft_proto::intent`).
fn control_command(
    session: &mut Session,
    op: MemberOp,
    control: &MemberControl,
) -> Result<([u8; 64], DataTransfer), SubmitError> {
    match control {
        MemberControl::Grow { shard_bytes } => {
            let mut command = weft_initiator::sqe(intent::GROW_OPCODE, 1);
            set_cdw(&mut command, 10, *shard_bytes as u32);
            set_cdw(&mut command, 11, (*shard_bytes >> 32) as u32);
            Ok((command, DataTransfer::None))
        }
        MemberControl::Snapshot { name } => {
            let len = name.len();
            if len == 0 || len > intent::SNAPSHOT_NAME_BYTES_MAX as usize {
                return Err(SubmitError::Op(
                    op,
                    format!(
                        "snapshot name {name:?}: 1 to {} bytes",
                        intent::SNAPSHOT_NAME_BYTES_MAX
                    ),
                ));
            }
            let mut command = weft_initiator::sqe(intent::SNAPSHOT_OPCODE, 1);
            set_cdw(&mut command, 10, len as u32);
            let cid = session.queue.free_cid().expect("room, checked");
            session.queue.buffer(cid)[..len].copy_from_slice(name.as_bytes());
            Ok((command, DataTransfer::ToController(len as u32)))
        }
    }
}

fn check(offset: u64, len: usize, block: u64, most: usize) -> Result<(), String> {
    if !offset.is_multiple_of(block) || !(len as u64).is_multiple_of(block) || len > most {
        return Err(format!(
            "an op of {len} bytes at {offset} does not fit the member's blocks ({block} bytes) or its transfer size ({most} bytes)"
        ));
    }
    Ok(())
}

/// Connects to the member and takes the fence: a session, or the token
/// that fences it (a newer primary's).
fn fence(target: &MemberTarget, token: Token) -> Result<Result<Session, Token>, String> {
    let start = std::time::Instant::now();
    let (controller, queue) = loop {
        match connect(target) {
            Ok(connected) => break connected,
            Err(error) if start.elapsed() + CONNECT_RETRY < CONNECT_PATIENCE => {
                log::debug!(
                    "member {} on node {}: {error}; trying again",
                    target.member,
                    target.node
                );
                std::thread::sleep(CONNECT_RETRY);
            }
            Err(error) => return Err(error),
        }
    };
    let fence = FenceToken {
        epoch: token.epoch.0,
        session: token.session,
    };
    if let Err(epoch) = controller.fence(fence).map_err(|e| e.to_string())? {
        return Ok(Err(Token {
            epoch: Epoch(epoch),
            session: 0,
        }));
    }
    queue
        .set_io_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    Ok(Ok(Session {
        transfer_bytes_max: controller.info.transfer_bytes_max as usize,
        _controller: controller,
        queue,
        token,
        ops: BTreeMap::new(),
        backlog: VecDeque::new(),
    }))
}

fn connect(target: &MemberTarget) -> Result<(Controller, Queue), String> {
    let view =
        weft_cluster::nodes::get(target.store.as_ref(), &target.node).map_err(|e| e.to_string())?;
    let member = &view.member;
    let other = Peer {
        name: member.name.clone(),
        certificate: member.certificate.clone(),
    };
    let credentials = target.keys.between(&target.me, &target.node, &other)?;
    let options = ConnectOptions {
        dhchap: Some(credentials.dhchap),
        tls_key_update_after_records: credentials
            .tls_psk
            .is_some()
            .then_some(weft_proto::tls::ASK_AFTER_RECORDS),
        tls_psk: credentials.tls_psk,
        ..target.options.clone()
    };
    let address = member
        .peer_nvme
        .first()
        .or(member.nvme.first())
        .ok_or_else(|| format!("node {} advertises no NVMe/TCP address", target.node))?;
    let url = TargetUrl::parse(&format!("nvme-tcp://{address}/{}", target.nqn))
        .map_err(|e| e.to_string())?;
    let controller = Controller::connect(&url, options, 1).map_err(|e| e.to_string())?;
    let queue = controller.open_io_queue(1).map_err(|e| e.to_string())?;
    Ok((controller, queue))
}
