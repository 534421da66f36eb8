// TensorFlow.js (core ops, tf.train.adam) on the bench's models; ?backend=cpu|webgl|webgpu.
import * as tf from "@tensorflow/tfjs";
import "@tensorflow/tfjs-backend-webgpu";
import { main, typed } from "./harness.mjs";

const linear = (x, W, b) => (b ? tf.matMul(x, W).add(b) : tf.matMul(x, W));

function layerNorm(x, g, b) {
  const { mean, variance } = tf.moments(x, -1, true);
  return x.sub(mean).mul(tf.rsqrt(variance.add(1e-5))).mul(g).add(b);
}

const LOSSES = {
  sine_mlp: (P, b) => {
    const h = tf.relu(linear(tf.relu(linear(b.x, P["l1.W"], P["l1.b"])), P["l2.W"], P["l2.b"]));
    return tf.mean(tf.square(linear(h, P["l3.W"], P["l3.b"]).sub(b.y)));
  },
  mnist_mlp: (P, b) => {
    const logits = linear(tf.relu(linear(b.x, P["l1.W"], P["l1.b"])), P["l2.W"], P["l2.b"]);
    return tf.neg(tf.mean(tf.sum(tf.oneHot(b.labels, 10).mul(tf.logSoftmax(logits)), -1)));
  },
  addition_transformer: (P, b, c) => {
    const [B, T] = b.tokens.shape;
    const { D, H, layers, vocab } = c;
    const dh = D / H;
    let x = tf.gather(P["tok_emb.W"], b.tokens.reshape([-1])).reshape([B, T, D]).add(P.pos_emb.slice([0, 0], [T, D]));
    for (let l = 0; l < layers; l++) {
      const p = (k) => P[`blocks.${l}.${k}`];
      const h = layerNorm(x, p("ln1.g"), p("ln1.b")).reshape([B * T, D]);
      const heads = (W) => tf.matMul(h, W).reshape([B, T, H, dh]).transpose([0, 2, 1, 3]);
      const s = tf.matMul(heads(p("q.W")), heads(p("k.W")), false, true).mul(1 / Math.sqrt(dh)).add(c.causal);
      const att = tf.matMul(tf.softmax(s), heads(p("v.W"))).transpose([0, 2, 1, 3]).reshape([B * T, D]);
      x = x.add(tf.matMul(att, p("o.W")).reshape([B, T, D]));
      const h2 = layerNorm(x, p("ln2.g"), p("ln2.b")).reshape([B * T, D]);
      x = x.add(linear(tf.relu(linear(h2, p("fc1.W"), p("fc1.b"))), p("fc2.W"), p("fc2.b")).reshape([B, T, D]));
    }
    const logits = tf.matMul(layerNorm(x, P["ln_f.g"], P["ln_f.b"]).reshape([B * T, D]), P["tok_emb.W"], false, true);
    const ce = tf.neg(tf.sum(tf.oneHot(b.targets.reshape([-1]), vocab).mul(tf.logSoftmax(logits)), -1));
    return tf.sum(ce.mul(b.mask.reshape([-1]))).mul(1 / (B * 3));
  },
};

main(async (data, q) => {
  const backend = q.get("backend") || "webgl";
  if (!(await tf.setBackend(backend))) throw new Error(`TensorFlow.js has no ${backend} backend here`);
  await tf.ready();
  const P = {};
  for (const [n, shape, v] of data.params) P[n] = tf.variable(tf.tensor(Float32Array.from(v), shape), true, n);
  const batches = data.batches.map((b) => Object.fromEntries(Object.entries(typed(b)).map(([k, [dt, shape, a]]) =>
    [k, tf.tensor(a, shape, dt === "i32" ? "int32" : "float32")])));
  const c = { ...data.config };
  if (data.model === "addition_transformer") {
    const T = c.T;
    c.causal = tf.tensor(Float32Array.from({ length: T * T }, (_, i) => (i % T > Math.floor(i / T) ? -1e9 : 0)), [T, T]);
  }
  const opt = tf.train.adam(data.lr, 0.9, 0.999, 1e-8);
  const vars = Object.values(P);
  const loss = LOSSES[data.model];
  return {
    step: async (i) => {
      const l = opt.minimize(() => loss(P, batches[i % batches.length], c), true, vars);
      const v = (await l.data())[0];
      l.dispose();
      return v;
    },
    info: { backend: tf.getBackend(), tfjs: tf.version.tfjs },
  };
});
