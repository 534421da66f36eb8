// The CPU kernel set's matmul blocks (and the GPU set's tile) on the browser's WebGPU adapter, for
// scripts/bench_web.py --matmul: every kernel of data/matmul.json compiled, checked against a
// float64 product on the host, then timed round-robin (one dispatch a submit, waited for) so that
// a busy machine slows every kernel alike.
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[s.length >> 1]; };

async function run() {
  const q = new URLSearchParams(location.search);
  const reps = Number(q.get("reps") || 5);
  const cases = await (await fetch("data/matmul.json")).json();
  const adapter = await navigator.gpu.requestAdapter();
  const device = await adapter.requestDevice();
  const U = GPUBufferUsage;
  const rows = [];
  for (const c of cases) {
    const { M, K, N, ta, tb } = c;
    let seed = 1;
    const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648) * 2 - 1;
    const a = Float32Array.from({ length: M * K }, rnd); // A [M, K] row-major
    const b = Float32Array.from({ length: K * N }, rnd);
    const at = ta ? Float32Array.from({ length: M * K }, (_, i) => a[(i % M) * K + Math.floor(i / M)]) : a; // [K, M]
    const bt = tb ? Float32Array.from({ length: K * N }, (_, i) => b[(i % K) * N + Math.floor(i / K)]) : b; // [N, K]
    const want = new Float64Array(M * N);
    for (let m = 0; m < M; m++) for (let k = 0; k < K; k++) { const x = a[m * K + k]; for (let n = 0; n < N; n++) want[m * N + n] += x * b[k * N + n]; }
    const mk = (data) => { const buf = device.createBuffer({ size: data.byteLength, usage: U.STORAGE, mappedAtCreation: true }); new Float32Array(buf.getMappedRange()).set(data); buf.unmap(); return buf; };
    const bufs = [mk(at), mk(bt), device.createBuffer({ size: 4 * M * N, usage: U.STORAGE | U.COPY_SRC })];
    const kernels = [];
    for (const [kind, name, src, grid] of c.kernels) {
      const module = device.createShaderModule({ code: src });
      const pipe = await device.createComputePipelineAsync({ layout: "auto", compute: { module, entryPoint: "main" } });
      const group = device.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries: bufs.map((buffer, i) => ({ binding: i, resource: { buffer } })) });
      const once = async () => {
        const enc = device.createCommandEncoder();
        const p = enc.beginComputePass();
        p.setPipeline(pipe); p.setBindGroup(0, group); p.dispatchWorkgroups(...grid); p.end();
        const t = performance.now();
        device.queue.submit([enc.finish()]);
        await device.queue.onSubmittedWorkDone();
        return performance.now() - t;
      };
      const first = await once(); // SwiftShader compiles here
      const staging = device.createBuffer({ size: 4 * M * N, usage: U.MAP_READ | U.COPY_DST });
      const enc = device.createCommandEncoder();
      enc.copyBufferToBuffer(bufs[2], 0, staging, 0, 4 * M * N);
      device.queue.submit([enc.finish()]);
      await staging.mapAsync(GPUMapMode.READ);
      const got = new Float32Array(staging.getMappedRange());
      let err = 0;
      for (let i = 0; i < M * N; i++) err = Math.max(err, Math.abs(got[i] - want[i]));
      staging.unmap();
      if (err > 1e-4 * K) throw new Error(`${kind} ${name} at ${M}x${K}x${N} (ta ${ta}, tb ${tb}): wrong result (max error ${err})`);
      kernels.push({ kind, name, grid, first, once, times: [] });
    }
    for (let r = 0; r < reps; r++) for (const k of kernels) k.times.push(await k.once());
    for (const k of kernels) {
      const ms = median(k.times);
      rows.push({ M, K, N, layout: c.layout, kind: k.kind, name: k.name, grid: k.grid, first_ms: k.first, run_ms: ms,
                  gflops: (2 * M * K * N) / ms / 1e6 });
    }
  }
  const info = adapter.info || {};
  return { rows, adapter: `${info.vendor || ""} ${info.architecture || ""} ${info.description || ""}`.trim() };
}

run().then((r) => { window.result = r; }, (e) => { window.result = { error: String((e && e.stack) || e) }; });
