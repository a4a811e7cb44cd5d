// Loom's extension for ComfyUI's official frontend (served at /extensions/loom/loom.js and listed by
// /extensions when `serve` puts that frontend at /). It adds a "Loom" sidebar tab and a "Loom" menu
// with what the official frontend has no view for: Loom's own editor, its job list
// (/api/v1/jobs), its model presets (/api/v1/presets) and the image-safety mode (/system_stats).
// Plain ES module, no imports: in Loom's own editor (which also loads /extensions) it does nothing.

const comfy = window.comfyAPI?.app?.app;
const base = location.pathname.replace(/\/(index\.html)?$/, "");

async function getJson(path) {
  const res = await fetch(base + path);
  if (!res.ok) throw new Error(`${path}: HTTP ${res.status}`);
  return res.json();
}

function row(parent, text, href) {
  const item = document.createElement(href ? "a" : "div");
  item.textContent = text;
  if (href) { item.href = href; item.target = "_blank"; item.rel = "noopener"; }
  item.style.display = "block";
  item.style.padding = "2px 0";
  parent.append(item);
  return item;
}

function heading(parent, text) {
  const h = document.createElement("h4");
  h.textContent = text;
  h.style.margin = "12px 0 4px";
  parent.append(h);
}

async function render(el) {
  el.replaceChildren();
  el.dataset.loomPanel = "ready";
  el.style.padding = "8px 12px";
  row(el, "Open Loom's editor", `${base}/loom/`).dataset.loomLink = "editor";
  heading(el, "Jobs");
  try {
    const { jobs = [] } = await getJson("/api/v1/jobs?limit=10");
    if (!jobs.length) row(el, "no jobs yet");
    for (const job of jobs) row(el, `${job.status} · ${job.id}`, `${base}/api/v1/jobs/${job.id}`).dataset.loomJob = job.id;
  } catch (err) { row(el, `jobs: ${err.message}`); }
  heading(el, "Model presets");
  try {
    const { presets = [] } = await getJson("/api/v1/presets");
    row(el, `${presets.length} presets`, `${base}/api/v1/presets`).dataset.loomLink = "presets";
  } catch (err) { row(el, `presets: ${err.message}`); }
  heading(el, "Image safety");
  try {
    const stats = await getJson("/system_stats");
    row(el, `--safety ${stats.loom?.safety ?? "off"}`, `${base}/system_stats`).dataset.loomLink = "safety";
  } catch (err) { row(el, `safety: ${err.message}`); }
}

function open(path) { window.open(base + path, "_blank", "noopener"); }

if (comfy?.registerExtension) {
  comfy.registerExtension({
    name: "Loom.Views",
    commands: [
      { id: "Loom.OpenEditor", label: "Loom's editor", function: () => open("/loom/") },
      { id: "Loom.OpenJobs", label: "Loom jobs", function: () => open("/api/v1/jobs") },
      { id: "Loom.OpenPresets", label: "Loom model presets", function: () => open("/api/v1/presets") },
    ],
    menuCommands: [{ path: ["Loom"], commands: ["Loom.OpenEditor", "Loom.OpenJobs", "Loom.OpenPresets"] }],
    setup(app) {
      app.extensionManager?.registerSidebarTab?.({
        id: "loom",
        icon: "pi pi-th-large",
        title: "Loom",
        tooltip: "Loom: its editor, jobs, presets and safety",
        type: "custom",
        render: (el) => { render(el); },
      });
    },
  });
}
