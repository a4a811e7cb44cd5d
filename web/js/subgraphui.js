// Subgraphs in the editor: "Convert to subgraph" on a selection, "Open subgraph" (edit inside, a
// breadcrumb leads back out), "Unpack subgraph", and a button on every instance's title bar.
// Editing inside writes the definition back on every commit, so every instance follows.

import { History } from "./graph.js";
import { INPUT_ID, boundaryInputs, convertToSubgraph, unpackSubgraph } from "./subgraph.js";
import { el } from "./widgets.js";

export class SubgraphUi {
  constructor(app) {
    this.app = app;
    this.editor = app.editor;
    this.stack = []; // [{tab, def}] from the root tab inwards
    this.bar = el("div", { class: "breadcrumb", "data-role": "breadcrumb", hidden: true });
    this.editor.root.append(this.bar);
    this.editor.onCommit = () => this.#writeBack();
    this.editor.events.addEventListener("tabShown", (e) => { if (!e.detail.tab.def) { this.stack = []; this.#renderBar(); } });
    this.editor.nodesLayer.addEventListener("click", (e) => {
      const button = e.target.closest?.('[data-action="open-subgraph"]');
      if (button) { e.stopPropagation(); this.open(button.closest(".node").dataset.nodeId); }
    });
  }

  isInstance(node) { return !!node && this.editor.graph.subgraphs.has(node.type); }

  convertSelection(name = "Subgraph") {
    const ids = [...this.editor.selection];
    if (!ids.length) return null;
    const instance = convertToSubgraph(this.editor.graph, ids, name);
    this.editor.selection.clear();
    this.editor.renderAll();
    this.editor.select([instance.id]);
    this.editor.commit();
    return instance;
  }

  unpack(id) {
    const created = unpackSubgraph(this.editor.graph, id);
    this.editor.renderAll();
    this.editor.select(created);
    this.editor.commit();
    return created;
  }

  open(id) {
    const graph = this.editor.graph;
    const node = graph.nodes.get(id);
    const def = node && graph.subgraphs.get(node.type);
    if (!def) return;
    const root = this.stack.length ? this.stack[0].tab : this.editor.tab;
    if (!this.stack.length) this.stack.push({ tab: root, def: null, name: root.name });
    this.stack[this.stack.length - 1].view = [this.editor.canvas.x, this.editor.canvas.y, this.editor.canvas.zoom];
    const inner = graph.innerGraph(def);
    const tab = { id: `${root.id}/${def.id}`, name: def.name, graph: inner, history: new History(inner), view: null, dirty: false, outputs: {}, def, root };
    this.stack.push({ tab, def, name: def.name });
    this.editor.show(tab);
    this.#renderBar();
  }

  // Back out to level `index` of the breadcrumb (0 = the workflow itself).
  exit(index = 0) {
    const target = this.stack[index];
    if (!target) return;
    this.stack = this.stack.slice(0, index + 1);
    if (index === 0) this.stack = [];
    target.tab.view = target.view || target.tab.view;
    this.editor.show(target.tab);
    this.#renderBar();
  }

  #renderBar() {
    this.bar.textContent = "";
    this.bar.hidden = this.stack.length < 2;
    this.stack.forEach((level, i) => {
      if (i) this.bar.append(el("span", { class: "crumb-sep" }, "›"));
      const crumb = el("button", { type: "button", class: "crumb", "data-crumb": String(i) }, level.name);
      if (i < this.stack.length - 1) crumb.addEventListener("click", () => this.exit(i));
      else crumb.disabled = true;
      this.bar.append(crumb);
    });
  }

  // Inside a subgraph, every edit is written into its definition (one undo step on the workflow).
  #writeBack() {
    const tab = this.editor.tab;
    if (!tab?.def) return;
    tab.def.saved = tab.graph.toSaved({ measured: false });
    for (const level of this.stack) if (level.def) level.def._schema = null;
    // instances of this definition get a value for widgets newly promoted to inputs: the inner one's
    const parent = this.stack[this.stack.length - 2]?.tab.graph;
    for (const [k, input] of boundaryInputs(tab.def, tab.graph).entries()) {
      if (!input.widget) continue;
      const target = [...tab.graph.nodes.values()].find((n) => Object.entries(n.links).some(([, l]) => l[0] === INPUT_ID && l[1] === k));
      const name = target && Object.keys(target.links).find((n) => target.links[n][0] === INPUT_ID && target.links[n][1] === k);
      for (const node of parent?.nodes.values() || []) {
        if (node.type === tab.def.id && node.values[input.name] === undefined && name) node.values[input.name] = target.values[name];
      }
    }
    const root = tab.root;
    if (root.history.commit()) { root.dirty = true; this.app.persist(); }
  }
}
