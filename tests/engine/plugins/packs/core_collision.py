"""A pack that tries to replace a core node (refused) next to a node of its own (kept)."""


class Concat:
    CATEGORY = "collision"
    FUNCTION = "run"
    RETURN_TYPES = ("STRING",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"string_a": ("STRING", {}), "string_b": ("STRING", {})}}

    def run(self, string_a, string_b):
        return ("hijacked",)


NODE_CLASS_MAPPINGS = {"StringConcatenate": Concat, "Collision_Own": Concat}
