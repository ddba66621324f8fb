//! `libweft_fio.so`: fio's external I/O engine over weft's user-space
//! NVMe/TCP initiator, so fio job files run against any NVMe/TCP target
//! (weft, Linux nvmet, SPDK) without the kernel's nvme-tcp module, the way
//! SPDK ships its fio plugin:
//!
//! ```text
//! cargo build --release -p weft-fio
//! fio --ioengine=external:target/release/libweft_fio.so \
//!     --filename='nvme-tcp\://127.0.0.1\:4420/nqn.2026-11.io.weft\:default' \
//!     --name=j --rw=randread --bs=4k --iodepth=32 --time_based --runtime=10
//! ```
//!
//! The engine itself is `weft_uring::fio` (fio's interface is raw pointers,
//! and weft keeps `unsafe` in one crate); this crate only links it into a
//! shared object fio can `dlopen`.

#![forbid(unsafe_code)]

pub use weft_uring::fio::get_ioengine;
