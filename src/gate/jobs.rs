//! Runs that may go side by side: the gates' executions of a tower, one
//! per image or case, largest first, the first alone on every thread and
//! the rest one per thread ([`run_jobs`]). A run of a few hundred patches
//! splits its products too finely over several threads, and its many small
//! ops run one after another; side by side, each thread runs a whole one
//! (BENCHMARKS.md, "The gate's cases side by side").

use crate::error::{Error, Result};

/// `jobs`, in the order given (largest first): the first alone on every
/// thread of the current pool (the artifact side's first run decodes the
/// package's weights for the others), the rest [`side_by_side`], one
/// thread each, when `concurrent` and the pool has several threads, else
/// one after another. Returns the results in the order of `jobs`, and the
/// most jobs that ran at once.
pub(crate) fn run_jobs<J: Sync, R: Send>(
    jobs: &[J],
    concurrent: bool,
    run: &(dyn Fn(&J) -> Result<R> + Sync),
    label: &(dyn Fn(&J) -> String + Sync),
    progress: &dyn Fn(&str),
) -> Result<(Vec<R>, usize)> {
    // Each start told as `label [k/n, ~ETA left]`.
    let (started, t0, n) = (
        std::cell::Cell::new(0usize),
        std::time::Instant::now(),
        jobs.len(),
    );
    let progress = &|m: &str| {
        let k = started.get() + 1;
        started.set(k);
        progress(&format!("{m} [{k}/{n}{}]", eta(t0.elapsed(), k - 1, n)));
    };
    let rest = jobs.get(1..).unwrap_or_default();
    let workers = if concurrent {
        rayon::current_num_threads().min(rest.len())
    } else {
        1
    };
    if workers <= 1 {
        let out = jobs
            .iter()
            .map(|j| {
                progress(&label(j));
                run(j)
            })
            .collect::<Result<Vec<_>>>()?;
        return Ok((out, usize::from(!jobs.is_empty())));
    }
    progress(&label(&jobs[0]));
    let first = run(&jobs[0])?;
    let mut others = side_by_side(rest, workers, run, label, progress)?;
    others.sort_by_key(|&(i, _)| i);
    let out = std::iter::once(first)
        .chain(others.into_iter().map(|(_, r)| r))
        .collect();
    Ok((out, workers))
}

/// What is left of `total` steps once `done` took `elapsed`, for progress
/// lines: `, ~1m20s left` (empty before the first step is done). The
/// gates' steps run largest first, so the estimate errs long.
pub(crate) fn eta(elapsed: std::time::Duration, done: usize, total: usize) -> String {
    if done == 0 || done >= total {
        return String::new();
    }
    let left = elapsed.as_secs_f64() * (total - done) as f64 / done as f64;
    let s = left.round() as u64;
    if s >= 60 {
        format!(", ~{}m{:02}s left", s / 60, s % 60)
    } else {
        format!(", ~{s}s left")
    }
}

/// `jobs` run `workers` at a time, each worker a rayon pool of one thread
/// of its own taking the next job as it frees up; `progress` (called on
/// this thread) hears of each job as it starts. Returns each job's index
/// and result, in the order they finished. The first error stops further
/// jobs from starting and is returned once the running ones finish.
fn side_by_side<J: Sync, R: Send>(
    jobs: &[J],
    workers: usize,
    run: &(dyn Fn(&J) -> Result<R> + Sync),
    label: &(dyn Fn(&J) -> String + Sync),
    progress: &dyn Fn(&str),
) -> Result<Vec<(usize, R)>> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    enum Msg<R> {
        Started(String),
        Done(usize, Result<R>),
    }
    let pools = (0..workers)
        .map(|_| rayon::ThreadPoolBuilder::new().num_threads(1).build())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Invalid(format!("the gate could not start its threads: {e}")))?;
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut out = Vec::new();
    let mut failed = None;
    std::thread::scope(|s| {
        for pool in &pools {
            let tx = tx.clone();
            let (next, stop) = (&next, &stop);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(j) = jobs.get(i) else {
                        break;
                    };
                    // A send fails only once the receiver is gone.
                    let _ = tx.send(Msg::Started(label(j)));
                    let r = pool.install(|| run(j));
                    if r.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    let _ = tx.send(Msg::Done(i, r));
                }
            });
        }
        drop(tx);
        for m in rx {
            match m {
                Msg::Started(l) => progress(&l),
                Msg::Done(i, Ok(r)) => out.push((i, r)),
                Msg::Done(_, Err(e)) => {
                    failed.get_or_insert(e);
                }
            }
        }
    });
    match failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every job runs once, on a thread of its own (one thread in its
    /// pool), at most `workers` at once; each is announced as it starts;
    /// an error stops the jobs not yet started and is returned.
    #[test]
    fn side_by_side_runs_every_job_once_one_thread_each() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let jobs: Vec<usize> = (0..24).collect();
        let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let run = |&j: &usize| -> Result<(usize, usize)> {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(5));
            running.fetch_sub(1, Ordering::SeqCst);
            Ok((j * j, rayon::current_num_threads()))
        };
        let started = std::sync::Mutex::new(Vec::new());
        let progress = |m: &str| started.lock().unwrap().push(m.to_string());
        let label = |j: &usize| format!("job {j}");
        let mut out = side_by_side(&jobs, 3, &run, &label, &progress).unwrap();
        out.sort_by_key(|&(i, _)| i);
        assert_eq!(out.len(), jobs.len());
        for (i, (sq, threads)) in out {
            assert_eq!((sq, threads), (i * i, 1), "job {i}");
        }
        let most = most.load(Ordering::SeqCst);
        assert!((2..=3).contains(&most), "{most} jobs at once");
        let mut started = started.into_inner().unwrap();
        started.sort();
        let mut want: Vec<String> = jobs.iter().map(label).collect();
        want.sort();
        assert_eq!(started, want);

        let ran = AtomicUsize::new(0);
        let failing = |&j: &usize| -> Result<usize> {
            ran.fetch_add(1, Ordering::SeqCst);
            if j == 2 {
                Err(Error::Invalid("job 2 failed".into()))
            } else {
                Ok(j)
            }
        };
        let err = side_by_side(&jobs, 2, &failing, &label, &|_| {}).unwrap_err();
        assert!(err.to_string().contains("job 2 failed"), "{err}");
        assert!(
            ran.load(Ordering::SeqCst) < jobs.len(),
            "jobs ran after the error"
        );
    }

    /// The first job runs alone on every thread of the pool, the rest one
    /// thread each when concurrent; one after another on the pool's
    /// threads otherwise; the results in the jobs' order either way.
    #[test]
    fn run_jobs_runs_the_first_alone_then_side_by_side() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let jobs: Vec<usize> = (0..6).collect();
        let run = |&j: &usize| -> Result<(usize, usize)> { Ok((j, rayon::current_num_threads())) };
        let label = |j: &usize| j.to_string();
        for concurrent in [true, false] {
            let (out, at_once) =
                pool.install(|| run_jobs(&jobs, concurrent, &run, &label, &|_| {}).unwrap());
            let threads: Vec<usize> = out.iter().map(|&(_, t)| t).collect();
            assert_eq!(out.iter().map(|&(j, _)| j).collect::<Vec<_>>(), jobs);
            if concurrent {
                assert_eq!((threads, at_once), (vec![2, 1, 1, 1, 1, 1], 2));
            } else {
                assert_eq!((threads, at_once), (vec![2; 6], 1));
            }
        }
        let none: Vec<usize> = Vec::new();
        assert_eq!(run_jobs(&none, true, &run, &label, &|_| {}).unwrap().1, 0);
    }

    #[test]
    fn eta_scales_the_time_per_step_to_what_is_left() {
        let d = std::time::Duration::from_secs(10);
        assert_eq!(eta(d, 0, 4), "");
        assert_eq!(eta(d, 4, 4), "");
        assert_eq!(eta(d, 1, 4), ", ~30s left");
        assert_eq!(eta(d, 1, 20), ", ~3m10s left");
    }
}
