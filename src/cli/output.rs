//! What the commands show the user: lines and progress bars on stderr
//! (hidden with `--quiet`), the hub's notes and downloads, the
//! interpreter's profiles.

use crate::interp::{self, Precision};

static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set as a command starts, from `-q/--quiet`.
pub(crate) fn set_quiet(q: bool) {
    QUIET.store(q, std::sync::atomic::Ordering::Relaxed);
}

/// Whether `-q/--quiet` was given.
pub fn quiet() -> bool {
    QUIET.load(std::sync::atomic::Ordering::Relaxed)
}

/// A line for the user on stderr (progress, summaries), unless `--quiet`.
pub fn say(line: &str) {
    if !quiet() {
        eprintln!("{line}");
    }
}

/// Where progress bars draw: stderr, or nowhere with `--quiet`.
pub(crate) fn draw_target() -> indicatif::ProgressDrawTarget {
    if quiet() {
        indicatif::ProgressDrawTarget::hidden()
    } else {
        indicatif::ProgressDrawTarget::stderr()
    }
}

/// The hub's notes as lines on stderr (always: they say what is about to be
/// downloaded, or warn), its downloads as a progress bar per file (hidden
/// with `--quiet`).
pub(crate) fn hub_events() -> crate::checkpoint::hub::HubEvents {
    use crate::checkpoint::hub::{HubEvent, HubEvents};
    let bar: std::sync::Mutex<Option<indicatif::ProgressBar>> = std::sync::Mutex::new(None);
    HubEvents::new(move |e| match e {
        HubEvent::Note(m) => eprintln!("{m}"),
        HubEvent::Bytes { file, done, total } => {
            let mut b = bar.lock().unwrap_or_else(|p| p.into_inner());
            let b = b.get_or_insert_with(|| {
                let b = indicatif::ProgressBar::with_draw_target(Some(total), draw_target());
                if let Ok(style) = indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                ) {
                    b.set_style(style.progress_chars("=> "));
                }
                b.set_message(file.to_string());
                b
            });
            b.set_position(done);
        }
        HubEvent::Finished { ok, .. } => {
            if let Some(b) = bar.lock().unwrap_or_else(|p| p.into_inner()).take() {
                if ok {
                    b.finish_and_clear();
                } else {
                    b.abandon();
                }
            }
        }
    })
}

/// A run's profile on stderr, one line per measure.
pub(crate) fn print_profile(p: &interp::Profile) {
    eprint!("{p}");
}

/// The interpreter in `precision` with `settings`, its profiles printed.
pub(crate) fn mil(precision: Precision, settings: interp::Settings) -> crate::exec::MilExecutor {
    crate::exec::MilExecutor {
        precision,
        settings,
        on_profile: Some(print_profile),
    }
}
