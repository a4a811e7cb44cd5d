// The mask editor: paint a mask over an image (brush, eraser, size, hardness, opacity, undo,
// invert, clear; mouse or pen, pen pressure scales the brush) and save it the way ComfyUI's mask
// editor does: the mask becomes the image's alpha channel (painted = transparent), uploaded through
// POST /upload/mask into the input folder's `clipspace/` with `original_ref`, so LoadImage's MASK
// output carries it. Strokes stamp a pre-rendered brush along each pointer segment, so a 2048²
// image stays responsive.

import { el } from "./widgets.js";

const UNDO_LIMIT = 12;

export class MaskEditor {
  constructor(app) {
    this.app = app;
    this.tool = "brush";
    this.size = 40; this.hardness = 0.7; this.opacity = 1;
    this.box = null;
  }

  // Open for a node's image widget (LoadImage and friends).
  openForNode(nodeId) {
    const editor = this.app.editor;
    const node = editor.graph.nodes.get(nodeId);
    const input = editor.graph.schema(node.type)?.inputs.find((i) => i.widget === "IMAGEUPLOAD");
    const value = input && node.values[input.name];
    if (!value) { editor.toast("Choose or upload an image first", "warn"); return; }
    const clean = String(value).replace(/\s*\[input\]$/, "");
    const slash = clean.lastIndexOf("/");
    const ref = { filename: clean.slice(slash + 1), subfolder: slash >= 0 ? clean.slice(0, slash) : "", type: "input" };
    this.open(ref, (name) => {
      if (!input.choices.includes(name)) input.choices.push(name);
      node.values[input.name] = name;
      editor.views.render(node);
      editor.links.updateNode(node.id);
      editor.commit();
    });
  }

  // Open for any image ({filename, subfolder, type}); `done(name)` gets the saved input file name.
  async open(ref, done) {
    this.close();
    this.ref = ref;
    this.done = done;
    const img = new Image();
    img.src = this.app.api.viewUrl(ref);
    await img.decode();
    const w = img.naturalWidth, h = img.naturalHeight;
    this.mask = el("canvas", { class: "mask-layer", width: w, height: h, "data-role": "mask-canvas" });
    this.stroke = el("canvas", { class: "mask-layer stroke-layer", width: w, height: h });
    this.mctx = this.mask.getContext("2d", { willReadFrequently: true });
    this.sctx = this.stroke.getContext("2d");
    this.#loadExistingMask(img);
    this.undoStack = [];
    const stage = el("div", { class: "mask-stage", "data-role": "mask-stage" }, img, this.mask, this.stroke);
    img.className = "mask-image";
    this.stage = stage;
    this.box = el("div", { class: "mask-editor", "data-role": "mask-editor" }, stage, this.#toolbar());
    document.body.append(this.box);
    this.#fit(w, h);
    stage.addEventListener("pointerdown", (e) => this.#strokeStart(e));
    stage.style.touchAction = "none";
  }

  close() { this.box?.remove(); this.box = null; }

  #fit(w, h) {
    const scale = Math.min(1, (window.innerWidth - 260) / w, (window.innerHeight - 40) / h);
    this.stage.style.width = `${w * scale}px`;
    this.stage.style.height = `${h * scale}px`;
  }

  // An image that already has alpha opens with its mask (transparent = masked).
  #loadExistingMask(img) {
    const probe = el("canvas", { width: img.naturalWidth, height: img.naturalHeight }).getContext("2d", { willReadFrequently: true });
    probe.drawImage(img, 0, 0);
    const data = probe.getImageData(0, 0, img.naturalWidth, img.naturalHeight);
    const px = data.data;
    let any = false;
    for (let i = 3; i < px.length; i += 4) {
      const masked = 255 - px[i];
      if (masked) any = true;
      px[i - 3] = 255; px[i - 2] = 0; px[i - 1] = 255; px[i] = masked;
    }
    if (any) this.mctx.putImageData(data, 0, 0);
  }

  #toolbar() {
    const tool = (name, label) => {
      const b = el("button", { type: "button", "data-tool": name, class: this.tool === name ? "active" : "" }, label);
      b.addEventListener("click", () => { this.tool = name; for (const x of this.box.querySelectorAll("[data-tool]")) x.classList.toggle("active", x.dataset.tool === name); });
      return b;
    };
    const range = (name, label, min, max, step, get, set) => {
      const input = el("input", { type: "range", min: String(min), max: String(max), step: String(step), value: String(get()), "data-mask-setting": name });
      input.addEventListener("input", () => set(Number(input.value)));
      return el("label", { class: "mask-range" }, el("span", {}, label), input);
    };
    const action = (name, label, fn) => { const b = el("button", { type: "button", "data-mask-action": name }, label); b.addEventListener("click", fn); return b; };
    return el("div", { class: "mask-tools" },
      el("div", { class: "mask-row" }, tool("brush", "Brush"), tool("eraser", "Eraser")),
      range("size", "size", 1, 400, 1, () => this.size, (v) => { this.size = v; }),
      range("hardness", "hardness", 0, 1, 0.05, () => this.hardness, (v) => { this.hardness = v; }),
      range("opacity", "opacity", 0.05, 1, 0.05, () => this.opacity, (v) => { this.opacity = v; }),
      el("div", { class: "mask-row" }, action("undo", "Undo", () => this.undo()), action("invert", "Invert", () => this.invert()), action("clear", "Clear", () => this.clear())),
      el("div", { class: "mask-row" }, action("cancel", "Cancel", () => this.close()), action("save", "Save", () => this.save())));
  }

  // --- painting ------------------------------------------------------------------------------------
  #brush(radius) {
    const r = Math.max(0.5, radius);
    const size = Math.ceil(r * 2) + 2;
    const c = el("canvas", { width: size, height: size });
    const ctx = c.getContext("2d");
    const g = ctx.createRadialGradient(size / 2, size / 2, 0, size / 2, size / 2, r);
    g.addColorStop(0, "rgba(255,0,255,1)");
    g.addColorStop(Math.min(0.999, this.hardness), "rgba(255,0,255,1)");
    g.addColorStop(1, "rgba(255,0,255,0)");
    ctx.fillStyle = g;
    ctx.fillRect(0, 0, size, size);
    return c;
  }

  #toImage(e) {
    const r = this.stage.getBoundingClientRect();
    return [(e.clientX - r.left) * (this.mask.width / r.width), (e.clientY - r.top) * (this.mask.height / r.height)];
  }

  #strokeStart(e) {
    if (e.button !== 0) return;
    e.preventDefault();
    this.stage.setPointerCapture?.(e.pointerId);
    this.#pushUndo();
    const eraser = this.tool === "eraser";
    const ctx = eraser ? this.mctx : this.sctx;
    ctx.globalCompositeOperation = eraser ? "destination-out" : "source-over";
    ctx.globalAlpha = eraser ? this.opacity : 1;
    this.stroke.style.opacity = String(eraser ? 0 : 0.6 * this.opacity); // the mask layer shows at 0.6
    let last = this.#toImage(e);
    const radiusOf = (ev) => (this.size / 2) * (ev.pointerType === "pen" && ev.pressure > 0 ? ev.pressure * 1.5 : 1);
    let brush = this.#brush(radiusOf(e)), brushR = radiusOf(e);
    const dab = (p) => ctx.drawImage(brush, p[0] - brush.width / 2, p[1] - brush.height / 2);
    dab(last);
    const move = (ev) => {
      const events = ev.getCoalescedEvents ? ev.getCoalescedEvents() : [ev];
      for (const c of events.length ? events : [ev]) {
        const r = radiusOf(c);
        if (Math.abs(r - brushR) > 0.5) { brush = this.#brush(r); brushR = r; }
        const p = this.#toImage(c);
        this.segment(last, p, brushR, dab);
        last = p;
      }
    };
    const up = () => {
      this.stage.removeEventListener("pointermove", move);
      window.removeEventListener("pointerup", up);
      if (!eraser) { // the stroke joins the mask at the chosen opacity
        this.mctx.globalCompositeOperation = "source-over";
        this.mctx.globalAlpha = this.opacity;
        this.mctx.drawImage(this.stroke, 0, 0);
        this.mctx.globalAlpha = 1;
        this.sctx.clearRect(0, 0, this.stroke.width, this.stroke.height);
      }
      this.mctx.globalCompositeOperation = "source-over";
      this.mctx.globalAlpha = 1;
    };
    this.stage.addEventListener("pointermove", move);
    window.addEventListener("pointerup", up);
  }

  // Stamp dabs from a to b, a quarter of the radius apart.
  segment(a, b, radius, dab) {
    const dist = Math.hypot(b[0] - a[0], b[1] - a[1]);
    const step = Math.max(1, radius * 0.25);
    for (let t = step; t <= dist; t += step) dab([a[0] + ((b[0] - a[0]) * t) / dist, a[1] + ((b[1] - a[1]) * t) / dist]);
  }

  #pushUndo() {
    this.undoStack.push(this.mctx.getImageData(0, 0, this.mask.width, this.mask.height));
    if (this.undoStack.length > UNDO_LIMIT) this.undoStack.shift();
  }

  undo() { const snap = this.undoStack.pop(); if (snap) this.mctx.putImageData(snap, 0, 0); }

  invert() {
    this.#pushUndo();
    const data = this.mctx.getImageData(0, 0, this.mask.width, this.mask.height);
    const px = data.data;
    for (let i = 0; i < px.length; i += 4) { px[i] = 255; px[i + 1] = 0; px[i + 2] = 255; px[i + 3] = 255 - px[i + 3]; }
    this.mctx.putImageData(data, 0, 0);
  }

  clear() { this.#pushUndo(); this.mctx.clearRect(0, 0, this.mask.width, this.mask.height); }

  // --- saving: alpha = 255 - mask, through /upload/mask into input/clipspace ------------------------
  async save() {
    const { width, height } = this.mask;
    const out = el("canvas", { width, height });
    const octx = out.getContext("2d");
    const data = this.mctx.getImageData(0, 0, width, height);
    const px = data.data;
    for (let i = 0; i < px.length; i += 4) { px[i] = 0; px[i + 1] = 0; px[i + 2] = 0; px[i + 3] = 255 - px[i + 3]; }
    octx.putImageData(data, 0, 0);
    const blob = await new Promise((resolve) => out.toBlob(resolve, "image/png"));
    const form = new FormData();
    form.append("image", blob, `clipspace-mask-${Date.now()}.png`);
    form.append("subfolder", "clipspace");
    form.append("type", "input");
    form.append("original_ref", JSON.stringify(this.ref));
    let res;
    try {
      res = await this.app.api.fetchJson("/upload/mask", { method: "POST", body: form });
    } catch (err) {
      this.app.editor.toast(`Could not save the mask: ${err.message}`, "error", 8000);
      return null;
    }
    const name = res.subfolder ? `${res.subfolder}/${res.name}` : res.name;
    this.close();
    this.done?.(name);
    this.app.editor.toast(`Mask saved as ${name}`);
    return name;
  }
}
