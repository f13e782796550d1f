#!/bin/sh
# Checks the Python SDK's wheel (make test-wheel): abi3, with the native
# extension inside; installed into a fresh venv, its `colocated` command
# serves (`colocated worker`) and reports (`colocated status`).
# Usage: wheel.sh WHEEL_DIR VENV PYTHON
set -eu
wheels=$1 venv=$2 python=$3
fail() { echo "wheel check: $*" >&2; exit 1; }
wheel=$(ls "$wheels"/colocated-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || fail "no wheel in $wheels"
case "$(basename "$wheel")" in *-abi3-*) ;; *) fail "$(basename "$wheel") is not abi3" ;; esac
"$python" -m zipfile -l "$wheel" | grep -q "colocated/_colocated.abi3.so" || fail "no native extension in the wheel"
"$python" -m zipfile -l "$wheel" | grep -q "entry_points.txt" || fail "no entry points in the wheel"
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel"
[ -x "$venv/bin/colocated" ] || fail "the colocated command is not installed"
"$venv/bin/colocated" status --help | grep -q "colocated status" || fail "colocated status --help"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$venv/bin/colocated" worker --insecure --listen 127.0.0.1:0 --cpu-devices 2 --exit-after-idle 20 \
  > "$out/worker" 2>/dev/null &
pid=$!
i=0
until grep -q "^listening on " "$out/worker"; do
  i=$((i + 1)); [ $i -gt 200 ] && { kill $pid; fail "the worker did not start"; }; sleep 0.1
done
address=$(sed -n 's/^listening on //p' "$out/worker")
env -u COLOCATED_TOKEN "$venv/bin/colocated" status "$address" > "$out/status" || { kill $pid; fail "colocated status $address"; }
kill $pid; wait $pid || true
grep -q "^$address  colocated .* 2 cpu devices .*python" "$out/status" || fail "unexpected status: $(cat "$out/status")"
echo "wheel check: $(basename "$wheel") ok (abi3, native code, colocated worker and status)"
