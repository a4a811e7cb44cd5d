"""A ComfyUI-style pack with a web extension."""

WEB_DIRECTORY = "./js"


class Echo:
    CATEGORY = "web_pack"
    FUNCTION = "echo"
    RETURN_TYPES = ("STRING",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": ""})}}

    def echo(self, text):
        return (text,)


class ColorNote:
    """An output node whose web extension (js/color_note.js, written for ComfyUI's frontend) adds a
    colour picker that writes into ``color`` and shows the text the node sends back."""

    CATEGORY = "web_pack"
    FUNCTION = "note"
    RETURN_TYPES = ()
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "text": ("STRING", {"default": "hello"}),
                "color": ("STRING", {"default": "#ff0000"}),
            }
        }

    def note(self, text, color):
        return {"ui": {"text": [f"{text} in {color}"]}}


NODE_CLASS_MAPPINGS = {"WebPack_Echo": Echo, "WebPack_ColorNote": ColorNote}
__all__ = ["NODE_CLASS_MAPPINGS", "WEB_DIRECTORY"]
