// Node elements: title, category colour, typed ports, widgets, progress bar, errors, outputs.
// Also node dragging/selection and the cached port positions links are drawn from.

import { categoryColor, typeColor } from "./schema.js";
import { buildWidget, el } from "./widgets.js";
import { primitiveSpec } from "./frontend.js";

export class NodeViews {
  constructor(editor, layer) {
    this.editor = editor;
    this.layer = layer;
    this.els = new Map(); // id -> element
    this.ports = new Map(); // id -> {in: {name: [dx, dy]}, out: {slot: [dx, dy]}, w, h}
    this.widgetEnvs = new Map(); // id -> {name: env}
    this.resize = new ResizeObserver((entries) => {
      for (const entry of entries) {
        const id = entry.target.dataset.nodeId;
        if (this.els.get(id) === entry.target) { this.measure(id); this.editor.links.updateNode(id); }
      }
    });
  }

  clear() {
    for (const elem of this.els.values()) { this.resize.unobserve(elem); elem.remove(); }
    this.els.clear(); this.ports.clear(); this.widgetEnvs.clear();
  }

  render(node, measureNow = true) {
    const { editor } = this;
    const schema = editor.graph.schema(node.type);
    const old = this.els.get(node.id);
    const root = el("div", { class: "node", "data-node-id": node.id, "data-node-type": node.type });
    root.style.setProperty("--cat", node.color || categoryColor(schema?.category));
    if (node.size) { root.style.width = `${node.size[0]}px`; root.style.maxWidth = "none"; }
    const title = el("span", { class: "node-title", title: schema?.description || node.type }, node.title);
    const collapse = el("button", { type: "button", class: "node-collapse", title: "collapse", "data-action": "collapse" }, node.collapsed ? "▸" : "▾");
    const header = el("div", { class: "node-header" }, collapse, title, el("span", { class: "node-badge" }));
    if (schema?.subgraph) {
      root.classList.add("subgraph-instance");
      header.append(el("button", { type: "button", class: "node-open", title: "open the subgraph", "data-action": "open-subgraph" }, "⤢"));
    }
    root.append(header, el("div", { class: "node-progress" }, el("div", { class: "bar" })));
    const body = el("div", { class: "node-body" });
    root.append(body);
    const ghost = schema ? null : editor.graph.placeholderSchema(node); // a missing type keeps its ports and values
    if (!schema) {
      root.classList.add("missing");
      body.append(el("div", { class: "node-missing", "data-role": "missing-type" }, `missing node type "${node.type}" — kept as it is`));
      for (const [name, value] of ghost.values) body.append(el("div", { class: "node-kept-value", "data-kept": name }, `${name}: ${JSON.stringify(value)}`));
    }
    const linkInputs = schema ? schema.inputs.filter((i) => !i.widget || node.converted.has(i.name))
      : ghost.inputs.filter((i) => !i.widget || node.links[i.name]);
    let widgets = (schema?.inputs || []).filter((i) => i.widget && !node.converted.has(i.name));
    const primitive = node.type === "PrimitiveNode";
    if (primitive) {
      const spec = primitiveSpec(editor.graph, node);
      widgets = spec ? [spec] : [];
      if (!spec) body.append(el("div", { class: "node-hint" }, "link the output to widget inputs"));
    }
    const outputs = schema?.outputs || ghost.outputs;
    for (let r = 0; r < Math.max(linkInputs.length, outputs.length); r++) {
      const row = el("div", { class: "io-row" });
      const input = linkInputs[r], output = outputs[r];
      row.append(input ? el("div", { class: "io-in" }, this.#port(input.name, "in", input.type, input.optional), el("span", { class: "io-label" }, input.name))
        : el("div", { class: "io-in" }));
      row.append(output ? el("div", { class: "io-out" }, el("span", { class: "io-label" }, output.name + (output.isList ? " ⋮" : "")), this.#port(output.name, "out", output.type, false, output.slot))
        : el("div", { class: "io-out" }));
      body.append(row);
    }
    const envs = {};
    for (const input of widgets) {
      const env = this.#widgetEnv(node, input);
      envs[input.name] = env;
      const control = buildWidget(env);
      const row = el("div", { class: "widget-row", "data-widget-row": input.name, title: input.opts.tooltip || input.name },
        primitive ? "" : this.#port(input.name, "in", input.type, input.optional, null, true),
        el("label", { class: "w-label" }, input.name),
        el("div", { class: "w-control-box" }, control, el("span", { class: "w-linked" }, "← linked")),
        el("div", { class: "w-error" }));
      if (node.links[input.name]) row.classList.add("linked");
      body.append(row);
    }
    body.append(el("div", { class: "node-error" }), el("div", { class: "node-outputs" }));
    const grip = el("div", { class: "node-resize", title: "drag to resize" });
    grip.addEventListener("pointerdown", (e) => { if (e.button === 0) { e.stopPropagation(); e.preventDefault(); this.#resizeDrag(node, root, e); } });
    root.append(grip);
    this.widgetEnvs.set(node.id, envs);
    root.classList.toggle("collapsed", node.collapsed);
    root.classList.toggle("bypassed", node.mode === 4);
    root.classList.toggle("muted", node.mode === 2);
    root.classList.toggle("selected", editor.selection.has(node.id));
    this.#wire(root, node, header, title, collapse);
    this.setPos(node, root);
    if (old) { this.resize.unobserve(old); old.replaceWith(root); } else this.layer.append(root);
    this.els.set(node.id, root);
    this.resize.observe(root);
    this.onRendered?.(node, root); // the ComfyUI extension shim attaches its node objects here
    if (measureNow) this.measure(node.id);
    return root;
  }

  #port(name, dir, type, optional, slot = null, widgetPort = false) {
    const port = el("span", { class: `port${widgetPort ? " widget-port" : ""}${optional ? " optional" : ""}`, "data-port": name, "data-dir": dir, "data-type": type, title: `${name}: ${type}` });
    if (slot !== null) port.dataset.slot = String(slot);
    port.style.setProperty("--type", typeColor(type));
    return port;
  }

  #widgetEnv(node, input) {
    const { editor } = this;
    const env = {
      input, node, value: node.values[input.name], control: node.control[input.name], api: editor.api,
      set: (value, commit) => {
        node.values[input.name] = value;
        this.clearError(node.id, input.name);
        if (commit) { editor.commit(); editor.emit("widgetChanged", { node, name: input.name, value }); }
      },
      setControl: (how) => { node.control[input.name] = how; editor.commit(); },
    };
    return env;
  }

  #wire(root, node, header, title, collapse) {
    const { editor } = this;
    collapse.addEventListener("pointerdown", (e) => e.stopPropagation());
    header.querySelector(".node-open")?.addEventListener("pointerdown", (e) => e.stopPropagation());
    collapse.addEventListener("click", () => editor.setCollapsed([node.id], !node.collapsed));
    title.addEventListener("dblclick", (e) => { e.stopPropagation(); this.rename(node.id); });
    root.addEventListener("pointerdown", (e) => {
      if (e.button !== 0 || e.target.closest(".port") || e.target.closest("input,textarea,select,button,.w-scrub") || editor.canvas.spaceDown) return;
      e.stopPropagation();
      editor.pointerOnNode(node.id, e);
    });
    root.addEventListener("contextmenu", (e) => {
      e.preventDefault(); e.stopPropagation();
      editor.menus.nodeMenu(node.id, e);
    });
    root.addEventListener("dblclick", (e) => e.stopPropagation());
  }

  #resizeDrag(node, root, e) {
    const zoom = this.editor.canvas.zoom;
    const startW = root.getBoundingClientRect().width / zoom, x0 = e.clientX;
    const move = (ev) => {
      const w = Math.max(160, startW + (ev.clientX - x0) / zoom);
      root.style.width = `${w}px`;
      root.style.maxWidth = "none";
      node.size = [w, root.getBoundingClientRect().height / zoom];
    };
    const up = () => {
      window.removeEventListener("pointermove", move);
      window.removeEventListener("pointerup", up);
      this.editor.commit();
    };
    window.addEventListener("pointermove", move);
    window.addEventListener("pointerup", up);
  }

  rename(id) {
    const node = this.editor.graph.nodes.get(id);
    const titleEl = this.els.get(id)?.querySelector(".node-title");
    if (!node || !titleEl) return;
    const box = el("input", { type: "text", class: "rename-box", value: node.title });
    titleEl.replaceWith(box);
    box.focus(); box.select();
    let done = false;
    const finish = (save) => {
      if (done) return; done = true;
      if (save && box.value.trim()) node.title = box.value.trim();
      box.replaceWith(titleEl);
      titleEl.textContent = node.title;
      this.editor.commit();
    };
    box.addEventListener("keydown", (e) => { e.stopPropagation(); if (e.key === "Enter") finish(true); if (e.key === "Escape") finish(false); });
    box.addEventListener("blur", () => finish(true));
  }

  setPos(node, elem = this.els.get(node.id)) {
    if (elem) elem.style.transform = `translate(${node.pos[0]}px, ${node.pos[1]}px)`;
  }

  // Port centres relative to the node's top-left corner, in world units.
  measure(id) {
    const elem = this.els.get(id);
    if (!elem || !elem.isConnected) return;
    const zoom = this.editor.canvas.zoom;
    const box = elem.getBoundingClientRect();
    const info = { in: {}, out: {}, w: box.width / zoom, h: box.height / zoom };
    const collapsed = elem.classList.contains("collapsed");
    const headerH = elem.querySelector(".node-header").offsetHeight;
    for (const port of elem.querySelectorAll(".port")) {
      const key = port.dataset.dir === "out" ? port.dataset.slot : port.dataset.port;
      let pos;
      if (collapsed || port.offsetParent === null) pos = [port.dataset.dir === "out" ? info.w : 0, headerH / 2];
      else {
        const r = port.getBoundingClientRect();
        pos = [(r.left + r.width / 2 - box.left) / zoom, (r.top + r.height / 2 - box.top) / zoom];
      }
      info[port.dataset.dir][key] = pos;
    }
    this.ports.set(id, info);
    const node = this.editor.graph.nodes.get(id);
    if (node) node.measured = [info.w, info.h];
  }

  portPos(id, dir, key) {
    const node = this.editor.graph.nodes.get(id);
    const info = this.ports.get(id);
    if (!node) return null;
    const p = info && info[dir][key];
    if (!p) return [node.pos[0] + (dir === "out" && info ? info.w : 0), node.pos[1] + 14];
    return [node.pos[0] + p[0], node.pos[1] + p[1]];
  }

  rect(id) {
    const node = this.editor.graph.nodes.get(id);
    const info = this.ports.get(id);
    return [node.pos[0], node.pos[1], info ? info.w : 200, info ? info.h : 80];
  }

  setSelected(id, on) { this.els.get(id)?.classList.toggle("selected", on); }

  updateWidget(id, name) {
    const node = this.editor.graph.nodes.get(id);
    const env = this.widgetEnvs.get(id)?.[name];
    if (node && env && env.update) env.update(node.values[name]);
  }

  setLinked(id, name, on) {
    this.els.get(id)?.querySelector(`.widget-row[data-widget-row="${CSS.escape(name)}"]`)?.classList.toggle("linked", on);
  }

  // --- run state: executing, progress, errors, outputs -------------------------------------------
  setState(id, cls, on) { this.els.get(id)?.classList.toggle(cls, on); }

  setProgress(id, fraction) {
    const elem = this.els.get(id);
    if (!elem) return;
    elem.classList.toggle("has-progress", fraction !== null);
    elem.querySelector(".node-progress .bar").style.width = `${Math.round((fraction || 0) * 100)}%`;
  }

  showError(id, message, inputName = null) {
    const elem = this.els.get(id);
    if (!elem) return;
    elem.classList.add("has-error");
    if (inputName) {
      const row = elem.querySelector(`.widget-row[data-widget-row="${CSS.escape(inputName)}"]`);
      const port = elem.querySelector(`.port[data-dir="in"][data-port="${CSS.escape(inputName)}"]`);
      if (row) { row.classList.add("error"); row.querySelector(".w-error").textContent = message; return; }
      if (port) port.classList.add("error");
    }
    const box = elem.querySelector(".node-error");
    box.textContent = box.textContent ? `${box.textContent}\n${message}` : message;
  }

  clearError(id, inputName) {
    const elem = this.els.get(id);
    const row = elem?.querySelector(`.widget-row[data-widget-row="${CSS.escape(inputName)}"]`);
    if (row) { row.classList.remove("error"); row.querySelector(".w-error").textContent = ""; }
  }

  clearAllErrors() {
    for (const elem of this.els.values()) {
      elem.classList.remove("has-error", "exec-error");
      elem.querySelector(".node-error").textContent = "";
      for (const row of elem.querySelectorAll(".widget-row.error")) { row.classList.remove("error"); row.querySelector(".w-error").textContent = ""; }
      for (const port of elem.querySelectorAll(".port.error")) port.classList.remove("error");
    }
  }

  showImages(id, urls, { preview = false } = {}) {
    const box = this.els.get(id)?.querySelector(".node-outputs");
    if (!box) return;
    box.textContent = "";
    for (const url of urls) box.append(el("img", { src: url, class: preview ? "node-preview" : "node-image", alt: "output" }));
  }

  showText(id, texts) {
    const box = this.els.get(id)?.querySelector(".node-outputs");
    if (box) { box.textContent = ""; for (const t of texts) box.append(el("pre", { class: "node-text" }, String(t))); }
  }
}
