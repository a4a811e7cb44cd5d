// A web extension file served under /extensions/comfy_web/hello.js
export const hello = "comfy_web";
