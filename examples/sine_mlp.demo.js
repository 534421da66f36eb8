// The sine MLP's demo page (Program(web={"demo": "sine_mlp.demo.js"}); the page is index.html of
// `python -m aot build examples/sine_mlp.py --target web`): it trains on y = sin(x) for x drawn
// uniformly from [-pi, pi], and plots the fitted curve against sin(x) as it trains.

export const title = "fitting sin(x)";
export const about =
  "A 1-64-64-1 ReLU MLP learns y = sin(x) on [-π, π] from 256 random points per step (Adam, lr 5e-3). " +
  "Right: sin(x) in light grey, the model's prediction on 256 points in orange, redrawn as it trains.";
export const steps = 300; // the page's default (?steps=N overrides)
export const every = 10; // steps per call between redraws

const N = 256; // the training batch and the plotted points (predict takes B up to 256)

// a seeded generator (mulberry32): every visit trains on the same points
function generator(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The inputs of training step `step`: 256 points x uniform in [-pi, pi] and y = sin(x). */
export function batch(step) {
  const rand = generator(1000 + step);
  const x = new Float32Array(N), y = new Float32Array(N);
  for (let i = 0; i < N; i++) {
    x[i] = (2 * rand() - 1) * Math.PI;
    y[i] = Math.sin(x[i]);
  }
  return { x: { data: x, shape: [N, 1] }, y: { data: y, shape: [N, 1] } };
}

const grid = Float32Array.from({ length: N }, (_, i) => -Math.PI + (2 * Math.PI * i) / (N - 1));

/** Plots sin(x) and the model's prediction on a grid into `div`; returns the fit's errors. */
export async function show(model, div, { step }) {
  const out = await model.predict({ x: { data: grid, shape: [N, 1] } });
  let canvas = div.querySelector("canvas");
  if (!canvas) {
    div.innerHTML = '<canvas width="420" height="320"></canvas><p class="fit"></p>';
    canvas = div.querySelector("canvas");
  }
  const ctx = canvas.getContext("2d"), w = canvas.width, h = canvas.height, pad = 34;
  const px = (x) => pad + ((w - 2 * pad) * (x + Math.PI)) / (2 * Math.PI);
  const py = (y) => h / 2 - ((h / 2 - pad) * y) / 1.25;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, w, h);
  ctx.font = "12px system-ui, sans-serif";
  ctx.fillStyle = "#222";
  ctx.textAlign = "center";
  ctx.fillText(`the fit after ${step} steps`, w / 2, 16);
  ctx.fillText("x", w - pad + 14, py(0) + 4);
  // axes through 0, ticks at -pi, 0, pi and y = -1, 1
  ctx.strokeStyle = "#bbb";
  ctx.lineWidth = 1;
  ctx.beginPath();
  ctx.moveTo(pad, py(0));
  ctx.lineTo(w - pad, py(0));
  ctx.moveTo(px(0), pad - 6);
  ctx.lineTo(px(0), h - pad + 6);
  ctx.stroke();
  for (const [v, label] of [[-Math.PI, "-π"], [0, "0"], [Math.PI, "π"]]) ctx.fillText(label, px(v), h - pad + 18);
  ctx.textAlign = "right";
  for (const v of [-1, 1]) ctx.fillText(String(v), pad - 4, py(v) + 4);
  const curve = (ys, colour, width) => {
    ctx.strokeStyle = colour;
    ctx.lineWidth = width;
    ctx.beginPath();
    grid.forEach((x, i) => (i ? ctx.lineTo(px(x), py(ys[i])) : ctx.moveTo(px(x), py(ys[i]))));
    ctx.stroke();
  };
  // sin(x) wide and light underneath, so that it shows where the fit covers it
  curve(grid.map(Math.sin), "#c8c8c8", 7);
  curve(out.data, "#e8710a", 2.5);
  ctx.textAlign = "left";
  ctx.fillStyle = "#999";
  ctx.fillText("— sin(x)", w - 110, 34);
  ctx.fillStyle = "#e8710a";
  ctx.fillText("— the model", w - 110, 50);
  let sq = 0, worst = 0;
  out.data.forEach((v, i) => {
    const d = Math.abs(v - Math.sin(grid[i]));
    sq += d * d;
    worst = Math.max(worst, d);
  });
  const rms = Math.sqrt(sq / N);
  div.querySelector(".fit").textContent = `after ${step} steps: rms error ${rms.toFixed(4)}, largest ${worst.toFixed(4)}`;
  return { rms, worst };
}
