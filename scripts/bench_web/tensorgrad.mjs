// tensorgrad (github.com/typebulb/tensorgrad, built from a checkout by scripts/bench_web.py) on
// the bench's models: modules named as aot's, so uploadParams takes the bench's parameters as
// they are. The transformer is its addition-transformer sample's, with Adam.
import {
  compile, Module, Linear, LayerNorm, Embedding, relu, sub, mul, mean, sum, add, matmul, swapAxes,
  embedding, arange, softmaxCausal, splitHeads, mergeHeads, crossEntropy,
} from "tensorgrad";
import { main, typed } from "./harness.mjs";

class SineMLP extends Module {
  l1 = new Linear(1, 64);
  l2 = new Linear(64, 64);
  l3 = new Linear(64, 1);
}

class MnistMLP extends Module {
  l1 = new Linear(784, 256);
  l2 = new Linear(256, 10);
}

class Block extends Module {
  constructor(D, mlp) {
    super();
    this.ln1 = new LayerNorm(D);
    this.q = new Linear(D, D, { bias: false });
    this.k = new Linear(D, D, { bias: false });
    this.v = new Linear(D, D, { bias: false });
    this.o = new Linear(D, D, { bias: false });
    this.ln2 = new LayerNorm(D);
    this.fc1 = new Linear(D, mlp);
    this.fc2 = new Linear(mlp, D);
  }
}

class Transformer extends Module {
  constructor({ vocab, D, layers, mlp, T }) {
    super();
    this.tok_emb = new Embedding(vocab, D);
    this.pos_emb = this.param([T + 1, D]);
    this.blocks = [];
    for (let i = 0; i < layers; i++) this.blocks.push(new Block(D, mlp));
    this.ln_f = new LayerNorm(D);
  }
}

function transformerLoss({ B, T, H, D }) {
  const scale = 1 / Math.sqrt(D / H);
  return (p, { tokens, targets, mask }) => {
    let x = add(embedding(p.tok_emb.W, tokens), embedding(p.pos_emb, arange(T)));
    for (const blk of p.blocks) {
      const h = blk.ln1.fwd(x);
      const [q, k, v] = [blk.q, blk.k, blk.v].map((f) => splitHeads(f.fwd(h), H));
      const att = matmul(softmaxCausal(mul(matmul(q, swapAxes(k, -1, -2)), scale)), v);
      x = add(x, blk.o.fwd(mergeHeads(att)));
      x = add(x, blk.fc2.fwd(relu(blk.fc1.fwd(blk.ln2.fwd(x)))));
    }
    const logits = matmul(p.ln_f.fwd(x), swapAxes(p.tok_emb.W, -1, -2));
    return mul(sum(mul(crossEntropy(logits, targets, { reduction: "none" }), mask)), 1 / (B * 3));
  };
}

const SPECS = {
  sine_mlp: () => ({
    model: new SineMLP(),
    loss: (p, { x, y }) => {
      const d = sub(p.l3.fwd(relu(p.l2.fwd(relu(p.l1.fwd(x))))), y);
      return mean(mul(d, d));
    },
  }),
  mnist_mlp: () => ({
    model: new MnistMLP(),
    loss: (p, { x, labels }) => crossEntropy(p.l2.fwd(relu(p.l1.fwd(x))), labels),
  }),
  addition_transformer: (c) => ({ model: new Transformer(c), loss: transformerLoss(c) }),
};

main(async (data) => {
  const batches = data.batches.map((b) => typed(b));
  const inputs = Object.fromEntries(Object.entries(batches[0]).map(([k, [dt, shape]]) =>
    [k, dt === "i32" ? { shape, dtype: "i32" } : shape]));
  const spec = SPECS[data.model](data.config || {});
  const train = await compile({ ...spec, inputs, optimizer: { kind: "adam", lr: data.lr } });
  const ours = data.params.map(([n]) => n).sort();
  const theirs = [...train.paramNames].sort();
  if (JSON.stringify(ours) !== JSON.stringify(theirs))
    throw new Error(`tensorgrad's parameters ${theirs} are not aot's ${ours}`);
  await train.uploadParams(Object.fromEntries(data.params.map(([n, , v]) => [n, Float32Array.from(v)])));
  const feeds = batches.map((b) => Object.fromEntries(Object.entries(b).map(([k, [, , a]]) => [k, a])));
  return {
    step: async (i) => (await train.step(feeds[i % feeds.length])).loss,
    info: { backend: "webgpu", kernels: train.kernels.length },
  };
});
