use std::sync::Arc;
use std::time::{Duration, Instant};

use half::bf16;

use super::{ShmComm, ShmConfig};
use crate::comm::{CommError, Communicator};

fn group(world: usize, slot_bytes: usize) -> Vec<ShmComm> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seg");
    let config = ShmConfig {
        slot_bytes,
        timeout: Duration::from_secs(5),
        join_timeout: Duration::from_secs(10),
        ..ShmConfig::default()
    };
    let handles: Vec<_> = (0..world)
        .map(|r| {
            let (path, config) = (path.clone(), config.clone());
            std::thread::spawn(move || ShmComm::join(&path, r, world, config).unwrap())
        })
        .collect();
    let comms = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        !path.exists(),
        "rank 0 removes the name once everyone joined"
    );
    comms
}

fn on_all<T: Send + 'static>(
    comms: Vec<ShmComm>,
    f: impl Fn(&ShmComm) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let f = f.clone();
            std::thread::spawn(move || f(&c))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn collectives_agree_bitwise_across_steps() {
    for world in [2, 3] {
        // 256-byte slots: 64 f32 per step, so 1000 values take 16 steps.
        let results = on_all(group(world, 256), move |c| {
            let r = c.rank();
            let mut sums = Vec::new();
            for n in [0usize, 1, 63, 64, 65, 1000] {
                let mut x: Vec<f32> = (0..n)
                    .map(|i| (i as f32 + 0.1) * (r as f32 + 1.3))
                    .collect();
                c.all_reduce_f32(&mut x).unwrap();
                let expected: Vec<f32> = (0..n)
                    .map(|i| {
                        (0..world).fold(0.0f32, |acc, q| {
                            let v = (i as f32 + 0.1) * (q as f32 + 1.3);
                            if q == 0 { v } else { acc + v }
                        })
                    })
                    .collect();
                assert_eq!(x, expected);
                sums.push(x);
                let mut h: Vec<bf16> = (0..n)
                    .map(|i| bf16::from_f32(i as f32 * 0.5 + r as f32))
                    .collect();
                c.all_reduce_bf16(&mut h).unwrap();
                for (i, v) in h.iter().enumerate() {
                    let e: f32 = (0..world)
                        .map(|q| bf16::from_f32(i as f32 * 0.5 + q as f32).to_f32())
                        .sum();
                    assert_eq!(*v, bf16::from_f32(e));
                }
            }
            // Uneven all-gather: rank q gives 70 + 30 q values equal to q.
            let counts: Vec<usize> = (0..world).map(|q| 70 + 30 * q).collect();
            let local = vec![r as f32; counts[r]];
            let mut out = vec![-1.0; counts.iter().sum()];
            c.all_gather_f32(&local, &counts, &mut out).unwrap();
            let expected: Vec<f32> = counts
                .iter()
                .enumerate()
                .flat_map(|(q, &n)| vec![q as f32; n])
                .collect();
            assert_eq!(out, expected);
            let mut b: Vec<f32> = (0..150).map(|i| (i * (r + 1)) as f32).collect();
            c.broadcast_f32(&mut b, world - 1).unwrap();
            assert_eq!(b, (0..150).map(|i| (i * world) as f32).collect::<Vec<_>>());
            c.barrier().unwrap();
            c.check_peers().unwrap();
            sums
        });
        assert!(results.windows(2).all(|w| w[0] == w[1]));
    }
}

#[test]
fn mismatched_collectives_are_errors_and_poison_the_group() {
    let results = on_all(group(2, 256), |c| {
        let first = if c.rank() == 0 {
            c.all_reduce_f32(&mut [1.0; 10])
        } else {
            c.all_reduce_f32(&mut [1.0; 11])
        };
        (
            first.map_err(|e| e.to_string()),
            c.barrier().is_err(),
            c.check_peers().is_err(),
        )
    });
    for (first, later, health) in results {
        let err = first.unwrap_err();
        assert!(err.contains("diverged") || err.contains("aborted"), "{err}");
        assert!(later && health);
    }
}

#[test]
fn a_missing_peer_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seg");
    let config = ShmConfig {
        join_timeout: Duration::from_millis(200),
        ..ShmConfig::default()
    };
    let err = ShmComm::join(&path, 0, 2, config.clone())
        .unwrap_err()
        .to_string();
    assert!(err.contains("did not join"), "{err}");
    let err = ShmComm::join(&path, 1, 2, config).unwrap_err().to_string();
    assert!(err.contains("did not appear"), "{err}");

    let mut comms = group(2, 256);
    comms[0].config.timeout = Duration::from_millis(300);
    let start = Instant::now();
    let err = comms[0].barrier().unwrap_err();
    assert!(matches!(err, CommError::Timeout { rank: 1, .. }), "{err}");
    assert!(start.elapsed() < Duration::from_secs(3));
    // The peer sees the abort instead of waiting out its own timeout.
    let err = comms[1].barrier().unwrap_err();
    assert!(matches!(err, CommError::Poisoned(_)), "{err}");
}
