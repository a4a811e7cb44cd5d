// A ComfyUI frontend extension, written against ComfyUI's API: a colour picker widget, a text
// widget filled from `executed` messages, properties, setSize, a custom widget type, and one call
// outside Loom's subset (which must only warn).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

app.registerExtension({
  name: "webpack.ColorNote",
  getCustomWidgets() {
    return {
      WEBPACK_SWATCH(node, inputName) {
        const box = document.createElement("input");
        box.type = "color";
        return { widget: node.addDOMWidget(inputName, "WEBPACK_SWATCH", box, { getValue: () => box.value, setValue: (v) => { box.value = v; } }) };
      },
    };
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name !== "WebPack_ColorNote") return;
    const created = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      created?.apply(this, arguments);
      const color = this.widgets.find((w) => w.name === "color");
      const picker = document.createElement("input");
      picker.type = "color";
      picker.className = "webpack-picker";
      this.addDOMWidget("picker", "color", picker, { getValue: () => picker.value, setValue: (v) => { picker.value = v; } });
      picker.addEventListener("input", () => { color.value = picker.value; });
      this.addWidget("text", "shown", "", () => {});
      this.setSize([300, 160]);
    };
    const executed = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      executed?.apply(this, arguments);
      this.widgets.find((w) => w.name === "shown").value = message.text.join("");
      this.properties.runs = (this.properties.runs || 0) + 1;
    };
    nodeType.prototype.onConnectionsChange = function (side, slot, connected) {
      this.properties.lastConnection = `${side}:${slot}:${connected}`;
    };
  },
  nodeCreated(node) {
    if (node.comfyClass === "WebPack_ColorNote") node.properties.madeBy = "webpack.ColorNote";
  },
  setup() {
    api.addEventListener("executed", (event) => {
      if (event.detail?.output?.text) window.__webpackExecuted = (window.__webpackExecuted || 0) + 1;
    });
  },
});

app.registerExtension({
  name: "webpack.UsesLiteGraph",
  setup() {
    app.canvas.ds.scale = 2; // LiteGraph internals: not in Loom's subset
    app.graph.setDirtyCanvas(true);
  },
});
