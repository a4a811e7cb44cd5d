// The editor: one canvas showing the current tab's graph; selection, moving, clipboard, undo/redo
// and keyboard shortcuts. Other modules (links, search, menus, groups) hang off this object.

import { Canvas, Minimap, isTyping } from "./canvas.js";
import { NodeViews } from "./nodeview.js";
import { Links } from "./links.js";
import { Search } from "./search.js";
import { Menus } from "./menu.js";
import { Groups } from "./groups.js";
import { el } from "./widgets.js";

const CLIPBOARD_KEY = "loom.clipboard";

export class Editor {
  constructor(root, { info, api }) {
    this.root = root;
    this.info = info;
    this.api = api;
    this.events = new EventTarget();
    this.selection = new Set();
    this.nodesLayer = root.querySelector(".nodes-layer");
    this.canvas = new Canvas(root, {
      onBoxSelect: (rect) => this.boxSelect(rect),
      onBackgroundClick: () => this.select([]),
      onBackgroundDblClick: (e) => this.openSearch(e.clientX, e.clientY),
      onContextMenu: (e) => this.menus.canvasMenu(e),
      onChange: () => { this.cull(); this.minimap.drawSoon(); if (this.tab) this.tab.view = [this.canvas.x, this.canvas.y, this.canvas.zoom]; },
    });
    this.views = new NodeViews(this, this.nodesLayer);
    this.links = new Links(this, root.querySelector(".links-layer"));
    this.groups = new Groups(this, root.querySelector(".groups-layer"));
    this.search = new Search(this);
    this.menus = new Menus(this);
    this.minimap = new Minimap(root.querySelector(".minimap"), this.canvas, () => [...this.graph?.nodes.keys() || []].map((id) => this.views.rect(id)));
    this.toasts = document.querySelector(".toasts");
    window.addEventListener("keydown", (e) => this.#key(e));
    root.addEventListener("pointermove", (e) => { this.lastPointer = [e.clientX, e.clientY]; });
  }

  emit(name, detail = {}) { this.events.dispatchEvent(new CustomEvent(name, { detail })); }

  // --- tabs hand the editor a graph ---------------------------------------------------------------
  show(tab) {
    this.tab = tab;
    this.graph = tab.graph;
    this.history = tab.history;
    this.selection.clear();
    this.renderAll();
    if (this.graph.needsLayout) this.#packColumns();
    if (tab.view) this.canvas.setView(...tab.view);
    else requestAnimationFrame(() => this.fitView());
  }

  // Lay out nodes that came without positions (API format) in columns, using their real sizes.
  #packColumns() {
    this.graph.needsLayout = false;
    const columns = new Map();
    for (const node of this.graph.nodes.values()) {
      if (node.column === undefined) continue;
      if (!columns.has(node.column)) columns.set(node.column, []);
      columns.get(node.column).push(node);
    }
    let x = 40;
    for (const d of [...columns.keys()].sort((a, b) => a - b)) {
      let y = 40, width = 0;
      for (const node of columns.get(d)) {
        const [, , w, h] = this.views.rect(node.id);
        node.pos = [x, y];
        delete node.column;
        this.views.setPos(node);
        y += h + 40;
        width = Math.max(width, w);
      }
      x += width + 80;
    }
    this.links.redrawAll();
    this.history.reset();
  }

  // Hide nodes and links well outside the view, so a frame composites only what can be seen. The
  // kept area reaches half a view beyond each edge; culling again repaints, so it runs only when the
  // view leaves the inner part of that area or the zoom doubles or halves (or `force`: the graph
  // changed). All geometry is read before any element is touched.
  cull(force = false) {
    if (!this.graph) return;
    const c = this.canvas, [vx0, vy0, vx1, vy1] = c.visibleWorld();
    const last = this.culled;
    if (!force && last && c.zoom < last.zoom * 2 && c.zoom > last.zoom / 2 &&
      vx0 >= last.inner[0] && vy0 >= last.inner[1] && vx1 <= last.inner[2] && vy1 <= last.inner[3]) return;
    const mx = (vx1 - vx0) / 2, my = (vy1 - vy0) / 2;
    const x0 = vx0 - mx, y0 = vy0 - my, x1 = vx1 + mx, y1 = vy1 + my;
    this.culled = { zoom: c.zoom, inner: [vx0 - mx / 2, vy0 - my / 2, vx1 + mx / 2, vy1 + my / 2] };
    const outside = (ax, ay, bx, by) => bx < x0 || ax > x1 || by < y0 || ay > y1;
    const nodes = [];
    for (const [id, elem] of this.views.els) {
      const [x, y, w, h] = this.views.rect(id);
      const off = outside(x, y, x + w, y + h);
      if (elem.classList.contains("offscreen") !== off) nodes.push([elem, off]);
    }
    const links = [];
    for (const link of this.links.paths.values()) {
      const box = link.box;
      if (!box) continue;
      const off = outside(box[0] - 100, box[1], box[2] + 100, box[3]);
      if (!!link.off !== off) links.push([link, off]);
    }
    for (const [elem, off] of nodes) elem.classList.toggle("offscreen", off);
    for (const [link, off] of links) { link.off = off; link.path.style.visibility = off ? "hidden" : ""; }
  }

  renderAll() {
    this.views.clear();
    this.links.clear();
    for (const node of this.graph.nodes.values()) this.views.render(node, false);
    for (const id of this.graph.nodes.keys()) this.views.measure(id); // one layout for all nodes
    this.links.redrawAll();
    this.groups.renderAll();
    this.cull(true);
    for (const id of [...this.selection]) if (!this.graph.nodes.has(id)) this.selection.delete(id);
    this.minimap.draw();
  }

  commit() {
    this.minimap.draw();
    this.links.reroutes.sync();
    this.onCommit?.(); // inside a subgraph: write the definition back
    if (this.history.commit()) {
      this.tab.dirty = true;
      this.emit("graphChanged", { graph: this.graph });
    }
  }

  undo() { if (this.history.undo()) { this.renderAll(); this.emit("graphChanged", { graph: this.graph }); } }
  redo() { if (this.history.redo()) { this.renderAll(); this.emit("graphChanged", { graph: this.graph }); } }

  toast(message, kind = "info", ms = 4000) {
    const item = el("div", { class: `toast ${kind}`, "data-role": "toast" }, message);
    this.toasts.append(item);
    setTimeout(() => item.remove(), ms);
  }

  fitView() {
    const ids = [...this.graph.nodes.keys()];
    if (!ids.length) { this.canvas.setView(0, 0, 1); return; }
    const rects = ids.map((id) => this.views.rect(id));
    const x0 = Math.min(...rects.map((r) => r[0])), y0 = Math.min(...rects.map((r) => r[1]));
    const x1 = Math.max(...rects.map((r) => r[0] + r[2])), y1 = Math.max(...rects.map((r) => r[1] + r[3]));
    this.canvas.fit([x0, y0, x1 - x0, y1 - y0]);
  }

  openSearch(clientX, clientY) {
    const at = this.canvas.toWorld(clientX, clientY);
    this.search.open({ clientX, clientY, onPick: (type) => this.addNode(type, at) });
  }

  // --- editing ----------------------------------------------------------------------------------
  addNode(type, pos, commit = true) {
    const node = this.graph.addNode(type, pos);
    this.views.render(node);
    this.select([node.id]);
    this.emit("nodeAdded", { node });
    if (commit) this.commit();
    return node;
  }

  deleteNodes(ids) {
    for (const id of ids) {
      for (const link of this.graph.links()) if (link.src === id) this.views.setLinked(link.dst, link.name, false);
      this.graph.removeNode(id);
      this.links.removeNode(id);
      this.views.els.get(id)?.remove();
      this.views.els.delete(id);
      this.selection.delete(id);
    }
    this.commit();
  }

  setMode(ids, mode) {
    for (const id of ids) { const n = this.graph.nodes.get(id); n.mode = mode; this.views.render(n); this.links.updateNode(id); }
    this.commit();
  }

  setCollapsed(ids, collapsed) {
    for (const id of ids) { const n = this.graph.nodes.get(id); n.collapsed = collapsed; this.views.render(n); this.links.updateNode(id); }
    this.commit();
  }

  setColor(ids, color) {
    for (const id of ids) { const n = this.graph.nodes.get(id); n.color = color; this.views.render(n); }
    this.commit();
  }

  convertWidget(id, name, toInput) {
    const node = this.graph.nodes.get(id);
    if (toInput) node.converted.add(name);
    else { node.converted.delete(name); }
    this.views.render(node);
    this.links.updateNode(id);
    this.commit();
  }

  select(ids) {
    if (ids.length || this.links.reroutes.selected !== null) this.links.reroutes.select(null);
    for (const id of this.selection) this.views.setSelected(id, false);
    this.selection = new Set(ids);
    for (const id of this.selection) this.views.setSelected(id, true);
  }

  selectAll() { this.select([...this.graph.nodes.keys()]); }

  boxSelect([x, y, w, h]) {
    const hit = [...this.graph.nodes.keys()].filter((id) => {
      const r = this.views.rect(id);
      return r[0] < x + w && r[0] + r[2] > x && r[1] < y + h && r[1] + r[3] > y;
    });
    this.select([...this.selection, ...hit]);
  }

  pointerOnNode(id, e) {
    if (e.shiftKey || e.ctrlKey || e.metaKey) {
      const next = new Set(this.selection);
      if (next.has(id)) next.delete(id); else next.add(id);
      this.select([...next]);
      return;
    }
    if (!this.selection.has(id)) this.select([id]);
    const elem = this.views.els.get(id);
    if (elem && elem !== this.nodesLayer.lastElementChild) this.nodesLayer.append(elem); // bring to front
    const start = this.canvas.toWorld(e.clientX, e.clientY);
    const moving = [...this.selection].map((nid) => [this.graph.nodes.get(nid), [...this.graph.nodes.get(nid).pos]]);
    let moved = false;
    const move = (ev) => {
      const p = this.canvas.toWorld(ev.clientX, ev.clientY);
      const dx = p[0] - start[0], dy = p[1] - start[1];
      if (!moved && Math.abs(dx) + Math.abs(dy) < 2) return;
      moved = true;
      for (const [node, pos] of moving) { node.pos = [pos[0] + dx, pos[1] + dy]; this.views.setPos(node); this.links.updateNode(node.id); }
    };
    const up = () => {
      window.removeEventListener("pointermove", move);
      window.removeEventListener("pointerup", up);
      if (moved && this.snap) {
        for (const [node] of moving) { node.pos = node.pos.map((v) => Math.round(v / this.snap) * this.snap); this.views.setPos(node); this.links.updateNode(node.id); }
      }
      if (moved) { this.commit(); this.minimap.draw(); }
    };
    window.addEventListener("pointermove", move);
    window.addEventListener("pointerup", up);
  }

  // --- clipboard: localStorage (shared by every tab) and the system clipboard when allowed ------
  copy(ids = [...this.selection]) {
    if (!ids.length) return;
    const set = new Set(ids);
    const nodes = ids.map((id) => {
      const n = this.graph.nodes.get(id);
      const links = Object.fromEntries(Object.entries(n.links).filter(([, l]) => set.has(l[0])));
      return { id: n.id, type: n.type, title: n.title, pos: n.pos, values: n.values, links, converted: [...n.converted],
        control: n.control, mode: n.mode, collapsed: n.collapsed, color: n.color, size: n.size };
    });
    // subgraph instances carry their definitions, so they paste into any tab
    const defs = [...new Set(nodes.map((n) => n.type))].filter((t) => this.graph.subgraphs.has(t)).map((t) => {
      const d = this.graph.subgraphs.get(t);
      return { id: d.id, name: d.name, inputs: d.inputs.map(({ name, type }) => ({ name, type })), outputs: d.outputs.map(({ name, type }) => ({ name, type })), saved: d.saved };
    });
    const text = JSON.stringify({ "loom-clipboard": 1, nodes, subgraphs: defs });
    localStorage.setItem(CLIPBOARD_KEY, text);
    navigator.clipboard?.writeText(text).catch(() => {});
    this.toast(`Copied ${nodes.length} node${nodes.length > 1 ? "s" : ""}`);
  }

  paste(at = null) {
    let data;
    try { data = JSON.parse(localStorage.getItem(CLIPBOARD_KEY) || "null"); } catch { data = null; }
    if (!data || !data.nodes?.length) return;
    for (const d of data.subgraphs || []) if (!this.graph.subgraphs.has(d.id)) this.graph.subgraphs.set(d.id, d);
    this.pasteNodes(data.nodes, at);
  }

  pasteNodes(nodes, at) {
    const minX = Math.min(...nodes.map((n) => n.pos[0])), minY = Math.min(...nodes.map((n) => n.pos[1]));
    const origin = at || (this.lastPointer ? this.canvas.toWorld(...this.lastPointer) : [minX + 30, minY + 30]);
    const ids = new Map();
    const created = [];
    for (const c of nodes) {
      const node = this.graph.addNode(c.type, [c.pos[0] - minX + origin[0], c.pos[1] - minY + origin[1]], { values: structuredClone(c.values), title: c.title });
      Object.assign(node, { converted: new Set(c.converted || []), control: { ...c.control }, mode: c.mode || 0, collapsed: !!c.collapsed, color: c.color || null, size: c.size || null });
      ids.set(c.id, node.id);
      created.push([c, node]);
    }
    for (const [c, node] of created) {
      for (const [name, [src, slot]] of Object.entries(c.links || {})) if (ids.has(src)) node.links[name] = [ids.get(src), slot];
    }
    for (const [, node] of created) this.views.render(node);
    for (const [, node] of created) for (const [name, [src, slot]] of Object.entries(node.links)) this.links.add({ src, slot, dst: node.id, name });
    this.select(created.map(([, n]) => n.id));
    this.commit();
  }

  clone(ids) { this.copy(ids); const r = this.views.rect(ids[0]); this.paste([r[0] + 30, r[1] + 30]); }

  #key(e) {
    if (isTyping(e.target) || this.search.isOpen || !this.graph || document.querySelector(".modal:not([hidden])")) return;
    const mod = e.ctrlKey || e.metaKey;
    const k = e.key.toLowerCase();
    if (mod && k === "z" && !e.shiftKey) { e.preventDefault(); this.undo(); }
    else if (mod && (k === "y" || (k === "z" && e.shiftKey))) { e.preventDefault(); this.redo(); }
    else if (mod && k === "c") { this.copy(); }
    else if (mod && k === "v") { e.preventDefault(); this.paste(); }
    else if (mod && k === "a") { e.preventDefault(); this.selectAll(); }
    else if (mod && k === "g") { e.preventDefault(); this.groups.addAround([...this.selection]); }
    else if ((e.key === "Delete" || e.key === "Backspace") && this.links.reroutes.selected !== null) { e.preventDefault(); this.links.reroutes.remove(this.links.reroutes.selected); }
    else if (e.key === "Delete" || e.key === "Backspace") { if (this.selection.size) { e.preventDefault(); this.deleteNodes([...this.selection]); } }
    else if (k === "/" && !mod) { e.preventDefault(); const r = this.root.getBoundingClientRect(); this.openSearch(r.left + r.width / 2 - 180, r.top + 80); }
    else if (k === "." && !mod) { this.fitView(); }
    else if (mod && k === "b") { e.preventDefault(); const ids = [...this.selection]; if (ids.length) this.setMode(ids, this.graph.nodes.get(ids[0]).mode === 4 ? 0 : 4); }
    else if (mod && k === "m") { e.preventDefault(); const ids = [...this.selection]; if (ids.length) this.setMode(ids, this.graph.nodes.get(ids[0]).mode === 2 ? 0 : 2); }
  }
}
