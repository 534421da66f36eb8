// The addition transformer's demo page (Program(web={"demo": "addition_transformer.demo.js"})):
// it trains on sums of two 2-digit numbers, about 80% of the pairs, and shows the sums of pairs it
// never trained on that it gets right (greedy decoding, the 3 digits of the sum one at a time),
// with the accuracy as it trains. The data follow addition_transformer.py's encode() and held_out().

export const title = "learning to add";
export const about =
  "A 3-block transformer reads \"a a + b b =\" (two 2-digit numbers) and writes the sum's 3 digits, " +
  "ones first. It trains on 80% of the pairs; right: sums of held-out pairs it has never seen, " +
  "decoded greedily after each round of steps, and the share it gets right.";
export const steps = 300; // the page's default (?steps=N overrides)
export const every = 20; // steps per call between evaluations

const PLUS = 10, EQUALS = 11, T = 8;
const heldOut = (a, b) => ((100 * a + b) * 31 + 7) % 5 === 0;
const encode = (a, b) => {
  const s = a + b;
  return [Math.floor(a / 10), a % 10, PLUS, Math.floor(b / 10), b % 10, EQUALS, s % 10, Math.floor(s / 10) % 10, Math.floor(s / 100)];
};
const pairs = (test) => {
  const out = [];
  for (let a = 0; a < 100; a++) for (let b = 0; b < 100; b++) if (heldOut(a, b) === test) out.push([a, b]);
  return out;
};
const TRAIN = pairs(false), TEST = pairs(true);

// a seeded generator (mulberry32): every visit trains on the same batches
function generator(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Training step `step`'s batch: random training pairs, the loss on the 3 digits of the sum. */
export function batch(step, { program }) {
  const B = program.signatures.train.tokens[1][0];
  const rand = generator(7000 + step);
  const tokens = new Int32Array(B * T), targets = new Int32Array(B * T), mask = new Float32Array(B * T);
  for (let i = 0; i < B; i++) {
    const seq = encode(...TRAIN[Math.floor(rand() * TRAIN.length)]);
    for (let t = 0; t < T; t++) {
      tokens[i * T + t] = seq[t];
      targets[i * T + t] = seq[t + 1];
      mask[i * T + t] = t >= 5 ? 1 : 0;
    }
  }
  const shape = [B, T];
  return { tokens: { data: tokens, shape }, targets: { data: targets, shape }, mask: { data: mask, shape } };
}

const history = []; // [step, sums right, digits right]

/** Decodes the sums of held-out pairs (as many as predict takes at once, up to 128) and shows
 * them in `div`; returns the share of sums and of digits it gets right. */
export async function show(model, div, { step, program }) {
  const n = Math.min(128, Math.max(...program.variants.predict.map(([sizes]) => sizes.N)));
  const rand = generator(99);
  const tests = Array.from({ length: n }, () => TEST[Math.floor(rand() * TEST.length)]);
  const tokens = new Int32Array(n * T);
  tests.forEach(([a, b], i) => tokens.set(encode(a, b).slice(0, 6), i * T));
  const digits = tests.map(() => []);
  for (let pos = 5; pos < 8; pos++) {
    const out = await model.predict({ tokens: { data: tokens, shape: [n, T] } });
    const vocab = out.shape[2];
    for (let i = 0; i < n; i++) {
      const row = out.data.subarray((i * T + pos) * vocab, (i * T + pos + 1) * vocab);
      let best = 0;
      for (let v = 1; v < vocab; v++) if (row[v] > row[best]) best = v;
      digits[i].push(best);
      if (pos + 1 < T) tokens[i * T + pos + 1] = best;
    }
  }
  let right = 0, digitsRight = 0;
  const rows = tests.map(([a, b], i) => {
    const want = encode(a, b).slice(6);
    const ok = want.every((d, j) => d === digits[i][j]);
    right += ok;
    digitsRight += want.filter((d, j) => d === digits[i][j]).length;
    const got = digits[i][0] + 10 * digits[i][1] + 100 * digits[i][2];
    return [a, b, got, ok];
  });
  const accuracy = right / n, digitAccuracy = digitsRight / (3 * n);
  history.push([step, accuracy, digitAccuracy]);
  const pct = (x) => `${(100 * x).toFixed(1)}%`;
  const cell = ([a, b, got, ok]) =>
    `<span style="color:${ok ? "#1a7f37" : "#c62828"}">${a} + ${b} = ${got} ${ok ? "✓" : "✗"}</span>`;
  div.innerHTML =
    `<p><b>after ${step} steps: ${right} of ${n} held-out sums right (${pct(accuracy)}), ` +
    `${pct(digitAccuracy)} of their digits</b></p>` +
    `<div style="columns: 3; font: 13px/1.5 ui-monospace, monospace">${rows.slice(0, 24).map(cell).join("<br>")}</div>` +
    `<p style="color:#555">accuracy so far: ${history.map(([s, acc]) => `${s}: ${pct(acc)}`).join(" · ")}</p>`;
  return { accuracy, digitAccuracy };
}
