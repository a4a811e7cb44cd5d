"""A ComfyUI-style pack whose code tries to end the process or returns junk (issue 19).

Every node here is hostile on purpose: the engine must contain what they do and blame this pack."""

import sys

from server import PromptServer


class ExitInFunction:
    CATEGORY = "hostile"
    OUTPUT_NODE = True
    FUNCTION = "run"
    RETURN_TYPES = ("INT",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 0})}}

    def run(self, value):
        sys.exit(3)


class KeyboardInFunction:
    CATEGORY = "hostile"
    OUTPUT_NODE = True
    FUNCTION = "run"
    RETURN_TYPES = ("INT",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 0})}}

    def run(self, value):
        raise KeyboardInterrupt


class ExitInValidate:
    CATEGORY = "hostile"
    OUTPUT_NODE = True
    FUNCTION = "run"
    RETURN_TYPES = ("INT",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 0})}}

    @classmethod
    def VALIDATE_INPUTS(cls, value):
        sys.exit(0)

    def run(self, value):
        return (value,)


class ExitInIsChanged:
    CATEGORY = "hostile"
    OUTPUT_NODE = True
    FUNCTION = "run"
    RETURN_TYPES = ("INT",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 0})}}

    @classmethod
    def IS_CHANGED(cls, value):
        raise KeyboardInterrupt

    def run(self, value):
        return (value,)


class WrongImage:
    """Declares an IMAGE and returns a string."""

    CATEGORY = "hostile"
    FUNCTION = "run"
    RETURN_TYPES = ("IMAGE",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 0})}}

    def run(self, value):
        return ("not an image",)


class WrongInt:
    """Declares an INT and returns a float."""

    CATEGORY = "hostile"
    FUNCTION = "run"
    RETURN_TYPES = ("INT",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 0})}}

    def run(self, value):
        return (0.5,)


class WrongArity:
    """Declares two outputs and returns one."""

    CATEGORY = "hostile"
    FUNCTION = "run"
    RETURN_TYPES = ("INT", "INT")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 0})}}

    def run(self, value):
        return (value,)


class Stubborn:
    """Blocks until a file named ``release`` appears in the input folder, never checking for an
    interrupt (as a blocking plugin does)."""

    CATEGORY = "hostile"
    FUNCTION = "run"
    RETURN_TYPES = ()
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 0})}}

    def run(self, value):
        import os
        import time

        import folder_paths

        release = os.path.join(folder_paths.get_input_directory(), "release")
        while not os.path.exists(release):
            time.sleep(0.02)
        return {}


class Sink:
    """Takes anything and shows its type (so junk from a node upstream would be 'saved')."""

    CATEGORY = "hostile"
    FUNCTION = "run"
    RETURN_TYPES = ()
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("*",)}}

    def run(self, value):
        return {"ui": {"text": [type(value).__name__]}}


@PromptServer.instance.routes.get("/exit_nodes/exit")
async def exit_route(request):
    sys.exit(1)


NODE_CLASS_MAPPINGS = {
    "Hostile_ExitInFunction": ExitInFunction,
    "Hostile_KeyboardInFunction": KeyboardInFunction,
    "Hostile_ExitInValidate": ExitInValidate,
    "Hostile_ExitInIsChanged": ExitInIsChanged,
    "Hostile_WrongImage": WrongImage,
    "Hostile_WrongInt": WrongInt,
    "Hostile_WrongArity": WrongArity,
    "Hostile_Sink": Sink,
    "Hostile_Stubborn": Stubborn,
}
