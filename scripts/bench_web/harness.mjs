// The timing loop every system of scripts/bench_web.py shares (bundled into each system's page).
// A system is `build(data) -> {step(i) -> Promise<loss>, info}`; `data` is the model's JSON from
// the bench (initial parameters by aot's names, the batches, the learning rate). Every step awaits
// its loss on the host, so each system finishes its step's GPU (or CPU) work before the next.

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  return n % 2 ? s[n >> 1] : (s[n / 2 - 1] + s[n / 2]) / 2;
};

export async function bench(build) {
  const q = new URLSearchParams(location.search);
  const model = q.get("model");
  const steps = Number(q.get("steps") || 20);
  const budgetMs = Number(q.get("budget_ms") || 20000);
  const data = await (await fetch(`data/${model}.json`)).json();
  let t = performance.now();
  const sys = await build(data, q);
  const createMs = performance.now() - t;
  const losses = [];
  t = performance.now();
  losses.push(await sys.step(0));
  const firstStepMs = performance.now() - t;
  t = performance.now();
  losses.push(await sys.step(1)); // a second untimed step: lazy work some systems leave for it
  const secondStepMs = performance.now() - t;
  const times = [];
  const start = performance.now();
  for (let i = 2; i < steps + 2; i++) {
    t = performance.now();
    losses.push(await sys.step(i));
    times.push(performance.now() - t);
    if (performance.now() - start > budgetMs && times.length >= 3) break;
  }
  const profile = sys.after ? await sys.after() : undefined;
  return { profile, createMs, firstStepMs, secondStepMs, stepMs: median(times), times, steps: times.length, losses, ...sys.info };
}

/** {name: [dtype, shape, Float32Array | Int32Array]} of batch i (cycled). */
export function typed(batch) {
  return Object.fromEntries(Object.entries(batch).map(([k, [dtype, shape, v]]) =>
    [k, [dtype, shape, dtype === "i32" ? Int32Array.from(v) : Float32Array.from(v)]]));
}

export function main(build) {
  bench(build).then(
    (r) => { window.result = r; },
    (e) => { window.result = { error: String((e && e.stack) || e) }; },
  );
}
