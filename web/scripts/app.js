// ComfyUI's `scripts/app.js` for frontend extensions written for ComfyUI: Loom's shim (the subset
// documented in web/EXTENSIONS.md).
export { app } from "../js/comfyshim.js";
