// ComfyUI's UI (litegraph) workflow format, both ways. Reading: every node with its positions,
// widget values and links; the editor-only nodes (legacy `Reroute`, `PrimitiveNode`) are kept as
// such, link-midpoint reroutes come from `extra.reroutes` and `extra.linkExtensions` (and from a
// link object's `parentId`). Writing (toUi): the same shape ComfyUI's current frontend saves
// (version 0.4: links as arrays, every widget also an input slot with `widget: {name}`).

import { parseSchema } from "./schema.js";
import { SAVED_FORMAT, SAVED_VERSION } from "./graph.js";
import { FRONTEND_INFO, PRIMITIVE_OUTPUT, isFrontendType, primitiveTargets } from "./frontend.js";
import { NEW_CONTROL, NOTE_TYPES, SUBGRAPH_INPUT_NODE, SUBGRAPH_OUTPUT_NODE, readWidgets, uploadValue, widgetsOf } from "./uirules.js";

// A PrimitiveNode stores its value and, after it, its control (the widgets of what it feeds).
const PRIMITIVE_WIDGETS = [{ name: "value", controlSlots: 1, serialize: true }];

function toPair(value) {
  if (Array.isArray(value)) return [Number(value[0]) || 0, Number(value[1]) || 0];
  if (value && typeof value === "object") return [Number(value[0] ?? value.x ?? 0) || 0, Number(value[1] ?? value.y ?? 0) || 0];
  return [0, 0];
}

function schemaOf(type, info) { return parseSchema(type, info) ?? (isFrontendType(type) ? parseSchema(type, FRONTEND_INFO) : null); }

// Widget values in the frontend's order → {name: value} and seed controls {name: how} (a type
// this server lacks keeps an object's values as they are; its list stays in the placeholder).
function widgetValues(schema, wv) {
  if (schema) return readWidgets(widgetsOf(schema), wv);
  return { values: wv && typeof wv === "object" && !Array.isArray(wv) ? { ...wv } : {}, control: {} };
}

// A subgraph definition of the UI format as a graph of its own, with its boundary nodes.
function definitionAsGraph(d) {
  const links = d.links || [];
  const into = (k) => links.find((l) => l && (Array.isArray(l) ? l[3] === SUBGRAPH_OUTPUT_NODE && l[4] === k
    : l.target_id === SUBGRAPH_OUTPUT_NODE && l.target_slot === k));
  const at = (node, dx) => (Array.isArray(node?.bounding) ? [node.bounding[0], node.bounding[1]] : [dx, 0]);
  const inputNode = { id: SUBGRAPH_INPUT_NODE, type: "SubgraphInput", pos: at(d.inputNode, -300), inputs: [], outputs: (d.inputs || []).map((i) => ({ name: i.name, type: i.type })) };
  const outputNode = { id: SUBGRAPH_OUTPUT_NODE, type: "SubgraphOutput", pos: at(d.outputNode, 900), outputs: [],
    inputs: (d.outputs || []).map((o, k) => { const l = into(k); return { name: o.name, type: o.type, link: l ? (Array.isArray(l) ? l[0] : l.id) : null }; }) };
  return { nodes: [...(d.nodes || []), inputNode, outputNode], links, groups: d.groups || [], extra: d.extra || {} };
}

// ComfyUI UI format → Loom's saved format.
export function convertUi(ui, info, defs = null) {
  const root = defs === null;
  if (root) defs = new Map((ui.definitions?.subgraphs || []).filter((d) => d && d.id).map((d) => [String(d.id), d]));
  const nodes = new Map(ui.nodes.map((n) => [String(n.id), n]));
  const links = new Map();
  const parents = new Map(); // link id -> reroute id nearest its target
  for (const link of ui.links || []) {
    if (Array.isArray(link)) links.set(link[0], { origin: String(link[1]), slot: link[2] });
    else if (link) {
      links.set(link.id, { origin: String(link.origin_id), slot: link.origin_slot });
      if (link.parentId !== undefined && link.parentId !== null) parents.set(link.id, link.parentId);
    }
  }
  for (const ext of ui.extra?.linkExtensions || []) if (ext && ext.parentId !== undefined && ext.parentId !== null) parents.set(ext.id, ext.parentId);
  // Follow a link id to what the API prompt gets: {link: [id, slot]} | {value} | null
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
    if (origin.type === "SubgraphInput") return null; // inside a subgraph: the editor link (via) carries it
    if (NOTE_TYPES.has(origin.type)) return null;
    return { link: [String(origin.id), link.slot] };
  };
  const prompt = {}, layout = { nodes: {}, groups: [] }, frontend = {};
  for (const n of ui.nodes) {
    if (NOTE_TYPES.has(n.type)) continue;
    const id = String(n.id);
    const entry = { pos: toPair(n.pos), size: toPair(n.size) };
    if (n.title) entry.title = n.title;
    if (n.color || n.bgcolor) entry.color = n.bgcolor || n.color;
    if (n.flags?.collapsed) entry.collapsed = true;
    if (n.mode === 2 || n.mode === 4) entry.mode = n.mode;
    const { "Node name for S&R": _sr, loom: _loom, ...props } = n.properties || {};
    if (Object.keys(props).length) entry.properties = props;
    const converted = n.properties?.loom?.converted;
    if (Array.isArray(converted) && converted.length) entry.converted = [...converted];
    const routes = {}, editorLinks = {}, via = {}, shadowed = {};
    const schema = schemaOf(n.type, info);
    const { values: inputs, control } = n.type === "PrimitiveNode"
      ? readWidgets(PRIMITIVE_WIDGETS, n.widgets_values || [])
      : defs.has(String(n.type)) ? { values: promotedValues(n), control: {} } : widgetValues(schema, n.widgets_values);
    for (const input of n.inputs || []) {
      if (input.link === null || input.link === undefined || !links.has(input.link)) continue;
      const name = n.type === "Reroute" ? "input" : input.widget?.name || input.name;
      const link = links.get(input.link);
      if (parents.has(input.link)) routes[name] = parents.get(input.link);
      const origin = nodes.get(link.origin);
      if (isFrontendType(n.type)) { editorLinks[name] = [link.origin, link.slot]; continue; }
      if (origin && isFrontendType(origin.type)) via[name] = [link.origin, link.slot];
      if (name in inputs) shadowed[name] = inputs[name];
      const source = resolve(input.link);
      if (!source) { delete inputs[name]; continue; }
      inputs[name] = source.link || source.value;
    }
    if (Object.keys(control).length) entry.control = control;
    if (Object.keys(routes).length) entry.routes = routes;
    if (!schema && !isFrontendType(n.type) && !defs.has(String(n.type))) { // a type this server lacks: keep what the file says
      entry.placeholder = {
        inputs: (n.inputs || []).map((i) => ({ name: i.widget?.name || i.name, type: i.type, widget: !!i.widget })),
        outputs: (n.outputs || []).map((o) => ({ name: o.name, type: o.type })),
        widgets_values: structuredClone(n.widgets_values ?? []),
      };
    }
    if (isFrontendType(n.type)) {
      frontend[id] = { type: n.type, ...entry, values: n.type === "PrimitiveNode" ? inputs : {}, links: editorLinks };
      continue;
    }
    if (Object.keys(via).length) entry.via = via;
    if (Object.keys(shadowed).length) entry.shadowed = shadowed;
    prompt[id] = { class_type: n.type, inputs };
    if (n.title) prompt[id]._meta = { title: n.title };
    layout.nodes[id] = entry;
  }
  for (const g of ui.groups || []) {
    if (Array.isArray(g.bounding) && g.bounding.length === 4) layout.groups.push({ title: g.title || "Group", bounding: g.bounding, color: g.color || null });
  }
  if (Object.keys(frontend).length) layout.frontend = frontend;
  const reroutes = (ui.extra?.reroutes || []).filter((r) => r && Number.isInteger(r.id));
  if (reroutes.length) layout.reroutes = reroutes.map((r) => ({ id: r.id, pos: toPair(r.pos), parentId: r.parentId ?? null }));
  const extra = ui.extra?.loom && typeof ui.extra.loom === "object" ? { ...ui.extra.loom } : {};
  if (root && defs.size) {
    layout.subgraphs = [...defs.values()].map((d) => ({
      id: String(d.id), name: d.name || "Subgraph", inputs: (d.inputs || []).map((i) => ({ name: i.name, type: i.type })),
      outputs: (d.outputs || []).map((o) => ({ name: o.name, type: o.type })), saved: convertUi(definitionAsGraph(d), info, defs),
    }));
  }
  return { format: SAVED_FORMAT, version: SAVED_VERSION, prompt, layout, extra };
}

// A subgraph instance's promoted widget values: its widget inputs, in order, with widgets_values.
// With the frontend's `properties.proxyWidgets` ([[inner node id, widget name], ...], "-1" for the
// subgraph's own inputs) the values follow that list; a proxy of an inner node's widget keeps its
// value on that node.
function promotedValues(n) {
  const wv = n.widgets_values;
  if (wv && typeof wv === "object" && !Array.isArray(wv)) return { ...wv };
  const proxies = n.properties?.proxyWidgets;
  if (Array.isArray(proxies) && Array.isArray(wv)) {
    return Object.fromEntries(proxies.map((p, i) => [p, wv[i]])
      .filter(([p, v]) => Array.isArray(p) && String(p[0]) === "-1" && v !== undefined).map(([p, v]) => [String(p[1]), v]));
  }
  const names = (n.inputs || []).filter((i) => i.widget?.name).map((i) => i.widget.name);
  return Object.fromEntries(names.map((name, i) => [name, (wv || [])[i]]).filter(([, v]) => v !== undefined));
}

// --- writing ---------------------------------------------------------------------------------------
function uiId(id) { return /^-?\d+$/.test(id) ? Number(id) : id; }

function nodeShape(graph, node) {
  const schema = graph.schema(node.type);
  const inputs = [], outputs = [], widgetsValues = [];
  if (node.type === "Reroute") {
    inputs.push({ name: "", type: "*", link: null });
    outputs.push({ name: "", type: graph.outputType(node, 0), links: [], slot_index: 0 });
    return { inputs, outputs, widgetsValues, slotOf: { input: 0 } };
  }
  if (node.type === "PrimitiveNode") {
    const targets = primitiveTargets(graph, node);
    const out = { name: PRIMITIVE_OUTPUT, type: graph.outputType(node, 0), links: [], slot_index: 0 };
    if (targets.length) out.widget = { name: targets[0].name };
    outputs.push(out);
    if (node.values.value !== undefined) widgetsValues.push(node.values.value);
    if (node.control.value) widgetsValues.push(node.control.value);
    return { inputs, outputs, widgetsValues, slotOf: {} };
  }
  if (!schema && node.placeholder) { // a missing type goes out as it came in
    const ph = node.placeholder, slotOf = {};
    for (const i of ph.inputs || []) { slotOf[i.name] = inputs.length; inputs.push({ name: i.name, type: i.type, link: null, ...(i.widget ? { widget: { name: i.name } } : {}) }); }
    for (const name of Object.keys(node.links)) if (!(name in slotOf)) { slotOf[name] = inputs.length; inputs.push({ name, type: "*", link: null }); }
    (ph.outputs || []).forEach((o, k) => outputs.push({ name: o.name, type: o.type, links: [], slot_index: k }));
    return { inputs, outputs, widgetsValues: structuredClone(ph.widgets_values), slotOf };
  }
  const slotOf = {};
  for (const input of schema ? schema.inputs : []) {
    const entry = { name: input.name, type: input.type, link: null };
    if (input.widget) {
      entry.widget = { name: input.name };
      widgetsValues.push(node.values[input.name] ?? null);
      if (input.opts.control_after_generate) widgetsValues.push(node.control[input.name] || NEW_CONTROL);
    }
    slotOf[input.name] = inputs.length;
    inputs.push(entry);
  }
  const upload = schema ? uploadValue(widgetsOf(schema)) : undefined; // after the widgets, as files store it
  if (upload !== undefined) widgetsValues.push(upload);
  for (const output of schema ? schema.outputs : []) outputs.push({ name: output.name, type: output.type, links: [], slot_index: output.slot });
  // inputs linked without a schema entry (unknown node types keep their links)
  for (const name of Object.keys(node.links)) if (!(name in slotOf)) { slotOf[name] = inputs.length; inputs.push({ name, type: "*", link: null }); }
  if (!schema) for (const [name, value] of Object.entries(node.values)) if (!(name in slotOf)) widgetsValues.push(value);
  return { inputs, outputs, widgetsValues, slotOf };
}

// Loom's graph → ComfyUI UI format (what ComfyUI's frontend saves and loads).
export function toUi(graph) {
  const shapes = new Map(), uiNodes = [];
  let order = 0, lastNode = 0;
  for (const node of graph.nodes.values()) {
    const shape = nodeShape(graph, node);
    shapes.set(node.id, shape);
    const schema = graph.schema(node.type);
    const size = node.size || node.measured || [200, 80];
    const n = {
      id: uiId(node.id), type: node.type, pos: [Math.round(node.pos[0]), Math.round(node.pos[1])],
      size: [Math.round(size[0]), Math.round(size[1])], flags: node.collapsed ? { collapsed: true } : {},
      order: order++, mode: node.mode || 0, inputs: shape.inputs, outputs: shape.outputs,
      properties: { ...(node.properties || {}), "Node name for S&R": node.type }, widgets_values: shape.widgetsValues,
    };
    if (!schema || node.title !== schema.display) n.title = node.title;
    if (node.color) { n.color = node.color; n.bgcolor = node.color; }
    if (node.converted.size) n.properties.loom = { converted: [...node.converted] };
    if (typeof n.id === "number") lastNode = Math.max(lastNode, n.id);
    uiNodes.push(n);
  }
  const links = [], linkExtensions = [], rerouteLinks = new Map();
  let linkId = 0;
  for (const node of graph.nodes.values()) {
    const shape = shapes.get(node.id);
    for (const [name, [src, slot]] of Object.entries(node.links)) {
      const source = shapes.get(src);
      if (!source || !(name in shape.slotOf)) continue;
      const id = ++linkId, targetSlot = shape.slotOf[name];
      links.push([id, uiId(src), slot, uiId(node.id), targetSlot, graph.outputType(graph.nodes.get(src), slot)]);
      shape.inputs[targetSlot].link = id;
      source.outputs[slot]?.links.push(id);
      if (node.routes[name] !== undefined) linkExtensions.push({ id, parentId: node.routes[name] });
      for (const r of graph.routeOf(node.id, name)) {
        if (!rerouteLinks.has(r.id)) rerouteLinks.set(r.id, []);
        rerouteLinks.get(r.id).push(id);
      }
    }
  }
  const extra = {};
  if (graph.reroutes.size) {
    extra.reroutes = [...graph.reroutes.values()].map((r) => {
      const out = { id: r.id, pos: [Math.round(r.pos[0]), Math.round(r.pos[1])], linkIds: rerouteLinks.get(r.id) || [] };
      if (r.parentId !== null) out.parentId = r.parentId;
      return out;
    });
  }
  if (linkExtensions.length) extra.linkExtensions = linkExtensions;
  if (Object.keys(graph.extra).length) extra.loom = { ...graph.extra };
  const groups = graph.groups.map((g, i) => ({ id: i + 1, title: g.title, bounding: g.bounding.map(Math.round), color: g.color || "#3f789e", font_size: 24, flags: {} }));
  const out = { last_node_id: lastNode, last_link_id: linkId, nodes: uiNodes, links, groups, config: {}, extra, version: 0.4 };
  if (graph.subgraphs.size && !graph.boundary) out.definitions = { subgraphs: [...graph.subgraphs.values()].map((d) => definitionToUi(graph, d)) };
  return out;
}

// One definition in ComfyUI's `definitions.subgraphs` shape (links as objects, the boundary nodes' ids
// from the shared rules).
function definitionToUi(graph, def) {
  const inner = toUi(graph.innerGraph(def));
  const boundary = (type) => inner.nodes.find((n) => n.type === type);
  const box = (n, dx) => [n ? n.pos[0] : dx, n ? n.pos[1] : 0, 120, 40 + 20 * Math.max(def.inputs.length, def.outputs.length)];
  const links = inner.links.map(([id, o, os, t, ts, type]) => ({ id, origin_id: o, origin_slot: os, target_id: t, target_slot: ts, type }));
  return {
    id: def.id, version: 1, state: { lastGroupId: 0, lastNodeId: inner.last_node_id, lastLinkId: inner.last_link_id, lastRerouteId: 0 },
    revision: 0, config: {}, name: def.name,
    inputNode: { id: SUBGRAPH_INPUT_NODE, bounding: box(boundary("SubgraphInput"), -300) },
    outputNode: { id: SUBGRAPH_OUTPUT_NODE, bounding: box(boundary("SubgraphOutput"), 900) },
    inputs: def.inputs.map((i, k) => ({ id: `${def.id}-in-${k}`, name: i.name, type: i.type, linkIds: links.filter((l) => l.origin_id === SUBGRAPH_INPUT_NODE && l.origin_slot === k).map((l) => l.id) })),
    outputs: def.outputs.map((o, k) => ({ id: `${def.id}-out-${k}`, name: o.name, type: o.type, linkIds: links.filter((l) => l.target_id === SUBGRAPH_OUTPUT_NODE && l.target_slot === k).map((l) => l.id) })),
    widgets: [], nodes: inner.nodes.filter((n) => n.type !== "SubgraphInput" && n.type !== "SubgraphOutput"), links, groups: inner.groups, extra: inner.extra,
  };
}
