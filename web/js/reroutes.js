// Reroutes on links, as ComfyUI's current frontend has them: points a link passes through (several
// per link, dragged, deleted), drawn as dots on the links layer. Double-click a link to add one;
// right-click a link for "Add reroute here", "Insert Reroute node" (the legacy node) or "Delete
// link"; drag a dot to move it; click it and press Delete (or right-click it) to remove it.

const SVG = "http://www.w3.org/2000/svg";

function segmentDistance(p, a, b) {
  const dx = b[0] - a[0], dy = b[1] - a[1];
  const len = dx * dx + dy * dy;
  const t = len ? Math.max(0, Math.min(1, ((p[0] - a[0]) * dx + (p[1] - a[1]) * dy) / len)) : 0;
  return Math.hypot(p[0] - a[0] - t * dx, p[1] - a[1] - t * dy);
}

export class Reroutes {
  constructor(editor, links, svg) {
    this.editor = editor;
    this.links = links;
    this.svg = svg;
    this.layer = document.createElementNS(SVG, "g");
    this.layer.setAttribute("class", "reroutes");
    this.dots = new Map(); // reroute id -> circle
    this.selected = null;
  }

  clear() { this.layer.textContent = ""; this.dots.clear(); }

  renderAll() {
    this.clear();
    this.svg.append(this.layer); // above the links
    const graph = this.editor.graph;
    for (const r of graph.reroutes.values()) this.#dot(r);
    if (!graph.reroutes.has(this.selected)) this.selected = null;
  }

  // Bring the dots in line with the graph when reroutes came or went (after a commit).
  sync() {
    const ids = this.editor.graph.reroutes;
    if (ids.size !== this.dots.size || [...ids.keys()].some((id) => !this.dots.has(id))) { this.renderAll(); this.links.redrawRouted(); }
  }

  #dot(r) {
    const dot = document.createElementNS(SVG, "circle");
    dot.setAttribute("class", `reroute${this.selected === r.id ? " selected" : ""}`);
    dot.setAttribute("r", "6");
    dot.dataset.rerouteId = String(r.id);
    this.#place(dot, r);
    dot.addEventListener("pointerdown", (e) => { if (e.button === 0) { e.stopPropagation(); e.preventDefault(); this.#drag(r, e); } });
    dot.addEventListener("dblclick", (e) => e.stopPropagation());
    dot.addEventListener("contextmenu", (e) => {
      e.preventDefault(); e.stopPropagation();
      this.editor.menus.show([{ label: "Delete reroute", action: () => this.remove(r.id) }], e.clientX, e.clientY);
    });
    this.layer.append(dot);
    this.dots.set(r.id, dot);
  }

  #place(dot, r) { dot.setAttribute("cx", String(r.pos[0])); dot.setAttribute("cy", String(r.pos[1])); }

  select(id) {
    for (const [rid, dot] of this.dots) dot.classList.toggle("selected", rid === id);
    this.selected = id;
  }

  #drag(r, e) {
    const { editor } = this;
    editor.select([]);
    this.select(r.id);
    const start = editor.canvas.toWorld(e.clientX, e.clientY), pos0 = [...r.pos];
    let moved = false;
    const move = (ev) => {
      const p = editor.canvas.toWorld(ev.clientX, ev.clientY);
      const dx = p[0] - start[0], dy = p[1] - start[1];
      if (!moved && Math.abs(dx) + Math.abs(dy) < 2) return;
      moved = true;
      r.pos = [pos0[0] + dx, pos0[1] + dy];
      this.#place(this.dots.get(r.id), r);
      this.links.redrawRouted();
    };
    const up = () => {
      window.removeEventListener("pointermove", move);
      window.removeEventListener("pointerup", up);
      if (moved && editor.snap) {
        r.pos = r.pos.map((v) => Math.round(v / editor.snap) * editor.snap);
        this.#place(this.dots.get(r.id), r);
        this.links.redrawRouted();
      }
      if (moved) editor.commit();
    };
    window.addEventListener("pointermove", move);
    window.addEventListener("pointerup", up);
  }

  // Add a reroute where the pointer is on link (dst, name), in the stretch nearest to it.
  addAt(dst, name, e) {
    const link = this.links.paths.get(`${dst}\u0000${name}`);
    const p = this.editor.canvas.toWorld(e.clientX, e.clientY);
    let index = 0, best = Infinity;
    const points = link?.points || [];
    for (let i = 0; i + 1 < points.length; i++) {
      const d = segmentDistance(p, points[i], points[i + 1]);
      if (d < best) { best = d; index = i; }
    }
    const r = this.editor.graph.addReroute(dst, name, p, index);
    if (!r) return null;
    this.renderAll();
    this.links.redrawRouted();
    this.select(r.id);
    this.editor.commit();
    return r;
  }

  remove(id) {
    this.editor.graph.removeReroute(id);
    if (this.selected === id) this.selected = null;
    this.renderAll();
    this.links.redrawRouted();
    this.editor.commit();
  }

  // The legacy Reroute node put on a link: source → Reroute → target.
  insertNode(dst, name, e) {
    const { editor } = this;
    const node = editor.graph.nodes.get(dst);
    const link = node?.links[name];
    if (!link) return null;
    const at = editor.canvas.toWorld(e.clientX, e.clientY);
    const reroute = editor.addNode("Reroute", [at[0] - 40, at[1] - 20], false);
    editor.graph.connect(link[0], link[1], reroute.id, "input");
    editor.graph.connect(reroute.id, 0, dst, name);
    editor.renderAll();
    editor.commit();
    return reroute;
  }

  linkMenu(dst, name, e) {
    const { editor } = this;
    editor.menus.show([
      { label: "Add reroute here", action: () => this.addAt(dst, name, e) },
      { label: "Insert Reroute node", action: () => this.insertNode(dst, name, e) },
      { label: "Delete link", action: () => { editor.graph.disconnect(dst, name); editor.renderAll(); editor.commit(); } },
    ], e.clientX, e.clientY);
  }
}
