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


NODE_CLASS_MAPPINGS = {"WebPack_Echo": Echo}
__all__ = ["NODE_CLASS_MAPPINGS", "WEB_DIRECTORY"]
