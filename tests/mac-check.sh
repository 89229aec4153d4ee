#!/usr/bin/env bash
# `make mac-check`: on a Mac with Apple silicon, produce in one command the
# evidence only a Mac can give, and write one report to commit.
#
#   1. build the demo artifact (the bundled tiny VLM, b1024 and b4096);
#   2. run the three release gates with `--executor coreml`: residency as
#      MLComputePlan measures it, cosine from Core ML on the Neural Engine;
#   3. `ane-run bench --executor coreml` over CPU_ONLY, CPU_AND_NE and ALL;
#   4. as root (directly or through sudo; MAC_CHECK_ENERGY=0 skips it):
#      `ane-run bench --energy`, and real `powermetrics` samples;
#   5. record the tools' property lists into tests/data/mac/recorded/ (the
#      parser tests' fixtures are hand-written until then) and the outputs
#      of every step, with the machine, in tests/data/mac/recorded/REPORT.md.
#
# Every figure it records is measured on the Mac it ran on. A step that fails
# is recorded with its exit code and the run goes on; the script exits 1 if
# any step failed. Anywhere but macOS it says so and exits 2, running nothing.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "$(uname -s)" != Darwin ]; then
    echo "make mac-check needs macOS on Apple silicon: it runs Core ML, MLComputePlan and the" >&2
    echo "Neural Engine, which this machine ($(uname -s) $(uname -m)) does not have. Nothing was run." >&2
    exit 2
fi
if [ "$(uname -m)" != arm64 ]; then
    echo "make mac-check needs Apple silicon (this Mac is $(uname -m)): Intel Macs have no Neural Engine." >&2
    exit 2
fi

OUT=out/mac-check
REC=tests/data/mac/recorded
ART=$OUT/tiny-vlm
REPORT=$REC/REPORT.md
mkdir -p "$OUT" "$REC"
failed=0

# run NAME CMD...: run a step, keep its output in $OUT/NAME.txt, note its exit.
run() {
    local name=$1
    shift
    echo "== $name: $*" >&2
    "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err"
    local rc=$?
    echo "$rc" >"$OUT/$name.rc"
    if [ "$rc" != 0 ]; then
        echo "   exit $rc (see $OUT/$name.err)" >&2
        failed=1
    fi
    return 0
}

make setup || { echo "make setup failed" >&2; exit 2; }
EXPORT=target/release/ane-export
RUN=target/release/ane-run

run build "$EXPORT" build --model golden/tiny-vlm --out "$ART" --force
run gate "$EXPORT" gate "$ART" --executor coreml
run bench "$RUN" bench --artifact "$ART" --executor coreml --runs 10
run system_profiler system_profiler -xml SPHardwareDataType
cp "$OUT/system_profiler.txt" "$REC/system_profiler_hardware.xml"
[ -f "$ART/gate/report.json" ] && cp "$ART/gate/report.json" "$REC/gate-report.json"

as_root=()
if [ "${MAC_CHECK_ENERGY:-1}" = 0 ]; then
    energy="skipped (MAC_CHECK_ENERGY=0)"
elif [ "$(id -u)" = 0 ]; then
    energy=yes
elif sudo -v; then
    energy=yes
    as_root=(sudo)
else
    energy="skipped (not root, and sudo was refused)"
fi
if [ "$energy" = yes ]; then
    run energy "${as_root[@]}" "$RUN" bench --artifact "$ART" --executor coreml --energy --runs 10
    # Real samples for the parser tests: the command ane-run bench runs, five samples.
    run powermetrics "${as_root[@]}" powermetrics --samplers ane_power,cpu_power,gpu_power \
        -f plist -b 0 -i 100 -n 5
    cp "$OUT/powermetrics.txt" "$REC/powermetrics_samples.plist"
    # The parsers of src/bench/plist.rs on what was just recorded.
    run parsers cargo test --release --locked --lib -- --ignored --exact bench::tests::reads_recordings_from_a_mac
fi

section() {
    local name=$1 title=$2
    echo "## $title"
    echo
    if [ ! -f "$OUT/$name.rc" ]; then
        echo "not run: $energy"
    else
        echo "exit code $(cat "$OUT/$name.rc")"
        echo
        echo '```'
        if [ "$name" = powermetrics ]; then
            echo "$(wc -c <"$OUT/$name.txt") bytes of plist, in $REC/powermetrics_samples.plist"
        else
            cat "$OUT/$name.txt"
        fi
        cat "$OUT/$name.err"
        echo '```'
    fi
    echo
}

{
    echo "# make mac-check: measured on a Mac"
    echo
    echo "Every figure below was measured on this Mac by \`make mac-check\` (tests/mac-check.sh)."
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "- macOS: $(sw_vers -productVersion) ($(sw_vers -buildVersion))"
    echo "- machine: $(sysctl -n hw.model 2>/dev/null), $(sysctl -n machdep.cpu.brand_string 2>/dev/null), $(($(sysctl -n hw.memsize) / 1073741824)) GiB"
    echo "- energy: $energy"
    echo
    section build "Build of the demo artifact"
    section gate "The three gates with --executor coreml (residency from MLComputePlan, cosine from Core ML)"
    section bench "ane-run bench --executor coreml (CPU_ONLY, CPU_AND_NE, ALL)"
    section energy "ane-run bench --energy"
    section powermetrics "powermetrics samples (recorded into powermetrics_samples.plist)"
    section parsers "src/bench/plist.rs parsers on the recordings"
} >"$REPORT"

echo "wrote $REPORT and the recordings in $REC/; commit them." >&2
exit "$failed"
