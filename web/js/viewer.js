// The image viewer over the gallery: a full-size image with its metadata (size, file, and the
// settings of every node of the prompt that made it, read from the PNG's text chunks), "load this
// workflow", delete (the history entry), and a compare view: Ctrl/Shift-click two gallery images
// (or "Compare with…" in the viewer, then pick one) and drag the slider between them. Images shown
// on nodes open here too.

import { el } from "./widgets.js";
import { readPngText } from "./formats.js";

function fromUrl(url) {
  const q = new URL(url, location.href).searchParams;
  return { filename: q.get("filename") || "", subfolder: q.get("subfolder") || "", type: q.get("type") || "output" };
}

function describe(value) {
  if (typeof value === "string") return value.length > 90 ? `${value.slice(0, 90)}…` : value;
  return JSON.stringify(value);
}

export class Viewer {
  constructor(app) {
    this.app = app;
    this.gallery = app.gallery;
    this.picked = [];
    this.box = el("div", { class: "viewer", "data-role": "viewer", hidden: true });
    document.body.append(this.box);
    window.addEventListener("keydown", (e) => { if (e.key === "Escape" && !this.box.hidden) this.close(); });
    // Ctrl/Shift-click in the gallery picks images for comparing (before the gallery's own click)
    this.gallery.list.addEventListener("click", (e) => {
      const thumb = e.target.closest?.(".gallery-thumb");
      if (!thumb) return;
      const item = this.#itemOf(thumb);
      if (e.ctrlKey || e.metaKey || e.shiftKey || this.comparing) { e.stopPropagation(); this.pick(item, thumb); return; }
      e.stopPropagation();
      this.open(item);
    }, true);
    app.editor.nodesLayer.addEventListener("click", (e) => {
      const img = e.target.closest?.(".node-outputs img.node-image");
      if (!img) return;
      const nodeId = img.closest(".node").dataset.nodeId;
      const item = this.gallery.items.find((i) => i.url === img.getAttribute("src")) || { img: fromUrl(img.src), url: img.getAttribute("src"), nodeId };
      this.open(item);
    });
  }

  #itemOf(thumb) { return this.gallery.items.find((i) => i.url === thumb.getAttribute("src")); }

  // --- one image ----------------------------------------------------------------------------------
  async open(item) {
    if (!item) return;
    this.current = item;
    const img = el("img", { src: item.url, class: "viewer-image", alt: item.img.filename });
    const meta = el("div", { class: "viewer-meta", "data-role": "image-meta" });
    const button = (action, label, fn) => { const b = el("button", { type: "button", "data-action": action }, label); b.addEventListener("click", fn); return b; };
    const actions = el("div", { class: "viewer-actions" },
      button("viewer-load-workflow", "Load this workflow", () => this.loadWorkflow(item)),
      button("viewer-compare", "Compare with…", () => this.startCompare(item)),
      button("viewer-mask", "Mask editor", () => this.maskImage(item)),
      button("viewer-delete", "Delete", () => this.remove(item)),
      button("viewer-close", "Close", () => this.close()));
    this.box.textContent = "";
    this.box.append(el("div", { class: "viewer-main" }, img), el("aside", { class: "viewer-side" }, meta, actions));
    this.box.hidden = false;
    img.addEventListener("load", () => meta.prepend(el("div", { "data-meta": "size" }, `${img.naturalWidth} × ${img.naturalHeight}`)), { once: true });
    meta.append(el("div", { "data-meta": "file" }, [item.img.subfolder, item.img.filename].filter(Boolean).join("/")));
    if (item.nodeId) meta.append(el("div", { "data-meta": "node" }, `made by node ${item.nodeId}`));
    const prompt = await this.#prompt(item);
    if (this.current !== item) return;
    for (const [id, node] of Object.entries(prompt || {})) {
      const values = Object.entries(node.inputs || {}).filter(([, v]) => !Array.isArray(v));
      if (!values.length) continue;
      meta.append(el("div", { class: "meta-node", "data-meta-node": id },
        el("b", {}, `${node._meta?.title || node.class_type} `),
        ...values.map(([k, v]) => el("span", { class: "meta-kv", "data-meta-key": k }, `${k}: ${describe(v)}`))));
    }
    if (!prompt) meta.append(el("div", { class: "empty" }, "no workflow in this image"));
  }

  close() { this.box.hidden = true; this.box.textContent = ""; this.current = null; }

  async #prompt(item) {
    try {
      const chunks = await readPngText(await (await fetch(item.url)).arrayBuffer());
      if (chunks.prompt) return JSON.parse(chunks.prompt);
    } catch { /* not a PNG with text chunks: use the history entry */ }
    return item.entry?.prompt?.[2] || null;
  }

  loadWorkflow(item) {
    this.close();
    this.gallery.current = item; // the gallery knows how to read an image's workflow
    this.gallery.lightbox.querySelector('[data-action="open-workflow"]').click();
  }

  // Paint a mask on a gallery image: the result goes into the input folder and onto a new LoadImage node.
  maskImage(item) {
    this.close();
    this.app.maskEditor.open(item.img, (name) => {
      const editor = this.app.editor;
      const r = editor.root.getBoundingClientRect();
      const node = editor.addNode("LoadImage", editor.canvas.toWorld(r.left + r.width / 2, r.top + r.height / 3), false);
      const spec = editor.graph.inputSpec(node, "image");
      if (spec && !spec.choices.includes(name)) spec.choices.push(name);
      node.values.image = name;
      editor.views.render(node);
      editor.commit();
    });
  }

  // Delete: ComfyUI's gallery removes the history entry (the file stays in the output folder).
  async remove(item) {
    if (!item.promptId) { this.app.editor.toast("This image has no history entry to delete", "warn"); return; }
    await this.app.api.fetchJson("/history", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ delete: [item.promptId] }),
    });
    const gone = this.gallery.items.filter((i) => i.promptId === item.promptId);
    this.gallery.items = this.gallery.items.filter((i) => i.promptId !== item.promptId);
    for (const i of gone) {
      for (const thumb of this.gallery.list.querySelectorAll(".gallery-thumb")) if (thumb.getAttribute("src") === i.url) thumb.remove();
    }
    this.close();
    this.app.editor.toast(`Deleted ${gone.length} image${gone.length === 1 ? "" : "s"} from the history`);
  }

  // --- comparing two images -----------------------------------------------------------------------
  startCompare(item) {
    this.close();
    this.picked = [];
    this.comparing = true;
    this.pick(item, null);
    this.app.editor.toast("Pick the image to compare it with in the gallery");
  }

  pick(item, thumb) {
    if (!item) return;
    if (!this.picked.includes(item)) this.picked.push(item);
    thumb?.classList.add("picked");
    if (this.picked.length === 2) {
      const [a, b] = this.picked;
      this.picked = [];
      this.comparing = false;
      for (const t of this.gallery.list.querySelectorAll(".picked")) t.classList.remove("picked");
      this.compare(a, b);
    }
  }

  compare(a, b) {
    const under = el("img", { src: a.url, class: "compare-under", alt: a.img.filename });
    const over = el("img", { src: b.url, class: "compare-over", alt: b.img.filename });
    const slider = el("input", { type: "range", min: "0", max: "100", value: "50", "data-role": "compare-slider" });
    const set = () => { over.style.clipPath = `inset(0 ${100 - Number(slider.value)}% 0 0)`; };
    slider.addEventListener("input", set);
    set();
    const close = el("button", { type: "button", "data-action": "viewer-close" }, "Close");
    close.addEventListener("click", () => this.close());
    this.box.textContent = "";
    this.box.append(el("div", { class: "compare", "data-role": "compare" }, el("div", { class: "compare-stage" }, under, over),
      el("div", { class: "compare-bar" }, el("span", {}, b.img.filename), slider, el("span", {}, a.img.filename), close)));
    this.box.hidden = false;
  }
}
