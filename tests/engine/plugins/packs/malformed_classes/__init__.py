"""A ComfyUI-style pack with one good class and several malformed ones."""


class Good:
    CATEGORY = "malformed"
    FUNCTION = "run"
    RETURN_TYPES = ("INT",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 5})}}

    def run(self, value):
        return (value,)


class MissingFunction:
    CATEGORY = "malformed"
    FUNCTION = "does_not_exist"
    RETURN_TYPES = ("INT",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}


class BadReturnNames:
    CATEGORY = "malformed"
    FUNCTION = "run"
    RETURN_TYPES = ("INT", "INT")
    RETURN_NAMES = ("only_one",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    def run(self):
        return (1, 2)


class RaisingInputTypes:
    CATEGORY = "malformed"
    FUNCTION = "run"
    RETURN_TYPES = ()

    @classmethod
    def INPUT_TYPES(cls):
        raise KeyError("missing_config")

    def run(self):
        return ()


NODE_CLASS_MAPPINGS = {
    "Malformed_Good": Good,
    "Malformed_MissingFunction": MissingFunction,
    "Malformed_BadReturnNames": BadReturnNames,
    "Malformed_RaisingInputTypes": RaisingInputTypes,
}
