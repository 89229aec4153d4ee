//! Host work ahead of execution: a stream of inputs whose host work
//! (decoding, preprocessing, host inputs: [`super::Runtime::prepare`]) runs
//! on worker threads while one thread executes them in input order
//! ([`super::Runtime::execute`]), so the executor is never kept waiting on
//! the host. What `ane-run embed` runs; a library caller embedding a stream
//! uses it the same way.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::Duration;

/// Each item's host work and then `finish`, in turn, until the items end,
/// `finish` says stop (false), or reading an item fails (that error).
pub fn in_turn<T, R>(
    items: impl Iterator<Item = std::io::Result<T>>,
    prepare: impl Fn(&T) -> R,
    mut finish: impl FnMut(T, R) -> bool,
) -> Option<std::io::Error> {
    for item in items {
        match item {
            Ok(t) => {
                let r = prepare(&t);
                if !finish(t, r) {
                    return None;
                }
            }
            Err(e) => return Some(e),
        }
    }
    None
}

/// [`in_turn`] with `jobs` threads doing the host work (`prepare`) ahead
/// while `finish` runs on this thread, in input order. At most `2 * jobs`
/// items are between being read and the end of their `finish`: the reading
/// thread takes a token for each item it hands out, and a token comes back
/// when that item is finished. The reading thread is not scoped: when
/// `finish` stops the run it may be waiting on stdin, and is left to end
/// with the process (or at its next token).
pub fn overlapped<T: Send + 'static, R: Send>(
    items: Box<dyn Iterator<Item = std::io::Result<T>> + Send>,
    jobs: usize,
    prepare: impl Fn(&T) -> R + Sync,
    mut finish: impl FnMut(T, R) -> bool,
) -> Option<std::io::Error> {
    let window = 2 * jobs;
    let (token_tx, token_rx) = mpsc::sync_channel::<()>(window);
    for _ in 0..window {
        let _ = token_tx.send(());
    }
    let (item_tx, item_rx) = mpsc::sync_channel::<(usize, T)>(jobs);
    let (res_tx, res_rx) = mpsc::sync_channel::<(usize, T, R)>(jobs);
    let item_rx = Mutex::new(item_rx);
    let stop = AtomicBool::new(false);
    let source = std::thread::spawn(move || -> Option<std::io::Error> {
        let mut items = items;
        for i in 0.. {
            if token_rx.recv().is_err() {
                return None;
            }
            match items.next() {
                None => return None,
                Some(Err(e)) => return Some(e),
                Some(Ok(t)) => {
                    if item_tx.send((i, t)).is_err() {
                        return None;
                    }
                }
            }
        }
        None
    });
    std::thread::scope(|s| {
        for _ in 0..jobs {
            let (res_tx, item_rx, prepare, stop) = (res_tx.clone(), &item_rx, &prepare, &stop);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let next = item_rx
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .recv_timeout(Duration::from_millis(50));
                    let (i, t) = match next {
                        Ok(v) => v,
                        Err(mpsc::RecvTimeoutError::Timeout) => continue,
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    };
                    let r = prepare(&t);
                    if res_tx.send((i, t, r)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(res_tx);
        let mut pending = BTreeMap::new();
        let mut next = 0usize;
        // Leaving the loop drops the receiver, so no worker stays blocked.
        'results: for (i, t, r) in res_rx {
            pending.insert(i, (t, r));
            while let Some((t, r)) = pending.remove(&next) {
                if !finish(t, r) {
                    stop.store(true, Ordering::Relaxed);
                    break 'results;
                }
                next += 1;
                let _ = token_tx.send(());
            }
        }
    });
    // Without tokens, a reading thread waiting for one returns.
    drop(token_tx);
    if stop.load(Ordering::Relaxed) {
        return None;
    }
    // Every item was taken, so the reading thread has ended.
    source.join().ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    type Items = Box<dyn Iterator<Item = std::io::Result<usize>> + Send>;

    #[test]
    fn overlapped_work_is_in_order_and_at_most_two_per_job_ahead() {
        let read = std::sync::Arc::new(AtomicUsize::new(0));
        let r = read.clone();
        let items: Items = Box::new((0..40).map(move |i| {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(i)
        }));
        let mut seen = Vec::new();
        let err = overlapped(
            items,
            2,
            |&i| {
                // The first item is slow: the others would pile up behind it.
                if i == 0 {
                    std::thread::sleep(Duration::from_millis(300));
                }
                i * 2
            },
            |i, r| {
                assert_eq!(r, i * 2);
                let ahead = read.load(Ordering::SeqCst) - i;
                assert!(ahead <= 4, "{ahead} items read ahead of item {i}");
                seen.push(i);
                true
            },
        );
        assert!(err.is_none());
        assert_eq!(seen, (0..40).collect::<Vec<_>>());
    }

    #[test]
    fn a_stop_ends_the_run_even_while_input_is_awaited() {
        // Items from a channel whose sender stays open: like stdin that
        // has not ended.
        let (tx, rx) = mpsc::channel::<usize>();
        for i in 0..10 {
            tx.send(i).unwrap();
        }
        let items: Items = Box::new(rx.into_iter().map(Ok));
        let mut seen = Vec::new();
        let err = overlapped(
            items,
            3,
            |&i| i,
            |i, _| {
                seen.push(i);
                i < 3
            },
        );
        assert!(err.is_none());
        assert_eq!(seen, [0, 1, 2, 3]);
        drop(tx);
        let mut seen = Vec::new();
        in_turn(
            (0..10).map(Ok),
            |&i| i,
            |i, _| {
                seen.push(i);
                i < 3
            },
        );
        assert_eq!(seen, [0, 1, 2, 3]);
    }

    #[test]
    fn an_input_that_cannot_be_read_ends_the_run_after_the_items_before_it() {
        let items = || -> Items {
            Box::new([Ok(0), Ok(1), Err(std::io::Error::other("not UTF-8")), Ok(3)].into_iter())
        };
        for overlap in [true, false] {
            let mut seen = Vec::new();
            let finish = |i, _| {
                seen.push(i);
                true
            };
            let e = if overlap {
                overlapped(items(), 2, |&i| i, finish)
            } else {
                in_turn(items(), |&i| i, finish)
            };
            assert_eq!(e.map(|e| e.to_string()).as_deref(), Some("not UTF-8"));
            assert_eq!(seen, [0, 1], "overlap {overlap}");
        }
    }
}
