// jax-js (@jax-js/jax): the bench's models as one jit-compiled training step (loss, gradients by
// valueAndGrad, Adam written out: jax-js has no optimizer package on npm); ?backend=wasm|webgpu.
// jax-js counts references: an array passed to a function is consumed, `.ref` keeps a use.
import { init, defaultDevice, numpy as np, nn, jit, valueAndGrad, tree } from "@jax-js/jax";
import { main, typed } from "./harness.mjs";

const lin = (x, W, b) => np.matmul(x, W).add(b);
const layerNorm = (x, g, b) => nn.standardize(x, -1, { epsilon: 1e-5 }).mul(g).add(b);

const LOSSES = {
  sine_mlp: () => (P, b) => {
    const h = nn.relu(lin(nn.relu(lin(b.x, P["l1.W"], P["l1.b"])), P["l2.W"], P["l2.b"]));
    return np.mean(np.square(lin(h, P["l3.W"], P["l3.b"]).sub(b.y)));
  },
  mnist_mlp: () => (P, b) => {
    const logits = lin(nn.relu(lin(b.x, P["l1.W"], P["l1.b"])), P["l2.W"], P["l2.b"]);
    return np.mean(np.sum(nn.oneHot(b.labels, 10).mul(nn.logSoftmax(logits, -1)), -1)).mul(-1);
  },
  addition_transformer: ({ B, T, D, H, layers, vocab }) => (P, b) => {
    const dh = D / H;
    const tokW = P["tok_emb.W"];
    let x = np.take(tokW.ref, b.tokens, 0).add(np.take(P.pos_emb, np.arange(0, T, 1, { dtype: np.int32 }), 0));
    for (let l = 0; l < layers; l++) {
      const p = (k) => P[`blocks.${l}.${k}`];
      const h = layerNorm(x.ref, p("ln1.g"), p("ln1.b"));
      const q = np.matmul(h.ref, p("q.W")).reshape([B, T, H, dh]);
      const k = np.matmul(h.ref, p("k.W")).reshape([B, T, H, dh]);
      const v = np.matmul(h, p("v.W")).reshape([B, T, H, dh]);
      const att = nn.dotProductAttention(q, k, v, { isCausal: true }).reshape([B, T, D]);
      x = x.add(np.matmul(att, p("o.W")));
      const h2 = layerNorm(x.ref, p("ln2.g"), p("ln2.b"));
      x = x.add(lin(nn.relu(lin(h2, p("fc1.W"), p("fc1.b"))), p("fc2.W"), p("fc2.b")));
    }
    const logits = np.matmul(layerNorm(x, P["ln_f.g"], P["ln_f.b"]), np.transpose(tokW));
    const ce = np.sum(nn.oneHot(b.targets, vocab).mul(nn.logSoftmax(logits, -1)), -1);
    return np.sum(ce.mul(b.mask)).mul(-1 / (B * 3));
  },
};

main(async (data, q) => {
  const backend = q.get("backend") || "webgpu";
  const got = await init(backend);
  if (!got.includes(backend)) throw new Error(`jax-js has no ${backend} device here (got ${got})`);
  defaultDevice(backend);
  let P = {}, M = {}, V = {};
  for (const [n, shape, v] of data.params) {
    P[n] = np.array(Float32Array.from(v), { shape });
    M[n] = np.zeros(shape);
    V[n] = np.zeros(shape);
  }
  const batches = data.batches.map((b) => Object.fromEntries(Object.entries(typed(b)).map(([k, [dt, shape, a]]) =>
    [k, np.array(a, { shape, dtype: dt === "i32" ? np.int32 : np.float32 })])));
  const lossFn = LOSSES[data.model](data.config || {});
  const [b1, b2] = [0.9, 0.999];
  // Adam as torch.optim.Adam computes it, the bias corrections folded into lrT and epsT
  const trainStep = jit((P, M, V, b, lrT, epsT) => {
    const [loss, G] = valueAndGrad(lossFn)(tree.ref(P), b);
    const P2 = {}, M2 = {}, V2 = {};
    for (const k of Object.keys(P)) {
      const g = G[k];
      const m = M[k].mul(b1).add(g.ref.mul(1 - b1));
      const v = V[k].mul(b2).add(g.ref.mul(g).mul(1 - b2));
      P2[k] = P[k].sub(m.ref.mul(lrT.ref).div(np.sqrt(v.ref).add(epsT.ref)));
      M2[k] = m;
      V2[k] = v;
    }
    lrT.dispose();
    epsT.dispose();
    return [loss, P2, M2, V2];
  });
  return {
    step: async (i) => {
      const t = i + 1;
      const lrT = np.array([(data.lr * Math.sqrt(1 - b2 ** t)) / (1 - b1 ** t)]);
      const epsT = np.array([1e-8 * Math.sqrt(1 - b2 ** t)]);
      const [loss, P2, M2, V2] = trainStep(P, M, V, tree.ref(batches[i % batches.length]), lrT, epsT);
      [P, M, V] = [P2, M2, V2];
      return (await loss.data())[0];
    },
    info: { backend },
  };
});
