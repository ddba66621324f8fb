//! The data plane over real TCP sockets: reactors, io_uring, RAM and file
//! devices, driven by the protocol core's host model from several threads.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;
use support::{admin, io_queue, start, Client};
use weft_proto::command::io_opcode;
use weft_proto::status::Status;
use weft_proto::testing;

/// Writes and reads back a pattern unique to (worker, round) on its own LBA range.
fn exercise(io: &mut Client, worker: u64, rounds: u64) {
    for round in 0..rounds {
        for (nsid, block_size) in [(1u32, 512u64), (2, 4096)] {
            let bytes = 64 * 1024u32;
            let blocks = bytes as u64 / block_size;
            let slba = worker * 4 * blocks + (round % 4) * blocks;
            let pattern: Vec<u8> = (0..bytes as u64)
                .map(|i| (i ^ (worker << 5) ^ round) as u8)
                .collect();
            let cid = (round % 1000) as u16;
            let write = testing::rw(
                io_opcode::WRITE,
                cid,
                nsid,
                slba,
                blocks as u32,
                bytes,
                false,
            );
            assert_eq!(io.write_r2t(&write, &pattern).status(), Status::SUCCESS);
            let small = testing::rw(
                io_opcode::WRITE,
                cid,
                nsid,
                slba,
                1,
                block_size as u32,
                true,
            );
            assert_eq!(
                io.command(&small, &pattern[..block_size as usize])
                    .1
                    .status(),
                Status::SUCCESS
            );
            let read = testing::rw(
                io_opcode::READ,
                cid,
                nsid,
                slba,
                blocks as u32,
                bytes,
                false,
            );
            let (data, response) = io.command(&read, &[]);
            assert_eq!(response.status(), Status::SUCCESS);
            assert!(
                data == pattern,
                "worker {worker} round {round} namespace {nsid}: data differs"
            );
        }
    }
}

#[test]
fn many_hosts_and_queues_in_parallel() {
    let address = start("parallel");
    let workers: Vec<_> = (0..4u64)
        .map(|worker| {
            std::thread::spawn(move || {
                let digests = worker % 2 == 1;
                let (_admin, cntlid) = admin(address, 0);
                let mut queues: Vec<Client> = (1..=2)
                    .map(|qid| io_queue(address, cntlid, qid, digests))
                    .collect();
                for (index, queue) in queues.iter_mut().enumerate() {
                    exercise(queue, worker * 2 + index as u64, 20);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
}

#[test]
fn a_malformed_pdu_ends_only_its_connection() {
    let address = start("malformed");
    let (_admin, cntlid) = admin(address, 0);
    let mut good = io_queue(address, cntlid, 1, false);
    let mut bad = Client::connect(address, false, false);
    bad.send(&[0x04, 0, 50, 0, 72, 0, 0, 0]);
    bad.send(&[0u8; 64]);
    let term = bad.next_pdu();
    assert_eq!(term.fatal_status(), 0x01);
    assert!(bad.try_next_pdu().is_none(), "closed after the C2HTermReq");
    let mut garbage = TcpStream::connect(address).unwrap();
    garbage.write_all(&[0xAB; 4096]).unwrap();
    exercise(&mut good, 0, 3);
}

#[test]
fn keep_alive_expiry_closes_the_controller_and_its_queues() {
    let address = start("keep-alive");
    let (mut admin, cntlid) = admin(address, 400);
    let mut io = io_queue(address, cntlid, 1, false);
    // 400 ms rounds up to the timer's 1 s granule, plus a granule of slack.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        admin.try_next_pdu().is_none(),
        "admin queue closed at keep-alive expiry"
    );
    assert!(
        io.try_next_pdu().is_none(),
        "I/O queue closed with its controller"
    );
}
