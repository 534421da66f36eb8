#!/usr/bin/env bash
# The main job: build examples/sine_mlp.py with aot, make a wheel of the generated package,
# install that wheel into a fresh environment that has only wgpu + numpy (no aot), then
# train it with a progress bar (step_many: 50 steps per call) and predict with it; ends by
# writing a loss-curve PNG and printing its path.
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
"$OUT/deploy/bin/python" scripts/train_sine.py --steps ${STEPS:-1000} --checkpoint "$OUT/sine_mlp.npz" --losses "$OUT/losses.npy"
# the plot is drawn in aot's environment (matplotlib); the deployed one stays wgpu + numpy
.venv/bin/python scripts/plot_losses.py "$OUT/losses.npy" "$OUT/loss_curve.png" || echo "demo: no loss-curve plot (matplotlib is missing from .venv)"
