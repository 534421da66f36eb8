#!/usr/bin/env bash
# The main job: build examples/sine_mlp.py with aot, make a wheel of the generated package,
# install that wheel into a fresh environment that has only wgpu + numpy (no aot), then
# train it with a progress bar and predict with it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}

OUT=$(mktemp -d)
.venv/bin/python -m aot build examples/sine_mlp.py -o "$OUT"
.venv/bin/python -m build --wheel --outdir "$OUT/dist" "$OUT/sine_mlp" >/dev/null
echo "demo: wheel $(ls "$OUT"/dist/*.whl)"

python3 -m venv "$OUT/deploy"
"$OUT/deploy/bin/python" -m pip install -q "$OUT"/dist/*.whl
"$OUT/deploy/bin/python" scripts/train_sine.py --steps ${STEPS:-1000} --checkpoint "$OUT/sine_mlp.npz"
