// aot's web package (built by scripts/bench_web.py with aot.web.write_web) on the bench's data.
import { main, typed } from "./harness.mjs";

main(async (data, q) => {
  // a URL esbuild leaves alone: the package is served next to the page, not bundled
  const M = await import(new URL(`aot/${data.model}/${data.model}.js`, location.href).href);
  const m = await M.Model.create({ seed: 0, kernels: q.get("backend") || "auto" });
  const params = {};
  for (const [n, shape, v] of data.params) params[n] = { data: Float32Array.from(v), shape };
  await m.loadParams(params);
  const batches = data.batches.map((b) => Object.fromEntries(Object.entries(typed(b)).map(([k, [, shape, a]]) => [k, { data: a, shape }])));
  const info = m.device.adapterInfo || {};
  return {
    step: (i) => m.step(batches[i % batches.length]),
    info: { backend: m.kernelSet, adapter: `${info.vendor || ""} ${info.architecture || ""} ${info.description || ""}`.trim(),
            createPhasesMs: m._engine.timings.create },
  };
});
