// A documented subset of ComfyUI's frontend extension API (see web/EXTENSIONS.md), so that small
// packs written for ComfyUI (`import { app } from "../../scripts/app.js"`) work unchanged:
// `app.registerExtension({name, init, setup, addCustomNodeDefs, getCustomWidgets,
// beforeRegisterNodeDef, nodeCreated})`, `api.addEventListener`, and per node an object with
// `id`, `type`, `comfyClass`, `title`, `widgets`, `properties`, `addWidget`, `addDOMWidget`,
// `setSize`, `onNodeCreated`, `onExecuted`, `onConnectionsChange`. Anything else fails soft:
// one console warning naming the extension, and the editor goes on.

import { el } from "./widgets.js";

const warned = new Set();
let running = null; // the extension whose hook runs now

function warnOnce(extension, what) {
  if (warned.has(extension)) return; // one warning per extension
  warned.add(extension);
  console.warn(`Loom: extension "${extension}" ${what} — outside the ComfyUI subset Loom supports (web/EXTENSIONS.md); ignored.`);
}

// A stand-in for unsupported parts (app.canvas, app.graph, …): any use warns once and does nothing.
function unsupported(path) {
  const target = function () {};
  return new Proxy(target, {
    get: (t, key) => {
      if (key === Symbol.toPrimitive || key === "then") return undefined;
      warnOnce(running || "unknown", `used ${path}.${String(key)}`);
      return unsupported(`${path}.${String(key)}`);
    },
    set: () => { warnOnce(running || "unknown", `set ${path}`); return true; },
    apply: () => { warnOnce(running || "unknown", `called ${path}()`); return undefined; },
  });
}

function withUnsupported(obj, path) {
  return new Proxy(obj, {
    get: (t, key) => (key in t || typeof key === "symbol" ? t[key] : unsupported(`${path}.${String(key)}`)),
  });
}

const WIDGET_KIND = { INT: "number", FLOAT: "number", STRING: "text", BOOLEAN: "toggle", COMBO: "combo", IMAGEUPLOAD: "combo" };

class Shim {
  constructor() {
    this.extensions = [];
    this.classes = new Map(); // node type -> constructor whose prototype extensions patch
    this.customWidgets = {};
    this.instances = new WeakMap(); // Loom node -> node object
    this.started = false;
    this.app = withUnsupported({ registerExtension: (ext) => this.register(ext), extensions: this.extensions }, "app");
    this.api = withUnsupported({
      addEventListener: (type, fn, opts) => this.loom?.api.events.addEventListener(type, fn, opts),
      removeEventListener: (type, fn, opts) => this.loom?.api.events.removeEventListener(type, fn, opts),
      fetchApi: (route, options) => fetch(`${this.loom?.api.base ?? ""}/api${route}`, options),
      apiURL: (route) => `${this.loom?.api.base ?? ""}/api${route}`,
      get clientId() { return sessionStorage.getItem("loom.clientId"); },
    }, "api");
  }

  // --- lifecycle ----------------------------------------------------------------------------------
  bind(loomApp) {
    this.loom = loomApp;
    loomApp.editor.views.onRendered = (node, elem) => this.#rendered(node, elem);
    loomApp.editor.links.onConnectionsChange = (...args) => this.#connections(...args);
    loomApp.api.events.addEventListener("executed", (e) => this.#executed(e.detail));
  }

  async register(ext) {
    if (!ext || typeof ext.name !== "string") { console.warn("Loom: registerExtension needs {name, …}; skipped"); return; }
    this.extensions.push(ext);
    if (this.started) await this.#runAll(ext);
  }

  async call(ext, hook, ...args) {
    if (typeof ext[hook] !== "function") return undefined;
    running = ext.name;
    try {
      return await ext[hook](...args);
    } catch (err) {
      warnOnce(ext.name, `failed in ${hook}: ${err?.message || err}`);
      return undefined;
    } finally { running = null; }
  }

  // After every extension module is imported: ComfyUI's order of hooks.
  async start() {
    this.started = true;
    for (const ext of this.extensions) await this.call(ext, "init", this.app);
    for (const ext of this.extensions) await this.#defs(ext);
    for (const ext of this.extensions) await this.call(ext, "setup", this.app);
    if (this.extensions.length) this.loom.editor.renderAll(); // existing nodes get their objects
  }

  async #runAll(ext) {
    await this.call(ext, "init", this.app);
    await this.#defs(ext);
    await this.call(ext, "setup", this.app);
  }

  async #defs(ext) {
    const info = this.loom.info;
    if (typeof ext.addCustomNodeDefs === "function") await this.call(ext, "addCustomNodeDefs", structuredClone(info), this.app);
    const widgets = await this.call(ext, "getCustomWidgets", this.app);
    if (widgets && typeof widgets === "object") {
      for (const [type, make] of Object.entries(widgets)) this.customWidgets[type] = { ext: ext.name, make };
      this.loom.registerCustomWidgetTypes(Object.keys(widgets));
    }
    if (typeof ext.beforeRegisterNodeDef !== "function") return;
    for (const [type, entry] of Object.entries(info)) {
      const cls = this.classOf(type);
      const before = { ...Object.getOwnPropertyDescriptors(cls.prototype) };
      await this.call(ext, "beforeRegisterNodeDef", cls, { ...entry, name: type }, this.app);
      for (const [key, desc] of Object.entries(Object.getOwnPropertyDescriptors(cls.prototype))) {
        if (typeof desc.value === "function" && before[key]?.value !== desc.value) cls.prototype[key] = this.#named(ext.name, key, desc.value);
      }
    }
  }

  #named(name, key, fn) {
    return function (...args) {
      const prev = running;
      running = name;
      try { return fn.apply(this, args); } catch (err) { warnOnce(name, `failed in ${key}: ${err?.message || err}`); return undefined; } finally { running = prev; }
    };
  }

  classOf(type) {
    if (!this.classes.has(type)) {
      const cls = class { };
      Object.defineProperty(cls, "name", { value: type });
      cls.comfyClass = type;
      this.classes.set(type, cls);
    }
    return this.classes.get(type);
  }

  // --- node objects ---------------------------------------------------------------------------------
  nodeOf(loomNode) { return this.instances.get(loomNode) || null; }

  #rendered(node, elem) {
    if (!this.started || !this.extensions.length) return;
    let obj = this.instances.get(node);
    const fresh = !obj;
    if (fresh) { obj = this.#create(node); this.instances.set(node, obj); }
    obj.element = elem;
    const box = el("div", { class: "ext-widgets" });
    elem.querySelector(".node-body")?.insertBefore(box, elem.querySelector(".node-error"));
    obj.extBox = box;
    for (const w of obj.widgets) if (w.extRow) box.append(w.extRow);
    if (fresh) {
      obj.onNodeCreated?.();
      for (const ext of this.extensions) if (typeof ext.nodeCreated === "function") this.call(ext, "nodeCreated", obj, this.app);
    }
    if (obj.size && node.size) elem.style.width = `${node.size[0]}px`;
  }

  #create(node) {
    const cls = this.classOf(node.type);
    const obj = Object.create(cls.prototype);
    const graph = this.loom.editor.graph;
    const schema = graph.schema(node.type);
    node.properties = node.properties || {};
    node.extWidgets = node.extWidgets || {};
    Object.assign(obj, {
      id: Number(node.id) || node.id, type: node.type, comfyClass: node.type, properties: node.properties,
      get title() { return node.title; }, set title(v) { node.title = String(v); },
      get pos() { return node.pos; }, get size() { return node.size || node.measured || [200, 80]; },
      inputs: (schema?.inputs || []).map((i) => ({ name: i.name, type: i.type, get link() { return node.links[i.name] ? 1 : null; } })),
      outputs: (schema?.outputs || []).map((o) => ({ name: o.name, type: o.type })),
      widgets: [],
      setSize: (size) => { node.size = [Number(size[0]) || 200, Number(size[1]) || 80]; if (obj.element) { obj.element.style.width = `${node.size[0]}px`; obj.element.style.maxWidth = "none"; } },
      setDirtyCanvas: () => {},
      addWidget: (type, name, value, callback, options = {}) => this.#extWidget(node, obj, { type, name, value, callback, options }),
      addDOMWidget: (name, type, element, options = {}) => this.#extWidget(node, obj, { type, name, element, options }),
    });
    obj.graph = unsupported("node.graph");
    for (const input of schema?.inputs || []) {
      if (!input.widget) continue;
      const views = this.loom.editor.views;
      const custom = this.customWidgets[input.type];
      if (custom) continue; // its factory adds the widget when the control is built
      obj.widgets.push({
        name: input.name, type: WIDGET_KIND[input.widget] || "text", options: { ...input.opts, values: input.choices || undefined },
        get value() { return node.values[input.name]; },
        set value(v) { node.values[input.name] = v; views.updateWidget(node.id, input.name); },
      });
    }
    return obj;
  }

  // A widget an extension adds (addWidget / addDOMWidget): shown in the node, its value kept with the node.
  #extWidget(node, obj, { type, name, value, callback, options, element }) {
    const store = node.extWidgets;
    if (!(name in store)) store[name] = element ? options.getValue?.() : value;
    let control = element;
    if (!control) {
      if (type === "button") control = el("button", { type: "button" }, name);
      else if (type === "toggle") control = el("input", { type: "checkbox" });
      else if (type === "number") control = el("input", { type: "number", step: String(options.step ?? 1) });
      else if (type === "combo") { control = el("select"); for (const v of options.values || []) control.append(el("option", { value: String(v) }, String(v))); }
      else control = el("input", { type: "text" });
    }
    control.dataset.extWidget = name;
    const read = () => (element ? options.getValue?.() : type === "toggle" ? control.checked : type === "number" ? Number(control.value) : control.value);
    const write = (v) => { if (element) options.setValue?.(v); else if (type === "toggle") control.checked = !!v; else if (type !== "button") control.value = v ?? ""; };
    const widget = {
      name, type, options, element,
      get value() { return element ? read() : store[name]; },
      set value(v) { store[name] = v; write(v); },
      callback,
    };
    write(store[name]);
    const fire = () => { if (type !== "button") store[name] = read(); try { callback?.(widget.value, null, obj); } catch (err) { warnOnce(running || obj.type, `widget ${name}: ${err.message}`); } };
    control.addEventListener(type === "button" ? "click" : "change", fire);
    widget.extRow = el("div", { class: "widget-row ext-widget-row", "data-ext-widget-row": name }, el("label", { class: "w-label" }, name), el("div", { class: "w-control-box" }, control));
    widget.extRow.addEventListener("pointerdown", (e) => e.stopPropagation());
    obj.widgets.push(widget);
    obj.extBox?.append(widget.extRow);
    return widget;
  }

  // A custom widget type from getCustomWidgets, used where a node input has that type.
  buildCustom(env, loomNode) {
    const custom = this.customWidgets[env.input.type];
    const obj = this.nodeOf(loomNode) || { widgets: [], addDOMWidget: null };
    const holder = el("div", { class: "ext-custom" });
    const fakeNode = Object.create(obj);
    fakeNode.addDOMWidget = (name, type, element, options = {}) => {
      holder.append(element);
      element.dataset.widget = env.input.name;
      if (options.setValue) options.setValue(env.value);
      element.addEventListener("change", () => env.set(options.getValue ? options.getValue() : element.value, true));
      return { name, type, element, options, get value() { return options.getValue?.(); }, set value(v) { options.setValue?.(v); } };
    };
    fakeNode.addWidget = (type, name, value) => {
      const box = el("input", { type: "text", "data-widget": env.input.name, value: String(env.value ?? value ?? "") });
      box.addEventListener("change", () => env.set(box.value, true));
      holder.append(box);
      return { name, type, get value() { return box.value; }, set value(v) { box.value = v; env.set(v, true); } };
    };
    running = custom.ext;
    try { custom.make(fakeNode, env.input.name, [env.input.type, env.input.opts], this.app); } catch (err) { warnOnce(custom.ext, `widget ${env.input.type}: ${err.message}`); } finally { running = null; }
    return holder;
  }

  #executed(d) {
    const graph = this.loom?.tabs.current.graph;
    const node = graph?.nodes.get(String(d.node));
    const obj = node && this.nodeOf(node);
    obj?.onExecuted?.(d.output);
  }

  #connections(nodeId, side, index, connected, linkInfo) {
    const node = this.loom?.editor.graph.nodes.get(nodeId);
    const obj = node && this.nodeOf(node);
    obj?.onConnectionsChange?.(side, index, connected, linkInfo, obj.inputs?.[index]);
  }
}

export const shim = new Shim();
export const app = shim.app;
export const api = shim.api;
