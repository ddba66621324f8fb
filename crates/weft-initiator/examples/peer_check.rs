//! Checks weft's initiator against any NVMe/TCP target, one line per check:
//! connect (with and without digests), identify, namespaces, writes and reads
//! from in-capsule to R2T sizes at queue depth, Flush, Write Zeroes and
//! Deallocate (when the controller supports them), keep-alive across an idle
//! period, and the errors for an unknown NQN and a refused host.
//! The test suite runs it in the guest against the Linux kernel's nvmet.
//!
//! Usage: peer_check nvme-tcp://HOST:PORT/NQN [--refused NQN] [--idle-s N]
//! (`--refused`: a subsystem on the same port that does not allow this host)

use std::process::ExitCode;
use std::time::Duration;
use weft_initiator::{read_write, ConnectOptions, Controller, InitiatorError, TargetUrl};
use weft_proto::command::io_opcode;
use weft_proto::host::DataTransfer;

type Check = Result<String, String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(url) = args.first().and_then(|a| TargetUrl::parse(a).ok()) else {
        eprintln!("usage: peer_check nvme-tcp://HOST:PORT/NQN [--refused NQN] [--idle-s N]");
        return ExitCode::from(2);
    };
    let option = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let idle = Duration::from_secs(option("--idle-s").and_then(|v| v.parse().ok()).unwrap_or(5));
    let mut failures = 0;
    let mut report = |what: &str, outcome: Check| match outcome {
        Ok(detail) => println!("  ok: {what}: {detail}"),
        Err(why) => {
            println!("FAIL {what}: {why}");
            failures += 1;
        }
    };
    for digests in [false, true] {
        report(
            &format!("data path (digests {digests})"),
            data_path(&url, digests),
        );
    }
    report("keep-alive", keep_alive(&url, idle));
    report("unknown NQN", unknown_nqn(&url));
    if let Some(refused) = option("--refused") {
        report("refused host", refused_host(&url, &refused));
    }
    if failures == 0 {
        println!("peer_check: all checks passed against {}", url.address);
        ExitCode::SUCCESS
    } else {
        println!(
            "peer_check: {failures} check(s) failed against {}",
            url.address
        );
        ExitCode::FAILURE
    }
}

fn fail(what: &str) -> impl Fn(InitiatorError) -> String + '_ {
    move |error| format!("{what}: {error}")
}

fn data_path(url: &TargetUrl, digests: bool) -> Check {
    let options = ConnectOptions {
        header_digest: digests,
        data_digest: digests,
        ..ConnectOptions::default()
    };
    let mut controller = Controller::connect(url, options, 2).map_err(fail("connect"))?;
    let info = controller.info.clone();
    let namespace = controller.namespace(1).map_err(fail("namespace 1"))?;
    let block = namespace.block_size;
    let mut queue = controller.open_io_queue(2).map_err(fail("I/O queue 2"))?;
    let mut moved = 0u64;
    // Every size from one block to the largest transfer, 16 commands in flight.
    let mut len = block;
    while len <= info.transfer_bytes_max.min(256 * 1024) {
        let blocks = len / block;
        let mut expected = Vec::new();
        for index in 0..16u64 {
            let slba = index * u64::from(blocks);
            let data: Vec<u8> = (0..len)
                .map(|i| (i as u64 * 7 + index + u64::from(len)) as u8)
                .collect();
            let cid = queue.next_cid();
            queue.buffer(cid)[..len as usize].copy_from_slice(&data);
            queue
                .submit(
                    read_write(io_opcode::WRITE, 1, slba, blocks),
                    DataTransfer::ToController(len),
                )
                .map_err(|e| format!("submit: {e}"))?;
            expected.push((slba, data));
        }
        for _ in 0..16 {
            let done = queue.wait().map_err(fail("write"))?;
            if !done.status.is_success() {
                return Err(format!("a {len}-byte write failed: {:?}", done.status));
            }
        }
        for (slba, data) in &expected {
            let back = queue.read(1, *slba, block, len).map_err(fail("read"))?;
            if back != &data[..] {
                return Err(format!(
                    "{len}-byte read at LBA {slba} differs from what was written"
                ));
            }
        }
        moved += 32 * u64::from(len);
        len *= 2;
    }
    queue.flush(1).map_err(fail("flush"))?;
    let mut extras = vec!["flush".to_string()];
    let zeroes = |bytes: &[u8]| bytes.iter().all(|&b| b == 0);
    if info.optional_commands & (1 << 3) != 0 {
        queue.write_zeroes(1, 0, 2).map_err(fail("write zeroes"))?;
        if !zeroes(queue.read(1, 0, block, 2 * block).map_err(fail("read"))?) {
            return Err("blocks read back non-zero after Write Zeroes".into());
        }
        extras.push("write zeroes".into());
    }
    if info.optional_commands & (1 << 2) != 0 {
        // Deallocated blocks may read as anything unless DLFEAT says zeroes: check the command only.
        queue
            .deallocate(1, &[(4, 2), (8, 1)])
            .map_err(fail("deallocate"))?;
        extras.push("deallocate".into());
    }
    Ok(format!(
        "model \"{}\", {} MiB moved in {}..{} byte commands at depth 16, {}",
        info.model,
        moved >> 20,
        block,
        len / 2,
        extras.join(", ")
    ))
}

fn keep_alive(url: &TargetUrl, idle: Duration) -> Check {
    let options = ConnectOptions {
        keep_alive: Some(Duration::from_secs(2)),
        ..ConnectOptions::default()
    };
    let mut controller = Controller::connect(url, options, 1).map_err(fail("connect"))?;
    let mut queue = controller.open_io_queue(1).map_err(fail("I/O queue"))?;
    std::thread::sleep(idle);
    if let Some(failure) = controller.keep_alive_failure() {
        return Err(format!("keep-alive stopped: {failure}"));
    }
    controller
        .namespaces()
        .map_err(fail("identify after idling"))?;
    queue.flush(1).map_err(fail("flush after idling"))?;
    Ok(format!(
        "controller alive after {} s idle with KATO 2 s",
        idle.as_secs()
    ))
}

fn unknown_nqn(url: &TargetUrl) -> Check {
    let mut unknown = url.clone();
    unknown.nqn = "nqn.2026-11.io.weft:no-such-subsystem".into();
    match Controller::connect(&unknown, ConnectOptions::default(), 1) {
        Err(error @ InitiatorError::UnknownNqn { .. }) => Ok(error.to_string()),
        Err(error) => Err(format!("expected an unknown-NQN error, got: {error}")),
        Ok(_) => Err("connected to a subsystem that does not exist".into()),
    }
}

fn refused_host(url: &TargetUrl, nqn: &str) -> Check {
    let mut refused = url.clone();
    refused.nqn = nqn.to_string();
    match Controller::connect(&refused, ConnectOptions::default(), 1) {
        Err(error @ InitiatorError::HostRejected { .. }) => Ok(error.to_string()),
        Err(error) => Err(format!("expected a host-rejected error, got: {error}")),
        Ok(_) => Err("connected to a subsystem that does not allow this host".into()),
    }
}
