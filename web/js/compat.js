// The compatibility report on load: when a workflow uses node types this server lacks, ask
// POST /api/v1/workflows/check and show which ones are missing (ComfyUI core or custom, with the
// pack the file names) and what the conversion had to guess. Test contract: the panel is
// [data-role="compat-report"]; each missing type [data-missing-node=TYPE][data-kind=core|custom]
// (with data-pack when known); each problem [data-problem-node=ID]; [data-action="close-report"].

import { el } from "./widgets.js";
import { FRONTEND_ONLY, isGroupNodeType } from "./uirules.js";

// Class types of a UI-format or API-format workflow (subgraph contents included, instances not).
export function workflowTypes(obj) {
  if (!obj || typeof obj !== "object") return [];
  if (Array.isArray(obj.nodes)) {
    const subgraphs = obj.definitions?.subgraphs || [];
    const ids = new Set(subgraphs.map((s) => String(s.id)));
    const all = [obj.nodes, ...subgraphs.map((s) => s.nodes || [])].flat();
    return all.map((n) => n?.type).filter((t) => typeof t === "string" && !ids.has(t) && !isGroupNodeType(t));
  }
  const prompt = obj.format ? obj.prompt : obj;
  const defs = obj.format ? obj.layout?.subgraphs || [] : []; // Loom's saved format keeps subgraphs in its layout
  const ids = new Set(defs.map((d) => String(d.id)));
  const types = Object.values(prompt || {}).map((n) => n?.class_type).filter((t) => typeof t === "string" && !ids.has(t));
  return [...types, ...defs.flatMap((d) => workflowTypes(d.saved))];
}

export function unknownTypes(obj, info) {
  return [...new Set(workflowTypes(obj).filter((t) => !FRONTEND_ONLY.has(t) && !(t in (info || {}))))];
}

export async function reportIfIncomplete(app, obj, name) {
  if (!unknownTypes(obj, app.info).length) return null;
  let report;
  try {
    report = await app.api.fetchJson("/api/v1/workflows/check", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(obj),
    });
  } catch { return null; } // the report is a help, never a reason not to open the workflow
  if (report?.missing?.length) showReport(report, name);
  return report;
}

function showReport(report, name) {
  document.querySelector('[data-role="compat-report"]')?.remove();
  const item = (m) => {
    const attrs = { "data-missing-node": m.class_type, "data-kind": m.kind };
    if (m.pack || m.repository) attrs["data-pack"] = m.pack || m.repository;
    const source = m.kind === "core" ? "ComfyUI core, not in Loom yet" : (m.pack || m.repository ? `custom: ${m.pack || m.repository}` : "custom node");
    return el("li", attrs, `${m.class_type} — ${source} (node ${m.node_ids.join(", ")})`);
  };
  const close = el("button", { type: "button", class: "small", "data-action": "close-report" }, "×");
  const panel = el("div", { class: "compat-report", "data-role": "compat-report" },
    close,
    el("strong", {}, `${name || "This workflow"} needs ${report.missing.length} node type${report.missing.length > 1 ? "s" : ""} Loom lacks`),
    el("ul", {}, ...report.missing.map(item)));
  const warnings = (report.problems || []).filter((p) => p.level === "warning");
  if (warnings.length) {
    panel.append(el("div", {}, "Conversion problems:"),
      el("ul", {}, ...warnings.map((p) => el("li", { "data-problem-node": p.node_id }, `${p.node_id} (${p.class_type}): ${p.message}`))));
  }
  close.addEventListener("click", () => panel.remove());
  document.body.append(panel);
}
