// The workflow model: nodes (with widget values and input links), groups, and undo/redo history.
// Serialises to Loom's saved format (engine/formats/saved.py) and to ComfyUI's API format.

import { parseSchema, defaultValue, typesCompatible } from "./schema.js";
import { FRONTEND_INFO, isFrontendType, primitiveAccepts, primitiveSpec, primitiveTargets } from "./frontend.js";
import { boundarySchema, flattenInstance, growBoundary, instanceOutput, instanceSchema } from "./subgraph.js";
import { NEW_CONTROL } from "./uirules.js";

export const MODE_NORMAL = 0, MODE_MUTED = 2, MODE_BYPASS = 4;
export const SAVED_FORMAT = "loom.workflow", SAVED_VERSION = 2;

export class TypeMismatch extends Error {}

export class Graph {
  constructor(info) {
    this.info = info;
    this.nodes = new Map();
    this.groups = [];
    this.extra = {};
    this.nextId = 1;
    this.reroutes = new Map(); // id -> {id, pos, parentId}: link-midpoint points (ComfyUI's native reroutes)
    this.nextRerouteId = 1;
    this.subgraphs = new Map(); // definition id -> {id, name, inputs, outputs, saved}; shared with inner graphs
    this.boundary = null; // inside a subgraph: its definition
  }

  schema(type) {
    const def = this.subgraphs.get(type);
    if (def) return (def._schema ||= instanceSchema(def, this.innerGraph(def)));
    if (this.boundary && (type === "SubgraphInput" || type === "SubgraphOutput")) return boundarySchema(type, this.boundary);
    return parseSchema(type, this.info) ?? (isFrontendType(type) ? parseSchema(type, FRONTEND_INFO) : null);
  }

  // --- subgraphs ----------------------------------------------------------------------------------
  spawn(def) {
    const inner = new Graph(this.info);
    inner.subgraphs = this.subgraphs;
    inner.boundary = def;
    return inner;
  }

  innerGraph(def) {
    if (!def._graph) { def._graph = this.spawn(def); def._graph.loadSaved(def.saved); }
    return def._graph;
  }

  // Ports and kept values of a node whose type this server lacks (from the file it came in).
  placeholderSchema(node) {
    const ph = node.placeholder || {};
    const inputs = (ph.inputs || []).map((i) => ({ name: i.name, type: i.type || "*", optional: true, opts: {}, choices: null, widget: i.widget ? "STRING" : null }));
    for (const name of Object.keys(node.links)) if (!inputs.some((i) => i.name === name)) inputs.push({ name, type: "*", optional: true, opts: {}, choices: null, widget: null });
    let outputs = (ph.outputs || []).map((o, k) => ({ name: o.name, type: o.type || "*", isList: false, slot: k }));
    if (!outputs.length) {
      let most = -1;
      for (const n of this.nodes.values()) for (const l of Object.values(n.links)) if (l[0] === node.id) most = Math.max(most, l[1]);
      outputs = Array.from({ length: most + 1 }, (_, k) => ({ name: `output ${k}`, type: "*", isList: false, slot: k }));
    }
    const values = ph.widgets_values !== undefined ? [["widgets_values", ph.widgets_values]] : Object.entries(node.values);
    return { inputs, outputs, values };
  }

  // A producer [id, slot] as the flattened prompt names it (an instance's output → its inner node).
  mapOut(source) {
    const node = this.nodes.get(source[0]);
    return node && this.subgraphs.has(node.type) ? instanceOutput(this, node, source[1]) : source;
  }

  addNode(type, pos = [0, 0], { id = null, values = null, title = null } = {}) {
    const schema = this.schema(type);
    const nodeId = String(id ?? this.nextId);
    this.nextId = Math.max(this.nextId, (parseInt(nodeId, 10) || 0) + 1);
    const node = {
      id: nodeId, type, title: title || (schema ? schema.display : type), pos: [...pos], size: null,
      values: {}, links: {}, converted: new Set(), mode: MODE_NORMAL, collapsed: false, color: null,
      control: {}, missing: !schema, routes: {}, frontend: isFrontendType(type),
    };
    for (const input of schema ? schema.inputs : []) {
      if (!input.widget) continue;
      node.values[input.name] = defaultValue(input);
      if (input.opts.control_after_generate) node.control[input.name] = NEW_CONTROL;
    }
    if (values) Object.assign(node.values, values);
    this.nodes.set(nodeId, node);
    return node;
  }

  removeNode(id) {
    this.nodes.delete(id);
    for (const node of this.nodes.values()) {
      for (const [name, link] of Object.entries(node.links)) if (link[0] === id) { delete node.links[name]; delete node.routes[name]; }
    }
    this.pruneReroutes();
  }

  inputSpec(node, name) {
    if (node.type === "PrimitiveNode") return name === "value" ? primitiveSpec(this, node) : null;
    const schema = this.schema(node.type);
    return schema ? schema.inputs.find((i) => i.name === name) : null;
  }

  outputType(node, slot, depth = 0) {
    if (node && node.type === "Reroute" && depth < 64) {
      const up = node.links.input;
      const src = up && this.nodes.get(up[0]);
      return src ? this.outputType(src, up[1], depth + 1) : "*";
    }
    if (node && node.type === "PrimitiveNode") return primitiveSpec(this, node)?.type ?? "*";
    const schema = node && this.schema(node.type);
    return schema && schema.outputs[slot] ? schema.outputs[slot].type : "*";
  }

  // Connect output `slot` of node `srcId` to input `name` of node `dstId`; throws TypeMismatch.
  connect(srcId, slot, dstId, name) {
    const src = this.nodes.get(srcId), dst = this.nodes.get(dstId);
    if (!src || !dst) throw new Error("no such node");
    if (srcId === dstId) throw new TypeMismatch("a node cannot feed itself");
    const spec = this.inputSpec(dst, name);
    if (src.type === "PrimitiveNode") {
      const others = primitiveTargets(this, src).filter((t) => !(t.node.id === dstId && t.name === name));
      if (!primitiveAccepts(others, spec)) {
        throw new TypeMismatch(spec?.widget ? `this primitive feeds ${others[0].spec.type} widgets, not ${name} (${spec.type})`
          : `a primitive feeds widget inputs only; ${name} is not one`);
      }
      if (!others.length) { // the first target gives the primitive its value and seed control
        src.values.value = dst.values[name] ?? defaultValue(spec);
        src.control = dst.control[name] ? { value: dst.control[name] } : {};
      }
    } else {
      const from = this.outputType(src, slot);
      const to = spec ? spec.type : "*";
      if (!typesCompatible(from, to)) throw new TypeMismatch(`${from} cannot connect to ${name} (${to})`);
    }
    if (this.reaches(dstId, srcId)) throw new TypeMismatch("that link would make a cycle");
    if (this.boundary) name = growBoundary(this, src, slot, dst, name); // the "+" slot of a boundary node
    if (dst.links[name]) delete dst.routes[name];
    dst.links[name] = [srcId, slot];
    this.pruneReroutes();
    return name;
  }

  disconnect(dstId, name) {
    const node = this.nodes.get(dstId);
    if (node) { delete node.links[name]; delete node.routes[name]; }
    this.pruneReroutes();
  }

  // --- link-midpoint reroutes ---------------------------------------------------------------------
  // A link's reroutes form a chain from the one nearest its target (node.routes[input]) through
  // parentId towards the source; several links may share the upstream part of a chain.
  routeOf(dstId, name) {
    const chain = [];
    let id = this.nodes.get(dstId)?.routes[name];
    while (id !== undefined && id !== null && this.reroutes.has(id) && chain.length < 256) {
      chain.unshift(this.reroutes.get(id));
      id = this.reroutes.get(id).parentId;
    }
    return chain; // source side first
  }

  // Put a new reroute at `pos` on link (dstId, name), after the first `index` points of its chain.
  addReroute(dstId, name, pos, index = null) {
    const node = this.nodes.get(dstId);
    if (!node || !node.links[name]) return null;
    const chain = this.routeOf(dstId, name);
    const at = index === null ? chain.length : Math.max(0, Math.min(index, chain.length));
    const reroute = { id: this.nextRerouteId++, pos: [...pos], parentId: at > 0 ? chain[at - 1].id : null };
    this.reroutes.set(reroute.id, reroute);
    if (at < chain.length) chain[at].parentId = reroute.id;
    else node.routes[name] = reroute.id;
    return reroute;
  }

  removeReroute(id) {
    const reroute = this.reroutes.get(id);
    if (!reroute) return;
    this.reroutes.delete(id);
    for (const r of this.reroutes.values()) if (r.parentId === id) r.parentId = reroute.parentId;
    for (const node of this.nodes.values()) {
      for (const [name, rid] of Object.entries(node.routes)) {
        if (rid !== id) continue;
        if (reroute.parentId === null) delete node.routes[name]; else node.routes[name] = reroute.parentId;
      }
    }
  }

  // Drop reroutes no link passes through any more.
  pruneReroutes() {
    if (!this.reroutes.size) return;
    const used = new Set();
    for (const node of this.nodes.values()) {
      for (const name of Object.keys(node.routes)) {
        if (!node.links[name]) { delete node.routes[name]; continue; }
        for (const r of this.routeOf(node.id, name)) used.add(r.id);
      }
    }
    for (const id of [...this.reroutes.keys()]) if (!used.has(id)) this.reroutes.delete(id);
  }

  // Is `target` downstream of (or equal to) `start`?
  reaches(start, target) {
    const seen = new Set([start]);
    const stack = [start];
    while (stack.length) {
      const id = stack.pop();
      if (id === target) return true;
      for (const node of this.nodes.values()) {
        if (seen.has(node.id)) continue;
        if (Object.values(node.links).some((l) => l[0] === id)) { seen.add(node.id); stack.push(node.id); }
      }
    }
    return false;
  }

  links() {
    const out = [];
    for (const node of this.nodes.values()) {
      for (const [name, [src, slot]] of Object.entries(node.links)) out.push({ src, slot, dst: node.id, name });
    }
    return out;
  }

  // --- Loom's saved format ---------------------------------------------------------------------
  toSaved({ measured = true } = {}) {
    const prompt = {}, nodes = {}, frontend = {};
    for (const node of this.nodes.values()) {
      const entry = { pos: [Math.round(node.pos[0]), Math.round(node.pos[1])] };
      const size = node.size || (measured && node.measured) || [0, 0];
      entry.size = [Math.round(size[0]), Math.round(size[1])];
      const schema = this.schema(node.type);
      if (!schema || node.title !== schema.display) entry.title = node.title;
      if (node.color) entry.color = node.color;
      if (node.collapsed) entry.collapsed = true;
      if (node.mode) entry.mode = node.mode;
      if (node.converted.size) entry.converted = [...node.converted];
      if (Object.keys(node.control).length) entry.control = { ...node.control };
      if (Object.keys(node.routes).length) entry.routes = { ...node.routes };
      if (node.properties && Object.keys(node.properties).length) entry.properties = structuredClone(node.properties);
      if (node.extWidgets && Object.keys(node.extWidgets).length) entry.ext_widgets = structuredClone(node.extWidgets);
      if (node.placeholder) entry.placeholder = structuredClone(node.placeholder);
      if (node.frontend) {
        frontend[node.id] = { type: node.type, ...entry, values: { ...node.values }, links: structuredClone(node.links) };
        continue;
      }
      const inputs = { ...node.values }, via = {};
      for (const [name, link] of Object.entries(node.links)) {
        if (!this.nodes.get(link[0])?.frontend) { inputs[name] = [link[0], link[1]]; continue; }
        via[name] = [link[0], link[1]]; // the editor's link; the prompt gets what it carries
        const source = this.resolveFrontend(link);
        if (Array.isArray(source)) {
          if (this.nodes.get(source[0])?.frontend) delete inputs[name]; // a subgraph's input node: the link says it all
          else inputs[name] = source;
        } else if (source) inputs[name] = source.value;
      }
      if (Object.keys(via).length) entry.via = via;
      // a linked widget keeps its own value for when the link goes again
      const shadowed = Object.fromEntries(Object.keys(node.links).filter((n) => n in node.values).map((n) => [n, node.values[n]]));
      if (Object.keys(shadowed).length) entry.shadowed = shadowed;
      prompt[node.id] = { class_type: node.type, inputs, _meta: { title: node.title } };
      nodes[node.id] = entry;
    }
    const groups = this.groups.map((g) => ({ title: g.title, bounding: g.bounding.map(Math.round), color: g.color }));
    const layout = { nodes, groups };
    if (Object.keys(frontend).length) layout.frontend = frontend;
    if (this.subgraphs.size && !this.boundary) {
      layout.subgraphs = [...this.subgraphs.values()].map((d) => ({ id: d.id, name: d.name, inputs: d.inputs.map(({ name, type }) => ({ name, type })),
        outputs: d.outputs.map(({ name, type }) => ({ name, type })), saved: d.saved }));
      // what the server and `main.py run` execute: the instances flattened, as queued from here
      if ([...this.nodes.values()].some((n) => this.subgraphs.has(n.type))) layout.runnable = this.toPrompt();
    }
    if (this.reroutes.size) {
      layout.reroutes = [...this.reroutes.values()].map((r) => ({ id: r.id, pos: r.pos.map(Math.round), parentId: r.parentId }));
    }
    return { format: SAVED_FORMAT, version: SAVED_VERSION, prompt, layout, extra: { ...this.extra } };
  }

  loadSaved(saved) {
    this.nodes.clear();
    this.groups = [];
    this.reroutes.clear();
    this.nextId = 1;
    this.nextRerouteId = 1;
    let layout = saved.layout || {};
    if (saved.version === 1) layout = migrateV1(layout);
    const laid = layout.nodes || {};
    const prompt = saved.prompt || {};
    if (!this.boundary) {
      this.subgraphs.clear();
      for (const d of layout.subgraphs || []) this.subgraphs.set(d.id, { id: d.id, name: d.name, inputs: d.inputs.map((i) => ({ ...i })), outputs: d.outputs.map((o) => ({ ...o })), saved: d.saved });
    }
    const place = (node, l) => {
      node.title = l.title || node.title;
      if (l.size && l.size[0] > 0) node.size = [...l.size];
      node.color = l.color || null;
      node.collapsed = !!l.collapsed;
      node.mode = l.mode || 0;
      node.converted = new Set(l.converted || []);
      if (l.control) Object.assign(node.control, l.control);
      node.routes = { ...(l.routes || {}) };
      if (l.properties) node.properties = structuredClone(l.properties);
      if (l.ext_widgets) node.extWidgets = structuredClone(l.ext_widgets);
      if (l.placeholder) node.placeholder = structuredClone(l.placeholder);
    };
    for (const [id, entry] of Object.entries(prompt)) {
      const l = laid[id] || {};
      const node = this.addNode(entry.class_type, l.pos || [0, 0], { id });
      if (entry._meta && entry._meta.title) node.title = entry._meta.title;
      place(node, l);
      for (const [name, value] of Object.entries(entry.inputs || {})) {
        if (isLink(value, prompt)) node.links[name] = [String(value[0]), value[1]];
        else node.values[name] = value;
      }
      for (const [name, link] of Object.entries(l.via || {})) node.links[name] = [String(link[0]), link[1]];
      for (const [name, value] of Object.entries(l.shadowed || {})) if (node.links[name]) node.values[name] = value;
    }
    const frontend = layout.frontend || {};
    for (const [id, f] of Object.entries(frontend)) {
      const node = this.addNode(f.type, f.pos || [0, 0], { id, values: f.values || {} });
      place(node, f);
      for (const [name, link] of Object.entries(f.links || {})) node.links[name] = [String(link[0]), link[1]];
    }
    for (const r of layout.reroutes || []) {
      this.reroutes.set(r.id, { id: r.id, pos: [...r.pos], parentId: r.parentId ?? null });
      this.nextRerouteId = Math.max(this.nextRerouteId, r.id + 1);
    }
    this.groups = (layout.groups || []).map((g) => ({ title: g.title || "Group", bounding: [...g.bounding], color: g.color || null }));
    this.extra = { ...(saved.extra || {}) };
    autoLayoutIfNeeded(this, { ...laid, ...frontend });
  }

  // Follow a link through editor-only nodes: [id, slot] of a real producer, {value} or null.
  resolveFrontend(link, depth = 0) {
    const src = this.nodes.get(link[0]);
    if (!src || depth > 64) return null;
    if (src.type === "Reroute") return src.links.input ? this.resolveFrontend(src.links.input, depth + 1) : null;
    if (src.type === "PrimitiveNode") return src.values.value === undefined ? null : { value: src.values.value };
    return [src.id, link[1]];
  }

  // --- ComfyUI API format (what /prompt runs): muted nodes left out, bypassed ones passed through
  toPrompt() {
    const prompt = {};
    for (const node of this.nodes.values()) {
      if (node.frontend || node.mode === MODE_MUTED || node.mode === MODE_BYPASS) continue;
      if (this.subgraphs.has(node.type)) { Object.assign(prompt, flattenInstance(this, node)); continue; }
      const inputs = {};
      const schema = this.schema(node.type);
      for (const [name, value] of Object.entries(node.values)) {
        if (!schema || schema.inputs.some((i) => i.name === name)) inputs[name] = value;
      }
      for (const name of Object.keys(node.links)) {
        delete inputs[name];
        let source = this.resolveSource(node.links[name], this.inputSpec(node, name)?.type ?? "*");
        if (Array.isArray(source)) source = this.mapOut(source);
        if (Array.isArray(source)) inputs[name] = source;
        else if (source) inputs[name] = source.value;
      }
      prompt[node.id] = { class_type: node.type, inputs, _meta: { title: node.title } };
    }
    return prompt;
  }

  // Follow a link through bypassed nodes to a real producer, as ComfyUI does: a bypassed node's
  // output k is replaced by its input of the same type (the k-th one first); muted → no source.
  // Editor-only nodes are followed too: a Reroute to its input, a PrimitiveNode gives {value}.
  resolveSource(link, type, depth = 0) {
    const src = this.nodes.get(link[0]);
    if (!src || depth > 64) return null;
    if (src.frontend) {
      const through = this.resolveFrontend(link, depth);
      return Array.isArray(through) && this.nodes.get(through[0]) !== src ? this.resolveSource(through, type, depth + 1) : through;
    }
    if (src.mode === MODE_MUTED) return null;
    if (src.mode !== MODE_BYPASS) return [src.id, link[1]];
    const outType = this.outputType(src, link[1]);
    const schema = this.schema(src.type);
    const candidates = (schema ? schema.inputs : []).filter((i) => src.links[i.name]);
    const same = candidates[link[1]] && typesCompatible(outType, candidates[link[1]].type) ? candidates[link[1]] : null;
    const pick = same || candidates.find((i) => typesCompatible(outType, i.type) && typesCompatible(i.type, type));
    return pick ? this.resolveSource(src.links[pick.name], type, depth + 1) : null;
  }

  // Apply "control after generate" to seed-like widgets (after a successful queue).
  applyControlAfterGenerate() {
    let changed = false;
    for (const node of this.nodes.values()) {
      for (const [name, how] of Object.entries(node.control)) {
        const spec = this.inputSpec(node, name);
        if (!spec || node.links[name] || how === "fixed") continue;
        const min = spec.opts.min ?? 0;
        const max = Math.min(spec.opts.max ?? Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER);
        let v = Number(node.values[name]) || 0;
        if (how === "increment") v = Math.min(max, v + 1);
        else if (how === "decrement") v = Math.max(min, v - 1);
        else if (how === "randomize") v = min + Math.floor(Math.random() * Math.min(max - min, 2 ** 50));
        node.values[name] = v;
        changed = true;
      }
    }
    return changed;
  }
}

export function isLink(value, prompt) {
  return Array.isArray(value) && value.length === 2 && Number.isInteger(value[1]) &&
    (typeof value[0] === "string" || Number.isInteger(value[0])) && String(value[0]) in prompt;
}

function migrateV1(layout) {
  const nodes = {};
  for (const [id, e] of Object.entries(layout)) {
    nodes[id] = { pos: [e.pos?.x ?? 0, e.pos?.y ?? 0], size: [e.size?.width ?? 0, e.size?.height ?? 0] };
    if (e.title) nodes[id].title = e.title;
  }
  return { nodes, groups: [] };
}

// An API-format graph has no positions: lay nodes out in columns by depth.
function autoLayoutIfNeeded(graph, laid) {
  const missing = [...graph.nodes.values()].filter((n) => !laid[n.id]);
  if (!missing.length) return;
  const depth = new Map();
  const depthOf = (node, guard = 0) => {
    if (depth.has(node.id)) return depth.get(node.id);
    let d = 0;
    for (const [src] of Object.values(node.links)) {
      const s = graph.nodes.get(src);
      if (s && guard < 200) d = Math.max(d, depthOf(s, guard + 1) + 1);
    }
    depth.set(node.id, d);
    return d;
  };
  const rows = {};
  for (const node of missing) {
    const d = depthOf(node);
    rows[d] = (rows[d] || 0) + 1;
    node.pos = [40 + d * 340, 40 + (rows[d] - 1) * 260];
    node.column = d;
  }
  graph.needsLayout = true; // the editor packs the columns once it knows the nodes' sizes
}

// Undo/redo over whole-graph snapshots (cheap enough: one per user action).
export class History {
  constructor(graph, limit = 200) {
    this.graph = graph;
    this.limit = limit;
    this.reset();
  }
  snap() { return JSON.stringify(this.graph.toSaved({ measured: false })); }
  reset() { this.stack = [this.snap()]; this.index = 0; }
  commit() {
    const snap = this.snap();
    if (snap === this.stack[this.index]) return false;
    this.stack.splice(this.index + 1);
    this.stack.push(snap);
    if (this.stack.length > this.limit) this.stack.shift();
    this.index = this.stack.length - 1;
    return true;
  }
  undo() { return this.#go(-1); }
  redo() { return this.#go(1); }
  #go(step) {
    const next = this.index + step;
    if (next < 0 || next >= this.stack.length) return false;
    this.index = next;
    this.graph.loadSaved(JSON.parse(this.stack[next]));
    return true;
  }
}
