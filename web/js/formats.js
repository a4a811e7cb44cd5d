// Reading workflows the editor did not write: PNG text chunks (tEXt / iTXt / zTXt, as ComfyUI and
// Loom write `prompt` and `workflow`), ComfyUI's UI (litegraph) format and its API format.
// Everything becomes Loom's saved format, which Graph.loadSaved() reads.

import { SAVED_FORMAT, SAVED_VERSION } from "./graph.js";
import { convertUi, toUi } from "./uiformat.js";
import { FRONTEND_ONLY } from "./uirules.js";

export { convertUi, toUi };

const PNG_SIGNATURE = [137, 80, 78, 71, 13, 10, 26, 10];

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
  // legacy group nodes are flattened by the server; subgraphs (definitions.subgraphs) are read here
  return ui.nodes.some((n) => !FRONTEND_ONLY.has(n.type) && !info[n.type]) && !!ui.extra?.groupNodes;
}
