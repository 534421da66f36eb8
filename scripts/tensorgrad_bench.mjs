// One tensorgrad training benchmark in Node, for scripts/bench_tensorgrad.py (which bundles this
// file with esbuild against a tensorgrad checkout and runs it once per model and round).
//
//     node bundle.mjs MODEL STEPS WARMUP     (MODEL: sine_mlp | addition_transformer | mnist_mlp)
//
// tensorgrad runs its GPU work in a Web Worker made from a Blob URL; Node has neither, so the
// worker's source is written to a module file and run in a worker thread whose globals
// (self, postMessage, onmessage, navigator.gpu from the `webgpu` package, Dawn) stand in for a
// browser worker's. Prints one JSON line: compile seconds, median step milliseconds, losses.

import { Worker as NodeWorker } from 'node:worker_threads'
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { compile, Module, Linear, relu, crossEntropy } from 'tensorgrad'
import { compileTraining as compileSine } from 'tensorgrad-samples/mlp-sin/spec.ts'
import { compileTraining as compileTransformer } from 'tensorgrad-samples/transformer/spec.ts'

const WEBGPU = process.env.AOT_WEBGPU_MODULE // absolute path of the `webgpu` package's index.js
const folder = mkdtempSync(join(tmpdir(), 'tensorgrad-worker-'))
const sources = new Map()

// a browser worker's globals over a worker thread's port; then the worker's own code
const PREAMBLE = `
import { parentPort } from 'node:worker_threads'
import { create, globals } from ${JSON.stringify(WEBGPU)}
Object.assign(globalThis, globals)
Object.defineProperty(globalThis, 'navigator', { value: { gpu: create([]) }, configurable: true })
globalThis.self = globalThis
globalThis.postMessage = (msg, opts) => parentPort.postMessage(msg, Array.isArray(opts) ? opts : (opts && opts.transfer) || [])
parentPort.on('message', data => globalThis.onmessage && globalThis.onmessage({ data }))
`

globalThis.Blob = class {
  constructor(parts) { this.source = parts.join('') }
}
URL.createObjectURL = blob => {
  const url = `blob:tensorgrad/${sources.size}`
  sources.set(url, blob.source)
  return url
}
URL.revokeObjectURL = () => {}
globalThis.Worker = class {
  constructor(url) {
    const file = join(folder, `worker${sources.size}.mjs`)
    writeFileSync(file, PREAMBLE + sources.get(url))
    this.thread = new NodeWorker(file)
    this.thread.on('message', data => this.onmessage && this.onmessage({ data }))
    this.thread.on('error', e => this.onerror && this.onerror({ message: String((e && e.stack) || e) }))
  }
  postMessage(msg, transfer) { this.thread.postMessage(msg, transfer) }
  terminate() { this.thread.terminate() }
}

// tensorgrad-bench's model (c): 784 -> 256 -> 10, cross-entropy, Adam 1e-3, batch 128
class MnistMLP extends Module {
  l1 = new Linear(784, 256)
  l2 = new Linear(256, 10)
}
const mnist = () => compile({
  model: new MnistMLP(),
  loss: (p, { x, labels }) => crossEntropy(p.l2.fwd(relu(p.l1.fwd(x))), labels),
  inputs: { x: [128, 784], labels: { shape: [128], dtype: 'i32' } },
  optimizer: { kind: 'adam', lr: 0.001 },
})

const uniform = (n, lo, hi) => Float32Array.from({ length: n }, () => lo + (hi - lo) * Math.random())
const digits = n => Int32Array.from({ length: n }, () => Math.floor(Math.random() * 12))
const MODELS = {
  sine_mlp: [compileSine, () => { const x = uniform(256, -Math.PI, Math.PI); return { x, y: x.map(Math.sin) } }],
  addition_transformer: [
    compileTransformer,
    () => ({ tokens: digits(128 * 8), targets: digits(128 * 8), mask: Float32Array.from({ length: 8 }, (_, t) => (t >= 5 ? 1 : 0)) }),
  ],
  mnist_mlp: [mnist, () => ({ x: uniform(128 * 784, 0, 1), labels: Int32Array.from({ length: 128 }, () => Math.floor(Math.random() * 10)) })],
}

const [name, steps = '50', warmup = '10'] = process.argv.slice(2)
const [make, batch] = MODELS[name]
const pool = Array.from({ length: 8 }, batch)
let t = performance.now()
const train = await make()
const compileS = (performance.now() - t) / 1000
const times = []
const losses = []
for (let i = 0; i < Number(warmup) + Number(steps); i++) {
  t = performance.now()
  const r = await train.step(pool[i % pool.length])
  if (i >= Number(warmup)) times.push(performance.now() - t)
  losses.push(r.loss)
}
times.sort((a, b) => a - b)
console.log(JSON.stringify({ model: name, compile_s: compileS, step_ms: times[times.length >> 1], steps: times.length, first_loss: losses[0], last_loss: losses[losses.length - 1] }))
rmSync(folder, { recursive: true, force: true })
process.exit(0)
