// Reading workflows the editor did not write: PNG text chunks (tEXt / iTXt / zTXt, as ComfyUI and
// Loom write `prompt` and `workflow`), ComfyUI's UI (litegraph) format and its API format.
// Everything becomes Loom's saved format, which Graph.loadSaved() reads.

import { parseSchema } from "./schema.js";
import { SAVED_FORMAT, SAVED_VERSION } from "./graph.js";

const PNG_SIGNATURE = [137, 80, 78, 71, 13, 10, 26, 10];
const FRONTEND_ONLY = new Set(["Note", "MarkdownNote", "Reroute", "PrimitiveNode"]);
const CONTROL_VALUES = new Set(["fixed", "increment", "decrement", "randomize"]);
// What files store after a widget with "control after generate" (engine/workflow_widgets.py has the
// same rules): a control string, a boolean (2023 files) or null; a COMBO also stores a filter text.
const looksLikeControl = (v) => v === null || typeof v === "boolean" || CONTROL_VALUES.has(v) || v === "increment-wrap";
const controlSlots = (input) => (input.opts.control_after_generate || (input.type === "INT" && /^(noise_)?seed$/.test(input.name)))
  ? (input.choices ? 2 : 1) : 0;

export function isPng(bytes) { return PNG_SIGNATURE.every((b, i) => bytes[i] === b); }

async function inflate(bytes) {
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

function decodeText(bytes) {
  try { return new TextDecoder("utf-8", { fatal: true }).decode(bytes); } catch { return new TextDecoder("latin1").decode(bytes); }
}

// All text chunks of a PNG as {keyword: text}.
export async function readPngText(buffer) {
  const bytes = new Uint8Array(buffer);
  if (!isPng(bytes)) throw new Error("not a PNG file");
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = {};
  let pos = 8;
  while (pos + 8 <= bytes.length) {
    const length = view.getUint32(pos);
    const type = String.fromCharCode(...bytes.subarray(pos + 4, pos + 8));
    const data = bytes.subarray(pos + 8, pos + 8 + length);
    pos += 12 + length;
    if (type === "IEND") break;
    if (type !== "tEXt" && type !== "iTXt" && type !== "zTXt") continue;
    const zero = data.indexOf(0);
    if (zero < 0) continue;
    const key = new TextDecoder("latin1").decode(data.subarray(0, zero));
    let rest = data.subarray(zero + 1);
    if (type === "tEXt") out[key] = decodeText(rest);
    else if (type === "zTXt") out[key] = decodeText(await inflate(rest.subarray(1)));
    else {
      const compressed = rest[0] === 1;
      rest = rest.subarray(2);
      const langEnd = rest.indexOf(0);
      rest = rest.subarray(langEnd + 1);
      const transEnd = rest.indexOf(0);
      rest = rest.subarray(transEnd + 1);
      out[key] = new TextDecoder("utf-8").decode(compressed ? await inflate(rest) : rest);
    }
  }
  return out;
}

export function detectFormat(obj) {
  if (!obj || typeof obj !== "object" || Array.isArray(obj)) return null;
  if (obj.format === SAVED_FORMAT) return "loom";
  if (Array.isArray(obj.nodes) && Array.isArray(obj.links)) return "ui";
  const values = Object.values(obj);
  if (values.length && values.every((v) => v && typeof v === "object" && "class_type" in v)) return "api";
  if (obj.prompt && typeof obj.prompt === "object") return detectFormat(obj.prompt) === "api" ? "request" : null;
  return null;
}

// Any supported object → Loom's saved format (or throws with a message for the user).
export function toSavedFormat(obj, info) {
  const kind = detectFormat(obj);
  if (kind === "loom") return obj;
  if (kind === "api") return { format: SAVED_FORMAT, version: SAVED_VERSION, prompt: obj, layout: { nodes: {}, groups: [] }, extra: {} };
  if (kind === "request") return toSavedFormat(obj.prompt, info);
  if (kind === "ui") return convertUi(obj, info);
  throw new Error("not a workflow: expected Loom's saved format, ComfyUI UI format or API format");
}

export function uiNeedsServer(ui, info) {
  return ui.nodes.some((n) => !FRONTEND_ONLY.has(n.type) && !info[n.type]) &&
    (ui.extra?.groupNodes || ui.definitions?.subgraphs);
}

// ComfyUI UI format → saved format. Reroutes are followed, PrimitiveNodes become constants, notes
// are dropped; muted and bypassed nodes keep their mode (the API prompt handles them).
export function convertUi(ui, info) {
  const nodes = new Map(ui.nodes.map((n) => [String(n.id), n]));
  const links = new Map();
  for (const link of ui.links || []) {
    if (Array.isArray(link)) links.set(link[0], { origin: String(link[1]), slot: link[2] });
    else if (link) links.set(link.id, { origin: String(link.origin_id), slot: link.origin_slot });
  }
  // Follow a link id back through Reroutes and PrimitiveNodes: {link: [id, slot]} | {value} | null
  const resolve = (linkId, depth = 0) => {
    const link = links.get(linkId);
    if (!link || depth > 64) return null;
    const origin = nodes.get(link.origin);
    if (!origin) return null;
    if (origin.type === "Reroute") {
      const upstream = (origin.inputs || [])[0]?.link;
      return upstream === null || upstream === undefined ? null : resolve(upstream, depth + 1);
    }
    if (origin.type === "PrimitiveNode") return { value: (origin.widgets_values || [])[0] };
    if (FRONTEND_ONLY.has(origin.type)) return null;
    return { link: [String(origin.id), link.slot] };
  };
  const prompt = {}, layout = { nodes: {}, groups: [] };
  for (const n of ui.nodes) {
    if (FRONTEND_ONLY.has(n.type)) continue;
    const id = String(n.id);
    const inputs = {}, control = {};
    const schema = parseSchema(n.type, info);
    const wv = n.widgets_values;
    if (schema && Array.isArray(wv)) {
      const widgets = schema.inputs.filter((x) => x.widget);
      let i = 0;
      widgets.forEach((input, position) => {
        if (i >= wv.length) return;
        inputs[input.name] = wv[i++];
        const needed = widgets.length - position - 1; // values the later widgets still need
        const slots = controlSlots(input);
        if (slots && i < wv.length && wv.length - i > needed && looksLikeControl(wv[i])) {
          if (CONTROL_VALUES.has(wv[i])) control[input.name] = wv[i];
          i++;
          if (slots === 2 && i < wv.length && wv.length - i > needed && typeof wv[i] === "string") i++;
        } else if (input.widget === "IMAGEUPLOAD" && (wv[i] === "image" || wv[i] === "upload")) i++;
      });
    } else if (wv && typeof wv === "object" && !Array.isArray(wv)) Object.assign(inputs, wv);
    for (const input of n.inputs || []) {
      if (input.link === null || input.link === undefined) continue;
      const source = resolve(input.link);
      const name = input.widget?.name || input.name;
      if (!source) { delete inputs[name]; continue; }
      inputs[name] = source.link || source.value;
    }
    prompt[id] = { class_type: n.type, inputs };
    if (n.title) prompt[id]._meta = { title: n.title };
    const entry = { pos: toPair(n.pos), size: toPair(n.size) };
    if (n.title) entry.title = n.title;
    if (n.color || n.bgcolor) entry.color = n.bgcolor || n.color;
    if (n.flags?.collapsed) entry.collapsed = true;
    if (n.mode === 2 || n.mode === 4) entry.mode = n.mode;
    if (Object.keys(control).length) entry.control = control;
    layout.nodes[id] = entry;
  }
  for (const g of ui.groups || []) {
    if (Array.isArray(g.bounding) && g.bounding.length === 4) layout.groups.push({ title: g.title || "Group", bounding: g.bounding, color: g.color || null });
  }
  return { format: SAVED_FORMAT, version: SAVED_VERSION, prompt, layout, extra: {} };
}

function toPair(value) {
  if (Array.isArray(value)) return [Number(value[0]) || 0, Number(value[1]) || 0];
  if (value && typeof value === "object") return [Number(value[0] ?? value.x ?? 0) || 0, Number(value[1] ?? value.y ?? 0) || 0];
  return [0, 0];
}
