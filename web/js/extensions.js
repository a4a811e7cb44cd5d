// Plugins' web extensions: every URL from GET /extensions is imported as an ES module and its
// `register(loom)` (or default export) is called with the small API documented in web/EXTENSIONS.md.

import { registerWidget } from "./widgets.js";
import { registerWidgetType } from "./schema.js";
import { addMenuItem } from "./menu.js";
import { shim } from "./comfyshim.js";

export function extensionApi(app) {
  return Object.freeze({
    version: 1,
    registerWidget(type, factory) { registerWidgetType(type); registerWidget(type, factory); },
    addMenuItem(item) {
      if (!item || typeof item.label !== "string" || typeof item.action !== "function") throw new Error("addMenuItem({label, action, where?})");
      addMenuItem(item.where || "canvas", item);
      if ((item.where || "canvas") === "main") app.addMainMenuItem(item);
    },
    on(event, handler) {
      const target = ["status", "execution_start", "executing", "progress", "executed", "execution_success",
        "execution_error", "execution_interrupted", "execution_cached", "preview"].includes(event) ? app.api.events : app.events;
      const listener = (e) => handler(e.detail);
      target.addEventListener(event, listener);
      return () => target.removeEventListener(event, listener);
    },
    get graph() { return app.tabs.current.graph; },
    get editor() { return app.editor; },
    api: app.api,
    toast: (message, kind) => app.editor.toast(message, kind),
  });
}

export async function loadExtensions(app) {
  shim.bind(app);
  const urls = await app.api.extensions();
  const loom = extensionApi(app);
  window.loomExtensionApi = loom;
  const loaded = [];
  for (const url of Array.isArray(urls) ? urls : []) {
    try {
      // "/extensions/…" under the API base: behind a sub-path (and at /loom/) its "../../scripts/app.js" is Loom's shim
      const mod = await import(url.startsWith("http") ? url : url.startsWith("/") ? app.api.url(url) : `./${url}`);
      const register = mod.register || mod.default;
      if (typeof register === "function") await register(loom);
      loaded.push(url);
    } catch (err) {
      console.warn(`Loom: extension ${url} failed to load:`, err);
      app.editor.toast(`Extension ${url} failed to load: ${err.message}`, "warn", 8000);
    }
  }
  await shim.start(); // ComfyUI-style extensions registered while importing: run their hooks
  return loaded;
}

// Input types an extension builds widgets for (ComfyUI's getCustomWidgets).
export function registerShimWidgetTypes(types) {
  for (const type of types) {
    registerWidgetType(type);
    registerWidget(type, (env) => shim.buildCustom(env, env.node));
  }
}
