//! Tests of the parsers, the accounting and the `powermetrics` driver (the
//! driver against a shell stand-in for `powermetrics`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::plist::StreamReader;
use super::powermetrics::unrecognized_sampler;
use super::*;
use crate::error::Error;

fn data(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/mac")
            .join(name),
    )
    .unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

/// A figure that is there and close to `b`.
fn has(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| close(a, b))
}

/// The recordings `make mac-check` makes on a Mac (tests/mac-check.sh
/// runs this test after recording; it fails where they are absent).
#[test]
#[ignore = "needs the recordings of `make mac-check`, made on a Mac"]
fn reads_recordings_from_a_mac() {
    let chip = chip_name(&data("recorded/system_profiler_hardware.xml")).unwrap();
    assert!(chip.starts_with("Apple M"), "{chip}");
    let st = powermetrics_stream(&data("recorded/powermetrics_samples.plist")).unwrap();
    assert_eq!(st.samples.len(), 5, "powermetrics -n 5");
    for s in &st.samples {
        assert!(s.elapsed_ns > 50_000_000 && s.ane_mj.is_finite() && s.ane_mj >= 0.0);
    }
    assert!(mean_power(&st.samples).unwrap().samples == 5);
}

#[test]
fn reads_the_chip() {
    assert_eq!(
        chip_name(&data("system_profiler_hardware.xml")).unwrap(),
        "Apple M2 Pro (Mac14,10)"
    );
    let e = chip_name(b"<plist version=\"1.0\"><array/></plist>").unwrap_err();
    assert_eq!(e, PlistError::NoHardware);
    assert!(e.to_string().contains("no SPHardwareDataType"));
    assert!(matches!(
        chip_name(b"garbage"),
        Err(PlistError::HardwareNotPlist(_))
    ));
    assert_eq!(
        chip_name(b"<plist version=\"1.0\"><array><dict><key>_dataType</key><string>SPHardwareDataType</string><key>_items</key><array><dict/></array></dict></array></plist>"),
        Err(PlistError::NoChip)
    );
}

#[test]
fn reads_energy_samples() {
    let st = powermetrics_stream(&data("powermetrics_samples.plist")).unwrap();
    assert!(!st.incomplete_tail);
    let s = st.samples;
    assert_eq!(s.len(), 3);
    assert_eq!(s[0].elapsed_ns, 102_345_000);
    // Mean power (mW) times the sample's length.
    let t = 0.102_345;
    assert!(close(s[0].ane_mj, 136.8 * t) && has(s[0].cpu_mj, 693.6 * t));
    assert!(has(s[0].gpu_mj, 29.3 * t));
    assert!(close(s[2].ane_mj, 152.2 * 0.101_002));
    let p = mean_power(&s).unwrap();
    let mw = (136.8 * 0.102_345 + 148.7 * 0.100_871 + 152.2 * 0.101_002) / 0.304_218;
    assert!(close(p.ane_mw, mw) && p.samples == 3);
    let e = powermetrics_stream(b"<plist version=\"1.0\"><dict/></plist>\0").unwrap_err();
    assert_eq!(e, PlistError::NoElapsed(0));
    assert!(e.to_string().contains("elapsed_ns"));
}

fn doc(elapsed_ns: u64, processor: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<plist version=\"1.0\">\n<dict>\n\
             <key>elapsed_ns</key><integer>{elapsed_ns}</integer>\n\
             <key>processor</key><dict>{processor}</dict>\n</dict>\n</plist>\n"
    )
}

#[test]
fn power_only_samples_are_power_times_time() {
    // 250 ms at 40 mW (ANE) and 1200 mW (CPU): 10 mJ and 300 mJ.
    let d = doc(
        250_000_000,
        "<key>ane_power</key><real>40</real><key>cpu_power</key><real>1200</real>",
    );
    let s = powermetrics_stream(d.as_bytes()).unwrap().samples;
    assert!(close(s[0].ane_mj, 10.0) && has(s[0].cpu_mj, 300.0));
    // A unit the sample does not give is unknown, not 0.
    assert_eq!(s[0].gpu_mj, None);
    let p = mean_power(&s).unwrap();
    assert!(has(p.cpu_mw, 1200.0) && p.gpu_mw.is_none());
    // The power key (exact) wins over the energy key (rounded to mJ).
    let d = doc(
        250_000_000,
        "<key>ane_energy</key><integer>7</integer><key>ane_power</key><real>27.6</real>",
    );
    assert!(close(
        powermetrics_stream(d.as_bytes()).unwrap().samples[0].ane_mj,
        6.9
    ));
    // macOS 12: energies only.
    let d = doc(
        250_000_000,
        "<key>ane_energy</key><integer>7</integer><key>gpu_energy</key><integer>2</integer>\
             <key>dram_energy</key><integer>9</integer><key>package_energy</key><integer>90</integer>",
    );
    let s = powermetrics_stream(d.as_bytes()).unwrap().samples;
    assert_eq!((s[0].ane_mj, s[0].gpu_mj), (7.0, Some(2.0)));
    // The GPU only under `gpu`.
    let d = doc(100_000_000, "<key>ane_energy</key><integer>1</integer>").replace(
        "</dict>\n</dict>",
        "</dict><key>gpu</key><dict><key>gpu_energy</key><integer>4</integer></dict>\n</dict>",
    );
    assert_eq!(
        powermetrics_stream(d.as_bytes()).unwrap().samples[0].gpu_mj,
        Some(4.0)
    );
    // Neither: an error that says which sampler to run.
    let d = doc(250_000_000, "<key>cpu_energy</key><integer>7</integer>");
    let e = powermetrics_stream(d.as_bytes()).unwrap_err();
    assert_eq!(e, PlistError::NoAneEnergy(0));
    assert!(e.to_string().contains("ane_power"));
}

#[test]
fn a_sample_still_being_written_is_left_out() {
    let one = doc(100_000_000, "<key>ane_energy</key><integer>3</integer>");
    let two = doc(100_000_000, "<key>ane_energy</key><integer>4</integer>");
    // As powermetrics writes them: a NUL before each sample after the first.
    let whole = format!("{one}\0{two}");
    let st = powermetrics_stream(whole.as_bytes()).unwrap();
    assert_eq!((st.samples.len(), st.incomplete_tail), (2, false));
    // The second sample cut anywhere before its `</plist>`: one sample
    // and an incomplete tail.
    for cut in (one.len() + 1..whole.trim_end().len()).step_by(7) {
        let st = powermetrics_stream(&whole.as_bytes()[..cut]).unwrap();
        assert_eq!(
            (st.samples.len(), st.incomplete_tail),
            (1, cut > one.len() + 1),
            "{cut}"
        );
    }
    // A NUL after the last sample changes nothing.
    assert_eq!(
        powermetrics_stream(format!("{whole}\0").as_bytes())
            .unwrap()
            .samples
            .len(),
        2
    );
    // A damaged sample followed by a NUL is an error, named by index.
    let bad = format!("{one}\0{}\0{two}", &two[..40]);
    let e = powermetrics_stream(bad.as_bytes()).unwrap_err();
    assert!(
        matches!(e, PlistError::SampleNotPlist { index: 1, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("sample 1"));
}

#[test]
fn reading_a_growing_stream_in_pieces_gives_the_same_samples() {
    let whole = (0..4)
        .map(|i| {
            doc(
                100_000_000 + i,
                &format!("<key>ane_energy</key><integer>{i}</integer>"),
            )
        })
        .collect::<Vec<_>>()
        .join("\0");
    let bytes = whole.as_bytes();
    let all = powermetrics_stream(bytes).unwrap().samples;
    assert_eq!(all.len(), 4);
    for step in [1, 7, 64, 333] {
        let mut r = StreamReader::default();
        let mut end = 0;
        while end < bytes.len() {
            end = (end + step).min(bytes.len());
            r.feed(&bytes[r.consumed as usize..end]).unwrap();
            let (seen, _) = r.visible();
            assert_eq!(seen[..], all[..seen.len()], "step {step}, end {end}");
        }
        assert_eq!(r.visible(), (all.clone(), false));
    }
}

#[test]
fn energy_per_image_is_busy_power_times_time() {
    let p = |ane, cpu, gpu| Power {
        ane_mw: ane,
        cpu_mw: Some(cpu),
        gpu_mw: gpu,
        seconds: 1.0,
        samples: 10,
    };
    let e = energy_per_image(
        p(500.0, 900.0, Some(30.0)),
        p(20.0, 400.0, Some(10.0)),
        40,
        2.0,
    );
    assert_eq!(e.seconds_per_image, 0.05);
    assert!(close(e.total.ane_mj, 25.0) && has(e.total.cpu_mj, 45.0));
    assert!(close(e.above_idle.ane_mj, 24.0) && has(e.above_idle.gpu_mj, 1.0));
    // No GPU figure while busy or while idle: none per image.
    let e = energy_per_image(p(500.0, 900.0, None), p(20.0, 400.0, Some(10.0)), 40, 2.0);
    assert_eq!((e.total.gpu_mj, e.above_idle.gpu_mj), (None, None));
    let m = mean_power(&[
        EnergySample {
            elapsed_ns: 100_000_000,
            ane_mj: 4.0,
            cpu_mj: Some(0.0),
            gpu_mj: Some(1.0),
        },
        EnergySample {
            elapsed_ns: 300_000_000,
            ane_mj: 8.0,
            cpu_mj: None,
            gpu_mj: Some(1.0),
        },
    ])
    .unwrap();
    assert!(close(m.ane_mw, 30.0) && has(m.gpu_mw, 5.0) && close(m.seconds, 0.4));
    // One sample without the CPU's figure: no CPU mean.
    assert_eq!(m.cpu_mw, None);
    assert_eq!(mean_power(&[]), None);
}

/// A stand-in for `powermetrics` taking its arguments: every 50 ms a
/// sample of 50 ms, written in two halves after a NUL (none before the
/// first), as powermetrics does; ANE 5 mJ for a sample that began when
/// the file `busy` beside the script existed, 1 mJ otherwise; the CPU
/// as 200 mW (power only); the GPU 1 mJ under `gpu`, whose dictionary
/// repeats a key as recorded output does. SIGINT ends it.
#[cfg(unix)]
fn stand_in(dir: &Path, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("powermetrics");
    std::fs::write(&p, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// The wait for a stand-in's first sample: ample on a loaded machine.
#[cfg(unix)]
const FIRST: Duration = Duration::from_secs(20);

#[cfg(unix)]
const SAMPLER: &str = r#"
while [ $# -gt 0 ]; do
  case "$1" in -o) out=$2; shift ;; esac
  shift
done
trap 'exit 0' INT
busy="$(dirname "$0")/busy"
n=0
: > "$out"
while :; do
  if [ -e "$busy" ]; then ane=5; else ane=1; fi
  sleep 0.04
  if [ $n -gt 0 ]; then printf '\000' >> "$out"; fi
  printf '<?xml version="1.0" encoding="UTF-8"?>\n<plist version="1.0">\n<dict>\n<key>elapsed_ns</key><integer>50000000</integer>\n<key>processor</key>\n<dict>\n<key>ane_energy</key><integer>%s</integer>\n' "$ane" >> "$out"
  sleep 0.01
  printf '<key>cpu_power</key><real>200.0</real>\n</dict>\n<key>gpu</key><dict><key>idle_ratio</key><real>0.9</real><key>idle_ratio</key><real>0.9</real><key>gpu_energy</key><integer>1</integer></dict>\n</dict>\n</plist>\n' >> "$out"
  n=$((n+1))
done
"#;

#[cfg(unix)]
#[test]
fn measures_a_running_sampler() {
    let dir = tempfile::tempdir().unwrap();
    let mut pm = PowerMetrics::start_program(&stand_in(dir.path(), SAMPLER), 50, FIRST).unwrap();
    let s = pm.wait_for(3, Duration::from_secs(20)).unwrap();
    let idle = mean_power(&s[..3]).unwrap();
    assert!(close(idle.ane_mw, 20.0) && has(idle.cpu_mw, 200.0) && has(idle.gpu_mw, 20.0));
    // Busy from here: the sample in progress began idle, so counting it
    // (or any sample that began before the loop) would lower the power.
    std::fs::write(dir.path().join("busy"), "").unwrap();
    let mut calls = 0;
    let e = pm
        .measure(idle, 4, 5, || {
            calls += 1;
            std::thread::sleep(Duration::from_millis(15));
            Ok(())
        })
        .unwrap();
    assert_eq!(e.images, calls);
    assert!(calls >= 4 && e.busy.samples >= 5);
    assert!(e.seconds_per_image >= 0.015);
    assert!(close(e.busy.ane_mw, 100.0) && has(e.busy.cpu_mw, 200.0));
    let t = e.seconds_per_image;
    assert!(close(e.total.ane_mj, 100.0 * t) && close(e.above_idle.ane_mj, 80.0 * t));
    assert!(has(e.above_idle.cpu_mj, 0.0) && has(e.above_idle.gpu_mj, 0.0));
    // An error from the work ends the measurement with that error.
    let err = pm
        .measure(idle, 1, 5, || Err(Error::Invalid("predict failed".into())))
        .unwrap_err();
    assert!(err.to_string().contains("predict failed"));
    let pid = pm.pid().unwrap();
    let st = pm.stop().unwrap();
    assert!(st.samples.len() >= 3 + 2 + 5);
    // SAFETY: signal 0 only asks whether the process exists.
    assert_eq!(
        unsafe { libc::kill(pid as i32, 0) },
        -1,
        "the sampler was stopped"
    );
}

#[cfg(unix)]
#[test]
fn a_sampler_that_fails_is_named_with_what_it_printed() {
    let dir = tempfile::tempdir().unwrap();
    let p = stand_in(
        dir.path(),
        "echo 'powermetrics must be invoked as the superuser' >&2\nexit 1\n",
    );
    let e = PowerMetrics::start_program(&p, 50, FIRST)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("exited") && e.contains("before its first sample") && e.contains("superuser"),
        "{e}"
    );
    let e = PowerMetrics::start_program(&dir.path().join("absent"), 50, FIRST)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("absent") && e.contains("powermetrics"), "{e}");
}

#[test]
fn reads_the_sampler_named_unknown() {
    for (says, name) in [
        (
            "powermetrics: unrecognized sampler: ane_power\n",
            Some("ane_power"),
        ),
        (
            "Unrecognized sampler: gpu_power, exiting",
            Some("gpu_power"),
        ),
        ("powermetrics: unrecognized sampler:", None),
        ("powermetrics must be invoked as the superuser", None),
    ] {
        assert_eq!(unrecognized_sampler(says), name, "{says}");
    }
}

/// Refuses to start with the ane_power sampler, as a powermetrics that
/// lacks it does, and keeps its arguments in `args`.
#[cfg(unix)]
const NO_ANE_SAMPLER: &str = r#"
echo "$@" > "$(dirname "$0")/args"
case ",$2," in *,ane_power,*)
  echo 'powermetrics: unrecognized sampler: ane_power' >&2; exit 64 ;;
esac
"#;

#[cfg(unix)]
#[test]
fn a_sampler_this_powermetrics_lacks_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let p = stand_in(dir.path(), &format!("{NO_ANE_SAMPLER}{SAMPLER}"));
    let mut pm = PowerMetrics::start_program(&p, 50, FIRST).unwrap();
    assert_eq!(pm.samplers(), ["cpu_power", "gpu_power"]);
    // The user is told, by the caller: one warning naming the sampler.
    assert_eq!(pm.warnings.len(), 1, "{:?}", pm.warnings);
    assert!(
        pm.warnings[0].contains("no `ane_power` sampler")
            && pm.warnings[0].contains("cpu_power,gpu_power"),
        "{:?}",
        pm.warnings
    );
    let args = std::fs::read_to_string(dir.path().join("args")).unwrap();
    assert!(
        args.starts_with("--samplers cpu_power,gpu_power -f plist"),
        "{args}"
    );
    // The ANE's energy comes from cpu_power's processor dictionary.
    let s = pm.wait_for(2, Duration::from_secs(20)).unwrap();
    assert!(close(mean_power(&s).unwrap().ane_mw, 20.0));
    drop(pm);
    // cpu_power itself is never dropped: the error is the refusal.
    let q = stand_in(
        dir.path(),
        "echo 'powermetrics: unrecognized sampler: cpu_power' >&2\nexit 64\n",
    );
    let e = PowerMetrics::start_program(&q, 50, FIRST)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("exited") && e.contains("sampler: cpu_power"),
        "{e}"
    );
}

#[cfg(unix)]
#[test]
fn a_silent_sampler_does_not_hang_the_benchmark_and_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    // Silent from the start: an error at start, and no process left.
    let p = stand_in(
        dir.path(),
        "echo $$ > \"$(dirname \"$0\")/pid\"\ntrap 'exit 0' INT\nwhile :; do sleep 0.05; done\n",
    );
    let e = PowerMetrics::start_program(&p, 50, Duration::from_secs(2))
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            Error::Bench(BenchError::TooFewSamples {
                got: 0,
                want: 1,
                ..
            })
        ),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(e.contains("wrote 0 of 1 samples"), "{e}");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: signal 0 only asks whether the process exists.
    assert_eq!(unsafe { libc::kill(pid, 0) }, -1, "stopped at start");
    // Silent after its first sample: an error while measuring.
    let p = stand_in(
        dir.path(),
        r#"
while [ $# -gt 0 ]; do
  case "$1" in -o) out=$2; shift ;; esac
  shift
done
trap 'exit 0' INT
printf '<?xml version="1.0"?><plist version="1.0"><dict><key>elapsed_ns</key><integer>50000000</integer><key>processor</key><dict><key>ane_energy</key><integer>1</integer></dict></dict></plist>\n' > "$out"
while :; do sleep 0.05; done
"#,
    );
    let mut pm = PowerMetrics::start_program(&p, 50, FIRST).unwrap();
    let idle = Power {
        ane_mw: 0.0,
        cpu_mw: None,
        gpu_mw: None,
        seconds: 1.0,
        samples: 1,
    };
    let e = pm
        .measure(idle, 1, 1, || {
            std::thread::sleep(Duration::from_millis(5));
            Ok(())
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("wrote no sample"), "{e}");
    let pid = pm.pid().unwrap();
    drop(pm);
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::kill(pid as i32, 0) },
        -1,
        "dropping stopped the sampler"
    );
}
