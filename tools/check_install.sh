#!/usr/bin/env bash
# The README's install section, tested as written: its first ```bash block under "## Install"
# runs line by line (bash -e) in a fresh copy of the source tree, so it creates a fresh
# virtual environment there, installs torch and the build tools into it and builds fused_ops
# (CPU kernels only unless FUSED_OPS_CUDA=1 is set: this checks the install path, not the
# kernels). Then, with that environment's python: an op from outside the source tree, and
# an import from inside it (where the unbuilt source folder shadows the installed package).
#
#   tools/check_install.sh        (CI runs it: .ci/run)
#
# PYTHON picks the interpreter that makes the venv (default python3). The torch download
# comes from pip's cache when the machine installed the same torch before.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d /tmp/fused_ops_install.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
export FUSED_OPS_CUDA="${FUSED_OPS_CUDA:-0}"
unset PYTHONPATH

# The tree as a user gets it: the files git tracks, as they are now (no build outputs).
mkdir "$WORK/src"
(cd "$ROOT" && git ls-files -z | xargs -0 tar -cf -) | tar -xf - -C "$WORK/src"

"$PYTHON" - "$ROOT/README.md" > "$WORK/steps.sh" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
section = text.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
block = re.search(r"```bash\n(.*?)```", section, re.S)
if not block:
    sys.exit("check_install: no ```bash block in the README's Install section")
print(block.group(1))
PY
echo "check_install: the README's install steps, in $WORK/src:"
sed 's/^/    /' "$WORK/steps.sh"

cd "$WORK/src"
start=$(date +%s)
# python3 in the README is the interpreter chosen here.
PATH="$(dirname "$(command -v "$PYTHON")"):$PATH" bash -euxo pipefail "$WORK/steps.sh"
echo "check_install: the steps took $(( $(date +%s) - start )) s"

VPY="$WORK/src/.venv/bin/python"
test -x "$VPY" || { echo "check_install: the steps made no .venv"; exit 1; }
(cd /tmp && "$VPY" - <<'PY'
import os, torch, torch.nn.functional as F, fused_ops
assert "site-packages" in fused_ops.__file__, fused_ops.__file__
x = torch.randn(64, 33, dtype=torch.float64)
torch.testing.assert_close(fused_ops.gelu(x), F.gelu(x))
torch.testing.assert_close(fused_ops.softmax(x, -1), torch.softmax(x, -1))
print(f"check_install: outside the tree, {fused_ops.__file__}: gelu and softmax match torch")
PY
)
out="$("$VPY" -m fused_ops.info 2>&1)"
grep -q "using the installed fused_ops" <<<"$out" || { echo "$out"; echo "check_install: no warning from the source tree"; exit 1; }
grep -q "^fused_ops 0\.1\.0 .*site-packages/fused_ops" <<<"$out" || { echo "$out"; echo "check_install: the source tree did not load the installed build"; exit 1; }
echo "check_install: inside the source tree, python -m fused_ops.info loads the installed build (with its warning)"
echo "check_install: PASS"
