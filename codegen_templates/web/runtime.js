// ---- aot web runtime: the browser twin of aot/runtime (model.py, engine.py, rng.py, schedules.py) ----
// Same tables, same initial parameters (bit for bit), same per-step scalars, same input checks and
// messages, same .npz checkpoints. WebGPU through navigator.gpu; no dependencies.

export class ValueError extends Error {
  constructor(message) { super(message); this.name = "ValueError"; }
}
export class KeyError extends Error {
  constructor(message) { super(message); this.name = "KeyError"; }
}
export class ShaderError extends Error {
  constructor(message) { super(message); this.name = "ShaderError"; }
}

// ---- Python-style formatting, so messages read exactly as the Python package's ----
function pyStr(s) {
  s = String(s);
  const q = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = q;
  for (const ch of s) {
    const c = ch.codePointAt(0);
    if (ch === "\\") out += "\\\\";
    else if (ch === q) out += "\\" + q;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (c < 0x20 || c === 0x7f) out += "\\x" + c.toString(16).padStart(2, "0");
    else out += ch;
  }
  return out + q;
}
const pyList = (items) => "[" + items.map(pyStr).join(", ") + "]";
function pyTuple(items, fmt = String) {
  if (items.length === 1) return "(" + fmt(items[0]) + ",)";
  return "(" + items.map(fmt).join(", ") + ")";
}
/** Python's repr of a float (shortest round-trip digits; scientific below 1e-4 and from 1e16). */
export function pyFloat(x) {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const sign = x < 0 ? "-" : "";
  const [mant, expText] = Math.abs(x).toExponential().split("e");
  const digits = mant.replace(".", "");
  const e = parseInt(expText, 10);
  if (e < -4 || e >= 16) {
    const m = digits.length > 1 ? digits[0] + "." + digits.slice(1) : digits;
    return sign + m + "e" + (e < 0 ? "-" : "+") + String(Math.abs(e)).padStart(2, "0");
  }
  if (e < 0) return sign + "0." + "0".repeat(-e - 1) + digits;
  if (digits.length <= e + 1) return sign + digits + "0".repeat(e + 1 - digits.length) + ".0";
  return sign + digits.slice(0, e + 1) + "." + digits.slice(e + 1);
}

// ---- rng.py: SplitMix64 streams + Box-Muller in float64, rounded once to float32 ----
// A kernel may bind a buffer a second time as array<vec4<f32>> (its matmuls read 4 floats at
// once through it), under the buffer's name + VEC_SUFFIX at VEC_BINDING_BASE + its binding.
const VEC_SUFFIX = "_v4";
const VEC_BINDING_BASE = 500;
const bufferOf = (name) => (name.endsWith(VEC_SUFFIX) ? name.slice(0, -VEC_SUFFIX.length) : name);
// The CPU set's offset tables: a uniform buffer per entry point, a 256-byte slot per kernel that
// reads where its operands start from one (bound at OFFSETS_BINDING with a dynamic offset).
const OFFSETS = "offsets";
const OFFSETS_BINDING = 400;
const OFFSETS_SLOT_BYTES = 256;
// a kernel's access to a binding -> its bind group layout entry's buffer type
const BUFFER_TYPE = { read_write: "storage", read: "read-only-storage", uniform: "uniform" };
const codeOnly = (wgsl) => wgsl.split("\n").filter((line) => !line.trimStart().startsWith("//")).join("\n");

const M64 = (1n << 64n) - 1n;
const GOLDEN = 0x9e3779b97f4a7c15n;
function splitmix64(x) {
  let z = (x + GOLDEN) & M64;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M64;
  return z ^ (z >> 31n);
}
export function checkSeed(seed, what = "seed") {
  if (typeof seed === "number") {
    if (!Number.isSafeInteger(seed)) throw new TypeError(`${what}: a seed must be an int in [0, 2**64), got ${seed}`);
    seed = BigInt(seed);
  }
  if (typeof seed !== "bigint") throw new TypeError(`${what}: a seed must be an int in [0, 2**64), got ${typeof seed} ${seed}`);
  if (seed < 0n || seed > M64) throw new ValueError(`${what}: a seed must be an int in [0, 2**64), got ${seed}`);
  return seed;
}
/** n float64 standard normals from stream `stream` of `seed` (rng.standard_normal). */
export function standardNormal(seed, stream, n) {
  let key = splitmix64(seed & M64);
  key = splitmix64(key ^ BigInt(stream));
  const pairs = Math.floor((n + 1) / 2);
  const out = new Float64Array(2 * pairs);
  const scale = 1.0 / 9007199254740992.0;
  let counter = key;
  for (let i = 0; i < pairs; i++) {
    const a = Number(splitmix64(counter) >> 11n) * scale;
    counter = (counter + GOLDEN) & M64;
    const b = Number(splitmix64(counter) >> 11n) * scale;
    counter = (counter + GOLDEN) & M64;
    const u1 = 1.0 - a;
    const r = Math.sqrt(-2.0 * Math.log(u1));
    const angle = 2.0 * Math.PI * b;
    out[2 * i] = r * Math.cos(angle);
    out[2 * i + 1] = r * Math.sin(angle);
  }
  return out.subarray(0, n);
}
function initParam(spec, size, seed, stream) {
  const kind = spec[0];
  if (kind === "zero_range") {
    // the inner spec's values with flat elements [begin, end) zeroed (Embedding's padding row)
    const inner = initParam(spec[1], size, seed, stream);
    inner.fill(0, spec[2], spec[3]);
    return inner;
  }
  const out = new Float32Array(size);
  if (kind === "randn") {
    const z = standardNormal(seed, stream, size);
    const std = spec[1];
    for (let i = 0; i < size; i++) out[i] = z[i] * std; // float64 product, rounded once to float32
  } else if (kind === "ones") {
    out.fill(1);
  } else if (kind === "literal") {
    const bin = atob(spec[1]);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const dv = new DataView(bytes.buffer);
    for (let i = 0; i < size; i++) out[i] = dv.getFloat32(4 * i, true);
  } else if (kind !== "zeros") {
    throw new ValueError(`unknown init spec ${JSON.stringify(spec)}`);
  }
  return out;
}
/** The i32 seed of step t's random numbers (rng.step_seed). */
export function stepSeed(seed, t) {
  let word = ((seed & 0xffffffffn) << 32n) | (BigInt(t) & 0xffffffffn);
  const high = (seed >> 32n) & 0xffffffffn;
  if (high) word ^= splitmix64(high);
  return Number(splitmix64(word) & 0x7fffffffn);
}

// ---- schedules.py ----
const SCHEDULE_ORDER = {
  linear: ["peak", "final", "steps"], cosine: ["peak", "final", "steps"], warmup: ["peak", "steps", "after"],
  step: ["peak", "every", "gamma"], multistep: ["peak", "milestones", "gamma"], sequential: ["first", "steps", "after"],
};
function rate(v, what) {
  if (typeof v !== "number") throw new TypeError(`${what} must be a finite non-negative float, got ${typeof v} ${v}`);
  if (!Number.isFinite(v) || v < 0) throw new ValueError(`${what} must be a finite non-negative float, got ${pyFloat(v)}`);
  return v;
}
function count(v, what, least) {
  if (typeof v !== "number") throw new TypeError(`${what} must be an int, got ${typeof v} ${v}`);
  if (!Number.isInteger(v)) throw new ValueError(`${what} must be a whole number of steps, got ${v}`);
  if (!(least <= v && v < 2 ** 62)) throw new ValueError(`${what} must be an int >= ${least}, got ${v}`);
  return v;
}
/** A float or ["linear", peak, final, steps] (an array for a tuple), or {kind, ...}: checked as schedules.normalize does. */
export function normalizeLr(spec) {
  if (typeof spec === "number") return rate(spec, "learning rate");
  if (spec && !Array.isArray(spec) && typeof spec === "object") {
    const order = SCHEDULE_ORDER[spec.kind];
    if (!order) throw new ValueError(`unknown schedule kind ${pyStr(spec.kind)}; expected one of ${Object.keys(SCHEDULE_ORDER).join(", ")}`);
    spec = [spec.kind, ...order.map((k) => spec[k])];
  }
  if (!Array.isArray(spec) || !(spec[0] in SCHEDULE_ORDER) || spec.length !== 4)
    throw new ValueError(`bad learning-rate schedule ${JSON.stringify(spec)}; expected a float or e.g. ('linear', peak, final, steps)`);
  const k = spec[0];
  if (k === "warmup") return [k, rate(spec[1], "warmup peak"), count(spec[2], "warmup steps", 1), normalizeLr(spec[3])];
  if (k === "sequential") return [k, normalizeLr(spec[1]), count(spec[2], "sequential steps", 1), normalizeLr(spec[3])];
  if (k === "multistep") {
    if (!Array.isArray(spec[2])) throw new TypeError(`multistep milestones must be a tuple of step counts, got ${spec[2]}`);
    if (spec[2].length > 1000) throw new ValueError(`multistep takes at most 1000 milestones, got ${spec[2].length}`);
    return [k, rate(spec[1], "multistep peak"), spec[2].map((m) => count(m, "multistep milestone", 0)), rate(spec[3], "multistep gamma")];
  }
  if (k === "step") return [k, rate(spec[1], "step peak"), count(spec[2], "step every", 1), rate(spec[3], "step gamma")];
  return [k, rate(spec[1], `${k} peak`), rate(spec[2], `${k} final`), count(spec[3], `${k} steps`, 1)];
}
/** Learning rate of update t (1-based): schedules.lr_at. */
export function lrAt(spec, t) {
  if (typeof spec === "number") return spec;
  const k = spec[0];
  if (k === "linear") { const [, peak, fin, steps] = spec; return peak + ((fin - peak) * Math.min(t - 1, steps)) / steps; }
  if (k === "cosine") { const [, peak, fin, steps] = spec; return fin + ((peak - fin) * (1 + Math.cos((Math.PI * Math.min(t - 1, steps)) / steps))) / 2; }
  if (k === "step") { const [, peak, every, gamma] = spec; return peak * gamma ** Math.floor((t - 1) / every); }
  if (k === "multistep") { const [, peak, ms, gamma] = spec; return peak * gamma ** ms.filter((m) => m <= t - 1).length; }
  if (k === "warmup") { const [, peak, steps, after] = spec; return t <= steps ? (peak * t) / steps : lrAt(after, t - steps); }
  if (k === "sequential") { const [, first, steps, after] = spec; return t <= steps ? lrAt(first, t) : lrAt(after, t - steps); }
  throw new ValueError(`unknown schedule ${JSON.stringify(spec)}`);
}
/** schedules.optimizer_scalars: the update's per-step scalars, in float64. */
export function optimizerScalars(opt, lr, t) {
  if (opt[0] === "adam" || opt[0] === "adamw") {
    const [, b1, b2] = opt;
    return { _lr: lr, _step_size: lr / (1.0 - b1 ** t), _bc2_sqrt: Math.sqrt(1.0 - b2 ** t), _decay: 1.0 - lr * opt[4] };
  }
  if (opt[0] === "adagrad") return { _lr: lr / (1.0 + (t - 1) * opt[1]) };
  return { _lr: lr };
}
/** schedules.step_scalars: the default group's scalars, then group i's as name + "_g" + i. */
export function stepScalars(opt, lr, t, groups, groupLrs) {
  const out = optimizerScalars(opt, lr, t);
  groups.forEach(([spec], i) => {
    for (const [k, v] of Object.entries(optimizerScalars(spec, groupLrs[i], t))) out[`${k}_g${i}`] = v;
  });
  return out;
}
/** repr() of a normalized schedule, as the Python package writes it into a checkpoint's __lr__. */
function lrRepr(spec) {
  if (spec === null) return "None";
  if (typeof spec === "number") return pyFloat(spec);
  const k = spec[0];
  if (k === "sequential") return "(" + [pyStr(k), lrRepr(spec[1]), String(spec[2]), lrRepr(spec[3])].join(", ") + ")";
  const parts = [pyStr(k), pyFloat(spec[1])];
  if (k === "warmup") parts.push(String(spec[2]), lrRepr(spec[3]));
  else if (k === "multistep") parts.push(pyTuple(spec[2]), pyFloat(spec[3]));
  else if (k === "step") parts.push(String(spec[2]), pyFloat(spec[3]));
  else parts.push(pyFloat(spec[2]), String(spec[3]));
  return "(" + parts.join(", ") + ")";
}
/** A Python literal of numbers, strings, None and tuples/lists (a checkpoint's __lr__). */
function parsePyLiteral(text) {
  let i = 0;
  const ws = () => { while (i < text.length && " \t\n".includes(text[i])) i++; };
  const value = (depth) => {
    if (depth > 50) throw new ValueError("the schedule is nested too deeply");
    ws();
    const c = text[i];
    if (c === "(" || c === "[") {
      const close = c === "(" ? ")" : "]";
      i++;
      const items = [];
      for (;;) {
        ws();
        if (text[i] === close) { i++; break; }
        items.push(value(depth + 1));
        ws();
        if (text[i] === ",") { i++; continue; }
        if (text[i] === close) { i++; break; }
        throw new ValueError(`${pyStr(text.slice(0, 80))} is not a literal`);
      }
      return items;
    }
    if (c === "'" || c === '"') {
      const j = text.indexOf(c, i + 1);
      if (j < 0) throw new ValueError(`${pyStr(text.slice(0, 80))} is not a literal`);
      const s = text.slice(i + 1, j);
      i = j + 1;
      return s;
    }
    if (text.startsWith("None", i)) { i += 4; return null; }
    const m = /^[-+]?(\d+\.?\d*(e[-+]?\d+)?|\.\d+(e[-+]?\d+)?|inf|nan)/i.exec(text.slice(i));
    if (!m) throw new ValueError(`${pyStr(text.slice(0, 80))} is not a literal`);
    i += m[0].length;
    return Number(m[0].replace(/inf/i, "Infinity"));
  };
  const v = value(0);
  ws();
  if (i !== text.length) throw new ValueError(`${pyStr(text.slice(0, 80))} is not a literal`);
  return v;
}

// ---- .npy and zip (numpy's .npz): what Model.save/restore read and write ----
const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();
function crc32(bytes) {
  let c = 0xffffffff;
  for (let i = 0; i < bytes.length; i++) c = CRC_TABLE[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}
const utf8 = new TextEncoder();
function npyBytes(descr, shape, body) {
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${pyTuple(shape)}, }`;
  const pad = 64 - ((10 + header.length + 1) % 64);
  header += " ".repeat(pad % 64) + "\n";
  const out = new Uint8Array(10 + header.length + body.length);
  out.set([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 1, 0], 0);
  new DataView(out.buffer).setUint16(8, header.length, true);
  out.set(utf8.encode(header), 10);
  out.set(body, 10 + header.length);
  return out;
}
function npyString(s) {
  const cps = Array.from(String(s), (ch) => ch.codePointAt(0));
  const n = Math.max(1, cps.length);
  const body = new Uint8Array(4 * n);
  const dv = new DataView(body.buffer);
  cps.forEach((c, i) => dv.setUint32(4 * i, c, true));
  return npyBytes(`<U${n}`, [], body);
}
function npyScalar64(value, descr) {
  const body = new Uint8Array(8);
  const dv = new DataView(body.buffer);
  if (descr === "<u8") dv.setBigUint64(0, BigInt(value), true);
  else dv.setBigInt64(0, BigInt(value), true);
  return npyBytes(descr, [], body);
}
function npyF32(data, shape) {
  const body = new Uint8Array(4 * data.length);
  const dv = new DataView(body.buffer);
  for (let i = 0; i < data.length; i++) dv.setFloat32(4 * i, data[i], true);
  return npyBytes("<f4", shape, body);
}
function npyI32(data, shape) {
  const body = new Uint8Array(4 * data.length);
  const dv = new DataView(body.buffer);
  for (let i = 0; i < data.length; i++) dv.setInt32(4 * i, data[i], true);
  return npyBytes("<i4", shape, body);
}
/** A zip of stored (uncompressed) members, as np.savez writes. */
export function zipStored(members) {
  const chunks = [], central = [];
  let offset = 0;
  for (const [name, data] of members) {
    const nameBytes = utf8.encode(name);
    const crc = crc32(data);
    const local = new Uint8Array(30 + nameBytes.length);
    const dv = new DataView(local.buffer);
    dv.setUint32(0, 0x04034b50, true); dv.setUint16(4, 20, true); dv.setUint16(6, 0x800, true);
    dv.setUint16(8, 0, true); dv.setUint16(10, 0, true); dv.setUint16(12, 0x21, true);
    dv.setUint32(14, crc, true); dv.setUint32(18, data.length, true); dv.setUint32(22, data.length, true);
    dv.setUint16(26, nameBytes.length, true); dv.setUint16(28, 0, true);
    local.set(nameBytes, 30);
    const cd = new Uint8Array(46 + nameBytes.length);
    const cv = new DataView(cd.buffer);
    cv.setUint32(0, 0x02014b50, true); cv.setUint16(4, 20, true); cv.setUint16(6, 20, true); cv.setUint16(8, 0x800, true);
    cv.setUint16(10, 0, true); cv.setUint16(12, 0, true); cv.setUint16(14, 0x21, true);
    cv.setUint32(16, crc, true); cv.setUint32(20, data.length, true); cv.setUint32(24, data.length, true);
    cv.setUint16(28, nameBytes.length, true); cv.setUint32(42, offset, true);
    cd.set(nameBytes, 46);
    chunks.push(local, data);
    central.push(cd);
    offset += local.length + data.length;
  }
  const cdSize = central.reduce((s, c) => s + c.length, 0);
  const end = new Uint8Array(22);
  const ev = new DataView(end.buffer);
  ev.setUint32(0, 0x06054b50, true); ev.setUint16(8, members.length, true); ev.setUint16(10, members.length, true);
  ev.setUint32(12, cdSize, true); ev.setUint32(16, offset, true);
  const all = [...chunks, ...central, end];
  const out = new Uint8Array(all.reduce((s, c) => s + c.length, 0));
  let pos = 0;
  for (const c of all) { out.set(c, pos); pos += c.length; }
  return out;
}
/** Inflate a raw deflate stream, stopping (null) as soon as it would pass `limit` bytes: a member's
 * declared size is checked before inflating, and a stream that lies about it costs one chunk more. */
async function inflateRaw(bytes, limit) {
  const reader = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate-raw")).getReader();
  const chunks = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.length;
    if (total > limit) { await reader.cancel(); return null; }
    chunks.push(value);
  }
  const out = new Uint8Array(total);
  let pos = 0;
  for (const c of chunks) { out.set(c, pos); pos += c.length; }
  return out;
}
/** Members of a zip (stored or deflated): name -> Uint8Array, from the central directory. */
export async function unzip(bytes, bad) {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let eocd = -1;
  for (let i = bytes.length - 22; i >= Math.max(0, bytes.length - 22 - 65535); i--) {
    if (dv.getUint32(i, true) === 0x06054b50) { eocd = i; break; }
  }
  if (eocd < 0) throw bad("not an aot checkpoint, or a damaged one (bad .npz archive: no end of central directory)");
  const n = dv.getUint16(eocd + 10, true);
  let p = dv.getUint32(eocd + 16, true);
  const out = new Map();
  const dec = new TextDecoder();
  for (let k = 0; k < n; k++) {
    if (p + 46 > bytes.length || dv.getUint32(p, true) !== 0x02014b50) throw bad("a damaged checkpoint (bad central directory)");
    const flags = dv.getUint16(p + 8, true), method = dv.getUint16(p + 10, true), crc = dv.getUint32(p + 16, true);
    let csize = dv.getUint32(p + 20, true), size = dv.getUint32(p + 24, true);
    const nlen = dv.getUint16(p + 28, true), xlen = dv.getUint16(p + 30, true), clen = dv.getUint16(p + 32, true);
    let local = dv.getUint32(p + 42, true);
    const name = dec.decode(bytes.subarray(p + 46, p + 46 + nlen));
    for (let x = p + 46 + nlen; x + 4 <= p + 46 + nlen + xlen;) { // zip64 sizes
      const id = dv.getUint16(x, true), len = dv.getUint16(x + 2, true);
      if (id === 1) {
        let q = x + 4;
        if (size === 0xffffffff) { size = Number(dv.getBigUint64(q, true)); q += 8; }
        if (csize === 0xffffffff) { csize = Number(dv.getBigUint64(q, true)); q += 8; }
        if (local === 0xffffffff) { local = Number(dv.getBigUint64(q, true)); q += 8; }
      }
      x += 4 + len;
    }
    p += 46 + nlen + xlen + clen;
    if (out.has(name)) throw bad(`damaged checkpoint: member ${pyStr(name)} appears twice`);
    if (flags & 1) throw bad(`checkpoint member ${pyStr(name)} is encrypted`);
    if (local + 30 > bytes.length || dv.getUint32(local, true) !== 0x04034b50) throw bad("a damaged checkpoint (bad local header)");
    const start = local + 30 + dv.getUint16(local + 26, true) + dv.getUint16(local + 28, true);
    if (start + csize > bytes.length) throw bad(`checkpoint member ${pyStr(name)} is truncated`);
    const raw = bytes.subarray(start, start + csize);
    out.set(name, { method, crc, size, raw });
  }
  return out;
}
async function memberBytes(m, name, bad, limit) {
  if (m.size > limit)
    throw bad(`checkpoint member ${pyStr(name)} declares ${m.size} bytes, more than this model's checkpoints hold for it (${limit})`);
  let data;
  if (m.method === 0) data = m.raw;
  else if (m.method === 8) {
    try { data = await inflateRaw(m.raw, m.size); } catch (e) { throw bad(`checkpoint member ${pyStr(name)} is damaged (${e.message})`); }
    if (data === null) throw bad(`checkpoint member ${pyStr(name)} is damaged (it inflates past its declared ${m.size} bytes)`);
  } else throw bad(`checkpoint member ${pyStr(name)} uses an unsupported compression (${m.method})`);
  if (data.length !== m.size || crc32(data) !== m.crc) throw bad(`checkpoint member ${pyStr(name)} is damaged (bad CRC or size)`);
  return data;
}
// the largest .npy header parseNpy reads (magic, version, a 4-byte length, 1024 bytes of text)
const NPY_HEADER_MAX = 12 + 1024;
// the longest string member (a Program name, a fingerprint, a learning rate's repr), in characters
const STR_MEMBER_MAX = 4096;
/** One .npy: {descr, fortran, shape, body}. */
function parseNpy(data, bad) {
  if (data.length < 10 || data[0] !== 0x93 || String.fromCharCode(...data.subarray(1, 6)) !== "NUMPY" || ![1, 2, 3].includes(data[6]))
    throw bad("is not a .npy array");
  const dv = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const width = data[6] === 1 ? 2 : 4;
  const hlen = width === 2 ? dv.getUint16(8, true) : dv.getUint32(8, true);
  if (hlen > 1024) throw bad(`has a ${hlen}-byte .npy header (at most 1024)`);
  const text = new TextDecoder().decode(data.subarray(8 + width, 8 + width + hlen));
  const descr = /'descr'\s*:\s*'([^']*)'/.exec(text), fortran = /'fortran_order'\s*:\s*(True|False)/.exec(text);
  const shape = /'shape'\s*:\s*\(([^)]*)\)/.exec(text);
  if (!descr || !fortran || !shape) throw bad("has an unreadable .npy header");
  const dims = shape[1].split(",").map((d) => d.trim()).filter((d) => d).map(Number);
  return { descr: descr[1], fortran: fortran[1] === "True", shape: dims, body: data.subarray(8 + width + hlen) };
}

// ---- the device side (engine.py) ----
// own properties only: "constructor", "toString", "__proto__" ... are on every object's prototype
const has = (o, k) => o !== null && o !== undefined && Object.prototype.hasOwnProperty.call(o, k);
const sizeOf = (shape) => shape.reduce((a, b) => a * b, 1);
// n rows of each input buffer of an entry: inputs, inputs_1, ... f32; inputs_i32, inputs_i32_1, ... i32
const inputRows = (sizes, n) =>
  Object.fromEntries(Object.entries(sizes).map(([a, m]) => [a, a.startsWith("inputs_i32") ? new Int32Array(n * m) : new Float32Array(n * m)]));
const now = () => (globalThis.performance ? performance.now() : Date.now());
// engine.py's run_many sizes: steps per command buffer, input bytes per chunk, losses per readback
const MANY_CHUNK = 32;
const MANY_UPLOAD_BYTES = 8 << 20;
const MANY_RING = 4096;

// Tint wants this directive in every shader that uses subgroup operations (naga, behind the
// Python package, rejects it), so the subgroup variants get it here.
const ENABLE_SUBGROUPS = "enable subgroups;\n";

/** engine.py's _lanes_out_of_order: the subgroup variants pair invocation i with i ^ m through
 * subgroupShuffleXor, which holds where a subgroup is a run of consecutive invocations at least as
 * long as the groups; checked once on the device for each workgroup size and mask they use.
 * Resolves to null when the lanes pair up, else what went wrong. */
async function lanesOutOfOrder(device, sources) {
  const found = (re) => [...new Set(sources.flatMap((s) => [...s.matchAll(re)].map((m) => Number(m[1]))))].sort((a, b) => a - b);
  const sizes = found(/@workgroup_size\((\d+)\)/g);
  const masks = found(/subgroupShuffleXor\([^,]+, (\d+)u\)/g);
  const stride = Math.max(...sizes);
  let code = ENABLE_SUBGROUPS + "@group(0) @binding(0) var<storage, read_write> out: array<u32>;\n";
  sizes.forEach((n, k) => masks.forEach((m, j) => {
    code += `@compute @workgroup_size(${n})\nfn probe${n}_${m}(@builtin(local_invocation_index) i: u32) {\n` +
      `    out[${(k * masks.length + j) * stride}u + i] = subgroupShuffleXor(i, ${m}u);\n}\n`;
  }));
  const bytes = 4 * stride * sizes.length * masks.length;
  const out = device.createBuffer({ size: bytes, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC });
  const rb = device.createBuffer({ size: bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const module = device.createShaderModule({ label: "subgroup lanes probe", code });
  const enc = device.createCommandEncoder();
  for (const n of sizes) for (const m of masks) {
    const pipeline = device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: `probe${n}_${m}` } });
    const group = device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries: [{ binding: 0, resource: { buffer: out } }] });
    const pass = enc.beginComputePass();
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, group);
    pass.dispatchWorkgroups(1);
    pass.end();
  }
  enc.copyBufferToBuffer(out, 0, rb, 0, bytes);
  device.queue.submit([enc.finish()]);
  await rb.mapAsync(GPUMapMode.READ);
  const got = new Uint32Array(rb.getMappedRange().slice(0));
  rb.unmap();
  rb.destroy();
  out.destroy();
  for (const [k, n] of sizes.entries())
    for (const [j, m] of masks.entries())
      for (let i = 0; i < n; i++)
        if (got[(k * masks.length + j) * stride + i] !== (i ^ m))
          return `invocation i of a ${n}-invocation workgroup does not find i ^ ${m} in its subgroup`;
  return null;
}

// ---- which kernel set suits the adapter (the same rules as aot/runtime/kernel_sets.py) ----
// Software adapters by name: SwiftShader (Chrome's fallback adapter), Mesa's llvmpipe and lavapipe
// (behind Dawn's Vulkan, GL or GL ES backends, or ANGLE) and Microsoft's WARP ("Microsoft Basic
// Render Driver"); Mesa's and Microsoft's vendor ids name only their software drivers (Mesa's
// hardware drivers report the GPU maker's).
const SOFTWARE_NAMES = /swiftshader|llvmpipe|lavapipe|softpipe|basic render|\bwarp\b/i;
const SOFTWARE_VENDORS = ["mesa", "microsoft", "0x10005", "0x1414"];

/** [kernel set, why] from what an adapter says of itself (its GPUAdapterInfo); the set is null
 * where it says nothing to go by, and timeKernelSets decides. */
export function recognise(info, fallback = false) {
  const fields = ["vendor", "architecture", "device", "description"].map((k) => String(info[k] ?? "").trim());
  const text = fields.filter(Boolean).join(", ");
  if (info.isFallbackAdapter || fallback) return ["cpu", `a software adapter (the browser's fallback adapter${text ? ": " + text : ""})`];
  const name = text.match(SOFTWARE_NAMES);
  if (name) return ["cpu", `a software adapter (${name[0]}: ${text})`];
  if (SOFTWARE_VENDORS.includes(fields[0].toLowerCase())) return ["cpu", `a software adapter (vendor ${text})`];
  if (!text) return [null, "the adapter does not say what it is"];
  return ["gpu", `a GPU (${text})`];
}

// Two small kernels that compute the same 64 x 64 matmul the way each set does: the GPU set's
// (16 x 16 tiles of C, A and B staged through workgroup memory between barriers) and the CPU set's
// (each invocation sums a 4 x 4 block over all of K by itself). A CPU adapter runs the first an
// order of magnitude slower; on a GPU both take a few microseconds.
const PROBE_N = 64;
const PROBE_REPS = 4; // dispatches per timing
const PROBE_MARGIN = 2; // the CPU set only where its probe is this many times faster
const PROBE_BINDINGS = `@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
const N = ${PROBE_N}u;
`;
const PROBES = {
  gpu: [[PROBE_N / 16, PROBE_N / 16], PROBE_BINDINGS + `var<workgroup> ta: array<f32, 256>;
var<workgroup> tb: array<f32, 256>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let row = wg.y * 16u + l.y;
    let col = wg.x * 16u + l.x;
    var acc = 0.0;
    for (var k0 = 0u; k0 < N; k0 += 16u) {
        ta[l.y * 16u + l.x] = a[row * N + k0 + l.x];
        tb[l.y * 16u + l.x] = b[(k0 + l.y) * N + col];
        workgroupBarrier();
        for (var k = 0u; k < 16u; k++) {
            acc += ta[l.y * 16u + k] * tb[k * 16u + l.x];
        }
        workgroupBarrier();
    }
    c[row * N + col] = acc;
}
`],
  cpu: [[PROBE_N * PROBE_N / 16 / 64, 1], PROBE_BINDINGS + `
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let row0 = g.x / (N / 4u) * 4u;
    let col0 = g.x % (N / 4u) * 4u;
    var c0 = vec4<f32>();
    var c1 = vec4<f32>();
    var c2 = vec4<f32>();
    var c3 = vec4<f32>();
    for (var k = 0u; k < N; k++) {
        let bk = vec4<f32>(b[k * N + col0], b[k * N + col0 + 1u], b[k * N + col0 + 2u], b[k * N + col0 + 3u]);
        c0 += a[row0 * N + k] * bk;
        c1 += a[(row0 + 1u) * N + k] * bk;
        c2 += a[(row0 + 2u) * N + k] * bk;
        c3 += a[(row0 + 3u) * N + k] * bk;
    }
    for (var j = 0u; j < 4u; j++) {
        c[row0 * N + col0 + j] = c0[j];
        c[(row0 + 1u) * N + col0 + j] = c1[j];
        c[(row0 + 2u) * N + col0 + j] = c2[j];
        c[(row0 + 3u) * N + col0 + j] = c3[j];
    }
}
`],
};

/** {cpu, gpu}: milliseconds of PROBE_REPS dispatches of each set's probe kernel on `device`, the
 * better of two timings after one untimed dispatch (some adapters compile at the first). */
async function timeKernelSets(device) {
  const bytes = 4 * PROBE_N * PROBE_N;
  const buffers = [0, 1, 2].map(() => device.createBuffer({ size: bytes, usage: GPUBufferUsage.STORAGE }));
  const out = {};
  for (const [set, [grid, code]] of Object.entries(PROBES)) {
    const module = device.createShaderModule({ label: `${set} set probe`, code });
    const pipeline = await device.createComputePipelineAsync({ layout: "auto", compute: { module, entryPoint: "main" } });
    const group = device.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: buffers.map((buffer, binding) => ({ binding, resource: { buffer } })),
    });
    const run = async (reps) => {
      const enc = device.createCommandEncoder();
      const pass = enc.beginComputePass();
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      for (let r = 0; r < reps; r++) pass.dispatchWorkgroups(grid[0], grid[1]);
      pass.end();
      device.queue.submit([enc.finish()]);
      await device.queue.onSubmittedWorkDone();
    };
    await run(1);
    out[set] = Infinity;
    for (let t = 0; t < 2; t++) {
      const t0 = now();
      await run(PROBE_REPS);
      out[set] = Math.min(out[set], now() - t0);
    }
  }
  for (const b of buffers) b.destroy();
  return out;
}

/** What an adapter says of itself (its GPUAdapterInfo's fields). */
function adapterInfoOf(adapter) {
  const info = adapter.info || {};
  const out = Object.fromEntries(["vendor", "architecture", "device", "description", "isFallbackAdapter"].map((k) => [k, info[k] ?? ""]));
  out.isFallbackAdapter = Boolean(info.isFallbackAdapter || adapter.isFallbackAdapter);
  return out;
}

class Engine {
  static async create(name, program, wgsl, wgslCpu = {}, kernels = "auto", wgslSubgroup = {}, adapterOption = null) {
    const e = new Engine();
    // where the time goes, in ms (SwiftShader: creating pipelines and barrier-heavy kernels are slow):
    // create's phases, each entry's _prepare, and the last run's [host, waiting for the GPU]
    e.timings = { create: {}, prepare: {}, last: null };
    let t = now();
    const mark = (phase) => { const t1 = now(); e.timings.create[phase] = t1 - t; t = t1; };
    e.name = name;
    e.program = program;
    e.wgsl = wgsl;
    const gpu = globalThis.navigator && navigator.gpu;
    if (!gpu) throw new Error(`${name}: this browser has no WebGPU (navigator.gpu is missing; it needs a secure context: https or localhost)`);
    // Model.create({adapter}): a GPUAdapter, or requestAdapter's options
    const options = adapterOption ?? { powerPreference: "high-performance" };
    const adapter = typeof GPUAdapter !== "undefined" && options instanceof GPUAdapter ? options : await gpu.requestAdapter(options);
    if (!adapter) throw new Error(`${name}: no WebGPU adapter found (navigator.gpu.requestAdapter(${JSON.stringify(options)}) returned null)`);
    // the kernel set, as the Python package picks it (kernel_sets.py): the CPU
    // variants on a software adapter, where workgroup barriers are slow; the subgroup set (the GPU
    // set with its attention rows shared by subgroup lanes) where the adapter offers subgroups and
    // the program has such variants; else the GPU set. An adapter whose info says nothing (Chrome
    // masks it on some backends) gets the faster of two probe kernels, timed on its device.
    const info = adapter.info || {};
    e.adapterInfo = adapterInfoOf(adapter);
    const hasSubgroups = adapter.features.has("subgroups");
    const variants = Object.keys(wgslSubgroup).length > 0;
    const [known, why] = kernels === "auto" ? recognise(info, adapter.isFallbackAdapter) : [kernels, `asked for (kernels: "${kernels}")`];
    e.kernelSet = known ?? "gpu";
    e.kernelSetReason = why;
    const said = why;
    if (e.kernelSet === "subgroup" && !hasSubgroups)
      throw new Error(`${name}: Model.create({kernels: "subgroup"}) needs an adapter with WebGPU's "subgroups" feature, ` +
        `which this one does not offer; use "gpu" or "auto"`);
    if (kernels === "auto" && e.kernelSet === "gpu" && variants && hasSubgroups) {
      e.kernelSet = "subgroup";
      e.kernelSetReason += "; it offers subgroups";
    }
    const requiredLimits = {};
    // a compatibility-mode adapter (no "core-features-and-limits") has lower defaults than core
    // WebGPU's: there every limit the program needs is asked for
    const core = adapter.features.has("core-features-and-limits");
    for (const [key, need] of Object.entries(program.limits)) {
      const have = adapter.limits[key];
      if (have !== undefined && need > have)
        throw new Error(`${name} needs ${key} = ${need}, but this adapter allows ${have}; rebuild with a smaller ` +
          `--max-binding-mib or smaller sizes so the program fits this device`);
      if (need > (program.default_limits[key] ?? Infinity) || (!core && have !== undefined)) requiredLimits[key] = need;
    }
    e.requiredLimits = requiredLimits;
    mark("adapter");
    e.device = await adapter.requestDevice({
      label: name, requiredLimits, requiredFeatures: e.kernelSet === "subgroup" ? ["subgroups"] : [],
    });
    mark("device");
    if (known === null) {
      e.probe = await timeKernelSets(e.device);
      const [cpu, gpu] = [e.probe.cpu.toFixed(2), e.probe.gpu.toFixed(2)];
      if (e.probe.cpu * PROBE_MARGIN < e.probe.gpu) {
        e.kernelSet = "cpu";
        e.kernelSetReason = `${said}; timed: the CPU set's probe kernel took ${cpu} ms, the GPU set's ${gpu} ms`;
      } else
        e.kernelSetReason = `${said}; timed: the GPU set's probe kernel took ${gpu} ms, the CPU set's ${cpu} ms` + e.kernelSetReason.slice(said.length);
      mark("probe");
    }
    if (e.kernelSet === "cpu") {
      e.wgsl = wgsl = { ...wgsl, ...wgslCpu };
      // every kernel a dispatch of its own: the GPU set runs independent kernels together, slower here
      const entries = {};
      for (const [key, en] of Object.entries(program.entries))
        entries[key] = en.dispatches_cpu ? { ...en, dispatches: en.dispatches_cpu, update_from: en.update_from_cpu ?? en.update_from } : en;
      e.program = program = { ...program, entries };
    }
    if (e.kernelSet === "subgroup" && variants) {
      const wrong = await lanesOutOfOrder(e.device, Object.values(wgslSubgroup));
      if (wrong && kernels === "subgroup")
        throw new Error(`${name}: Model.create({kernels: "subgroup"}) cannot run on this adapter: ${wrong}; use "gpu"`);
      if (wrong) {
        e.kernelSet = "gpu";
        e.kernelSetReason += `; but ${wrong}`;
      } else e.wgsl = wgsl = { ...wgsl, ...Object.fromEntries(Object.entries(wgslSubgroup).map(([k, v]) => [k, ENABLE_SUBGROUPS + v])) };
      mark("subgroupCheck");
    }
    e.order = Object.keys(program.arenas);
    e.buffers = {};
    for (const [a, n] of Object.entries(program.arenas)) e.buffers[a] = e._buffer(a, n);
    e.modules = {};
    e.recipes = {};
    e._pipelines = new Map(); // kernel source (comments aside) + bindings -> its pipeline (a promise)
    e.entryBuffers = {};
    e.readback = {};
    // every kernel's WGSL is compiled up front, so a broken kernel is named at create()
    const names = Object.keys(program.kernels);
    for (const k of names) e.modules[k] = e.device.createShaderModule({ label: k, code: wgsl[k] });
    const infos = await Promise.all(names.map((k) => e.modules[k].getCompilationInfo()));
    names.forEach((k, i) => {
      const errors = infos[i].messages.filter((m) => m.type === "error");
      if (errors.length) {
        const text = errors.map((m) => `${k}.wgsl:${m.lineNum}:${m.linePos} error: ${m.message}`).join("\n");
        throw new ShaderError(`kernel ${k} (from ${program.kernels[k][1]}) failed to compile:\n${text}\n${wgslContext(wgsl[k], errors[0].lineNum)}`);
      }
    });
    mark("shaderModules");
    e._many = {};
    for (const [key, en] of Object.entries(program.entries)) {
      const n = [...en.outputs, ...en.captures].reduce((s, o) => s + sizeOf(o[2]), 0);
      e.readback[key] = e.device.createBuffer({ size: Math.max(4, 4 * n), usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    }
    return e;
  }

  /** A buffer's binding number in every kernel (its vec4 alias's VEC_BINDING_BASE above). */
  _binding(name) {
    if (name === OFFSETS) return OFFSETS_BINDING;
    const base = bufferOf(name);
    return this.order.indexOf(base) + (base === name ? 0 : VEC_BINDING_BASE);
  }

  _buffer(label, n) {
    return this.device.createBuffer({ label, size: Math.max(4, 4 * n), usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC });
  }

  /** Pipelines and bind groups of one entry point, at its first call. */
  async _prepare(key) {
    const t0 = now();
    const en = this.program.entries[key];
    const buffers = { ...this.buffers };
    for (const [a, n] of Object.entries(en.arenas || {}))
      if (a.startsWith("work") && 4 * n > this.buffers[a].size) buffers[a] = this._buffer(a, n); // its own scratch
    this.entryBuffers[key] = buffers;
    // The CPU set's kernels that read where their operands start from an offset table: one
    // 256-byte slot each in a uniform buffer, picked per dispatch (engine.py _offset_tables)
    const slots = {};
    if (this.kernelSet === "cpu")
      for (const [k] of en.dispatches) {
        const table = this.program.kernels[k][2];
        if (table && table.length && !(k in slots)) slots[k] = [OFFSETS_SLOT_BYTES * Object.keys(slots).length, table];
      }
    const nSlots = Object.keys(slots).length;
    if (nSlots) {
      const data = new Uint32Array(nSlots * OFFSETS_SLOT_BYTES / 4);
      for (const [at, table] of Object.values(slots)) data.set(table, at / 4);
      buffers[OFFSETS] = this.device.createBuffer({ label: OFFSETS, size: data.byteLength, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
      this.device.queue.writeBuffer(buffers[OFFSETS], 0, data);
    }
    this.device.pushErrorScope("validation");
    const steps = await Promise.all(en.dispatches.map(async ([k, grid]) => {
      const [storage, site] = this.program.kernels[k];
      const bindings = k in slots ? [...storage, [OFFSETS, "uniform"]] : storage;
      const layout = this.device.createBindGroupLayout({
        label: k,
        entries: bindings.map(([a, access]) => ({
          binding: this._binding(a), visibility: GPUShaderStage.COMPUTE,
          buffer: { type: BUFFER_TYPE[access], hasDynamicOffset: access === "uniform" },
        })),
      });
      const group = this.device.createBindGroup({
        label: k, layout,
        entries: bindings.map(([a]) => ({
          binding: this._binding(a),
          resource: a === OFFSETS ? { buffer: buffers[OFFSETS], size: OFFSETS_SLOT_BYTES } : { buffer: buffers[bufferOf(a)] },
        })),
      });
      // one pipeline per source (comments aside) and bindings: kernels that differ only in their
      // offset tables are compiled once
      const code = codeOnly(this.wgsl[k]) + JSON.stringify(bindings);
      if (!this._pipelines.has(code))
        this._pipelines.set(code, this.device.createComputePipelineAsync({
          label: k, layout: this.device.createPipelineLayout({ bindGroupLayouts: [layout] }),
          compute: { module: this.modules[k], entryPoint: "main" },
        }).catch((err) => { throw new ShaderError(`kernel ${k} (from ${site}) failed to compile:\n${err.message}`); }));
      const pipeline = await this._pipelines.get(code);
      return [pipeline, group, grid, k in slots ? [slots[k][0]] : []];
    }));
    const err = await this.device.popErrorScope();
    if (err) throw new ShaderError(`${this.name}: preparing ${key} failed: ${err.message}`);
    this.recipes[key] = steps;
    this.timings.prepare[key] = now() - t0;
  }

  write(arena, offset, data) {
    if (data.length) this.device.queue.writeBuffer(this.buffers[arena], 4 * offset, data.buffer, data.byteOffset, data.byteLength);
  }

  async read(arena, offset, count, Type = Float32Array) {
    if (count === 0) return new Type(0);
    const staging = this.device.createBuffer({ size: 4 * count, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    const enc = this.device.createCommandEncoder();
    enc.copyBufferToBuffer(this.buffers[arena], 4 * offset, staging, 0, 4 * count);
    this.device.queue.submit([enc.finish()]);
    await staging.mapAsync(GPUMapMode.READ);
    const out = new Type(staging.getMappedRange().slice(0));
    staging.destroy();
    return out;
  }

  /** One compute pass with every dispatch of `key`. */
  _record(enc, key) {
    const pass = enc.beginComputePass();
    for (const [pipeline, group, grid, dyn] of this.recipes[key]) {
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group, dyn);
      pass.dispatchWorkgroups(grid[0], grid[1], grid[2]);
    }
    pass.end();
  }

  /** Copies of the outputs (+ captures) into the entry's readback buffer; returns what _unpack reads. */
  _reads(enc, key, wantCaptures) {
    const en = this.program.entries[key];
    const buffers = this.entryBuffers[key];
    const reads = wantCaptures ? [...en.outputs, ...en.captures] : en.outputs;
    const rb = this.readback[key];
    let pos = 0;
    for (const [, , shape, arena, off] of reads) {
      const n = sizeOf(shape);
      if (n) enc.copyBufferToBuffer(buffers[arena], 4 * off, rb, 4 * pos, 4 * n);
      pos += n;
    }
    return reads;
  }

  async _unpack(key, reads) {
    const total = reads.reduce((s, r) => s + sizeOf(r[2]), 0);
    const out = {};
    if (total) {
      const rb = this.readback[key];
      const t = now();
      await rb.mapAsync(GPUMapMode.READ, 0, 4 * total);
      this._waited += now() - t;
      const raw = rb.getMappedRange(0, 4 * total).slice(0);
      rb.unmap();
      let pos = 0;
      for (const [name, dtype, shape] of reads) {
        const n = sizeOf(shape);
        const Type = dtype === "i32" ? Int32Array : Float32Array;
        out[name] = { data: new Type(raw, 4 * pos, n), shape: [...shape], dtype };
        pos += n;
      }
    }
    return out;
  }

  /** One call of an entry point: upload, one pass, writebacks, readback of outputs (+captures). */
  async run(key, packed, wantCaptures) {
    if (!this.recipes[key]) await this._prepare(key);
    const t0 = now();
    this._waited = 0;
    const en = this.program.entries[key];
    const buffers = this.entryBuffers[key];
    for (const [arena, data] of Object.entries(packed))
      if (data.length) this.device.queue.writeBuffer(buffers[arena], 0, data.buffer, data.byteOffset, data.byteLength);
    const enc = this.device.createCommandEncoder();
    this._record(enc, key);
    for (const [src, so, dst, d, n] of en.copies) enc.copyBufferToBuffer(buffers[src], 4 * so, buffers[dst], 4 * d, 4 * n);
    const reads = this._reads(enc, key, wantCaptures);
    this.device.queue.submit([enc.finish()]);
    const out = await this._unpack(key, reads);
    this.timings.last = [now() - t0 - this._waited, this._waited];
    return out;
  }

  /** Steps per chunk of runMany for this entry: MANY_CHUNK, fewer for large inputs (engine.many_slots). */
  manySlots(key) {
    const sizes = this.program.entries[key].input_sizes;
    const perStep = 4 * Object.values(sizes).reduce((a, b) => a + b, 0);
    return Math.max(1, Math.min(MANY_CHUNK, Math.floor(MANY_UPLOAD_BYTES / Math.max(perStep, 1))));
  }

  /** k training steps of `key` (engine.run_many). fill(start, n) -> {arena: typed array [n * input size]}
   * gives the packed inputs of steps start .. start + n - 1, one row per step laid out as run's.
   * Chunks of manySlots(key) steps: one upload, one command buffer and one submit each, and no
   * wait; every step's loss is copied into a ring read back when full and at the end.
   * Resolves to [losses (Float32Array [k]), outputs/captures of the last step or null]. */
  async runMany(key, k, fill, wantCaptures) {
    if (!this.recipes[key]) await this._prepare(key);
    const t0 = now();
    this._waited = 0;
    const en = this.program.entries[key];
    const buffers = this.entryBuffers[key];
    const sizes = en.input_sizes;
    let area = this._many[key];
    if (!area) {
      const slots = this.manySlots(key);
      const stage = {};
      for (const [a, n] of Object.entries(sizes))
        if (n) stage[a] = this.device.createBuffer({ label: `${a}_slots`, size: 4 * slots * n, usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
      const ring = this.device.createBuffer({ label: "loss_ring", size: 4 * MANY_RING, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
      area = this._many[key] = { slots, stage, ring };
    }
    const { slots, stage, ring } = area;
    const [, , , lossArena, lossOff] = en.outputs.find((o) => o[0] === "loss");
    const lossBuf = buffers[lossArena];
    const losses = new Float32Array(k);
    let inRing = 0, start = 0, reads = null;
    while (start < k) {
      if (this.destroyed) throw new Error(`${this.name}: the device was destroyed (the model was closed)`);
      const n = Math.min(slots, k - start, MANY_RING - inRing);
      const packed = fill(start, n);
      for (const [a, rows] of Object.entries(packed))
        if (stage[a]) this.device.queue.writeBuffer(stage[a], 0, rows.buffer, rows.byteOffset, rows.byteLength);
      const enc = this.device.createCommandEncoder();
      for (let i = 0; i < n; i++) {
        for (const [a, buf] of Object.entries(stage)) enc.copyBufferToBuffer(buf, 4 * i * sizes[a], buffers[a], 0, 4 * sizes[a]);
        this._record(enc, key);
        for (const [src, so, dst, d, m] of en.copies) enc.copyBufferToBuffer(buffers[src], 4 * so, buffers[dst], 4 * d, 4 * m);
        enc.copyBufferToBuffer(lossBuf, 4 * lossOff, ring, 4 * (inRing + i), 4);
      }
      const last = start + n === k;
      if (last && wantCaptures) reads = this._reads(enc, key, true);
      this.device.queue.submit([enc.finish()]);
      start += n;
      inRing += n;
      if (inRing === MANY_RING || last) {
        const t = now();
        await ring.mapAsync(GPUMapMode.READ, 0, 4 * inRing);
        this._waited += now() - t;
        losses.set(new Float32Array(ring.getMappedRange(0, 4 * inRing).slice(0)), start - inRing);
        ring.unmap();
        inRing = 0;
      }
    }
    const out = reads === null ? null : await this._unpack(key, reads);
    this.timings.last = [now() - t0 - this._waited, this._waited];
    return [losses, out];
  }

  destroy() {
    this.destroyed = true;
    for (const b of Object.values(this.buffers)) b.destroy();
    this.device.destroy();
  }
}

// ---- the "wasm" kernel set: the whole step in WebAssembly, no WebGPU (aot/wasm_build.py) ----
// One linear memory holds every arena at the build's addresses (WASM.layout); one exported
// function per entry point runs its dispatch list and copies. Inputs go in and outputs come out
// through typed-array views of that memory.
const WASM_MATH = {
  exp: Math.exp, log: Math.log, sin: Math.sin, cos: Math.cos, tan: Math.tan, tanh: Math.tanh, pow: Math.pow,
  exp2: (x) => 2 ** x, log2: Math.log2, atan: Math.atan, atan2: Math.atan2, asin: Math.asin, acos: Math.acos,
  sinh: Math.sinh, cosh: Math.cosh,
};
function fromBase64(text) {
  const bin = atob(text);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return bytes;
}
/** Why the wasm set cannot run here, or null: the build left it out, or this engine lacks wasm SIMD. */
function wasmUnavailable(wasmSet) {
  if (!wasmSet) return "this module was built without the wasm kernel set";
  if (wasmSet.error) return `the build left the wasm kernel set out: ${wasmSet.error}`;
  if (typeof WebAssembly === "undefined") return "this JavaScript engine has no WebAssembly";
  if (!wasmSet.bytes) {
    // the matmuls' multiply-adds fused where the engine has relaxed SIMD (FMA on x86-64 and ARM64)
    const relaxed = wasmSet.wasm_relaxed && fromBase64(wasmSet.wasm_relaxed);
    wasmSet.relaxed = Boolean(relaxed && WebAssembly.validate(relaxed));
    wasmSet.bytes = wasmSet.relaxed ? relaxed : fromBase64(wasmSet.wasm);
  }
  if (!WebAssembly.validate(wasmSet.bytes)) {
    return "this JavaScript engine does not compile the wasm kernel set (it needs 128-bit SIMD; a module over an engine's limits fails too)";
  }
  return null;
}

class WasmEngine {
  static async create(name, program, wasmSet, why, adapter = null) {
    const e = new WasmEngine();
    e.timings = { create: {}, prepare: {}, last: null };
    const t0 = now();
    e.name = name;
    e.program = program;
    e.kernelSet = "wasm";
    e.kernelSetReason = why;
    // the software adapter it runs instead of, or none
    e.adapterInfo = adapter ? adapterInfoOf(adapter) : { vendor: "", architecture: "", device: "", description: "WebAssembly (no WebGPU)", isFallbackAdapter: false };
    e.requiredLimits = {};
    e.device = null;
    e.layout = wasmSet.layout;
    e.memory = new WebAssembly.Memory({ initial: wasmSet.pages });
    const math = Object.fromEntries(wasmSet.math.map((n) => [n, WASM_MATH[n]]));
    const { instance } = await WebAssembly.instantiate(wasmSet.bytes, { env: { memory: e.memory }, m: math });
    e.exports = instance.exports;
    e.timings.create.instantiate = now() - t0;
    return e;
  }
  _bytes(arena, offset, nbytes) {
    return new Uint8Array(this.memory.buffer, this.layout[arena][0] + 4 * offset, nbytes);
  }
  write(arena, offset, data) {
    if (data.length) this._bytes(arena, offset, data.byteLength).set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
  }
  async read(arena, offset, count, Type = Float32Array) {
    return new Type(this.memory.buffer, this.layout[arena][0] + 4 * offset, count).slice();
  }
  _call(key) {
    const f = this.exports["run:" + key];
    if (!f) throw new Error(`${this.name}: the wasm module has no entry ${key}`);
    f();
  }
  _unpack(key, wantCaptures) {
    const en = this.program.entries[key];
    const out = {};
    for (const [name, dtype, shape, arena, off] of wantCaptures ? [...en.outputs, ...en.captures] : en.outputs) {
      const Type = dtype === "i32" ? Int32Array : Float32Array;
      out[name] = { data: new Type(this.memory.buffer, this.layout[arena][0] + 4 * off, sizeOf(shape)).slice(), shape: [...shape], dtype };
    }
    return out;
  }
  async run(key, packed, wantCaptures) {
    const t0 = now();
    for (const [arena, data] of Object.entries(packed)) this.write(arena, 0, data);
    this._call(key);
    const out = this._unpack(key, wantCaptures);
    this.timings.last = [now() - t0, 0];
    return out;
  }
  manySlots(key) {
    return Engine.prototype.manySlots.call(this, key);
  }
  async runMany(key, k, fill, wantCaptures) {
    const t0 = now();
    const en = this.program.entries[key];
    const sizes = en.input_sizes;
    const [, , , lossArena, lossOff] = en.outputs.find((o) => o[0] === "loss");
    const loss = new Float32Array(this.memory.buffer, this.layout[lossArena][0] + 4 * lossOff, 1);
    const losses = new Float32Array(k);
    const slots = this.manySlots(key);
    for (let start = 0; start < k; start += slots) {
      const n = Math.min(slots, k - start);
      const rows = fill(start, n);
      for (let i = 0; i < n; i++) {
        for (const [a, m] of Object.entries(sizes)) if (m) this.write(a, 0, rows[a].subarray(i * m, (i + 1) * m));
        this._call(key);
        losses[start + i] = loss[0];
      }
    }
    const out = wantCaptures ? this._unpack(key, true) : null;
    this.timings.last = [now() - t0, 0];
    return [losses, out];
  }
  destroy() {
    this.destroyed = true;
    this.exports = {};
  }
}

/** The engine Model.create asked for: the wasm set where asked, or ("auto") where WebGPU is
 * missing or its adapter is a software one and the build has the set; else WebGPU's Engine. */
async function createEngine(name, program, wgsl, wgslCpu, kernels, wgslSubgroup, adapterOption, wasmSet) {
  if (kernels === "wasm") {
    const why = wasmUnavailable(wasmSet);
    if (why) throw new Error(`${name}: Model.create({kernels: "wasm"}) cannot run: ${why}; use "auto" or "cpu"`);
    return WasmEngine.create(name, program, wasmSet, `asked for (kernels: "wasm")`);
  }
  if (kernels !== "auto" || wasmUnavailable(wasmSet)) return Engine.create(name, program, wgsl, wgslCpu, kernels, wgslSubgroup, adapterOption);
  const gpu = globalThis.navigator && navigator.gpu;
  if (!gpu) return WasmEngine.create(name, program, wasmSet, "this JavaScript engine has no WebGPU (navigator.gpu is missing)");
  const options = adapterOption ?? { powerPreference: "high-performance" };
  const adapter = typeof GPUAdapter !== "undefined" && options instanceof GPUAdapter ? options : await gpu.requestAdapter(options);
  if (!adapter) return WasmEngine.create(name, program, wasmSet, `no WebGPU adapter (requestAdapter(${JSON.stringify(options)}) returned null)`);
  const [set, why] = recognise(adapter.info || {}, adapter.isFallbackAdapter);
  if (set === "cpu") return WasmEngine.create(name, program, wasmSet, `${why}: WebAssembly runs the step faster than its WGSL`, adapter);
  const e = await Engine.create(name, program, wgsl, wgslCpu, kernels, wgslSubgroup, adapter);
  if (e.kernelSet !== "cpu") return e;
  // an adapter that says nothing, timed as a CPU: WebAssembly beats its WGSL too
  e.destroy();
  const w = await WasmEngine.create(name, program, wasmSet, `${e.kernelSetReason}: WebAssembly runs the step faster than the CPU set's WGSL`, adapter);
  w.probe = e.probe;
  return w;
}

function wgslContext(source, line) {
  if (!line) return "";
  const lines = source.split("\n");
  const lo = Math.max(0, line - 3), hi = Math.min(lines.length, line + 2);
  const out = [];
  for (let i = lo; i < hi; i++) out.push(`${i + 1 === line ? ">>" : "  "} ${String(i + 1).padStart(4)} | ${lines[i]}`);
  return out.join("\n");
}

// ---- inputs: what numpy would make of them, for the same checks and messages as model.py ----
const TYPED = [
  [Float32Array, "float32", "f"], [Float64Array, "float64", "f"], [Int32Array, "int32", "i"], [Int8Array, "int8", "i"],
  [Int16Array, "int16", "i"], [Uint8Array, "uint8", "u"], [Uint8ClampedArray, "uint8", "u"], [Uint16Array, "uint16", "u"],
  [Uint32Array, "uint32", "u"],
];
function flatten(value, shape, flat, depth) {
  if (Array.isArray(value)) {
    if (shape.length <= depth) shape.push(value.length);
    else if (shape[depth] !== value.length) return false;
    for (const v of value) if (!flatten(v, shape, flat, depth + 1)) return false;
    return true;
  }
  if (depth !== shape.length) return false;
  flat.push(value);
  return true;
}
/** {data, shape, dtype (numpy's name), kind ("f", "i", "u" or "" for non-numeric)} of one input. */
function asArray(value) {
  if (value && typeof value === "object" && !Array.isArray(value) && "data" in value && "shape" in value) {
    const { data, shape } = value;
    if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && d >= 0)) throw new Error("shape must be an array of sizes");
    let arr = data;
    if (Array.isArray(data)) arr = fromPlain(data);
    const t = TYPED.find(([T]) => arr instanceof T);
    if (!t) return { data: null, shape, dtype: "object", kind: "" };
    if (arr.length !== sizeOf(shape)) throw new Error(`data has ${arr.length} values, shape ${pyTuple(shape)} needs ${sizeOf(shape)}`);
    return { data: arr, shape, dtype: t[1], kind: t[2] };
  }
  const t = TYPED.find(([T]) => value instanceof T);
  if (t) return { data: value, shape: [value.length], dtype: t[1], kind: t[2] };
  if (typeof value === "number") return { ...describePlain([value]), shape: [] };
  if (!Array.isArray(value)) throw new Error(`expected nested arrays of numbers or {data, shape}, got ${typeof value}`);
  const shape = [], flat = [];
  if (!flatten(value, shape, flat, 0)) throw new Error("the nested arrays are ragged");
  return { ...describePlain(flat), shape };
}
/** [bound, value] for each value of an i32 input that index ops read (model.py's _indexed):
 * `checks` is one bound for all of it, or [bound, offset, [[size, stride], ...]] per part (with a
 * fourth item where the part may also hold that one value, an ignore_index), in each of its
 * `batches` (stepMany's stacked inputs) alike. */
function* indexed(data, checks, batches) {
  if (typeof checks === "number") {
    for (const v of data) yield [checks, v];
    return;
  }
  const per = data.length / batches;
  for (let bt = 0; bt < batches; bt++) {
    for (const [bound, offset, dims, allowed] of checks) {
      const count = dims.reduce((n, [size]) => n * size, 1);
      for (let e = 0; e < count; e++) {
        let at = bt * per + offset;
        for (let d = dims.length - 1, rest = e; d >= 0; d--) {
          at += (rest % dims[d][0]) * dims[d][1];
          rest = Math.floor(rest / dims[d][0]);
        }
        if (data[at] !== allowed) yield [bound, data[at]];
      }
    }
  }
}

function describePlain(flat) {
  if (!flat.every((v) => typeof v === "number")) return { data: null, dtype: "object", kind: "" };
  return flat.every((v) => Number.isInteger(v)) ? { data: flat, dtype: "int64", kind: "i" } : { data: Float64Array.from(flat), dtype: "float64", kind: "f" };
}
function fromPlain(flat) {
  const d = describePlain(flat);
  return d.data === null ? null : d.kind === "i" ? Float64Array.from(flat) : d.data;
}
/** Python's type name of what a JS value would be (for step_many's message on a batch that is not a dict). */
function pyTypeName(v) {
  if (v === null || v === undefined) return "NoneType";
  if (typeof v === "number") return Number.isInteger(v) ? "int" : "float";
  if (typeof v === "bigint") return "int";
  if (typeof v === "string") return "str";
  if (typeof v === "boolean") return "bool";
  if (Array.isArray(v)) return "list";
  if (ArrayBuffer.isView(v)) return "ndarray";
  return (v.constructor && v.constructor.name) || "object";
}
const describe = (a) => `${a.dtype} array of shape ${pyTuple(a.shape)}`;
const specStr = (dtype, dims) => `${dtype}[${dims.join(",")}]`;
function dimsNote(shape, dims) {
  const syms = [...new Set(shape.filter((d) => typeof d === "string"))];
  return syms.length ? " with " + syms.map((d) => `${d} in ${pyTuple(dims[d])}`).join(", ") : "";
}

/** The method that runs `entry`, as the Python package names it (model.py's _method). */
function methodName(entry, stacked) {
  if (entry === "train") return stacked ? "step_many" : "step";
  if (entry.startsWith("train_")) return (stacked ? "step_many_" : "step_") + entry.slice(6);
  return entry;
}
/** None, "default" or an index into the entry's optimizer's groups (trains.py's _group_index). */
function groupIndex(e, group) {
  if (group === null || group === undefined || group === "default") return group ?? null;
  if (!Number.isInteger(group)) throw new TypeError(`group must be an int index into the optimizer's groups, 'default' or null, got ${group}`);
  if (group < 0 || group >= e.groupLrs.length) throw new RangeError(`group ${group} out of range: the optimizer has ${e.groupLrs.length} parameter group(s)`);
  return group;
}
/** Table name -> training entry state (trains.py's train_entries): own optimizer, lr, counts. */
function trainEntries(p, total) {
  let tables = p.trains;
  if (!tables) {
    if (!has(p.signatures, "train")) return {};
    tables = { train: { name: "train", optimizer: p.optimizer, lr: p.lr, start: 0, size: total, offset: 0, params: p.params.map((q) => q[0]), state: p.state || [], groups: p.groups || [] } };
  }
  return Object.fromEntries(Object.entries(tables).map(([k, t]) => [k, {
    name: t.name, opt: t.optimizer, lr: t.lr === null ? null : normalizeLr(t.lr), start: t.start, size: t.size,
    offset: t.offset, params: t.params, nState: t.state.length, count: 0, lrOrigin: 0,
    groups: t.groups || [], groupLrs: (t.groups || []).map(([, lr]) => [normalizeLr(lr), 0]),
  }]));
}

// ---- the Model (model.py's ModelBase) ----
// a buffer's dtype -> the buffer holding it and its array type (plan.BUFFER_ARENAS)
const BUFFER_ARENAS = { f32: ["buffers", Float32Array], i32: ["buffers_i32", Int32Array] };
/** np.rint: to the nearest integer, ties to even (an i32 buffer's initial values). */
function rintEven(x) {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}
export class ModelBase {
  /** const model = await Model.create({seed}): acquires a device and uploads the initial parameters. */
  static async create({ seed, kernels = "auto", adapter = null } = {}) {
    if (!["auto", "gpu", "subgroup", "cpu", "wasm"].includes(kernels))
      throw new Error(`Model.create({kernels}) must be "auto", "gpu", "subgroup", "cpu" or "wasm", got ${JSON.stringify(kernels)}`);
    const m = new this();
    const p = this.PROGRAM;
    m._program = p;
    m._seed = checkSeed(seed === undefined || seed === null ? BigInt(p.seed) : seed, "Model.create({seed})");
    m._params = p.params; // [name, shape, init, decay, offset]
    m._buffers = p.buffers || []; // [name, shape, dtype, init, offset in buffers / buffers_i32, PyTorch name]
    m._total = m._params.reduce((s, q) => s + sizeOf(q[1]), 0);
    m._engine = await createEngine(p.name, p, this.WGSL, this.WGSL_CPU || {}, kernels, this.WGSL_SUBGROUP || {}, adapter, this.WASM);
    m._opt = p.optimizer; // the single training entry's (null with several: _trains)
    m._trains = trainEntries(p, m._total);
    m._staging = {};
    m.stepCount = 0;
    m._inferCalls = 0;
    m._closed = false;
    m._hasGrads = Object.keys(m._trains).length > 0;
    m._queue = Promise.resolve();
    await m.reset();
    return m;
  }

  /** Calls run one at a time, in call order (a call's device work must not interleave with another's). */
  _locked(fn) {
    let started = false;
    const run = this._queue.then(() => { this._checkOpen(); started = true; return fn(); }).catch((err) => {
      // close() destroyed the device under a call in flight: whatever the device said, say that
      if (started && this._closed) throw new Error(`${this._program.name}: the model was closed during the call`);
      throw err;
    });
    this._queue = run.catch(() => {});
    return run;
  }
  _checkOpen() {
    if (this._closed) throw new Error(`${this._program.name}: the model is closed`);
  }

  get paramNames() { return this._params.map((q) => q[0]); }
  get bufferNames() { return this._buffers.map((b) => b[0]); }
  get seed() { return this._seed; }
  set seed(v) { this._seed = checkSeed(v, "seed"); }
  /** The lr spec in use; with several training entries, {name: spec} (model.py's lr). */
  get lr() {
    const es = Object.values(this._trains);
    if (es.length > 1) return Object.fromEntries(es.map((e) => [e.name, e.lr]));
    return es.length ? es[0].lr : null;
  }
  /** The training entries' names: ["train"] for one aot.Train, else the dict's keys. */
  get trainEntries() { return Object.values(this._trains).map((e) => e.name); }
  /** {name: steps} of each training entry (its optimizer's step count); stepCount is their sum. */
  get stepCounts() { return Object.fromEntries(Object.values(this._trains).map((e) => [e.name, e.count])); }
  /** The entry a call means (trains.py's _train_entry): by name, or the only one when null. */
  _trainEntry(entry, method) {
    const es = Object.values(this._trains), names = es.map((e) => e.name).join(", ");
    if (!es.length) throw new Error(`${method}(): ${this._program.name} was built without train=: it has no optimizer`);
    if (entry === undefined || entry === null) {
      if (es.length === 1) return es[0];
      throw new TypeError(`${method}(): this model has several training entries (${names}); say which with entry=`);
    }
    const e = es.find((x) => x.name === entry);
    if (!e) throw new KeyError(`${method}(): no training entry ${pyStr(entry)}; this model has ${names}`);
    return e;
  }
  /** The device limits this model asked for beyond WebGPU's defaults ({} when none). */
  get requiredLimits() { return { ...this._engine.requiredLimits }; }
  get device() { return this._engine.device; }
  /** "gpu"; "subgroup": the GPU set with variants that use subgroup operations; "cpu": the
   * kernels' WGSL variants for software adapters; or "wasm": the step as WebAssembly, no WebGPU
   * (what "auto" takes on a software adapter or without WebGPU; Model.create({kernels})). */
  get kernelSet() { return this._engine.kernelSet; }
  /** Why Model.create chose kernelSet: what the adapter said of itself, or the probe kernels'
   * times where it said nothing, or that the set was asked for. */
  get kernelSetReason() { return this._engine.kernelSetReason; }
  /** The adapter's GPUAdapterInfo fields (vendor, architecture, device, description, isFallbackAdapter). */
  get adapterInfo() { return { ...this._engine.adapterInfo }; }

  _split(flat) {
    const out = [];
    for (const [n, s, , , o] of this._params) out.push([n, { data: flat.slice(o, o + sizeOf(s)), shape: [...s], dtype: "f32" }]);
    return Object.fromEntries(out); // own properties, "__proto__" included
  }
  /** {name: {data: Float32Array, shape}}: a copy of every parameter. */
  params() {
    return this._locked(async () => this._split(await this._engine.read("params", 0, this._total)));
  }
  /** Gradients of the training entry's last step (before clipping), zeros before its first, for
   * the parameters it trains (frozen ones have none); entry: which one (null: the only one). */
  grads(entry = null) {
    return this._locked(async () => {
      if (!this._hasGrads) throw new Error(`${this._program.name} was built without train=: it has no gradients`);
      const e = this._trainEntry(entry, "grads");
      const flat = e.size ? await this._engine.read("grads", e.offset, e.size) : new Float32Array(0);
      const out = [];
      for (const [n, s, , , o] of this._params) {
        if (e.params.includes(n)) out.push([n, { data: flat.slice(o - e.start, o - e.start + sizeOf(s)), shape: [...s], dtype: "f32" }]);
      }
      return Object.fromEntries(out);
    });
  }
  /** Overwrite parameters by name ({name: {data, shape} or nested arrays}); checked whole first. */
  loadParams(values, { partial = false } = {}) {
    let arrays;
    try { this._checkOpen(); arrays = this._checkParams(values, partial); } catch (e) { return Promise.reject(e); }
    return this._locked(async () => {
      for (const [n, a, o] of arrays) this._engine.write("params", o, a);
    });
  }
  /** loadParams's checks: [name, Float32Array copy, offset] of each value. */
  _checkParams(values, partial) {
    const known = Object.fromEntries(this._params.map(([n, s, , , o]) => [n, [s, o]]));
    const names = Object.keys(values);
    const unknown = names.filter((n) => !has(known, n)).sort();
    if (unknown.length) throw new KeyError(`load_params: unknown parameter(s) ${pyList(unknown)}; this model has ${pyList(Object.keys(known).sort())}`);
    const missing = Object.keys(known).filter((n) => !has(values, n)).sort();
    if (missing.length && !partial) throw new KeyError(`load_params: missing parameter(s) ${pyList(missing)} (pass partial=True to load a subset)`);
    const arrays = [];
    for (const n of names) {
      const a = asArray(values[n]);
      if (!a.kind) throw new TypeError(`load_params: ${pyStr(n)} must be numeric, got ${describe(a)}`);
      if (pyTuple(a.shape) !== pyTuple(known[n][0])) throw new ValueError(`load_params: ${pyStr(n)} expects shape ${pyTuple(known[n][0])}, got ${pyTuple(a.shape)}`);
      arrays.push([n, Float32Array.from(a.data), known[n][1]]);
    }
    return arrays;
  }
  // ---- buffers (Module.buffer; state.py): f32 ones in the `buffers` buffer, i32 ones in `buffers_i32`
  async _readBuffers() {
    const out = {};
    for (const [dt, [arena, Type]] of Object.entries(BUFFER_ARENAS)) {
      const n = this._program.arenas[arena] || 0;
      out[dt] = n ? await this._engine.read(arena, 0, n, Type) : new Type(0);
    }
    return out;
  }
  /** {name: {data: Float32Array or Int32Array, shape, dtype}}: a copy of every buffer. */
  buffers() {
    return this._locked(async () => {
      const flat = await this._readBuffers();
      return Object.fromEntries(this._buffers.map(([n, s, dt, , o]) => [n, { data: flat[dt].slice(o, o + sizeOf(s)), shape: [...s], dtype: dt }]));
    });
  }
  /** Overwrite buffers by name, as loadParams overwrites parameters; checked whole first. */
  loadBuffers(values, { partial = false } = {}) {
    return this._locked(async () => {
      const known = Object.fromEntries(this._buffers.map(([n, s, dt, , o]) => [n, [s, dt, o]]));
      const names = Object.keys(values);
      const unknown = names.filter((n) => !has(known, n)).sort();
      if (unknown.length) {
        const hint = unknown.every((n) => this.paramNames.includes(n)) ? " (parameters load with load_params)" : "";
        throw new KeyError(`load_buffers: unknown buffer(s) ${pyList(unknown)}${hint}; this model has ${pyList(Object.keys(known).sort())}`);
      }
      const missing = Object.keys(known).filter((n) => !has(values, n)).sort();
      if (missing.length && !partial) throw new KeyError(`load_buffers: missing buffer(s) ${pyList(missing)} (pass partial=True to load a subset)`);
      const arrays = new Map(); // a Map: a buffer may be named "__proto__"
      for (const n of names) {
        const [shape, dt] = known[n];
        const a = asArray(values[n]);
        if (!a.kind) throw new TypeError(`load_buffers: ${pyStr(n)} must be numeric, got ${describe(a)}`);
        if (pyTuple(a.shape) !== pyTuple(shape)) throw new ValueError(`load_buffers: ${pyStr(n)} expects shape ${pyTuple(shape)}, got ${pyTuple(a.shape)}`);
        if (dt === "i32") {
          const vals = Array.from(a.data, Number);
          if (!vals.every(Number.isInteger)) throw new ValueError(`load_buffers: ${pyStr(n)} is an i32 buffer; got values that are not whole numbers`);
          if (!vals.every((v) => v >= -(2 ** 31) && v <= 2 ** 31 - 1)) throw new ValueError(`load_buffers: ${pyStr(n)} is an i32 buffer; got values outside the i32 range`);
          arrays.set(n, Int32Array.from(vals));
        } else arrays.set(n, Float32Array.from(a.data, Number));
      }
      for (const [n, a] of arrays) this._engine.write(BUFFER_ARENAS[known[n][1]][0], known[n][2], a);
    });
  }
  /** {dtype: flat initial contents}: buffer j from its init spec on stream len(params) + j (state.py). */
  _initBuffers() {
    const flat = {};
    for (const [dt, [arena, Type]] of Object.entries(BUFFER_ARENAS)) flat[dt] = new Type(this._program.arenas[arena] || 0);
    this._buffers.forEach(([, s, dt, spec, o], j) => {
      const v = initParam(spec, sizeOf(s), this._seed, this._params.length + j);
      flat[dt].set(dt === "i32" ? Int32Array.from(v, rintEven) : v, o);
    });
    return flat;
  }
  _initParams() {
    const flat = new Float32Array(Math.max(this._total, 1));
    this._params.forEach(([, s, spec, , o], i) => flat.set(initParam(spec, sizeOf(s), this._seed, i), o));
    return flat;
  }
  _stateBuffers() {
    return Object.entries(this._program.arenas).filter(([a, n]) => n && (a === "state" || a.startsWith("state_")));
  }
  /** params: parameters and buffers back to the seed's initial values; optimizer: zero state and
   * stepCount; entry: only that training entry's optimizer (its state, gradients and count; model.py's reset). */
  reset({ params = true, optimizer = true, entry = null } = {}) {
    return this._locked(async () => {
      const one = entry === null || entry === undefined ? null : this._trainEntry(entry, "reset");
      if (params) {
        this._engine.write("params", 0, this._initParams().subarray(0, this._total));
        for (const [dt, a] of Object.entries(this._initBuffers())) this._engine.write(BUFFER_ARENAS[dt][0], 0, a);
      }
      if (optimizer && one) {
        const zeros = new Float32Array(one.size);
        const arenas = this._stateBuffers().slice(0, one.nState).map(([a]) => a).concat(one.size ? ["grads"] : []);
        for (const a of arenas) this._engine.write(a, one.offset, zeros);
        one.count = one.lrOrigin = 0;
        for (const g of one.groupLrs) g[1] = 0;
      } else if (optimizer) {
        for (const [a, n] of this._stateBuffers()) this._engine.write(a, 0, new Float32Array(n));
        const nGrads = this._program.arenas.grads || 0;
        if (this._hasGrads && nGrads) this._engine.write("grads", 0, new Float32Array(nGrads));
        this.stepCount = 0;
        for (const e of Object.values(this._trains)) {
          e.count = e.lrOrigin = 0;
          for (const g of e.groupLrs) g[1] = 0;
        }
      }
    });
  }
  /** A float, or a schedule such as ["linear", 5e-3, 5e-4, 1500] or {kind: "cosine", peak, final, steps}. */
  /** With parameter groups: group i sets groups[i]'s lr, "default" the ungrouped params', null every
   * group's; entry: which training entry (null: the only one). */
  /** Bad arguments throw at once; the change itself is queued like a call, so steps requested
   * before it (not yet run) train with the old lr and later ones with the new; resolves when applied. */
  setLr(lr, group = null, entry = null) {
    this._checkOpen();
    const e = this._trainEntry(entry, "set_lr");
    if (e.opt === null) throw new Error("this program was built without an optimizer (optimizer=None)");
    const which = groupIndex(e, group);
    lr = normalizeLr(lr);
    return this._locked(async () => {
      if (which === null || which === "default") { e.lr = lr; e.lrOrigin = e.count; }
      e.groupLrs.forEach((g, i) => { if (which === null || which === i) { g[0] = lr; g[1] = e.count; } });
    });
  }
  currentLr(group = "default", entry = null) {
    const e = this._trainEntry(entry, "current_lr");
    const which = groupIndex(e, group);
    if (which === null) throw new TypeError("currentLr(null): name one group, an int or 'default'");
    const [lr, origin] = which === "default" ? [e.lr, e.lrOrigin] : e.groupLrs[which];
    return lrAt(lr, e.count + 1 - origin);
  }

  /** Check inputs against the entry's declaration (model.py's _pick): [variant key, arrays].
   * stacked: each input holds K batches on a new leading axis (stepMany). */
  _pick(entry, inputs, stacked = false) {
    const decl = this._program.signatures[entry];
    // the method's name as the Python package spells it, so that messages are the same
    const shown = methodName(entry, stacked);
    const given = Object.keys(inputs || {});
    const unknown = given.filter((n) => !has(decl, n)).sort();
    if (unknown.length) throw new TypeError(`${shown}(): unknown input(s) ${pyList(unknown)}; expected ${pyList(Object.keys(decl).sort())}`);
    const missing = Object.keys(decl).filter((n) => !given.includes(n)).sort();
    if (missing.length) throw new TypeError(`${shown}(): missing input(s) ${pyList(missing)}`);
    const dims = this._program.dims, sizes = Object.create(null), arrays = Object.create(null);
    const lead = stacked ? 1 : 0;
    let k = null;
    for (const [name, [dtype, shape]] of Object.entries(decl)) {
      let a;
      try { a = asArray(inputs[name]); } catch (e) { throw new TypeError(`${shown}(): input ${pyStr(name)} is not array-like: ${e.message}`); }
      let want = specStr(dtype, shape);
      if (stacked) want = `K stacked ${want}, shape (K, ${shape.join(", ")})`;
      if (!a.kind) throw new TypeError(`${shown}(): input ${pyStr(name)} expects ${want}; got non-numeric ${describe(a)}`);
      if (dtype === "i32" && a.kind === "f") throw new TypeError(`${shown}(): input ${pyStr(name)} expects integer data (${want}); got ${describe(a)}`);
      const note = dimsNote(shape, dims);
      if (a.shape.length !== shape.length + lead) throw new ValueError(`${shown}(): input ${pyStr(name)} expects ${want}${note}; got ${describe(a)}`);
      if (stacked) {
        if (k !== null && a.shape[0] !== k)
          throw new ValueError(`${shown}(): input ${pyStr(name)} expects ${want} with K = ${k} (from an earlier input); got ${describe(a)}`);
        k = a.shape[0];
      }
      shape.forEach((d, i) => {
        const got = a.shape[i + lead];
        if (typeof d === "string") {
          const ok = dims[d].includes(got);
          if (!ok || (has(sizes, d) && sizes[d] !== got)) {
            const clash = ok ? ` (${d} = ${sizes[d]} from an earlier input)` : "";
            throw new ValueError(`${shown}(): input ${pyStr(name)} expects ${want}${note}${clash}; got ${describe(a)}`);
          }
          sizes[d] = got;
        } else if (got !== d) throw new ValueError(`${shown}(): input ${pyStr(name)} expects ${want}${note}; got ${describe(a)}`);
      });
      if (dtype === "i32") {
        for (const v of a.data) if (v < -(2 ** 31) || v > 2 ** 31 - 1) throw new ValueError(`${shown}(): input ${pyStr(name)} has values outside the i32 range`);
      }
      // a copy, made now: the caller may refill its array before the queued call runs (the
      // constructor copies a typed array in one go; Float32Array.from walks an iterator, 1-2 ms
      // for MNIST's batch of 100,352 pixels)
      arrays[name] = dtype === "i32" ? new Int32Array(a.data) : new Float32Array(a.data);
    }
    if (stacked && k === 0) throw new ValueError(`${shown}(): no batches (the stacked inputs have K = 0)`);
    const key = this._variant(entry, sizes);
    for (const [name, checks] of Object.entries(this._program.entries[key].index_bounds)) {
      for (const [bound, v] of indexed(arrays[name], checks, stacked ? k : 1)) {
        if (v < 0 || v >= bound) throw new ValueError(`${shown}(): input ${pyStr(name)} holds index ${v}, outside [0, ${bound}) (nothing was run)`);
      }
    }
    return [key, arrays, k];
  }
  _variant(entry, sizes) {
    const want = JSON.stringify(Object.keys(sizes).sort().map((k) => [k, sizes[k]]));
    return this._program.variants[entry].find(([s]) => JSON.stringify(Object.keys(s).sort().map((k) => [k, s[k]])) === want)[1];
  }
  /** stepMany(batches): an array (or other iterable) of step()'s input objects, each checked as
   * step() checks its inputs (the message names the batch), then stacked (model.py's _pick_batches). */
  _pickBatches(batches, entry = "train") {
    const many = methodName(entry, true), one = methodName(entry, false);
    const items = Array.from(batches);
    if (!items.length) throw new ValueError(`${many}(): no batches (the iterable was empty)`);
    const picked = [];
    let key0 = null;
    items.forEach((b, i) => {
      if (!b || typeof b !== "object" || Array.isArray(b) || ArrayBuffer.isView(b))
        throw new TypeError(`${many}(): batch ${i} is a ${pyTypeName(b)}, expected a dict of inputs by name`);
      let key, arrays;
      try { [key, arrays] = this._pick(entry, b); } catch (err) {
        if (!(err instanceof TypeError || err instanceof ValueError)) throw err;
        const Err = err instanceof TypeError ? TypeError : ValueError;
        throw new Err(`${many}(): batch ${i}: ${err.message.replace(`${one}(): `, "")}`);
      }
      if (key0 !== null && key !== key0)
        throw new ValueError(`${many}(): batch ${i} has other sizes (${key}) than batch 0 (${key0}); one call takes one size`);
      key0 = key;
      picked.push(arrays);
    });
    const stackedArrays = {};
    for (const n of Object.keys(picked[0])) {
      const w = picked[0][n].length;
      const out = new picked[0][n].constructor(w * picked.length);
      picked.forEach((a, i) => out.set(a[n], i * w));
      stackedArrays[n] = out;
    }
    return [key0, stackedArrays, items.length];
  }
  _pack(key, arrays, extra) {
    const en = this._program.entries[key];
    let packed = this._staging[key];
    if (!packed) packed = this._staging[key] = inputRows(en.input_sizes, 1);
    for (const [name, , shape, arena, off] of en.inputs) {
      const v = has(arrays, name) ? arrays[name] : extra[name];
      if (typeof v === "number") packed[arena][off] = v;
      else packed[arena].set(v, off);
    }
    return packed;
  }
  /** Per-step inputs of training step t (over every entry), the i-th step of entry e from now:
   * its random seed and e's optimizer scalars at e's own step count (model.py's _step_scalars). */
  _trainArgs(t, e, i = 1) {
    const extra = { _rng: stepSeed(this._seed, t) };
    if (e.opt !== null) {
      const te = e.count + i;
      const groupLrs = e.groupLrs.map(([lr, o]) => lrAt(lr, te - o));
      Object.assign(extra, stepScalars(e.opt, lrAt(e.lr, te - e.lrOrigin), te, e.groups, groupLrs));
    }
    return extra;
  }
  /** One training step; resolves to the loss (a number), or {loss, captures} with captures: true. */
  _step(inputs, captures = false, entry = "train") {
    if (!has(this._program.signatures, entry)) return Promise.reject(new Error(`${this._program.name} was built without train=`));
    let picked;
    try { this._checkOpen(); picked = this._pick(entry, inputs); } catch (e) { return Promise.reject(e); }
    return this._locked(async () => {
      const [key, arrays] = picked;
      const e = this._trains[entry];
      const t = this.stepCount + 1;
      const out = await this._engine.run(key, this._pack(key, arrays, this._trainArgs(t, e)), captures);
      this.stepCount = t;
      e.count += 1;
      const loss = out.loss.data[0];
      if (!captures) return loss;
      return { loss, captures: Object.fromEntries(this._program.entries[key].captures.map(([n]) => [n, out[n]])) };
    });
  }
  /** K training steps in one call (model.py's _step_many): Float32Array of K losses, or
   * {losses, captures} (captures of the last step) with captures: true. */
  _stepMany(batches, captures = false, entry = "train") {
    if (!has(this._program.signatures, entry)) return Promise.reject(new Error(`${this._program.name} was built without train=`));
    let key, arrays, k;
    try {
      this._checkOpen();
      const iterable = batches !== null && typeof batches === "object" && typeof batches[Symbol.iterator] === "function" && !ArrayBuffer.isView(batches);
      if (iterable) [key, arrays, k] = this._pickBatches(batches, entry);
      else if (batches === undefined || batches === null || (typeof batches === "object" && !ArrayBuffer.isView(batches))) {
        [key, arrays, k] = this._pick(entry, batches || {}, true);
      } else throw new TypeError(`${methodName(entry, true)}(): batches must be an iterable of dicts, got ${pyTypeName(batches)}`);
    } catch (e) { return Promise.reject(e); }
    return this._locked(async () => {
      const t0 = this.stepCount;
      const tr = this._trains[entry];
      const en = this._program.entries[key];
      const sizes = en.input_sizes;
      const fill = (start, n) => {
        const rows = inputRows(sizes, n);
        for (let i = 0; i < n; i++) {
          const extra = this._trainArgs(t0 + start + i + 1, tr, start + i + 1);
          for (const [name, , shape, arena, off] of en.inputs) {
            const at = i * sizes[arena] + off;
            if (has(arrays, name)) {
              const w = Math.max(sizeOf(shape), 1);
              rows[arena].set(arrays[name].subarray((start + i) * w, (start + i + 1) * w), at);
            } else rows[arena][at] = extra[name]; // per-step scalars, converted as _pack converts step()'s
          }
        }
        return rows;
      };
      const [losses, out] = await this._engine.runMany(key, k, fill, captures);
      this.stepCount = t0 + k;
      tr.count += k;
      if (!captures) return losses;
      return { losses, captures: Object.fromEntries(en.captures.map(([n]) => [n, out[n]])) };
    });
  }
  /** An infer entry: resolves to {data, shape, dtype}, or {output, captures} with captures: true. */
  _infer(entry, inputs, captures = false) {
    let picked;
    try { this._checkOpen(); picked = this._pick(entry, inputs); } catch (e) { return Promise.reject(e); }
    return this._locked(async () => {
      const [key, arrays] = picked;
      this._inferCalls += 1;
      const extra = { _rng: stepSeed(this._seed, -this._inferCalls) };
      const out = await this._engine.run(key, this._pack(key, arrays, extra), captures);
      if (!captures) return out.out;
      return { output: out.out, captures: Object.fromEntries(this._program.entries[key].captures.map(([n]) => [n, out[n]])) };
    });
  }

  // ---- checkpoints: the Python package's .npz, both ways ----
  /** Params, buffers, optimizer state, step count, lr schedule position and seed as .npz bytes (a Uint8Array). */
  save() {
    return this._locked(async () => {
      const es = Object.values(this._trains);
      const one = es.length === 1 ? es[0] : null, several = es.length > 1 ? es : [];
      const members = [
        ["__program__.npy", npyString(this._program.name)],
        ["__fingerprint__.npy", npyString(this._program.fingerprint)],
        ["__step_count__.npy", npyScalar64(this.stepCount, "<i8")],
        ["__seed__.npy", npyScalar64(this._seed, "<u8")],
        ["__lr__.npy", npyString(lrRepr(one ? one.lr : null))],
        ["__lr_origin__.npy", npyScalar64(one ? one.lrOrigin : 0, "<i8")],
      ];
      (one ? one.groupLrs : []).forEach(([lr, o], i) => {
        members.push([`__lr_g${i}__.npy`, npyString(lrRepr(lr))], [`__lr_origin_g${i}__.npy`, npyScalar64(o, "<i8")]);
      });
      for (const e of several) {
        members.push([`__train__/${e.name}/step_count.npy`, npyScalar64(e.count, "<i8")]);
        members.push([`__train__/${e.name}/lr.npy`, npyString(lrRepr(e.lr))]);
        members.push([`__train__/${e.name}/lr_origin.npy`, npyScalar64(e.lrOrigin, "<i8")]);
        e.groupLrs.forEach(([lr, o], i) => {
          members.push([`__train__/${e.name}/lr_g${i}.npy`, npyString(lrRepr(lr))], [`__train__/${e.name}/lr_origin_g${i}.npy`, npyScalar64(o, "<i8")]);
        });
      }
      const parts = [];
      for (const [a, n] of this._stateBuffers()) parts.push(await this._engine.read(a, 0, n));
      const state = new Float32Array(parts.reduce((s, x) => s + x.length, 0));
      let pos = 0;
      for (const x of parts) { state.set(x, pos); pos += x.length; }
      members.push(["__state__.npy", npyF32(state, [state.length])]);
      const flat = await this._engine.read("params", 0, this._total);
      for (const [n, s, , , o] of this._params) members.push([`param/${n}.npy`, npyF32(flat.subarray(o, o + sizeOf(s)), s)]);
      const bflat = await this._readBuffers();
      for (const [n, s, dt, , o] of this._buffers)
        members.push([`buffer/${n}.npy`, (dt === "i32" ? npyI32 : npyF32)(bflat[dt].subarray(o, o + sizeOf(s)), s)]);
      return zipStored(members);
    });
  }
  /** Load a checkpoint (bytes of a .npz written by either package's save); checked whole before anything changes. */
  restore(bytes, path = "checkpoint") {
    // a copy, made now: the caller may reuse its buffer before the queued restore runs
    if (bytes instanceof ArrayBuffer) bytes = new Uint8Array(bytes.slice(0));
    else if (ArrayBuffer.isView(bytes)) bytes = new Uint8Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
    return this._locked(async () => {
      const bad = (why) => new ValueError(`${path}: ${why}`);
      if (bytes.length >= 6 && bytes[0] === 0x93 && String.fromCharCode(...bytes.subarray(1, 6)) === "NUMPY")
        throw bad("this is a .npy file (one array), not an aot checkpoint (a .npz written by Model.save)");
      if (!(bytes.length >= 4 && bytes[0] === 0x50 && bytes[1] === 0x4b && (bytes[2] === 3 || bytes[2] === 5)))
        throw bad("not an aot checkpoint (Model.save writes .npz archives; this is not one)");
      const zip = await unzip(bytes, bad);
      const names = new Map([...zip.keys()].map((m) => [m.endsWith(".npy") ? m.slice(0, -4) : m, m]));
      if (!names.has("__fingerprint__") || !names.has("__program__")) throw bad("not an aot checkpoint (it has no __program__/__fingerprint__ members)");
      const layout = { __program__: "str", __fingerprint__: "str", __step_count__: "i8", __seed__: "seed", __lr__: "str", __lr_origin__: "i8",
        __state__: ["f4", [this._stateBuffers().reduce((s, [, n]) => s + n, 0)]] };
      for (const [n, s] of this._params) layout["param/" + n] = ["f4", s];
      for (const [n, s, dt] of this._buffers) layout["buffer/" + n] = [dt === "i32" ? "i4" : "f4", s];
      const es = Object.values(this._trains);
      const one = es.length === 1 ? es[0] : null, several = es.length > 1 ? es : [];
      (one ? one.groupLrs : []).forEach((_, i) => { layout[`__lr_g${i}__`] = "str"; layout[`__lr_origin_g${i}__`] = "i8"; });
      for (const e of several) {
        Object.assign(layout, { [`__train__/${e.name}/step_count`]: "i8", [`__train__/${e.name}/lr`]: "str", [`__train__/${e.name}/lr_origin`]: "i8" });
        e.groupLrs.forEach((_, i) => Object.assign(layout, { [`__train__/${e.name}/lr_g${i}`]: "str", [`__train__/${e.name}/lr_origin_g${i}`]: "i8" }));
      }
      // the most bytes each member can hold (model.py's _nbytes): checked before a byte is inflated
      const most = (kind) => NPY_HEADER_MAX + (kind === "str" ? 4 * STR_MEMBER_MAX : kind === "i8" || kind === "seed" ? 8 : 4 * sizeOf(kind[1]));
      const limit = 65536 + Object.entries(layout).reduce((sum, [m, kind]) => sum + 1024 + 2 * m.length + most(kind), 0);
      if (bytes.length > limit) throw bad(`not a checkpoint of ${this._program.name}: it has ${bytes.length} bytes, more than this model's checkpoints can hold (${limit})`);
      const read = async (member) => {
        const kind = layout[member];
        const mbad = (why) => bad(`checkpoint member ${pyStr(member)} ${why}`);
        const npy = parseNpy(await memberBytes(zip.get(names.get(member)), member, bad, most(kind)), mbad);
        const dv = new DataView(npy.body.buffer, npy.body.byteOffset, npy.body.byteLength);
        if (kind === "str") {
          const m = /^[<|=]U(\d+)$/.exec(npy.descr);
          if (!m || npy.shape.length) throw mbad(`has dtype ${pyStr(npy.descr)}, expected a string`);
          if (+m[1] > STR_MEMBER_MAX || npy.body.length !== 4 * +m[1])
            throw mbad(`declares ${m[1]} characters in ${npy.body.length} bytes (a string member holds at most ${STR_MEMBER_MAX})`);
          let s = "";
          for (let i = 0; i < +m[1]; i++) { const c = dv.getUint32(4 * i, true); if (c === 0) break; s += String.fromCodePoint(c); }
          return s;
        }
        if (kind === "i8" || kind === "seed") {
          if (npy.shape.length || npy.body.length < 8) throw mbad(`has shape ${pyTuple(npy.shape)}, expected ()`);
          if (npy.descr === "<u8") return dv.getBigUint64(0, true);
          if (npy.descr === "<i8") return dv.getBigInt64(0, true);
          throw mbad(`has dtype ${pyStr(npy.descr)}, expected ${kind === "seed" ? "a uint64 scalar" : "an int64 scalar"}`);
        }
        const shape = kind[1];
        if (pyTuple(npy.shape) !== pyTuple(shape)) throw mbad(`has shape ${pyTuple(npy.shape)}, expected ${pyTuple(shape)}`);
        const int = kind[0] === "i4";
        if (npy.descr !== (int ? "<i4" : "<f4")) throw mbad(`has dtype ${pyStr(npy.descr)}, expected ${int ? "int32" : "float32"}`);
        const n = sizeOf(shape);
        if (npy.body.length !== 4 * n) throw mbad("is truncated");
        const a = int ? new Int32Array(n) : new Float32Array(n);
        for (let i = 0; i < n; i++) a[i] = int ? dv.getInt32(4 * i, true) : dv.getFloat32(4 * i, true);
        if (npy.fortran && shape.length > 1) { // column-major on disk
          const strides = shape.map((_, i) => sizeOf(shape.slice(0, i)));
          const c = new a.constructor(n), idx = new Array(shape.length).fill(0);
          for (let k = 0; k < n; k++) {
            c[k] = a[idx.reduce((s, v, i) => s + v * strides[i], 0)];
            for (let d = shape.length - 1; d >= 0; d--) { if (++idx[d] < shape[d]) break; idx[d] = 0; }
          }
          return c;
        }
        return a;
      };
      const program = await read("__program__"), fingerprint = await read("__fingerprint__");
      if (program !== this._program.name || fingerprint !== this._program.fingerprint)
        throw bad(`checkpoint of program ${pyStr(program)} does not match this model (${pyStr(this._program.name)}: different parameters, shapes or optimizer)`);
      for (const [what, found] of [["unknown", [...names.keys()].filter((m) => !has(layout, m)).sort()], ["missing", Object.keys(layout).filter((m) => !names.has(m)).sort()]]) {
        const ps = found.filter((m) => m.startsWith("param/")).map((m) => m.slice(6));
        if (ps.length) throw new KeyError(`${path}: ${what} parameter(s) ${pyList(ps)} in the checkpoint`);
        const bs = found.filter((m) => m.startsWith("buffer/")).map((m) => m.slice(7));
        if (bs.length) throw new KeyError(`${path}: ${what} buffer(s) ${pyList(bs)} in the checkpoint`);
        if (found.length) throw bad(`damaged checkpoint: ${what} member(s) ${pyList(found)}`);
      }
      const v = {};
      for (const m of Object.keys(layout)) v[m] = m in { __program__: 1, __fingerprint__: 1 } ? null : await read(m);
      const stepCount = v.__step_count__, origin = v.__lr_origin__;
      const mb = (m, why) => bad(`checkpoint member ${pyStr(m)} ${why}`);
      if (!(stepCount >= 0n && stepCount < 2n ** 62n)) throw mb("__step_count__", `must be a step count >= 0, got ${stepCount}`);
      const seed = BigInt.asUintN(64, v.__seed__) === v.__seed__ ? v.__seed__ : null;
      if (seed === null) throw mb("__seed__", `is not a seed: __seed__: a seed must be an int in [0, 2**64), got ${v.__seed__}`);
      if (!(origin >= 0n && origin <= stepCount)) throw mb("__lr_origin__", `must be in [0, step count ${stepCount}], got ${origin}`);
      let lr;
      try { const x = parsePyLiteral(v.__lr__); lr = x === null ? null : normalizeLr(x); } catch (e) {
        throw mb("__lr__", `is not a learning rate or schedule: ${e.message}`);
      }
      if ((lr === null) === (one !== null && one.opt !== null)) throw mb("__lr__", `is ${lrRepr(lr)}, which does not fit this model's optimizer`);
      const groupLrs = (one ? one.groupLrs : []).map((_, i) => {
        const go = v[`__lr_origin_g${i}__`];
        if (!(go >= 0n && go <= stepCount)) throw mb(`__lr_origin_g${i}__`, `must be in [0, step count ${stepCount}], got ${go}`);
        let glr;
        try { glr = normalizeLr(parsePyLiteral(v[`__lr_g${i}__`])); } catch (e) {
          throw mb(`__lr_g${i}__`, `is not a learning rate or schedule: ${e.message}`);
        }
        return [glr, Number(go)];
      });
      const entryValues = several.map((e) => {
        const key = `__train__/${e.name}/`, count = v[key + "step_count"], o = v[key + "lr_origin"];
        if (!(count >= 0n && count < 2n ** 62n)) throw mb(key + "step_count", `must be a step count >= 0, got ${count}`);
        if (!(o >= 0n && o <= count)) throw mb(key + "lr_origin", `must be in [0, ${count}], got ${o}`);
        let elr;
        try { const x = parsePyLiteral(v[key + "lr"]); elr = x === null ? null : normalizeLr(x); } catch (err) {
          throw mb(key + "lr", `is not a learning rate or schedule: ${err.message}`);
        }
        if ((elr === null) !== (e.opt === null)) throw mb(key + "lr", `is ${lrRepr(elr)}, which does not fit the entry's optimizer`);
        const groups = e.groupLrs.map((_, i) => {
          const go = v[key + `lr_origin_g${i}`];
          if (!(go >= 0n && go <= count)) throw mb(key + `lr_origin_g${i}`, `must be in [0, ${count}], got ${go}`);
          let glr;
          try { glr = normalizeLr(parsePyLiteral(v[key + `lr_g${i}`])); } catch (err) {
            throw mb(key + `lr_g${i}`, `is not a learning rate or schedule: ${err.message}`);
          }
          return [glr, Number(go)];
        });
        return [e, Number(count), elr, Number(o), groups];
      });
      // everything is valid: only now does the model change
      const flat = new Float32Array(Math.max(this._total, 1));
      for (const [n, s, , , o] of this._params) flat.set(v["param/" + n], o);
      if (this._total) this._engine.write("params", 0, flat.subarray(0, this._total));
      let pos = 0;
      for (const [a, n] of this._stateBuffers()) { this._engine.write(a, 0, v.__state__.subarray(pos, pos + n)); pos += n; }
      for (const [n, , dt, , o] of this._buffers) this._engine.write(BUFFER_ARENAS[dt][0], o, v["buffer/" + n]);
      this.stepCount = Number(stepCount);
      this._seed = seed;
      if (one) [one.count, one.lr, one.lrOrigin, one.groupLrs] = [Number(stepCount), lr, Number(origin), groupLrs];
      for (const [e, count, elr, o, groups] of entryValues) [e.count, e.lr, e.lrOrigin, e.groupLrs] = [count, elr, o, groups];
    });
  }

  /** Release the GPU resources; calling it again does nothing. */
  close() {
    if (this._closed) return;
    this._closed = true;
    this._engine.destroy();
  }
}
