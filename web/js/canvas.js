// The infinite canvas: pan (drag the background, space-drag, middle button), zoom around the
// cursor (wheel), fit to view, box selection, and the minimap.
//
// Nodes live in a "world" element inside a scroll container (the viewport). A pan only changes the
// viewport's scroll offset: Chromium moves a composited scroller's contents without painting or
// re-layerizing them (a changed CSS transform would repaint and re-layerize every node each frame).
// The world's own transform (an anchor far inside the scroll range, and the zoom) changes only when
// the zoom changes, the pan leaves the scroll range, or the offset stops being whole pixels.
// Below LOD_ZOOM the canvas root gets the class "lod": nodes draw without their widgets' contents,
// labels, titles and shadows, and links without anti-aliasing (CSS only, no per-node work).

export const LOD_ZOOM = 0.5;
const MIN_ZOOM = 0.1, MAX_ZOOM = 3;
const ANCHOR = 100000; // the world's anchor in the scroll range [0, 2 * ANCHOR] (the spacer is larger)

export class Canvas {
  constructor(root, { onBoxSelect, onBackgroundClick, onBackgroundDblClick, onContextMenu, onChange }) {
    this.root = root;
    this.viewport = root.querySelector(".viewport");
    this.world = root.querySelector(".world");
    this.boxEl = root.querySelector(".box-select");
    this.x = 0; this.y = 0; this.zoom = 1;
    this.anchor = null; // [ax, ay, zoom] of the world's transform
    this.scrolled = [0, 0]; // the scroll offset apply() set last
    this.spaceDown = false;
    this.hooks = { onBoxSelect, onBackgroundClick, onBackgroundDblClick, onContextMenu, onChange };
    this.size = [0, 0];
    new ResizeObserver(([entry]) => {
      this.size = [entry.contentRect.width, entry.contentRect.height];
      this.scrolled = [NaN, NaN]; // a hidden canvas loses its scroll offset: set it again
      this.apply();
    }).observe(root);
    // a scroll that apply() did not ask for (focus moving to a widget scrolls it into view): follow it
    this.viewport.addEventListener("scroll", () => {
      const { scrollLeft, scrollTop, clientWidth } = this.viewport;
      if (!clientWidth || (scrollLeft === this.scrolled[0] && scrollTop === this.scrolled[1])) return;
      this.scrolled = [scrollLeft, scrollTop];
      this.x = this.anchor[0] - scrollLeft; this.y = this.anchor[1] - scrollTop;
      this.#changed();
    });
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

  // The view's size in screen pixels, without a layout read while the size is known.
  viewSize() {
    if (this.size[0] <= 0) { const r = this.root.getBoundingClientRect(); this.size = [r.width, r.height]; }
    return this.size;
  }

  // The world rectangle [x0, y0, x1, y1] the view shows.
  visibleWorld() {
    const [w, h] = this.viewSize();
    const x0 = -this.x / this.zoom, y0 = -this.y / this.zoom;
    return [x0, y0, x0 + w / this.zoom, y0 + h / this.zoom];
  }

  get lowQuality() { return this.zoom < LOD_ZOOM; }

  isBackground(target) {
    return target === this.root || target === this.viewport || target === this.world || target.classList?.contains("links-layer") ||
      target.classList?.contains("nodes-layer") || target.classList?.contains("group-body");
  }

  toWorld(clientX, clientY) {
    const r = this.root.getBoundingClientRect();
    return [(clientX - r.left - this.x) / this.zoom, (clientY - r.top - this.y) / this.zoom];
  }

  setView(x, y, zoom) {
    this.x = x; this.y = y; this.zoom = Math.min(MAX_ZOOM, Math.max(MIN_ZOOM, zoom));
    this.apply();
  }

  // Show the view: a pan is one scroll-offset change; the world's transform moves only when it must.
  apply() {
    let sx = this.anchor ? this.anchor[0] - this.x : NaN, sy = this.anchor ? this.anchor[1] - this.y : NaN;
    const whole = (v) => Math.abs(v - Math.round(v)) < 1e-6;
    const inRange = (v) => v >= 0 && v <= 2 * ANCHOR;
    if (!this.anchor || this.anchor[2] !== this.zoom || !whole(sx) || !whole(sy) || !inRange(sx) || !inRange(sy)) {
      // move the anchor, keeping the scroll offset where it is while it is well inside the range:
      // writing the offset right after the transform would force a layout
      const keep = this.anchor && [0, 1].every((i) => Math.abs(this.scrolled[i] - ANCHOR) < ANCHOR / 2);
      [sx, sy] = keep ? this.scrolled : [ANCHOR, ANCHOR];
      this.anchor = [sx + this.x, sy + this.y, this.zoom];
      this.world.style.transform = `translate(${this.anchor[0]}px, ${this.anchor[1]}px) scale(${this.zoom})`;
    }
    sx = Math.round(sx); sy = Math.round(sy);
    if (sx !== this.scrolled[0] || sy !== this.scrolled[1]) {
      this.scrolled = [sx, sy];
      this.viewport.scrollLeft = sx;
      this.viewport.scrollTop = sy;
    }
    const lod = this.lowQuality; // zoomed far out: widgets are unreadable, draw nodes as outlines
    if (lod !== this.root.classList.contains("lod")) this.root.classList.toggle("lod", lod);
    this.#changed();
  }

  // Tell the editor once per frame that the view changed (culling, minimap).
  #changed() {
    if (!this.pending) {
      this.pending = true;
      requestAnimationFrame(() => { this.pending = false; this.hooks.onChange(); });
    }
  }

  zoomAt(clientX, clientY, factor) {
    const r = this.root.getBoundingClientRect();
    const px = clientX - r.left, py = clientY - r.top;
    const zoom = Math.min(MAX_ZOOM, Math.max(MIN_ZOOM, this.zoom * factor));
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
      const [w, h] = canvas.viewSize();
      canvas.setView(w / 2 - wx * canvas.zoom, h / 2 - wy * canvas.zoom, canvas.zoom);
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

  // Draw now, or, when the last drawing is under 100 ms old (a pan or zoom in progress), a little
  // later: the overview needs no update on every frame.
  drawSoon() {
    const wait = 100 - (performance.now() - (this.drawnAt || 0));
    if (wait <= 0) { this.draw(); return; }
    if (!this.timer) this.timer = setTimeout(() => { this.timer = null; this.draw(); }, wait);
  }

  draw() {
    const { ctx, el, canvas } = this;
    this.drawnAt = performance.now();
    const rects = this.getRects();
    ctx.clearRect(0, 0, el.width, el.height);
    const [vx, vy, vx1, vy1] = canvas.visibleWorld();
    const vw = vx1 - vx, vh = vy1 - vy;
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
