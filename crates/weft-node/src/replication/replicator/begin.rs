//! How a replicator begins: it takes its epoch (a new one if this node
//! served the last), persists its run and served epoch, fences its own copy
//! and builds its primary; or, when this node cannot persist those files,
//! hands the volume to a replica in sync.
//!
//! What this does not do: serve (the replicator's turns do, `super`).

use super::*;

impl Replicator {
    /// Takes the epoch (a new one if this node served it before), fences
    /// its own replica and builds the primary; none if this node may not
    /// serve (a newer primary exists).
    /// (`inbox` is taken once it begins.)
    pub(super) fn begin(
        setup: ReplicatorSetup,
        events: Events,
        inbox: &mut Option<Receiver<Event>>,
        doorbell: Arc<Doorbell>,
        shared: Shared,
    ) -> Result<Option<Replicator>, String> {
        let plane = setup.plane.clone().ok_or("the data plane is not up yet")?;
        let ReplicatorSetup {
            volume,
            volume_id,
            me,
            mut replication,
            mut revision,
            backend,
            members,
            intent,
            desired,
            lease,
            connect,
            link_keys,
            manager,
            dir,
            published,
            rebuild_bytes_per_s,
            plane: _,
        } = setup;
        let Shared {
            path,
            taking,
            finished,
            host,
        } = shared;
        let epoch_file = dir.join("replicas").join(format!("{volume}.epoch"));
        let served = crate::intents::served_epoch(&epoch_file);
        let mut run_file = RunFile::load(&dir, &volume, &volume_id);
        let own = node_id(&replication, &me).ok_or("this node holds no replica")?;
        let mut start = plan_start(&replica_set(&replication), own, Epoch(served));
        if let Start::NextEpoch(next) = start {
            // Served before (a restart, or a lapsed lease): a new epoch.
            let next = with_replica_set(&replication, &next);
            match commit(&desired, &volume, revision, next) {
                Event::Committed {
                    revision: new,
                    record,
                } => {
                    log::info!("volume {volume}: serves again under epoch {}", record.epoch);
                    (replication, revision) = (record, new);
                }
                _ => return Ok(None),
            }
            start = plan_start(&replica_set(&replication), own, Epoch(served));
        }
        let Start::Serve { continued } = start else {
            unreachable!("the next epoch is served")
        };
        // The run first: a served epoch written alone would pass a new
        // run for the old one's continuation after a crash.
        let persisted = run_file
            .begin(replication.epoch, continued)
            .map_err(|e| format!("the run file of volume {volume}: {e}"))
            .and_then(|goes_on| {
                if !goes_on {
                    intent.forget_kept();
                }
                write_served_epoch(&dir, &volume, replication.epoch)
                    .map_err(|e| format!("{}: {e}", epoch_file.display()))
            });
        if let Err(error) = persisted {
            // Without its files it cannot serve: another copy in sync does.
            hand_over_unwritable(&desired, &volume, &me, revision, &replication);
            return Err(error);
        }
        let geometry = Geometry {
            blocks: replication.size_bytes / u64::from(replication.block_size),
            region_blocks: intent.intent().region_bytes() / u64::from(replication.block_size),
        };
        let own_target = LinkTarget {
            node: own,
            name: me.clone(),
            store: Arc::clone(desired.store()),
            nqn: replica_nqn(&volume),
            me: me.clone(),
            options: connect.clone(),
            keys: link_keys,
            block_size: u64::from(replication.block_size) as u32,
            // The record's regions, as the core's sets have: a copy may be
            // larger (a growth whose record failed).
            regions: geometry.regions(),
            unreachable: Arc::default(),
        };
        // The old primary's writes stop here too (session 0 of this epoch).
        let waits_for_grants = !replica_set(&replication).handed_over_by_previous();
        let Some(own_fence) =
            fence_own(&plane, &own_target.nqn, replication.epoch, waits_for_grants)?
        else {
            log::info!("volume {volume}: a newer primary fenced this node's replica");
            return Ok(None);
        };
        let config = PrimaryConfig {
            me: own_target.node,
            geometry,
            replica_timeout: REPLICA_TIMEOUT,
            reattach_interval: REATTACH_INTERVAL,
            copies_in_flight_max: 4,
            clean_delay: CLEAN_DELAY,
            read_grant: READ_GRANT - READ_GRANT_MARGIN,
        };
        // The copy may exceed the record's size (a growth whose record
        // failed): the core sees the record's regions.
        let regions = geometry.regions();
        let mut marked = RegionSet::new(regions);
        for region in intent
            .intent()
            .marked()
            .into_iter()
            .filter(|&r| r < regions)
        {
            marked.insert(region);
        }
        let mut run = Run::new(Epoch(run_file.first_epoch), regions);
        for region in intent.kept_regions().iter().filter(|&r| r < regions) {
            run.kept.insert(region);
        }
        run.full = run_file
            .full
            .iter()
            .filter_map(|name| node_id(&replication, name))
            .collect();
        let now = lease.now();
        let set = replica_set(&replication);
        let mut driver = Driver::new(
            Primary::new(config, set, revision, marked, run, now),
            geometry.blocks,
        );
        driver.tick(lease.until(), now);
        let targets = replication
            .members
            .iter()
            .filter(|member| member.node != me)
            .map(|member| {
                let node = node_id(&replication, &member.node).expect("a member");
                let target = LinkTarget {
                    node,
                    name: member.node.clone(),
                    unreachable: Arc::default(),
                    ..own_target.clone()
                };
                (node, target)
            })
            .collect();
        let local = LocalPool::start(&backend, &members, &events)?;
        let files = Durable::start(&volume, Arc::clone(&intent), run_file, events.clone())
            .map_err(|e| format!("its files' thread: {e}"))?;
        let ring = WriteRing::new(&backend, doorbell).map_err(|e| format!("its I/O ring: {e}"))?;
        let stop_poller = Arc::new(AtomicBool::new(false));
        let records = events.clone();
        poll_record(
            desired.clone(),
            volume.clone(),
            Arc::clone(&stop_poller),
            move |revision, record| records.send(Event::Record { revision, record }).is_ok(),
        );
        log::info!(
            "volume {volume}: primary of epoch {} (revision {revision})",
            replication.epoch
        );
        let pool = backend.pool.clone();
        Ok(Some(Replicator {
            me,
            pool,
            map: Arc::clone(&backend.map),
            cipher: backend.cipher.clone(),
            files,
            barrier: None,
            barriers: 0,
            taking,
            held: std::collections::VecDeque::new(),
            volume,
            driver,
            block_size: u64::from(replication.block_size),
            replication,
            revision,
            local,
            ring,
            intent,
            own_fence,
            targets,
            links: Links::new(events.clone()),
            replies: Vec::new(),
            ops: BTreeMap::new(),
            next_op: 0,
            events,
            path,
            plane,
            desired,
            lease,
            manager,
            serving: Serving::Transition,
            stop_poller,
            published,
            trackers: BTreeMap::new(),
            shown: Vec::new(),
            limiter: CopyLimiter::new(rebuild_bytes_per_s),
            deferred: std::collections::VecDeque::new(),
            inbox: inbox.take().expect("given"),
            woken: Woken::default(),
            draining: None,
            finished,
            host,
            recording: None,
            overdue: false,
        }))
    }
}

/// This node cannot write the files a primary must persist (its data
/// directory is full, or failing): it hands the volume to a replica in
/// sync, on a live node if one is, under the next epoch, and faults its
/// own copy into that epoch, as a promotion faults the old primary: its
/// copy holds every acknowledged write (only its files failed), so it is
/// rebuilt partially, and it gets the role back if the new primary turns
/// out to have lost power. Safe as a promotion after a lease is: this node
/// does not serve (its last replicator drained), the replicas in sync hold
/// every acknowledged write, and the next primary fences every copy.
/// Nothing if no replica is in sync: it tries to serve again at the next
/// reconcile.
fn hand_over_unwritable(
    desired: &DesiredState,
    volume: &str,
    me: &str,
    revision: u64,
    replication: &ReplicationRecord,
) {
    let in_sync: Vec<&str> = replication
        .members
        .iter()
        .filter(|m| m.node != me && m.state == ReplicaState::InSync)
        .map(|m| m.node.as_str())
        .collect();
    let alive = |node: &&&str| {
        let key = weft_cluster::records::alive_key(node);
        matches!(desired.store().get(&key), Ok(Some(_)))
    };
    let Some(target) = in_sync.iter().find(alive).or(in_sync.first()) else {
        return;
    };
    let (Some(to), Some(from)) = (node_id(replication, target), node_id(replication, me)) else {
        return;
    };
    let mut next = replica_set(replication).handed_over(to);
    next.set_state(from, MemberState::Faulted { epoch: next.epoch });
    match commit(desired, volume, revision, with_replica_set(replication, &next)) {
        Event::Committed { record, .. } => log::error!(
            "volume {volume}: this node cannot persist a primary's files; it handed the volume to {target} (epoch {}), which rebuilds its copy here once it can",
            record.epoch
        ),
        _ => log::warn!("volume {volume}: this node cannot persist a primary's files, nor hand the volume over yet"),
    }
}

/// Takes this node's replica subsystem's fence (`nqn`) for its local
/// writes with session 0 of `epoch`, and waits until no older primary's
/// write to this node's copy is on its way and, after a promotion
/// (`waits_for_grants`), until the read grant this copy gave another node's
/// primary ran out (see `weft_proto::fence`); none if a newer epoch holds it.
fn fence_own(
    plane: &DataPlane,
    nqn: &str,
    epoch: u64,
    waits_for_grants: bool,
) -> Result<Option<LocalFence>, String> {
    let token = FenceToken { epoch, session: 0 };
    let Ok(fence) = plane.fences().fence_local(nqn, token) else {
        return Ok(None);
    };
    let start = Instant::now();
    let settled = |fence: &LocalFence| {
        fence.drained()
            && !(waits_for_grants && fence.grant_ends().is_some_and(|ends| plane.now() < ends))
    };
    while !settled(&fence) && fence.holds() {
        if start.elapsed() >= OWN_FENCE_PATIENCE {
            return Err(format!(
                "an older primary's writes to this node's copy are still on their way after {OWN_FENCE_PATIENCE:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // A newer epoch took it meanwhile.
    Ok(fence.holds().then_some(fence))
}
