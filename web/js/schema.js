// Node schemas read from the server's /object_info (ComfyUI's shape), and socket-type helpers.
// One parsed schema per class: which inputs are ports, which are widgets, and the outputs.

import { WIDGET_TYPES } from "./uirules.js";

export { WIDGET_TYPES };
const customWidgets = new Set(); // registered by extensions (see extensions.js)

export function registerWidgetType(type) { customWidgets.add(type); }

const TYPE_COLORS = {
  MODEL: "#b39ddb", CLIP: "#ffd54f", VAE: "#ef5350", CONDITIONING: "#ffa726", LATENT: "#f06292",
  IMAGE: "#64b5f6", MASK: "#81c784", CLIP_VISION: "#a1887f", CLIP_VISION_OUTPUT: "#bcaaa4",
  CONTROL_NET: "#4db6ac", INT: "#9ccc65", FLOAT: "#aed581", STRING: "#90a4ae", BOOLEAN: "#7986cb",
  COMBO: "#78909c", IPADAPTER: "#ce93d8",
};

function hash(text) {
  let h = 0;
  for (const ch of String(text)) h = (h * 31 + ch.charCodeAt(0)) | 0;
  return Math.abs(h);
}

export function typeColor(type) {
  return TYPE_COLORS[type] || `hsl(${hash(type) % 360} 55% 62%)`;
}

export function categoryColor(category) {
  const top = String(category || "misc").split("/")[0];
  return `hsl(${hash(top) % 360} 32% 30%)`;
}

// Can an output of type `from` feed an input of type `to`? "*" matches anything; ComfyUI also
// allows comma-separated unions ("IMAGE,MASK").
export function typesCompatible(from, to) {
  if (from === "*" || to === "*") return true;
  const a = String(from).split(","), b = String(to).split(",");
  return a.some((t) => b.includes(t));
}

const cache = new Map();

export function clearSchemaCache() { cache.clear(); }

// Parse one object_info entry into {inputs, outputs, ...}; each input is
// {name, type, optional, opts, choices, widget} where widget is null for a link-only port.
export function parseSchema(type, info) {
  const entry = info[type];
  if (!entry) return null;
  const key = entry;
  if (cache.has(key)) return cache.get(key);
  const inputs = [];
  const order = entry.input_order || {};
  for (const section of ["required", "optional"]) {
    const specs = (entry.input || {})[section] || {};
    const names = order[section] || Object.keys(specs);
    for (const name of names) {
      const spec = specs[name];
      if (!spec) continue;
      inputs.push(parseInput(name, spec, section === "optional"));
    }
  }
  const outputs = (entry.output || []).map((t, i) => ({
    type: Array.isArray(t) ? "COMBO" : t,
    name: (entry.output_name || [])[i] || t,
    isList: !!(entry.output_is_list || [])[i],
    slot: i,
  }));
  const schema = {
    type, inputs, outputs,
    display: entry.display_name || type,
    category: entry.category || "",
    description: entry.description || "",
    outputNode: !!entry.output_node,
  };
  cache.set(key, schema);
  return schema;
}

function parseInput(name, spec, optional) {
  const raw = spec[0];
  const opts = spec[1] || {};
  let type = raw, choices = null;
  if (Array.isArray(raw)) { type = "COMBO"; choices = raw; }
  else if (raw === "COMBO") choices = opts.options || [];
  let widget = null;
  if (opts.image_upload && choices) widget = "IMAGEUPLOAD";
  else if (WIDGET_TYPES.has(type) || customWidgets.has(type)) widget = type;
  if (opts.forceInput) widget = null;
  return { name, type, optional, opts, choices, widget };
}

export function defaultValue(input) {
  const { opts, choices, type } = input;
  if (opts.default !== undefined) return opts.default;
  if (choices) return choices[0] ?? "";
  if (type === "INT" || type === "FLOAT") return Math.max(0, opts.min ?? 0);
  if (type === "BOOLEAN") return false;
  return "";
}
