// Subgraphs, as ComfyUI's current frontend has them: a definition (a graph of its own with an
// input node and an output node, whose ids the shared UI-format rules give) and any number of
// instance nodes whose type is the definition's id. The editor keeps each definition as
// {id, name, inputs, outputs, saved} (`saved`: the inner graph in Loom's saved format, boundary
// nodes included); the API prompt flattens instances the way the server does (inner node "5" of
// instance "12" becomes "12:5"), and ComfyUI's UI format carries them in `definitions.subgraphs`.

import { SUBGRAPH_INPUT_NODE, SUBGRAPH_OUTPUT_NODE } from "./uirules.js";

export const INPUT_ID = String(SUBGRAPH_INPUT_NODE), OUTPUT_ID = String(SUBGRAPH_OUTPUT_NODE);

// The inputs of a definition with their widget shape, taken from the first inner input each feeds.
export function boundaryInputs(def, inner) {
  return def.inputs.map((input, k) => {
    if (input.widget !== undefined) return input;
    let spec = null;
    for (const node of inner.nodes.values()) {
      for (const [name, link] of Object.entries(node.links)) {
        if (link[0] === INPUT_ID && link[1] === k && !spec) spec = inner.inputSpec(node, name);
      }
    }
    const opts = { ...(spec?.widget ? spec.opts : {}) };
    delete opts.control_after_generate; // the instance's widgets_values hold plain values
    return { ...input, widget: spec?.widget ? spec.widget : null, opts, choices: spec?.widget ? spec.choices : null, default: opts.default };
  });
}

// The schema an instance node shows, and the schemas of the two boundary nodes inside.
export function instanceSchema(def, inner) {
  const inputs = boundaryInputs(def, inner).map((i) => ({ name: i.name, type: i.type, optional: true, opts: i.opts || {}, choices: i.choices || null, widget: i.widget || null }));
  const outputs = def.outputs.map((o, k) => ({ name: o.name, type: o.type, isList: false, slot: k }));
  return { type: def.id, inputs, outputs, display: def.name, category: "subgraph", description: `Subgraph “${def.name}”`, outputNode: false, subgraph: true };
}

// The boundary nodes inside; each has one more slot, "+": link it to add an input (or output).
export const ADD_SLOT = "+";

export function boundarySchema(type, def) {
  if (type === "SubgraphInput") {
    const outputs = def.inputs.map((i, k) => ({ name: i.name, type: i.type, isList: false, slot: k }));
    outputs.push({ name: ADD_SLOT, type: "*", isList: false, slot: def.inputs.length });
    return { type, inputs: [], outputs, display: "Subgraph inputs", category: "subgraph", description: "", outputNode: false };
  }
  const inputs = def.outputs.map((o) => ({ name: o.name, type: o.type, optional: true, opts: {}, choices: null, widget: null }));
  inputs.push({ name: ADD_SLOT, type: "*", optional: true, opts: {}, choices: null, widget: null });
  return { type, inputs, outputs: [], display: "Subgraph outputs", category: "subgraph", description: "", outputNode: false };
}

// Linking the "+" slot of a boundary node adds an input (or output) to the definition; returns the
// input name the link should use at the target.
export function growBoundary(graph, src, slot, dst, name) {
  const def = graph.boundary;
  if (!def) return name;
  const taken = (list) => new Set(list.map((x) => x.name));
  if (src.type === "SubgraphInput" && slot === def.inputs.length) {
    def.inputs.push({ name: uniqueName(name, taken(def.inputs)), type: graph.inputSpec(dst, name)?.type ?? "*" });
  }
  if (dst.type === "SubgraphOutput" && name === ADD_SLOT) {
    const out = graph.schema(src.type)?.outputs[slot];
    const added = { name: uniqueName(out?.name || "output", taken(def.outputs)), type: graph.outputType(src, slot) };
    def.outputs.push(added);
    return added.name;
  }
  return name;
}

function uniqueName(name, taken) {
  let out = name, n = 2;
  while (taken.has(out)) out = `${name}_${n++}`;
  taken.add(out);
  return out;
}

function newId() {
  return crypto.randomUUID ? crypto.randomUUID() : `sg-${Date.now()}-${Math.random().toString(16).slice(2)}`;
}

// Turn nodes `ids` of `graph` into one instance of a new definition. Returns the instance node.
export function convertToSubgraph(graph, ids, name = "Subgraph") {
  const sel = new Set(ids);
  const picked = [...graph.nodes.values()].filter((n) => sel.has(n.id));
  if (!picked.length) return null;
  const inputs = [], outputs = [], inKey = new Map(), outKey = new Map(), inNames = new Set(), outNames = new Set();
  const outerLinks = []; // [consumer node, input name, output index]
  for (const node of picked) {
    for (const [input, link] of Object.entries(node.links)) {
      if (sel.has(link[0])) continue;
      const key = `${link[0]}\u0000${link[1]}`;
      if (!inKey.has(key)) {
        inKey.set(key, inputs.length);
        inputs.push({ name: uniqueName(input, inNames), type: graph.outputType(graph.nodes.get(link[0]), link[1]), source: [...link] });
      }
      node.links[input] = [INPUT_ID, inKey.get(key)];
      delete node.routes[input];
    }
  }
  for (const node of graph.nodes.values()) {
    if (sel.has(node.id)) continue;
    for (const [input, link] of Object.entries(node.links)) {
      if (!sel.has(link[0])) continue;
      const key = `${link[0]}\u0000${link[1]}`;
      if (!outKey.has(key)) {
        outKey.set(key, outputs.length);
        const out = graph.schema(graph.nodes.get(link[0]).type)?.outputs[link[1]];
        outputs.push({ name: uniqueName(out?.name || "output", outNames), type: graph.outputType(graph.nodes.get(link[0]), link[1]), source: [...link] });
      }
      outerLinks.push([node, input, outKey.get(key)]);
    }
  }
  const xs = picked.map((n) => n.pos[0]), ys = picked.map((n) => n.pos[1]);
  const def = { id: newId(), name, inputs: inputs.map(({ name: n, type }) => ({ name: n, type })), outputs: outputs.map(({ name: n, type }) => ({ name: n, type })) };
  // the inner graph: the picked nodes and the two boundary nodes
  const inner = graph.spawn(def);
  const entryOf = (n) => ({ type: n.type, title: n.title, pos: [n.pos[0], n.pos[1]], values: structuredClone(n.values), links: structuredClone(n.links),
    converted: [...n.converted], control: { ...n.control }, mode: n.mode, color: n.color, collapsed: n.collapsed, size: n.size });
  inner.addNode("SubgraphInput", [Math.min(...xs) - 260, Math.min(...ys)], { id: INPUT_ID });
  const outNode = inner.addNode("SubgraphOutput", [Math.max(...xs) + 420, Math.min(...ys)], { id: OUTPUT_ID });
  outputs.forEach((o, k) => { outNode.links[o.name] = [...o.source]; def.outputs[k].name = o.name; });
  for (const n of picked) {
    const e = entryOf(n);
    const copy = inner.addNode(e.type, e.pos, { id: n.id, values: e.values, title: e.title });
    Object.assign(copy, { links: e.links, converted: new Set(e.converted), control: e.control, mode: e.mode, color: e.color, collapsed: e.collapsed, size: e.size });
  }
  def.saved = inner.toSaved({ measured: false });
  graph.subgraphs.set(def.id, def);
  // the outer graph: one instance in their place
  for (const n of picked) graph.removeNode(n.id);
  const instance = graph.addNode(def.id, [(Math.min(...xs) + Math.max(...xs)) / 2, (Math.min(...ys) + Math.max(...ys)) / 2]);
  inputs.forEach((i) => { instance.links[i.name] = [...i.source]; });
  for (const [node, input, k] of outerLinks) node.links[input] = [instance.id, k];
  return instance;
}

// Put an instance's inner nodes back into `graph` (new ids), wired as the instance was.
export function unpackSubgraph(graph, instanceId) {
  const instance = graph.nodes.get(instanceId);
  const def = instance && graph.subgraphs.get(instance.type);
  if (!def) return [];
  const inner = graph.innerGraph(def);
  const ids = new Map();
  const outNode = inner.nodes.get(OUTPUT_ID);
  const dx = instance.pos[0] - Math.min(...[...inner.nodes.values()].filter((n) => !n.id.startsWith("-")).map((n) => n.pos[0]));
  const dy = instance.pos[1] - Math.min(...[...inner.nodes.values()].filter((n) => !n.id.startsWith("-")).map((n) => n.pos[1]));
  const created = [];
  for (const n of inner.nodes.values()) {
    if (n.id === INPUT_ID || n.id === OUTPUT_ID) continue;
    const copy = graph.addNode(n.type, [n.pos[0] + dx, n.pos[1] + dy], { values: structuredClone(n.values), title: n.title });
    Object.assign(copy, { converted: new Set(n.converted), control: { ...n.control }, mode: n.mode, color: n.color, collapsed: n.collapsed, size: n.size });
    ids.set(n.id, copy.id);
    created.push([n, copy]);
  }
  const inputsDef = def.inputs;
  for (const [n, copy] of created) {
    for (const [name, link] of Object.entries(n.links)) {
      if (link[0] === INPUT_ID) {
        const outer = instance.links[inputsDef[link[1]]?.name];
        if (outer) copy.links[name] = [...outer];
        else if (inputsDef[link[1]] && instance.values[inputsDef[link[1]].name] !== undefined) copy.values[name] = instance.values[inputsDef[link[1]].name];
      } else if (ids.has(link[0])) copy.links[name] = [ids.get(link[0]), link[1]];
    }
  }
  for (const node of graph.nodes.values()) {
    for (const [name, link] of Object.entries(node.links)) {
      if (link[0] !== instanceId) continue;
      const src = outNode?.links[def.outputs[link[1]]?.name];
      if (src && ids.has(src[0])) node.links[name] = [ids.get(src[0]), src[1]];
      else if (src && src[0] === INPUT_ID && instance.links[inputsDef[src[1]]?.name]) node.links[name] = [...instance.links[inputsDef[src[1]].name]];
      else delete node.links[name];
    }
  }
  graph.removeNode(instanceId);
  if (![...graph.nodes.values()].some((n) => n.type === def.id)) graph.subgraphs.delete(def.id);
  return created.map(([, c]) => c.id);
}

// --- flattening for the API prompt -------------------------------------------------------------------
// What feeds input k of an instance from outside: [id, slot] (already mapped), {value} or null.
export function boundarySource(graph, instance, k) {
  const def = graph.subgraphs.get(instance.type);
  const input = def && boundaryInputs(def, graph.innerGraph(def))[k];
  if (!input) return null;
  const link = instance.links[input.name];
  if (link) {
    const source = graph.resolveSource(link, input.type);
    return Array.isArray(source) ? graph.mapOut(source) : source;
  }
  return input.widget && instance.values[input.name] !== undefined ? { value: instance.values[input.name] } : null;
}

// An instance's inner nodes as API prompt entries, ids prefixed with the instance's.
export function flattenInstance(graph, instance) {
  const def = graph.subgraphs.get(instance.type);
  const inner = graph.innerGraph(def);
  const out = {};
  for (const [id, entry] of Object.entries(inner.toPrompt())) {
    const inputs = {};
    for (const [name, value] of Object.entries(entry.inputs)) {
      if (!Array.isArray(value) || value.length !== 2 || typeof value[0] !== "string") { inputs[name] = value; continue; }
      if (value[0] === INPUT_ID) {
        const source = boundarySource(graph, instance, value[1]);
        if (Array.isArray(source)) inputs[name] = source;
        else if (source) inputs[name] = source.value;
      } else inputs[name] = [`${instance.id}:${value[0]}`, value[1]];
    }
    out[`${instance.id}:${id}`] = { ...entry, inputs };
  }
  return out;
}

// Output `slot` of an instance → the inner producer's flattened [id, slot] (or what passes through).
export function instanceOutput(graph, instance, slot) {
  const def = graph.subgraphs.get(instance.type);
  const inner = graph.innerGraph(def);
  const link = inner.nodes.get(OUTPUT_ID)?.links[def.outputs[slot]?.name];
  if (!link) return null;
  const source = inner.resolveSource(link, def.outputs[slot].type);
  if (!Array.isArray(source)) return source;
  if (source[0] === INPUT_ID) return boundarySource(graph, instance, source[1]);
  const mapped = inner.mapOut(source);
  return Array.isArray(mapped) ? [`${instance.id}:${mapped[0]}`, mapped[1]] : mapped;
}
