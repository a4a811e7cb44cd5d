// Runs the editor's UI-format code (web/js) under Node for tests/compat/test_ui_rules.py: reads
// {"task": ..., ...} JSON on stdin, writes the answer as JSON on stdout.
//   {"task": "widgets", "cases": [{"info": {...}, "type": T, "widgets_values": [...]}]}
//     → [{"widgets": [{name, controlSlots, serialize}], "values": {...}, "control": {...}}]
//   {"task": "export", "info": {...}, "workflows": [ui, ...]}
//     → [{"ui": toUi(graph), "prompt": graph.toPrompt()}] for each UI-format workflow as the editor opens it
//   {"task": "frontend"} → the node types the editor models itself (catalogue entries of its own)
import { register } from "node:module";

register("./served_rules.mjs", import.meta.url);
const web = new URL("../../../web/js/", import.meta.url);
const { parseSchema } = await import(new URL("schema.js", web));
const { readWidgets, widgetsOf } = await import(new URL("uirules.js", web));
const { convertUi, toUi } = await import(new URL("uiformat.js", web));
const { Graph } = await import(new URL("graph.js", web));
const { FRONTEND_INFO, addFrontendNodes } = await import(new URL("frontend.js", web));

let text = "";
for await (const chunk of process.stdin) text += chunk;
const request = JSON.parse(text);

function widgets(cases) {
  return cases.map(({ info, type, widgets_values: stored }) => {
    const list = widgetsOf(parseSchema(type, { [type]: info }));
    return { widgets: list, ...readWidgets(list, stored) };
  });
}

function exported({ info, workflows }) {
  const catalogue = addFrontendNodes(structuredClone(info));
  return workflows.map((ui) => {
    const graph = new Graph(catalogue);
    graph.loadSaved(convertUi(ui, catalogue));
    return { ui: toUi(graph), prompt: graph.toPrompt() };
  });
}

const tasks = { widgets: () => widgets(request.cases), export: () => exported(request), frontend: () => Object.keys(FRONTEND_INFO) };
process.stdout.write(JSON.stringify(tasks[request.task]()));
