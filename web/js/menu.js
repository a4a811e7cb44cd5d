// Context menus: on the canvas (add node, group, paste, fit), on a node (rename, collapse,
// bypass, mute, colour, widget <-> input, clone, delete) and on a group; extensions add items.

import { el } from "./widgets.js";

const extraItems = { canvas: [], node: [], main: [] };

export function addMenuItem(where, item) {
  (extraItems[where] || extraItems.canvas).push(item);
}
export function mainMenuItems() { return extraItems.main; }

const COLORS = { none: null, red: "#5a2b2b", green: "#2b4a2f", blue: "#283b5a", purple: "#45305a", yellow: "#5a4f26", cyan: "#24505a" };

export class Menus {
  constructor(editor) {
    this.editor = editor;
    this.box = el("div", { class: "context-menu", hidden: true, "data-role": "context-menu" });
    document.body.append(this.box);
    window.addEventListener("pointerdown", (e) => { if (!this.box.contains(e.target)) this.close(); }, true);
    window.addEventListener("keydown", (e) => { if (e.key === "Escape") this.close(); });
  }

  close() { this.box.hidden = true; }

  // items: [{label, action, disabled?, submenu?: items}] or "-" for a separator
  show(items, x, y) {
    this.box.textContent = "";
    this.#fill(this.box, items);
    this.box.hidden = false;
    const r = this.box.getBoundingClientRect();
    this.box.style.left = `${Math.min(x, window.innerWidth - r.width - 4)}px`;
    this.box.style.top = `${Math.min(y, window.innerHeight - r.height - 4)}px`;
  }

  #fill(box, items) {
    for (const item of items) {
      if (item === "-") { box.append(el("div", { class: "menu-sep" })); continue; }
      const entry = el("div", { class: `menu-item${item.disabled ? " disabled" : ""}`, "data-menu": item.label }, item.label);
      if (item.submenu) {
        entry.classList.add("has-sub");
        const sub = el("div", { class: "menu-sub" });
        this.#fill(sub, item.submenu);
        entry.append(sub);
      } else if (!item.disabled) {
        entry.addEventListener("click", (e) => { e.stopPropagation(); this.close(); item.action(); });
      }
      box.append(entry);
    }
  }

  canvasMenu(e) {
    const ed = this.editor;
    const at = ed.canvas.toWorld(e.clientX, e.clientY);
    const group = ed.groups.at(at);
    const items = [
      { label: "Add node…", action: () => ed.openSearch(e.clientX, e.clientY) },
      { label: "Add group", action: () => ed.groups.add(at) },
      { label: "Paste", action: () => ed.paste(at) },
      { label: "Clear canvas", action: () => window.loom?.settings.clearCanvas() },
      "-",
      { label: "Fit view", action: () => ed.fitView() },
      { label: "Select all", action: () => ed.selectAll() },
    ];
    if (group) {
      items.push("-",
        { label: "Rename group", action: () => ed.groups.rename(group) },
        { label: "Fit group to its nodes", action: () => ed.groups.fitToNodes(group) },
        { label: "Remove group", action: () => ed.groups.remove(group) });
    }
    for (const item of extraItems.canvas) items.push({ label: item.label, action: () => item.action({ editor: ed, pos: at }) });
    this.show(items, e.clientX, e.clientY);
  }

  nodeMenu(id, e) {
    const ed = this.editor;
    if (!ed.selection.has(id)) ed.select([id]);
    const node = ed.graph.nodes.get(id);
    const ids = [...ed.selection];
    const schema = ed.graph.schema(node.type);
    const widgetInputs = (schema?.inputs || []).filter((i) => i.widget);
    const convert = widgetInputs.map((i) => node.converted.has(i.name)
      ? { label: `Convert ${i.name} to widget`, action: () => ed.convertWidget(id, i.name, false) }
      : { label: `Convert ${i.name} to input`, action: () => ed.convertWidget(id, i.name, true) });
    const items = [
      { label: "Rename", action: () => ed.views.rename(id) },
      { label: node.collapsed ? "Expand" : "Collapse", action: () => ed.setCollapsed(ids, !node.collapsed) },
      { label: node.mode === 4 ? "Stop bypassing" : "Bypass", action: () => ed.setMode(ids, node.mode === 4 ? 0 : 4) },
      { label: node.mode === 2 ? "Unmute" : "Mute", action: () => ed.setMode(ids, node.mode === 2 ? 0 : 2) },
      { label: "Colour", submenu: Object.entries(COLORS).map(([name, color]) => ({ label: name, action: () => ed.setColor(ids, color) })) },
    ];
    if (convert.length) items.push({ label: "Widgets ↔ inputs", submenu: convert });
    if (widgetInputs.some((i) => i.widget === "IMAGEUPLOAD")) items.push({ label: "Open in mask editor", action: () => ed.emit("openMaskEditor", { nodeId: id }) });
    const sub = ed.subgraphUi;
    if (sub) {
      items.push("-", { label: "Convert to subgraph", action: () => sub.convertSelection() });
      if (sub.isInstance(node)) items.push({ label: "Open subgraph", action: () => sub.open(id) }, { label: "Unpack subgraph", action: () => sub.unpack(id) });
    }
    items.push("-",
      { label: "Copy", action: () => ed.copy() },
      { label: "Clone", action: () => ed.clone(ids) },
      { label: "Group selected nodes", action: () => ed.groups.addAround(ids) },
      { label: "Delete", action: () => ed.deleteNodes(ids) });
    for (const item of extraItems.node) items.push({ label: item.label, action: () => item.action({ editor: ed, node }) });
    this.show(items, e.clientX, e.clientY);
  }
}
