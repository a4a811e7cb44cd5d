// Links as SVG paths, and the port drag that makes, moves and removes them. Wrong types are
// refused visibly (the port flashes red and a message says why); a link dropped on empty canvas
// opens the node search filtered to compatible nodes.

import { typeColor, typesCompatible } from "./schema.js";
import { TypeMismatch } from "./graph.js";
import { Reroutes } from "./reroutes.js";

const SVG = "http://www.w3.org/2000/svg";

function curve(a, b) {
  const dx = Math.max(40, Math.abs(b[0] - a[0]) * 0.5);
  return `M${a[0]},${a[1]} C${a[0] + dx},${a[1]} ${b[0] - dx},${b[1]} ${b[0]},${b[1]}`;
}

// The link styles of ComfyUI's "Comfy.LinkRenderMode": 2 spline, 1 linear, 0 straight (elbows).
function stretch(a, b, style) {
  if (style === 1) return `M${a[0]},${a[1]} L${a[0] + 15},${a[1]} L${b[0] - 15},${b[1]} L${b[0]},${b[1]}`;
  if (style === 0) {
    const mid = (a[0] + b[0]) / 2;
    return `M${a[0]},${a[1]} L${mid},${a[1]} L${mid},${b[1]} L${b[0]},${b[1]}`;
  }
  return curve(a, b);
}

// A link drawn through its reroute points: one stretch per pair of points.
function route(points, style) {
  const parts = [];
  for (let i = 0; i + 1 < points.length; i++) parts.push(stretch(points[i], points[i + 1], style));
  return parts.join(" ");
}

export class Links {
  constructor(editor, svg) {
    this.editor = editor;
    this.svg = svg;
    this.paths = new Map(); // "dst\u0000input" -> {path, src, slot, dst, name}
    this.byNode = new Map(); // node id -> Set of keys
    this.temp = document.createElementNS(SVG, "path");
    this.temp.setAttribute("class", "link temp");
    this.reroutes = new Reroutes(editor, this, svg);
    editor.nodesLayer.addEventListener("pointerdown", (e) => {
      const port = e.target.closest?.(".port");
      if (port && e.button === 0 && !editor.canvas.spaceDown) { e.preventDefault(); e.stopPropagation(); this.#startDrag(port, e); }
    });
  }

  setStyle(style) {
    const next = Number(style);
    this.editor.root.classList.toggle("links-hidden", next === -1);
    if (next === this.style) return;
    this.style = next;
    for (const link of this.paths.values()) this.#draw(link);
  }

  clear() { for (const { path } of this.paths.values()) path.remove(); this.paths.clear(); this.byNode.clear(); this.reroutes.clear(); }

  redrawAll() {
    this.clear();
    for (const link of this.editor.graph.links()) this.add(link);
    this.reroutes.renderAll();
  }

  // Redraw every link that passes through reroutes (after one moved, or the chains changed).
  redrawRouted() {
    const graph = this.editor.graph;
    for (const link of this.paths.values()) if (graph.nodes.get(link.dst)?.routes[link.name] !== undefined || link.routed) this.#draw(link);
  }

  add({ src, slot, dst, name }) {
    const key = `${dst}\u0000${name}`;
    this.remove(dst, name);
    this.#reshapePrimitive(src);
    const path = document.createElementNS(SVG, "path");
    path.setAttribute("class", "link");
    path.dataset.src = src; path.dataset.dst = dst; path.dataset.input = name;
    path.addEventListener("dblclick", (e) => { e.stopPropagation(); this.reroutes.addAt(dst, name, e); });
    path.addEventListener("contextmenu", (e) => { e.preventDefault(); e.stopPropagation(); this.reroutes.linkMenu(dst, name, e); });
    const type = this.editor.graph.outputType(this.editor.graph.nodes.get(src), slot);
    path.style.stroke = typeColor(type);
    this.svg.append(path);
    this.paths.set(key, { path, src, slot, dst, name });
    for (const id of [src, dst]) {
      if (!this.byNode.has(id)) this.byNode.set(id, new Set());
      this.byNode.get(id).add(key);
    }
    this.#draw(this.paths.get(key));
    this.editor.views.setLinked(dst, name, true);
    this.#notify(src, slot, dst, name, true);
  }

  // ComfyUI's onConnectionsChange(side, slot, connected, linkInfo) for the extension shim: 1 = input, 2 = output.
  #notify(src, slot, dst, name, connected) {
    if (!this.onConnectionsChange) return;
    const graph = this.editor.graph;
    const index = graph.schema(graph.nodes.get(dst)?.type)?.inputs.findIndex((i) => i.name === name) ?? -1;
    const info = { origin_id: src, origin_slot: slot, target_id: dst, target_slot: index };
    this.onConnectionsChange(dst, 1, index, connected, info);
    this.onConnectionsChange(src, 2, slot, connected, info);
  }

  remove(dst, name) {
    const key = `${dst}\u0000${name}`;
    const link = this.paths.get(key);
    if (!link) return;
    link.path.remove();
    this.paths.delete(key);
    this.byNode.get(link.src)?.delete(key);
    this.byNode.get(link.dst)?.delete(key);
    this.editor.views.setLinked(dst, name, false);
    this.#reshapePrimitive(link.src);
    this.#notify(link.src, link.slot, dst, name, false);
  }

  // A PrimitiveNode's widget follows the inputs it feeds: draw it again when they change.
  #reshapePrimitive(id) {
    const node = this.editor.graph.nodes.get(id);
    if (node?.type !== "PrimitiveNode" || !this.editor.views.els.has(id)) return;
    this.editor.views.render(node);
    this.updateNode(id);
  }

  removeNode(id) {
    for (const key of [...(this.byNode.get(id) || [])]) {
      const link = this.paths.get(key);
      if (link) this.remove(link.dst, link.name);
    }
    this.byNode.delete(id);
  }

  updateNode(id) {
    for (const key of this.byNode.get(id) || []) this.#draw(this.paths.get(key));
  }

  #draw(link) {
    if (!link) return;
    const views = this.editor.views;
    const a = views.portPos(link.src, "out", String(link.slot));
    const b = views.portPos(link.dst, "in", link.name);
    if (!a || !b) return;
    const points = [a, ...this.editor.graph.routeOf(link.dst, link.name).map((r) => r.pos), b];
    link.routed = points.length > 2;
    link.points = points;
    let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
    for (const [x, y] of points) { if (x < x0) x0 = x; if (x > x1) x1 = x; if (y < y0) y0 = y; if (y > y1) y1 = y; }
    link.box = [x0, y0, x1, y1]; // for culling
    if (link.off) { link.off = false; link.path.style.visibility = ""; } // moved: shown until culled again
    link.path.setAttribute("d", route(points, this.style ?? 2));
  }

  // --- dragging -------------------------------------------------------------------------------
  #startDrag(port, e) {
    const { editor } = this;
    const nodeId = port.closest(".node").dataset.nodeId;
    let from; // {dir: "out", id, slot, type} or {dir: "in", id, name, type}
    if (port.dataset.dir === "out") {
      from = { dir: "out", id: nodeId, slot: Number(port.dataset.slot), type: port.dataset.type };
    } else {
      const node = editor.graph.nodes.get(nodeId);
      const link = node.links[port.dataset.port];
      if (link) { // detach: pick the link up by its input end
        editor.graph.disconnect(nodeId, port.dataset.port);
        this.remove(nodeId, port.dataset.port);
        editor.commit();
        from = { dir: "out", id: link[0], slot: link[1], type: editor.graph.outputType(editor.graph.nodes.get(link[0]), link[1]) };
      } else from = { dir: "in", id: nodeId, name: port.dataset.port, type: port.dataset.type };
    }
    const anchor = editor.views.portPos(from.id, from.dir, from.dir === "out" ? String(from.slot) : from.name);
    this.temp.style.stroke = typeColor(from.type);
    this.temp.classList.remove("refused");
    this.svg.append(this.temp);
    editor.root.classList.add("dragging-link");
    const move = (ev) => {
      const p = editor.canvas.toWorld(ev.clientX, ev.clientY);
      this.temp.setAttribute("d", from.dir === "out" ? curve(anchor, p) : curve(p, anchor));
    };
    move(e);
    const up = (ev) => {
      window.removeEventListener("pointermove", move);
      window.removeEventListener("pointerup", up);
      editor.root.classList.remove("dragging-link");
      this.temp.remove();
      this.#drop(from, ev);
    };
    window.addEventListener("pointermove", move);
    window.addEventListener("pointerup", up);
  }

  #drop(from, ev) {
    const { editor } = this;
    const target = document.elementFromPoint(ev.clientX, ev.clientY);
    const port = target?.closest?.(".port");
    const nodeEl = target?.closest?.(".node");
    if (port && port.dataset.dir !== from.dir) {
      const other = port.closest(".node").dataset.nodeId;
      if (from.dir === "out") this.tryConnect(from.id, from.slot, other, port.dataset.port, port);
      else this.tryConnect(other, Number(port.dataset.slot), from.id, from.name, port);
      return;
    }
    if (nodeEl && !port) { // dropped on a node: use its first compatible free port
      const other = nodeEl.dataset.nodeId;
      const node = editor.graph.nodes.get(other);
      const schema = editor.graph.schema(node.type);
      if (!schema || other === from.id) return;
      if (from.dir === "out") {
        const input = schema.inputs.find((i) => !node.links[i.name] && (!i.widget || node.converted.has(i.name)) && typesCompatible(from.type, i.type));
        if (input) this.tryConnect(from.id, from.slot, other, input.name);
        else editor.toast(`${node.title} has no free input of type ${from.type}`, "warn");
      } else {
        const output = schema.outputs.find((o) => typesCompatible(o.type, from.type));
        if (output) this.tryConnect(other, output.slot, from.id, from.name);
      }
      return;
    }
    if (!target || editor.canvas.isBackground(target)) {
      const at = editor.canvas.toWorld(ev.clientX, ev.clientY);
      editor.search.open({
        clientX: ev.clientX, clientY: ev.clientY,
        filter: from.dir === "out" ? { inputType: from.type } : { outputType: from.type },
        onPick: (type) => {
          const node = editor.addNode(type, from.dir === "out" ? at : [at[0] - 220, at[1]], false);
          const schema = editor.graph.schema(type);
          if (from.dir === "out") {
            const input = schema.inputs.find((i) => typesCompatible(from.type, i.type) && !i.widget) ||
              schema.inputs.find((i) => typesCompatible(from.type, i.type));
            if (input) this.tryConnect(from.id, from.slot, node.id, input.name, null, false);
          } else {
            const output = schema.outputs.find((o) => typesCompatible(o.type, from.type));
            if (output) this.tryConnect(node.id, output.slot, from.id, from.name, null, false);
          }
          editor.commit();
        },
      });
    }
  }

  // Connect if the types allow it; otherwise flash the target port and say why.
  tryConnect(srcId, slot, dstId, name, portEl = null, commit = true) {
    const { editor } = this;
    try {
      const used = editor.graph.connect(srcId, slot, dstId, name);
      if (used !== name || editor.graph.nodes.get(srcId)?.type === "SubgraphInput") { // a boundary node grew a slot
        for (const id of [srcId, dstId]) editor.views.render(editor.graph.nodes.get(id));
        name = used;
      }
    } catch (err) {
      if (!(err instanceof TypeMismatch)) throw err;
      const el = portEl || editor.views.els.get(dstId)?.querySelector(`.port[data-dir="in"][data-port="${CSS.escape(name)}"]`);
      if (el) { el.classList.add("refused"); setTimeout(() => el.classList.remove("refused"), 1200); }
      editor.toast(`Link refused: ${err.message}`, "warn");
      return false;
    }
    this.add({ src: srcId, slot, dst: dstId, name });
    editor.views.clearError(dstId, name);
    if (commit) editor.commit();
    return true;
  }
}
