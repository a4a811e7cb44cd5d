// The gallery / history panel: every image the server made (from /history, then live), newest
// first; click one to enlarge it, and open the workflow that made it in a new tab.

import { el } from "./widgets.js";

export class Gallery {
  constructor(app) {
    this.app = app;
    this.api = app.api;
    this.list = document.querySelector('[data-panel="gallery"] .panel-body');
    this.items = [];
    this.seen = new Set();
    this.lightbox = document.querySelector(".lightbox");
    this.lightbox.addEventListener("click", (e) => { if (e.target === this.lightbox) this.close(); });
    this.lightbox.querySelector('[data-action="close-lightbox"]').addEventListener("click", () => this.close());
    this.lightbox.querySelector('[data-action="open-workflow"]').addEventListener("click", () => this.#openWorkflow());
    window.addEventListener("keydown", (e) => { if (e.key === "Escape") this.close(); });
  }

  async loadHistory() {
    try {
      const history = await this.api.history();
      for (const [promptId, entry] of Object.entries(history || {})) {
        for (const [nodeId, out] of Object.entries(entry.outputs || {})) {
          for (const img of out.images || []) this.add(img, promptId, nodeId, entry);
        }
      }
    } catch { /* no history: an empty gallery */ } finally {
      this.list.dataset.loaded = "true"; // tests (and extensions) can wait for this
    }
  }

  add(img, promptId, nodeId, entry = null) {
    if (img.type === "temp") return; // previews are not kept
    const key = `${img.type}/${img.subfolder}/${img.filename}`;
    if (this.seen.has(key)) return;
    this.seen.add(key);
    const item = { img, promptId, nodeId, entry, url: this.api.viewUrl(img) };
    this.items.unshift(item);
    // The server marks files that are gone (deleted, another --output-dir) with missing: true; the
    // gallery then shows a placeholder and never requests the file.
    const thumb = img.missing
      ? el("div", { class: "gallery-thumb gallery-missing", title: `${img.filename} is no longer on disk`,
                    "data-filename": img.filename }, "file gone")
      : el("img", { src: item.url, class: "gallery-thumb", alt: img.filename, title: img.filename, "data-filename": img.filename });
    thumb.addEventListener("click", () => (img.missing ? this.#openWorkflow(item) : this.open(item)));
    this.list.querySelector(".empty")?.remove();
    this.list.prepend(thumb);
    this.app.emit("galleryAdded", item);
  }

  open(item) {
    this.current = item;
    this.lightbox.querySelector("img").src = item.url;
    this.lightbox.querySelector(".lightbox-caption").textContent = item.img.filename;
    this.lightbox.hidden = false;
  }

  close() { this.lightbox.hidden = true; this.current = null; }

  async #openWorkflow(missingItem = null) {
    const item = missingItem || this.current;
    if (!item) return;
    this.close();
    if (!item.img.missing) {
      try {
        const res = await fetch(item.url);
        const blob = await res.blob();
        const ok = await this.app.workflows.loadFile(new File([blob], item.img.filename, { type: "image/png" }));
        if (ok) return;
      } catch { /* fall back to the history entry */ }
    }
    const prompt = item.entry?.prompt?.[2];
    const workflow = item.entry?.prompt?.[3]?.extra_pnginfo?.workflow;
    if (workflow || prompt) this.app.workflows.loadObject(workflow || prompt, item.img.filename);
    else this.app.editor.toast("This image carries no workflow", "warn");
  }
}
