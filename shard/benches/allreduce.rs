//! The shared-memory all-reduce between 2 ranks (threads with their own mapping of the
//! segment, as separate processes would have) against a plain memcpy of the same size.
//!
//! Run with `cargo bench -p tessera-shard --bench allreduce`. "GB/s" is the message size
//! over the time per call (algorithm bandwidth, as nccl-tests reports it).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tessera_shard::comm::{Communicator, ShmComm, ShmConfig};

const SIZES: [usize; 9] = [
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    32 << 20,
    64 << 20,
];

fn iterations(bytes: usize) -> usize {
    ((256 << 20) / bytes).clamp(5, 2000)
}

fn time_memcpy(bytes: usize) -> Duration {
    let src = vec![1.0f32; bytes / 4];
    let mut dst = vec![0.0f32; bytes / 4];
    dst.copy_from_slice(&src);
    let n = iterations(bytes);
    let start = Instant::now();
    for _ in 0..n {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    start.elapsed() / n as u32
}

fn main() {
    let world = 2;
    let path =
        std::path::Path::new("/dev/shm").join(format!("tessera-bench-{}", std::process::id()));
    let barrier = Arc::new(Barrier::new(world));
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let (path, barrier) = (path.clone(), barrier.clone());
            std::thread::spawn(move || {
                let comm = ShmComm::join(&path, rank, world, ShmConfig::default()).unwrap();
                let mut results = Vec::new();
                for bytes in SIZES {
                    let mut data = vec![rank as f32 + 1.0; bytes / 4];
                    comm.all_reduce_f32(&mut data).unwrap(); // warm the pages
                    let n = iterations(bytes);
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..n {
                        comm.all_reduce_f32(&mut data).unwrap();
                    }
                    results.push(start.elapsed() / n as u32);
                }
                results
            })
        })
        .collect();
    let times: Vec<Vec<Duration>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    println!("shared-memory all-reduce (f32 sum), {world} ranks, vs memcpy of the same size");
    println!(
        "{:>10} {:>14} {:>12} {:>14} {:>12} {:>8}",
        "size", "all-reduce", "GB/s", "memcpy", "GB/s", "ratio"
    );
    for (i, bytes) in SIZES.iter().enumerate() {
        let ar = times.iter().map(|t| t[i]).max().unwrap_or_default();
        let mc = time_memcpy(*bytes);
        let gbs = |d: Duration| *bytes as f64 / d.as_secs_f64() / 1e9;
        let size = if *bytes >= 1 << 20 {
            format!("{} MiB", bytes >> 20)
        } else {
            format!("{} KiB", bytes >> 10)
        };
        println!(
            "{size:>10} {:>11.1} µs {:>12.2} {:>11.1} µs {:>12.2} {:>7.1}x",
            ar.as_secs_f64() * 1e6,
            gbs(ar),
            mc.as_secs_f64() * 1e6,
            gbs(mc),
            ar.as_secs_f64() / mc.as_secs_f64()
        );
    }
}
