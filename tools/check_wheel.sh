#!/usr/bin/env bash
# Builds a wheel of this tree against the installed torch, installs it into a fresh virtual
# environment and smoke-tests it from outside the source tree: the wheel's files, its
# Requires-Dist pin on the torch it was built with, an import, a CPU op against torch, and
# `python -m fused_ops.info`.
#
#   tools/check_wheel.sh        (CI runs it after `make test`: .ci/run)
#
# The build reuses build/ (after `make build` only the link runs again). The venv sees the
# system site-packages, so torch is not installed twice; the wheel is installed with
# --no-index, so a torch pin the environment does not satisfy fails here instead of
# downloading another torch.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d /tmp/fused_ops_wheel.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
unset PYTHONPATH

cd "$ROOT"
start=$(date +%s)
"$PYTHON" -m pip wheel -q --no-build-isolation --no-deps -w "$WORK/dist" .
whl="$(ls "$WORK"/dist/fused_ops-*.whl)"
echo "check_wheel: built $(basename "$whl") in $(( $(date +%s) - start )) s"

"$PYTHON" - "$whl" <<'PY'
import importlib.metadata, sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for want in ("fused_ops/__init__.py", "fused_ops/_build_info.py", "fused_ops/info.py",
             "fused_ops/_impl/__init__.py", "fused_ops/patch.py", "fused_ops/hf/__init__.py"):
    assert want in names, f"check_wheel: {want} is not in the wheel"
assert any(n.startswith("fused_ops/_C.") and n.endswith(".so") for n in names), \
    "check_wheel: no fused_ops/_C*.so in the wheel"
assert not any(n.startswith(("tests/", "csrc/", "benchmarks/")) for n in names), \
    "check_wheel: the wheel carries source-tree folders"
meta = zipfile.ZipFile(sys.argv[1]).read(
    next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
pin = f"Requires-Dist: torch=={importlib.metadata.version('torch')}"
assert pin in meta.splitlines(), f"check_wheel: the METADATA lacks '{pin}':\n{meta}"
assert "Provides-Extra: hf" in meta.splitlines(), f"check_wheel: no [hf] extra:\n{meta}"
print(f"check_wheel: {len(names)} files; METADATA has '{pin}'")
PY

"$PYTHON" -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --no-index "$whl"
cd /tmp  # not the source tree: its fused_ops/ would be found first
"$WORK/venv/bin/python" - "$WORK/venv" <<'PY'
import sys, torch, torch.nn.functional as F, fused_ops
assert fused_ops.__file__.startswith(sys.argv[1]), f"imported {fused_ops.__file__}"
x = torch.randn(32, 40, dtype=torch.float64)
torch.testing.assert_close(fused_ops.gelu(x, approximate="tanh"), F.gelu(x, approximate="tanh"))
y, mean, rstd = torch.ops.fused.layer_norm(x, [40])
torch.testing.assert_close(y, F.layer_norm(x, [40]))
print(f"check_wheel: {fused_ops.__file__}: gelu and layer_norm on CPU match torch")
PY
info="$("$WORK/venv/bin/python" -m fused_ops.info)"
echo "$info" | sed 's/^/    /'
grep -q "^fused_ops 0\.1\.0 .*$WORK/venv" <<<"$info" || { echo "check_wheel: info names another copy"; exit 1; }
echo "check_wheel: PASS"
