// The libraries in the side bar. Nodes: every node type by category (plugin nodes marked with
// their pack), a search box, click or drag onto the canvas. Models: the files of each model folder
// with size, base model, title and trigger words from their safetensors metadata
// (/api/v1/models/{folder}/info); drag one onto the canvas for the loader that takes it (and, for a
// checkpoint or diffusion model, an offer of its family's preset: presets.js). Templates:
// the shipped example workflows (web/workflows/templates.json) with a drawn thumbnail, opened in
// a new tab.

import { el } from "./widgets.js";
import { parseSchema } from "./schema.js";

const NODE_MIME = "application/x-loom-node", MODEL_MIME = "application/x-loom-model";
// model folder → the loader node and its file input (ComfyUI's core loaders)
const LOADERS = {
  checkpoints: ["CheckpointLoaderSimple", "ckpt_name"], loras: ["LoraLoader", "lora_name"],
  controlnet: ["ControlNetLoader", "control_net_name"], vae: ["VAELoader", "vae_name"],
  upscale_models: ["UpscaleModelLoader", "model_name"], clip_vision: ["CLIPVisionLoader", "clip_name"],
  unet: ["UNETLoader", "unet_name"], diffusion_models: ["UNETLoader", "unet_name"], clip: ["CLIPLoader", "clip_name"],
  ipadapter: ["IPAdapterModelLoader", "ipadapter_file"], style_models: ["StyleModelLoader", "style_model_name"],
  gligen: ["GLIGENLoader", "gligen_name"], hypernetworks: ["HypernetworkLoader", "hypernetwork_name"],
};

export function packOf(entry) {
  const mod = String(entry?.python_module || "");
  return mod.startsWith("custom_nodes.") ? mod.slice("custom_nodes.".length).split(".")[0] : null;
}

function sizeText(bytes) {
  if (bytes === null || bytes === undefined) return "";
  const units = ["B", "KB", "MB", "GB"];
  let v = bytes, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

// Which loader takes a file of `folder`: the table above, else any node with a combo listing it.
export function loaderFor(info, folder, name) {
  const known = LOADERS[folder];
  if (known && info[known[0]]) return known;
  for (const type of Object.keys(info)) {
    const input = parseSchema(type, info)?.inputs.find((i) => i.choices && i.choices.includes(name));
    if (input) return [type, input.name];
  }
  return null;
}

export class Library {
  constructor(app) {
    this.app = app;
    this.nodesPanel = document.querySelector('[data-panel="nodes"] .panel-body');
    this.modelsPanel = document.querySelector('[data-panel="models"] .panel-body');
    this.templatesPanel = document.querySelector('[data-panel="templates"] .panel-body');
    const root = app.editor.root;
    root.addEventListener("dragover", (e) => {
      const types = e.dataTransfer?.types || [];
      if (types.includes(NODE_MIME) || types.includes(MODEL_MIME)) { e.preventDefault(); e.dataTransfer.dropEffect = "copy"; }
    });
    root.addEventListener("drop", (e) => this.#drop(e));
  }

  // --- nodes --------------------------------------------------------------------------------------
  renderNodes() {
    const search = el("input", { type: "search", placeholder: "search nodes…", "data-role": "node-library-search", class: "lib-search" });
    const tree = el("div", { class: "lib-tree" });
    search.addEventListener("input", () => this.#fillNodes(tree, search.value.trim().toLowerCase()));
    this.nodesPanel.textContent = "";
    this.nodesPanel.append(search, tree);
    this.#fillNodes(tree, "");
  }

  #nodeItem(type, entry) {
    const pack = packOf(entry);
    const item = el("div", { class: "lib-node", draggable: "true", "data-type": type, title: entry.description || type },
      el("span", {}, entry.display_name || type));
    if (pack) item.append(el("span", { class: "lib-pack", "data-pack": pack }, pack));
    item.addEventListener("dragstart", (e) => { e.dataTransfer.setData(NODE_MIME, type); e.dataTransfer.effectAllowed = "copy"; });
    item.addEventListener("click", () => {
      const r = this.app.editor.root.getBoundingClientRect();
      this.app.editor.addNode(type, this.app.editor.canvas.toWorld(r.left + r.width / 2, r.top + r.height / 3));
    });
    return item;
  }

  #fillNodes(tree, query) {
    const info = this.app.info;
    tree.textContent = "";
    const types = Object.keys(info).filter((t) => !info[t].deprecated);
    if (query) {
      const hits = types.filter((t) => `${t} ${info[t].display_name || ""} ${info[t].category || ""} ${packOf(info[t]) || ""}`.toLowerCase().includes(query));
      hits.sort((a, b) => (info[a].display_name || a).localeCompare(info[b].display_name || b));
      for (const t of hits.slice(0, 200)) tree.append(this.#nodeItem(t, info[t]));
      if (!hits.length) tree.append(el("div", { class: "empty" }, "No node matches."));
      return;
    }
    const root = { children: new Map(), nodes: [] };
    for (const t of types) {
      let at = root;
      for (const part of String(info[t].category || "other").split("/")) {
        if (!at.children.has(part)) at.children.set(part, { children: new Map(), nodes: [] });
        at = at.children.get(part);
      }
      at.nodes.push(t);
    }
    const build = (branch, box, path) => {
      for (const [name, child] of [...branch.children].sort((a, b) => a[0].localeCompare(b[0]))) {
        const full = path ? `${path}/${name}` : name;
        const details = el("details", { class: "lib-category", "data-category": full }, el("summary", {}, name));
        details.addEventListener("toggle", () => { if (details.open && details.childElementCount === 1) build(child, details, full); }, { once: false });
        box.append(details);
      }
      for (const t of branch.nodes.sort((a, b) => (info[a].display_name || a).localeCompare(info[b].display_name || b))) box.append(this.#nodeItem(t, info[t]));
    };
    build(root, tree, "");
  }

  // --- models -------------------------------------------------------------------------------------
  async renderModels() {
    this.modelsPanel.textContent = "";
    let folders = [];
    try { folders = await this.app.api.fetchJson("/models"); } catch { folders = []; }
    for (const folder of folders) {
      const details = el("details", { class: "lib-category", "data-folder": folder }, el("summary", {}, folder));
      details.addEventListener("toggle", () => { if (details.open && details.childElementCount === 1) this.#fillFolder(details, folder); });
      this.modelsPanel.append(details);
    }
  }

  async #fillFolder(box, folder) {
    let body;
    try { body = await this.app.api.fetchJson(`/api/v1/models/${encodeURIComponent(folder)}/info`); } catch { body = { files: [] }; }
    if (!body.files.length) box.append(el("div", { class: "empty" }, "No files."));
    for (const f of body.files) {
      const item = el("div", { class: "lib-model", draggable: "true", "data-model": f.name, title: f.error || f.name },
        el("div", { class: "lib-model-name" }, f.title ? `${f.title}` : f.name),
        el("div", { class: "lib-model-meta" }, [f.title ? f.name : "", sizeText(f.size), f.base_model || ""].filter(Boolean).join(" · ")));
      if (f.trigger_words?.length) item.append(el("div", { class: "lib-model-trigger", "data-role": "trigger-words" }, `trigger: ${f.trigger_words.join(", ")}`));
      item.addEventListener("dragstart", (e) => { e.dataTransfer.setData(MODEL_MIME, JSON.stringify({ folder, name: f.name })); e.dataTransfer.effectAllowed = "copy"; });
      box.append(item);
    }
  }

  #drop(e) {
    const node = e.dataTransfer?.getData(NODE_MIME);
    const model = e.dataTransfer?.getData(MODEL_MIME);
    if (!node && !model) return;
    e.preventDefault();
    const editor = this.app.editor;
    const at = editor.canvas.toWorld(e.clientX, e.clientY);
    if (node) { editor.addNode(node, at); return; }
    const { folder, name } = JSON.parse(model);
    const loader = loaderFor(this.app.info, folder, name);
    if (!loader) { editor.toast(`No loader node takes ${folder} files`, "warn"); return; }
    const added = editor.addNode(loader[0], at, false);
    added.values[loader[1]] = name;
    editor.views.render(added);
    editor.commit();
    this.app.presets?.offer(folder, name);  // checkpoints and diffusion models: the family's preset
  }

  // --- templates ----------------------------------------------------------------------------------
  async renderTemplates() {
    this.templatesPanel.textContent = "";
    let list = [];
    try { list = (await this.app.api.fetchJson("/workflows/templates.json")).templates || []; } catch { list = []; }
    for (const t of list) {
      const thumb = el("div", { class: "lib-thumb" });
      const card = el("div", { class: "lib-template", "data-template": t.file, title: "open in a new tab" },
        thumb, el("div", { class: "lib-model-name" }, t.title), el("div", { class: "lib-model-meta" }, t.description));
      card.addEventListener("click", () => this.openTemplate(t));
      this.templatesPanel.append(card);
      this.app.api.fetchJson(`/workflows/${t.file}`).then((saved) => { thumb.innerHTML = thumbnail(saved); }).catch(() => {});
    }
  }

  async openTemplate(t) {
    const saved = await this.app.api.fetchJson(`/workflows/${t.file}`);
    this.app.tabs.open(structuredClone(saved), t.title);
  }
}

// A small drawing of a saved workflow: its nodes as boxes, its links as lines.
export function thumbnail(saved) {
  const laid = saved.layout?.nodes || {};
  const boxes = Object.entries(laid).map(([id, l]) => [id, l.pos[0], l.pos[1], Math.max(120, l.size?.[0] || 200), Math.max(60, l.size?.[1] || 100)]);
  if (!boxes.length) return "";
  const x0 = Math.min(...boxes.map((b) => b[1])), y0 = Math.min(...boxes.map((b) => b[2]));
  const x1 = Math.max(...boxes.map((b) => b[1] + b[3])), y1 = Math.max(...boxes.map((b) => b[2] + b[4]));
  const at = Object.fromEntries(boxes.map((b) => [b[0], b]));
  const lines = [];
  for (const [id, node] of Object.entries(saved.prompt || {})) {
    for (const v of Object.values(node.inputs || {})) {
      const src = Array.isArray(v) && at[String(v[0])];
      if (src && at[id]) lines.push(`<line x1="${src[1] + src[3]}" y1="${src[2] + 20}" x2="${at[id][1]}" y2="${at[id][2] + 20}"/>`);
    }
  }
  const rects = boxes.map((b) => `<rect x="${b[1]}" y="${b[2]}" width="${b[3]}" height="${b[4]}" rx="8"/>`);
  return `<svg viewBox="${x0 - 20} ${y0 - 20} ${x1 - x0 + 40} ${y1 - y0 + 40}" preserveAspectRatio="xMidYMid meet">` +
    `<g class="thumb-links">${lines.join("")}</g><g class="thumb-nodes">${rects.join("")}</g></svg>`;
}
