"""A ComfyUI-style output node that talks to the client through PromptServer."""

from aiohttp import web
from server import PromptServer


@PromptServer.instance.routes.get("/output_node_pack/ping")
async def ping(request):
    return web.json_response({"pong": True})


class ShowText:
    CATEGORY = "output_pack"
    FUNCTION = "show"
    RETURN_TYPES = ("STRING",)
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"forceInput": True})}, "hidden": {"node": "UNIQUE_ID"}}

    def show(self, text, node=None):
        PromptServer.instance.send_sync("output_pack.shown", {"node": node, "text": text})
        return {"ui": {"text": [text]}, "result": (text,)}


NODE_CLASS_MAPPINGS = {"OutputPack_ShowText": ShowText}
