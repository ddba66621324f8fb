//! Fabrics: Connect (a new admin or I/O queue, the host checked against
//! the subsystem) and DH-HMAC-CHAP authentication (NVMe-oF 1.1, sections
//! 3.3, 3.5 and 3.6).

use super::*;

/// The keep-alive of a discovery controller connected with KATO 0.
const DISCOVERY_KATO_MS: u32 = 120_000;

impl Connection {
    /// Authentication Send/Receive (NVMe-oF 1.1, sections 3.5/3.6) on a
    /// queue whose host must authenticate.
    pub(super) fn authentication_command(
        &mut self,
        command: &Command,
        buffer: &mut [u8],
    ) -> Outcome {
        let (State::Admin(queue, _) | State::Io(queue, _)) = &mut self.state else {
            unreachable!("authentication commands are executed on connected queues")
        };
        let Some(exchange) = queue.authentication.as_mut() else {
            // This host has no secret here: there is nothing to authenticate.
            return Outcome::status(Status::COMMAND_SEQUENCE_ERROR);
        };
        // CDW10: SPSP0 (byte 41), SPSP1 (byte 42), SECP (byte 43); CDW11: TL or AL.
        let [_, spsp0, spsp1, secp] = command.cdw[0].to_le_bytes();
        let length = command.cdw[1];
        if secp != SECP_DHCHAP || spsp0 != SPSP_DHCHAP || spsp1 != SPSP_DHCHAP || length == 0 {
            return Outcome::status(Status::INVALID_FIELD);
        }
        if length != command.sgl.length {
            return Outcome::status(Status::SGL_LENGTH_INVALID);
        }
        // TL/AL equals the SGL length, which prepare bounded by the slot buffer.
        let buffer = &mut buffer[..length as usize];
        if command.fctype() == fctype::AUTH_SEND {
            exchange.on_send(buffer);
            if exchange.is_authenticated() && queue.qid == 0 {
                queue.controller.set_authenticated();
            }
            return Outcome::status(Status::SUCCESS);
        }
        let received = exchange.on_receive(buffer, &*self.target.random);
        if exchange.is_authenticated() && queue.qid == 0 {
            queue.controller.set_authenticated();
        }
        match received {
            Some(len) => Outcome::Complete {
                status: Status::SUCCESS,
                result: 0,
                reply_len: len as u32,
            },
            None => Outcome::status(Status::INVALID_FIELD),
        }
    }

    // ----- Fabrics Connect -----

    /// Fabrics Connect (NVMe-oF 1.1, section 3.3): creates an admin queue with
    /// a new controller, or an I/O queue of an existing one.
    pub(super) fn connect(
        &mut self,
        command: &Command,
        buffer: &mut [u8],
        now: Timestamp,
    ) -> Outcome {
        match self.try_connect(command, buffer, now) {
            Ok(result) => Outcome::Complete {
                status: Status::SUCCESS,
                result: u64::from(result),
                reply_len: 0,
            },
            Err((status, result)) => {
                if status == Status::CONNECT_INVALID_HOST {
                    // Decoded before the refusal, so it decodes again.
                    self.refused_host =
                        ConnectData::decode(&buffer[..CONNECT_DATA_LEN])
                            .ok()
                            .map(|data| RefusedHost {
                                subnqn: data.subnqn,
                                hostnqn: data.hostnqn,
                            });
                }
                Outcome::Complete {
                    status,
                    result,
                    reply_len: 0,
                }
            }
        }
    }

    pub(super) fn try_connect(
        &mut self,
        command: &Command,
        buffer: &mut [u8],
        now: Timestamp,
    ) -> Result<u32, (Status, u64)> {
        let connect = ConnectCommand::decode(command);
        if connect.recfmt != 0 {
            return Err((Status::CONNECT_INCOMPATIBLE_FORMAT, 0));
        }
        if command.sgl.length as usize != CONNECT_DATA_LEN {
            return Err((Status::SGL_LENGTH_INVALID, 0));
        }
        let data = ConnectData::decode(&buffer[..CONNECT_DATA_LEN])
            .map_err(|_| (Status::INTERNAL_ERROR, 0))?;
        let entries = u32::from(connect.sqsize) + 1;
        if connect.sqsize == 0 || entries > u32::from(self.limits.queue_entries_max) {
            return Err(invalid_sqe_field(44));
        }
        // At most queue_entries_max, a u16, as just checked.
        let entries = entries as u16;
        let sq_flow_disabled = connect.cattr & ConnectCommand::CATTR_DISABLE_SQ_FLOW != 0;
        let queue = if connect.qid == 0 {
            self.connect_admin(&data, connect, now)?
        } else {
            self.connect_io(&data, connect)?
        };
        // Discovery is not authenticated: it is not in the configuration's subsystems.
        let authentication = self
            .config
            .subsystem(&data.subnqn)
            .and_then(|subsystem| subsystem.access.keys_of(&data.hostnqn))
            .map(|keys| {
                Box::new(ControllerExchange::new(
                    Arc::clone(keys),
                    &data.hostnqn,
                    &data.subnqn,
                ))
            });
        let result_flags = if authentication.is_some() {
            CONNECT_AUTHREQ_ATR
        } else {
            0
        };
        let info = |controller| QueueInfo {
            qid: connect.qid,
            entries,
            sqhd: 1 % entries,
            sq_flow_disabled,
            controller,
            authentication,
        };
        let (cntlid, state) = match queue {
            NewQueue::Admin(controller, admin) => {
                (controller.cntlid.0, State::Admin(info(controller), admin))
            }
            NewQueue::Io(controller, io) => (controller.cntlid.0, State::Io(info(controller), io)),
        };
        self.state = state;
        // The queue now has its negotiated number of command slots (twice its
        // entries, see `Limits::slots_per_queue`); slot 0 holds this Connect.
        // Allocated now, once: what a queue of this size needs at most.
        let slots = 2 * usize::from(entries);
        self.slots.resize_with(slots, Slot::empty);
        self.io_requests.reserve(2 * slots);
        self.tx.reserve(16 * 1024, 4 * slots);
        self.free_slots.clear();
        self.free_slots.reserve(slots);
        // At most 2 x 32768 - 1 (`Limits::QUEUE_ENTRIES_LIMIT`): a u16.
        self.free_slots
            .extend((1..2 * u32::from(entries)).rev().map(|slot| slot as u16));
        Ok(u32::from(cntlid) | result_flags)
    }

    pub(super) fn connect_admin(
        &self,
        data: &ConnectData,
        connect: ConnectCommand,
        now: Timestamp,
    ) -> Result<NewQueue, (Status, u64)> {
        if data.cntlid != 0xFFFF {
            // Dynamic controller model: the host must ask for any controller.
            return Err(invalid_data_field(16));
        }
        check_tls_identity(self.tls_identity.as_ref(), data)?;
        let (kind, authenticating) = if data.subnqn == DISCOVERY_NQN {
            (ControllerKind::Discovery, false)
        } else {
            let subsystem = self
                .config
                .subsystem(&data.subnqn)
                .ok_or(invalid_data_field(256))?;
            check_host_allowed(subsystem, data, self.tls_identity.is_some())?;
            check_host_id(subsystem, data)?;
            let authenticating = subsystem.access.keys_of(&data.hostnqn).is_some();
            (ControllerKind::Io, authenticating)
        };
        let new = NewController {
            subnqn: &data.subnqn,
            hostnqn: &data.hostnqn,
            host_id: data.host_id,
            authenticating,
            peer: self.peer,
            // An IPv4 peer on a dual-stack listener shows as ::ffff:a.b.c.d.
            stranger: !self.config.node_addresses.is_empty()
                && self.peer.is_none_or(|peer| {
                    let peer = peer.to_canonical();
                    self.config.node_addresses.binary_search(&peer).is_err()
                }),
        };
        let controller = self
            .target
            .registry
            .create_within(&new, &self.limits)
            .map_err(|error| match error {
                // Another host's identifier: the HOSTID field is wrong.
                RegistryError::HostIdTaken => invalid_data_field(0),
                // Strangers naming the host wait to authenticate: try again
                // later (without DNR), as a host does after Controller Busy.
                RegistryError::PendingFull | RegistryError::AddressFull => {
                    (Status::CONNECT_CONTROLLER_BUSY, 0)
                }
                // As nvmet when it has no controller ID left: Controller Busy with DNR.
                _ => {
                    let busy = Status {
                        dnr: true,
                        ..Status::CONNECT_CONTROLLER_BUSY
                    };
                    (busy, 0)
                }
            })?;
        // A discovery controller that never expires would hold its place in
        // the registry for good: 256 idle ones, from anyone, refused every
        // host's discovery. As nvmet does (NVMET_DISC_KATO_MS), KATO 0
        // means two minutes there.
        let kato_ms = match (kind, connect.kato_ms) {
            (ControllerKind::Discovery, 0) => DISCOVERY_KATO_MS,
            (_, kato_ms) => kato_ms,
        };
        let admin = AdminQueue::new(Arc::clone(&controller), kind, kato_ms, now);
        Ok(NewQueue::Admin(controller, Box::new(admin)))
    }

    pub(super) fn connect_io(
        &self,
        data: &ConnectData,
        connect: ConnectCommand,
    ) -> Result<NewQueue, (Status, u64)> {
        let subsystem = self
            .config
            .subsystem_index(&data.subnqn)
            .ok_or(invalid_data_field(256))?;
        check_tls_identity(self.tls_identity.as_ref(), data)?;
        check_host_allowed(
            &self.config.subsystems[subsystem],
            data,
            self.tls_identity.is_some(),
        )?;
        let controller = self
            .target
            .registry
            .find(&data.subnqn, data.cntlid, &data.hostnqn, data.host_id)
            .map_err(|error| match error {
                RegistryError::UnknownController
                | RegistryError::Exhausted
                | RegistryError::SubsystemFull
                | RegistryError::HostIdTaken
                | RegistryError::PendingFull
                | RegistryError::AddressFull => invalid_data_field(16),
            })?;
        if !controller.is_ready() {
            return Err((Status::COMMAND_SEQUENCE_ERROR, 0));
        }
        if u32::from(connect.qid) > controller.io_queues_granted() {
            return Err(invalid_sqe_field(42));
        }
        if !controller.claim_io_queue(connect.qid) {
            return Err((Status::CONNECT_CONTROLLER_BUSY, 0));
        }
        let io = IoQueue {
            epoch: controller.epoch(),
            subsystem,
        };
        Ok(NewQueue::Io(controller, io))
    }
}

/// A queue a successful Connect creates.
pub(super) enum NewQueue {
    Admin(Arc<ControllerShared>, Box<AdminQueue>),
    Io(Arc<ControllerShared>, IoQueue),
}

/// Refuses a host the subsystem does not allow with Connect Invalid Host,
/// pointing at the Host NQN in the Connect data (NVMe-oF 1.1, section 3.3,
/// Figure 21; Linux nvmet answers the same); so is a host given a TLS PSK
/// that connects without TLS (`over_tls` false).
pub(super) fn check_host_allowed(
    subsystem: &SubsystemConfig,
    data: &ConnectData,
    over_tls: bool,
) -> Result<(), (Status, u64)> {
    let needs_tls = subsystem.access.tls_psk_of(&data.hostnqn).is_some();
    if subsystem.access.allows(&data.hostnqn) && (over_tls || !needs_tls) {
        Ok(())
    } else {
        Err((Status::CONNECT_INVALID_HOST, (1 << 16) | 512))
    }
}

/// In a TLS stream, a Connect must name the host and subsystem of the PSK
/// identity the stream was established with (NVMe/TCP 1.1 section 3.6.1.3:
/// the identity binds the key to both NQNs): another host's NQN is refused
/// as Connect Invalid Host, another subsystem at the SUBNQN field.
pub(super) fn check_tls_identity(
    identity: Option<&crate::tls::psk::Identity>,
    data: &ConnectData,
) -> Result<(), (Status, u64)> {
    let Some(identity) = identity else {
        return Ok(());
    };
    if identity.host_nqn != data.hostnqn {
        return Err((Status::CONNECT_INVALID_HOST, (1 << 16) | 512));
    }
    if identity.subsystem_nqn != data.subnqn {
        return Err(invalid_data_field(256));
    }
    Ok(())
}

/// A zero host identifier cannot hold a reservation (the identifier is
/// what registrants are known by), so it may not connect to a subsystem
/// whose namespaces have reservations: refused at HOSTID.
pub(super) fn check_host_id(
    subsystem: &SubsystemConfig,
    data: &ConnectData,
) -> Result<(), (Status, u64)> {
    let reservations = subsystem
        .namespaces
        .iter()
        .any(|namespace| namespace.reservations.is_some());
    if reservations && data.host_id == [0; 16] {
        return Err(invalid_data_field(0));
    }
    Ok(())
}

/// Connect Invalid Parameters in the SQE at byte `offset` (IATTR 0).
pub(super) fn invalid_sqe_field(offset: u64) -> (Status, u64) {
    (Status::CONNECT_INVALID_PARAMETERS, offset)
}

/// Connect Invalid Parameters in the Connect data at byte `offset` (IATTR 1).
pub(super) fn invalid_data_field(offset: u64) -> (Status, u64) {
    (Status::CONNECT_INVALID_PARAMETERS, (1 << 16) | offset)
}
