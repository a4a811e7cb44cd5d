// The infinite canvas: pan (drag the background, space-drag, middle button), zoom around the
// cursor (wheel), fit to view, box selection, and the minimap. Nodes live in a "world" element that
// is moved with one CSS transform, so panning 300 nodes costs one composite per frame.

export class Canvas {
  constructor(root, { onBoxSelect, onBackgroundClick, onBackgroundDblClick, onContextMenu, onChange }) {
    this.root = root;
    this.world = root.querySelector(".world");
    this.boxEl = root.querySelector(".box-select");
    this.x = 0; this.y = 0; this.zoom = 1;
    this.spaceDown = false;
    this.hooks = { onBoxSelect, onBackgroundClick, onBackgroundDblClick, onContextMenu, onChange };
    root.addEventListener("pointerdown", (e) => this.#pointerDown(e));
    root.addEventListener("wheel", (e) => this.#wheel(e), { passive: false });
    root.addEventListener("dblclick", (e) => { if (this.isBackground(e.target)) this.hooks.onBackgroundDblClick(e); });
    root.addEventListener("contextmenu", (e) => { e.preventDefault(); this.hooks.onContextMenu(e); });
    window.addEventListener("keydown", (e) => {
      if (e.code === "Space" && !isTyping(e.target)) { this.spaceDown = true; root.classList.add("space-pan"); e.preventDefault(); }
    });
    window.addEventListener("keyup", (e) => { if (e.code === "Space") { this.spaceDown = false; root.classList.remove("space-pan"); } });
    this.apply();
  }

  isBackground(target) {
    return target === this.root || target === this.world || target.classList?.contains("links-layer") ||
      target.classList?.contains("nodes-layer") || target.classList?.contains("group-body");
  }

  toWorld(clientX, clientY) {
    const r = this.root.getBoundingClientRect();
    return [(clientX - r.left - this.x) / this.zoom, (clientY - r.top - this.y) / this.zoom];
  }

  setView(x, y, zoom) {
    this.x = x; this.y = y; this.zoom = Math.min(3, Math.max(0.1, zoom));
    this.apply();
  }

  apply() {
    this.world.style.transform = `translate(${this.x}px, ${this.y}px) scale(${this.zoom})`;
    const lod = this.zoom < 0.5; // zoomed far out: widgets are unreadable, draw nodes as outlines
    if (lod !== this.root.classList.contains("lod")) this.root.classList.toggle("lod", lod);
    if (!this.pending) {
      this.pending = true;
      requestAnimationFrame(() => { this.pending = false; this.hooks.onChange(); });
    }
  }

  zoomAt(clientX, clientY, factor) {
    const r = this.root.getBoundingClientRect();
    const px = clientX - r.left, py = clientY - r.top;
    const zoom = Math.min(3, Math.max(0.1, this.zoom * factor));
    const k = zoom / this.zoom;
    this.setView(px - (px - this.x) * k, py - (py - this.y) * k, zoom);
  }

  // Fit a world-space rectangle [x, y, w, h] into the view.
  fit(bounds, margin = 40) {
    const r = this.root.getBoundingClientRect();
    if (!bounds || bounds[2] <= 0 || r.width <= 0) { this.setView(0, 0, 1); return; }
    const zoom = Math.min(1.2, (r.width - 2 * margin) / bounds[2], (r.height - 2 * margin) / bounds[3]);
    this.setView((r.width - bounds[2] * zoom) / 2 - bounds[0] * zoom, (r.height - bounds[3] * zoom) / 2 - bounds[1] * zoom, zoom);
  }

  #wheel(e) {
    e.preventDefault();
    if (e.ctrlKey || !e.shiftKey) this.zoomAt(e.clientX, e.clientY, Math.exp(-e.deltaY * 0.0015));
    else this.setView(this.x - e.deltaX, this.y - e.deltaY, this.zoom);
  }

  #pointerDown(e) {
    const pan = e.button === 1 || (e.button === 0 && this.spaceDown) ||
      (e.button === 0 && this.isBackground(e.target) && !e.shiftKey && !e.ctrlKey && !e.metaKey);
    const box = e.button === 0 && this.isBackground(e.target) && (e.shiftKey || e.ctrlKey || e.metaKey) && !this.spaceDown;
    if (!pan && !box) return;
    e.preventDefault();
    document.activeElement?.blur?.();
    const startX = e.clientX, startY = e.clientY, ox = this.x, oy = this.y;
    let moved = false;
    const move = (ev) => {
      if (Math.abs(ev.clientX - startX) + Math.abs(ev.clientY - startY) > 3) moved = true;
      if (pan) this.setView(ox + ev.clientX - startX, oy + ev.clientY - startY, this.zoom);
      else this.#drawBox(startX, startY, ev.clientX, ev.clientY);
    };
    const up = (ev) => {
      window.removeEventListener("pointermove", move);
      window.removeEventListener("pointerup", up);
      this.root.classList.remove("panning");
      if (box) {
        this.boxEl.hidden = true;
        const a = this.toWorld(startX, startY), b = this.toWorld(ev.clientX, ev.clientY);
        if (moved) this.hooks.onBoxSelect([Math.min(a[0], b[0]), Math.min(a[1], b[1]), Math.abs(a[0] - b[0]), Math.abs(a[1] - b[1])], true);
      } else if (!moved && e.button === 0) this.hooks.onBackgroundClick(ev);
    };
    if (pan) this.root.classList.add("panning");
    window.addEventListener("pointermove", move);
    window.addEventListener("pointerup", up);
  }

  #drawBox(x0, y0, x1, y1) {
    const r = this.root.getBoundingClientRect();
    Object.assign(this.boxEl.style, {
      left: `${Math.min(x0, x1) - r.left}px`, top: `${Math.min(y0, y1) - r.top}px`,
      width: `${Math.abs(x1 - x0)}px`, height: `${Math.abs(y1 - y0)}px`,
    });
    this.boxEl.hidden = false;
  }
}

export function isTyping(target) {
  return target && (target.tagName === "INPUT" || target.tagName === "TEXTAREA" || target.tagName === "SELECT" || target.isContentEditable);
}

// A small overview of the whole graph; click or drag on it to move the view there.
export class Minimap {
  constructor(el, canvas, getRects) {
    this.el = el;
    this.canvas = canvas;
    this.getRects = getRects;
    this.ctx = el.getContext("2d");
    const go = (e) => {
      if (!this.map) return;
      const r = el.getBoundingClientRect();
      const { scale, ox, oy } = this.map;
      const wx = (e.clientX - r.left) / scale + ox, wy = (e.clientY - r.top) / scale + oy;
      const view = canvas.root.getBoundingClientRect();
      canvas.setView(view.width / 2 - wx * canvas.zoom, view.height / 2 - wy * canvas.zoom, canvas.zoom);
    };
    el.addEventListener("pointerdown", (e) => {
      e.stopPropagation();
      go(e);
      const move = (ev) => go(ev);
      const up = () => { window.removeEventListener("pointermove", move); window.removeEventListener("pointerup", up); };
      window.addEventListener("pointermove", move);
      window.addEventListener("pointerup", up);
    });
  }

  draw() {
    const { ctx, el, canvas } = this;
    const rects = this.getRects();
    ctx.clearRect(0, 0, el.width, el.height);
    const view = canvas.root.getBoundingClientRect();
    const vx = -canvas.x / canvas.zoom, vy = -canvas.y / canvas.zoom;
    const vw = view.width / canvas.zoom, vh = view.height / canvas.zoom;
    let x0 = vx, y0 = vy, x1 = vx + vw, y1 = vy + vh;
    for (const r of rects) {
      x0 = Math.min(x0, r[0]); y0 = Math.min(y0, r[1]);
      x1 = Math.max(x1, r[0] + r[2]); y1 = Math.max(y1, r[1] + r[3]);
    }
    const scale = Math.min(el.width / (x1 - x0 || 1), el.height / (y1 - y0 || 1));
    this.map = { scale, ox: x0, oy: y0 };
    ctx.fillStyle = "#8895a8";
    for (const r of rects) ctx.fillRect((r[0] - x0) * scale, (r[1] - y0) * scale, Math.max(1, r[2] * scale), Math.max(1, r[3] * scale));
    ctx.strokeStyle = "#ffcc66";
    ctx.strokeRect((vx - x0) * scale, (vy - y0) * scale, vw * scale, vh * scale);
  }
}
