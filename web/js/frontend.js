// Node types that live only in the editor, as in ComfyUI's frontend: the legacy `Reroute` node (one
// input, one output of whatever type flows through) and `PrimitiveNode` (a value source whose
// widget takes the shape of the widget inputs it feeds). They are never sent to the server: the
// API prompt follows a Reroute to its producer and puts a PrimitiveNode's value in the input.

export const PRIMITIVE_OUTPUT = "connect to widget input";

export const FRONTEND_INFO = {
  Reroute: {
    input: { required: { input: ["*", { tooltip: "anything: passed through unchanged" }] } },
    input_order: { required: ["input"] },
    output: ["*"], output_name: ["output"], output_is_list: [false],
    display_name: "Reroute", category: "utils", description: "Passes a link through a point of its own (frontend only).",
    frontend_only: true, python_module: "frontend",
  },
  PrimitiveNode: {
    input: { required: {} }, input_order: { required: [] },
    output: ["*"], output_name: [PRIMITIVE_OUTPUT], output_is_list: [false],
    display_name: "Primitive", category: "utils",
    description: "One value for several widget inputs: link its output to widget inputs (frontend only).",
    frontend_only: true, python_module: "frontend",
  },
};

// Add the editor-only entries to an /object_info catalogue (the server never lists them).
export function addFrontendNodes(info) {
  for (const [type, entry] of Object.entries(FRONTEND_INFO)) if (!info[type]) info[type] = structuredClone(entry);
  return info;
}

// The types the editor models itself: those above, and SubgraphInput / SubgraphOutput, the boundary
// nodes inside a subgraph (see subgraph.js).
export const FRONTEND_TYPES = new Set([...Object.keys(FRONTEND_INFO), "SubgraphInput", "SubgraphOutput"]);

export function isFrontendType(type) { return FRONTEND_TYPES.has(type); }

// The widget inputs a PrimitiveNode feeds: [{node, name, spec}] (the first decides its shape).
export function primitiveTargets(graph, primitive) {
  const out = [];
  for (const node of graph.nodes.values()) {
    for (const [name, link] of Object.entries(node.links)) {
      if (link[0] !== primitive.id) continue;
      const spec = graph.inputSpec(node, name);
      if (spec) out.push({ node, name, spec });
    }
  }
  return out;
}

// The spec a PrimitiveNode's own widget uses: the first target's, renamed "value".
export function primitiveSpec(graph, primitive) {
  const target = primitiveTargets(graph, primitive).find((t) => t.spec.widget);
  return target ? { ...target.spec, name: "value", optional: false } : null;
}

// Can a PrimitiveNode (already feeding `current` targets) also feed input `spec`? Only widget
// inputs of the same type (and, for combos, the same choices).
export function primitiveAccepts(current, spec) {
  if (!spec || !spec.widget) return false;
  const first = current[0]?.spec;
  if (!first) return true;
  if (first.type !== spec.type) return false;
  return first.type !== "COMBO" || JSON.stringify(first.choices) === JSON.stringify(spec.choices);
}
