// ComfyUI's `scripts/api.js` for frontend extensions written for ComfyUI: Loom's shim (the subset
// documented in web/EXTENSIONS.md).
export { api } from "../js/comfyshim.js";
