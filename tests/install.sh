#!/usr/bin/env bash
# The installed tool away from its checkout (`make test-install`, part of
# `make test`): `make install` into a temporary prefix, then, from another
# temporary directory holding only a copy of the bundled tiny VLM (standing
# for the user's own checkpoint), the user's job with the installed
# binaries and no path flags: build, gate (its default golden sets come from
# the installation), ane-run embed and ane-run vqa. Then the artifact and
# its checkpoint moved together, and a checkpoint that is gone, named.
# Nothing of the checkout is reachable from there: the binaries are copies
# under the prefix, the working directory is outside the checkout, and the
# variables that could point back are unset.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

make -C "$root" --no-print-directory install PREFIX="$prefix"

mkdir -p "$work/user"
cp -R "$root/golden/tiny-vlm" "$work/user/tiny-vlm"
cp "$root/golden/vqa/images/test-0000.png" "$work/user/photo.png"
cd "$work/user"
unset ANE_EXPORT_VENV ANE_EXPORT_HOME
export PATH="$prefix/bin:$PATH"

fail() { echo "test-install: $*" >&2; exit 1; }

[ "$(command -v ane-export)" = "$prefix/bin/ane-export" ] || fail "ane-export is not the installed one"
# The matrix products run on the pinned OpenBLAS in the installed venv, not the gemm crate.
ane-export --version > version.txt 2>&1
grep -q "^matrix products: OpenBLAS .*(libscipy_openblas.so)" version.txt || { cat version.txt; fail "the installed binary does not open the pinned OpenBLAS"; }
ane-export build --model tiny-vlm --out art
ane-export gate --artifact art > gate.txt || { cat gate.txt; fail "gate did not pass"; }
grep -q "artifact accepted" gate.txt || { cat gate.txt; fail "the artifact was not accepted"; }
grep -q "vqa: pass" gate.txt || { cat gate.txt; fail "the VQA gate did not pass"; }
# The package metadata names the model, never a path of this machine.
if grep -rq "$work" art/art.mlpackage; then fail "the package records a machine path"; fi

ane-run embed --artifact art photo.png --out emb > embed.jsonl
[ -f emb/photo.safetensors ] || fail "embed wrote no photo.safetensors"
answer="$(ane-run vqa --artifact art --image photo.png --question "what shape is in the image?")"
[ -n "$answer" ] || fail "vqa gave no answer"

# The artifact and its checkpoint moved together: still found, from anywhere.
mkdir -p "$work/moved"
mv art tiny-vlm "$work/moved/"
cd /
ane-run vqa --artifact "$work/moved/art" --image "$work/user/photo.png" \
    --question "what shape is in the image?" > /dev/null
# The checkpoint gone: the error names where it looked, exit 2.
mv "$work/moved/tiny-vlm" "$work/moved/elsewhere"
set +e
ane-run vqa --artifact "$work/moved/art" --image "$work/user/photo.png" \
    --question "what shape?" 2> "$work/err.txt"
rc=$?
set -e
[ "$rc" = 2 ] || fail "a missing checkpoint exited $rc, expected 2"
grep -q "tiny-vlm" "$work/err.txt" || { cat "$work/err.txt"; fail "the error does not name the path"; }

# A text encoder the same way: built, gated on the installed golden texts
# and labelled texts (accepted), and run.
cd "$work/user"
cp -R "$root/golden/models/tiny-minilm" "$work/user/minilm"
printf 'buckets:\n  - name: b80\n    tokens: 80\n  - name: b128\n    tokens: 128\n' > text-buckets.yaml
ane-export build --model minilm --buckets text-buckets.yaml --out text-art
ane-export gate text-art > text-gate.txt || { cat text-gate.txt; fail "the text encoder's gate did not pass"; }
grep -q "artifact accepted" text-gate.txt || { cat text-gate.txt; fail "the text encoder was not accepted"; }
grep -q "task: pass" text-gate.txt || { cat text-gate.txt; fail "the text task gate did not pass"; }
ane-run embed --artifact text-art --text "what color is the triangle?" --out text-emb > text.jsonl
[ -f text-emb/text-0000.safetensors ] || fail "embed --text wrote no text-0000.safetensors"
echo "test-install: installed binaries built, gated (accepted), embedded and answered away from the checkout ($answer); a text encoder built, gated (accepted) and embedded"
