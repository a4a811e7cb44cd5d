// Groups: titled frames. Dragging a group's title moves it with the nodes inside it; the corner
// handle resizes it.

import { el } from "./widgets.js";

export class Groups {
  constructor(editor, layer) {
    this.editor = editor;
    this.layer = layer;
  }

  get list() { return this.editor.graph.groups; }

  renderAll() {
    this.layer.textContent = "";
    this.list.forEach((group, index) => this.layer.append(this.#render(group, index)));
  }

  #render(group, index) {
    const [x, y, w, h] = group.bounding;
    const title = el("div", { class: "group-title" }, group.title);
    const handle = el("div", { class: "group-resize" });
    const box = el("div", { class: "group", "data-group": String(index) }, title, el("div", { class: "group-body" }), handle);
    Object.assign(box.style, { transform: `translate(${x}px, ${y}px)`, width: `${w}px`, height: `${h}px` });
    if (group.color) box.style.setProperty("--group", group.color);
    title.addEventListener("pointerdown", (e) => { if (e.button === 0) { e.stopPropagation(); this.#drag(group, e, false); } });
    handle.addEventListener("pointerdown", (e) => { if (e.button === 0) { e.stopPropagation(); this.#drag(group, e, true); } });
    title.addEventListener("dblclick", (e) => { e.stopPropagation(); this.rename(group); });
    return box;
  }

  nodesInside(group) {
    const [x, y, w, h] = group.bounding;
    const views = this.editor.views;
    return [...this.editor.graph.nodes.values()].filter((n) => {
      const r = views.rect(n.id);
      return r[0] >= x && r[1] >= y && r[0] + r[2] <= x + w && r[1] + r[3] <= y + h;
    });
  }

  #drag(group, e, resize) {
    const ed = this.editor;
    const start = ed.canvas.toWorld(e.clientX, e.clientY);
    const orig = [...group.bounding];
    const members = resize ? [] : this.nodesInside(group).map((n) => [n, [...n.pos]]);
    let moved = false;
    const move = (ev) => {
      const p = ed.canvas.toWorld(ev.clientX, ev.clientY);
      const dx = p[0] - start[0], dy = p[1] - start[1];
      moved = moved || Math.abs(dx) + Math.abs(dy) > 2;
      if (resize) group.bounding = [orig[0], orig[1], Math.max(120, orig[2] + dx), Math.max(60, orig[3] + dy)];
      else {
        group.bounding = [orig[0] + dx, orig[1] + dy, orig[2], orig[3]];
        for (const [node, pos] of members) { node.pos = [pos[0] + dx, pos[1] + dy]; ed.views.setPos(node); ed.links.updateNode(node.id); }
      }
      const box = this.layer.children[this.list.indexOf(group)];
      if (box) Object.assign(box.style, { transform: `translate(${group.bounding[0]}px, ${group.bounding[1]}px)`, width: `${group.bounding[2]}px`, height: `${group.bounding[3]}px` });
    };
    const up = () => {
      window.removeEventListener("pointermove", move);
      window.removeEventListener("pointerup", up);
      if (moved) ed.commit();
    };
    window.addEventListener("pointermove", move);
    window.addEventListener("pointerup", up);
  }

  at(pos) {
    for (let i = this.list.length - 1; i >= 0; i--) {
      const [x, y, w, h] = this.list[i].bounding;
      if (pos[0] >= x && pos[1] >= y && pos[0] <= x + w && pos[1] <= y + h) return this.list[i];
    }
    return null;
  }

  add(pos, title = "Group") {
    this.list.push({ title, bounding: [pos[0], pos[1], 400, 300], color: null });
    this.renderAll();
    this.editor.commit();
  }

  addAround(ids) {
    if (!ids.length) return;
    const rects = ids.map((id) => this.editor.views.rect(id));
    const x0 = Math.min(...rects.map((r) => r[0])) - 20, y0 = Math.min(...rects.map((r) => r[1])) - 50;
    const x1 = Math.max(...rects.map((r) => r[0] + r[2])) + 20, y1 = Math.max(...rects.map((r) => r[1] + r[3])) + 20;
    this.list.push({ title: "Group", bounding: [x0, y0, x1 - x0, y1 - y0], color: null });
    this.renderAll();
    this.editor.commit();
  }

  fitToNodes(group) {
    const ids = this.nodesInside(group).map((n) => n.id);
    if (!ids.length) return;
    this.list.splice(this.list.indexOf(group), 1);
    this.addAround(ids);
    this.list[this.list.length - 1].title = group.title;
    this.renderAll();
  }

  rename(group) {
    const index = this.list.indexOf(group);
    const box = this.layer.children[index];
    const titleEl = box?.querySelector(".group-title");
    if (!titleEl) return;
    const input = el("input", { type: "text", class: "rename-box", value: group.title });
    titleEl.textContent = "";
    titleEl.append(input);
    input.focus(); input.select();
    let done = false;
    const finish = () => {
      if (done) return; done = true;
      if (input.value.trim()) group.title = input.value.trim();
      this.renderAll();
      this.editor.commit();
    };
    input.addEventListener("keydown", (e) => { e.stopPropagation(); if (e.key === "Enter" || e.key === "Escape") finish(); });
    input.addEventListener("blur", finish);
  }

  remove(group) {
    this.list.splice(this.list.indexOf(group), 1);
    this.renderAll();
    this.editor.commit();
  }
}
