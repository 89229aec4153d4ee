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
#   5. Core AI (issue 52): the demo's .aimodel loaded by the OS's Core AI
#      runtime (USE_OS_COREAI=1, macOS 27) with the Neural Engine preferred,
#      one prediction, and the count of `*ANE_region_*` files its compiler
#      wrote (0 means a silent GPU or CPU fallback, as Core AI's users check
#      it). Where the OS keeps the compiled bundle is not documented: the
#      count is over files newer than the load under the user's temporary
#      and cache directories ($TMPDIR, DARWIN_USER_CACHE_DIR,
#      ~/Library/Caches), and the report lists where they were found. A
#      count of 0 can also mean the bundle is elsewhere: the paths say so;
#   6. record the tools' property lists into tests/data/mac/recorded/ (the
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

run build "$EXPORT" build --model golden/tiny-vlm --out "$ART" --force --format both
run gate "$EXPORT" gate "$ART" --executor coreml
run bench "$RUN" bench --artifact "$ART" --executor coreml --runs 10
# Core AI on the Neural Engine: one prediction of the smallest bucket, then
# the compiler's Neural Engine regions counted (see step 5 above).
coreai_regions() {
    local stamp=$OUT/coreai.stamp
    touch "$stamp"
    sleep 1
    USE_OS_COREAI=1 .venv/bin/python - "$ART/tiny-vlm.aimodel" <<'PY' || return 1
import asyncio, sys
import numpy as np
from coreai.authoring import AIModelAsset
from coreai.runtime import ComputeUnitKind, NDArray, SpecializationOptions

async def main(path):
    asset = AIModelAsset.load(path)
    opts = SpecializationOptions.from_preferred_compute_unit_kind(ComputeUnitKind.neural_engine())
    async with asset.executable(specialization_options=opts) as model:
        name = sorted(model.function_names)[0]
        f = model.load_function(name)
        feed = {}
        for n in f.desc.input_names:
            d = f.desc.input_descriptor(n)
            dtype = np.float16 if "16" in str(d.dtype) else np.float32
            feed[n] = NDArray(np.zeros(tuple(d.shape), dtype=dtype))
        out = await f(feed)
        print(f"ran {name} of {path} with the Neural Engine preferred: outputs {sorted(out)}")
        del out, f, feed

asyncio.run(main(sys.argv[1]))
PY
    local places=("${TMPDIR:-/tmp}" "$(getconf DARWIN_USER_CACHE_DIR 2>/dev/null)" "$HOME/Library/Caches")
    echo "searched for *ANE_region_* newer than the load under: ${places[*]}"
    local found
    found=$(find "${places[@]}" -newer "$stamp" -name '*ANE_region_*' 2>/dev/null)
    echo "ANE_region files: $(printf '%s' "$found" | grep -c . || true)"
    [ -n "$found" ] && printf '%s\n' "$found"
    return 0
}
run coreai_ane coreai_regions
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
    section gate "The three gates with --executor coreml (residency from MLComputePlan, cosine from Core ML; the .aimodel's with Core AI)"
    section coreai_ane "Core AI with the Neural Engine preferred: the compiled bundle's *ANE_region_* files (0: a fallback, or the bundle is elsewhere)"
    section bench "ane-run bench --executor coreml (CPU_ONLY, CPU_AND_NE, ALL)"
    section energy "ane-run bench --energy"
    section powermetrics "powermetrics samples (recorded into powermetrics_samples.plist)"
    section parsers "src/bench/plist.rs parsers on the recordings"
} >"$REPORT"

echo "wrote $REPORT and the recordings in $REC/; commit them." >&2
exit "$failed"
