// aot's web package (built by scripts/bench_web.py with aot.web.write_web) on the bench's data.
import { main, typed } from "./harness.mjs";

const reps = Number(new URLSearchParams(location.search).get("profile") || 0);
main(async (data, q) => {
  // a URL esbuild leaves alone: the package is served next to the page, not bundled
  const M = await import(new URL(`${q.get("pkg") || "aot"}/${data.model}/${data.model}.js`, location.href).href);
  const m = await M.Model.create({ seed: 0, kernels: q.get("backend") || "auto" });
  const params = {};
  for (const [n, shape, v] of data.params) params[n] = { data: Float32Array.from(v), shape };
  await m.loadParams(params);
  const batches = data.batches.map((b) => Object.fromEntries(Object.entries(typed(b)).map(([k, [, shape, a]]) => [k, { data: a, shape }])));
  const info = (m.device && m.device.adapterInfo) || m.adapterInfo || {};
  return {
    step: (i) => m.step(batches[i % batches.length]),
    info: { backend: m.kernelSet, adapter: `${info.vendor || ""} ${info.architecture || ""} ${info.description || ""}`.trim(),
            createPhasesMs: m._engine.timings.create },
    after: reps ? () => profile(m, reps) : null,
  };
});

/** ?profile=REPS: after the timed steps, each dispatch of the training step alone, REPS times in
 * one pass, one submit waited for (less an empty submit's time): per-kernel ms on adapters without
 * timestamp queries (SwiftShader). A dispatch repeated sees its own outputs: times, not values. */
export async function profile(m, reps) {
  const e = m._engine;
  if (m.kernelSet === "wasm") return profileWasm(e, reps);
  const recipe = e.recipes.train;
  const dispatches = e.program.entries.train.dispatches;
  const wait = async (fn) => {
    const enc = e.device.createCommandEncoder();
    fn(enc);
    const t = performance.now();
    e.device.queue.submit([enc.finish()]);
    await e.device.queue.onSubmittedWorkDone();
    return performance.now() - t;
  };
  const empty = [];
  for (let i = 0; i < 5; i++) empty.push(await wait(() => {}));
  empty.sort((a, b) => a - b);
  const base = empty[2];
  const rows = [];
  for (let i = 0; i < recipe.length; i++) {
    const [pipeline, group, grid, dyn] = recipe[i];
    const ms = await wait((enc) => {
      const pass = enc.beginComputePass();
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group, dyn);
      for (let r = 0; r < reps; r++) pass.dispatchWorkgroups(grid[0], grid[1], grid[2]);
      pass.end();
    });
    rows.push([dispatches[i][0], grid, Math.max(0, ms - base) / reps]);
  }
  const whole = await wait((enc) => e._record(enc, "train"));
  return { emptySubmitMs: base, wholePassMs: whole, kernels: rows };
}

/** The wasm set's kernels, each called alone REPS times (the module exports every kernel): the
 * best of 3 such runs per kernel, in ms per call. */
function profileWasm(e, reps) {
  const dispatches = e.program.entries.train.dispatches_cpu || e.program.entries.train.dispatches;
  const rows = dispatches.map(([k, grid]) => {
    let best = Infinity;
    for (let t = 0; t < 3; t++) {
      const t0 = performance.now();
      for (let r = 0; r < reps; r++) e.exports["kernel:" + k](...grid);
      best = Math.min(best, (performance.now() - t0) / reps);
    }
    return [k, grid, best];
  });
  const t0 = performance.now();
  e._call("train");
  return { emptySubmitMs: 0, wholePassMs: performance.now() - t0, kernels: rows };
}
