"""A ComfyUI-style pack (V1 API) exercising every class attribute Loom maps."""


class TextRepeat:
    DESCRIPTION = "Repeats a text several times."
    CATEGORY = "text_tools/text"
    FUNCTION = "repeat"
    RETURN_TYPES = ("STRING", "INT")
    RETURN_NAMES = ("text", "length")
    OUTPUT_TOOLTIPS = ("The repeated text.", "Its length in characters.")
    EXPERIMENTAL = True

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "text": ("STRING", {"default": "ab", "multiline": True, "tooltip": "What to repeat."}),
                "times": ("INT", {"default": 2, "min": 1, "max": 10, "step": 1}),
                "mode": (["plain", "numbered"], {"default": "plain"}),
            },
            "optional": {
                "separator": ("STRING", {"default": "", "placeholder": "between copies"}),
                "scale": (
                    "FLOAT",
                    {"default": 1.0, "min": 0.0, "max": 2.0, "step": 0.1, "round": 0.01, "display": "slider"},
                ),
            },
            "hidden": {
                "prompt": "PROMPT",
                "unique_id": "UNIQUE_ID",
                "extra_pnginfo": "EXTRA_PNGINFO",
                "dynprompt": "DYNPROMPT",
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, times):
        return True if times != 7 else "7 is an unlucky number of repetitions"

    def repeat(
        self,
        text,
        times,
        mode,
        separator="",
        scale=1.0,
        prompt=None,
        unique_id=None,
        extra_pnginfo=None,
        dynprompt=None,
    ):
        self.last_hidden = {"prompt": prompt, "unique_id": unique_id, "extra_pnginfo": extra_pnginfo}
        parts = [f"{i + 1}:{text}" if mode == "numbered" else text for i in range(times)]
        out = separator.join(parts)
        return (out, len(out))


class LazySwitch:
    CATEGORY = "text_tools/logic"
    FUNCTION = "pick"
    RETURN_TYPES = ("STRING",)

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "choose_a": ("BOOLEAN", {"default": True}),
                "a": ("STRING", {"lazy": True, "forceInput": True}),
                "b": ("STRING", {"lazy": True, "forceInput": True}),
            }
        }

    def check_lazy_status(self, choose_a, a=None, b=None):
        wanted = "a" if choose_a else "b"
        return [wanted] if (a if choose_a else b) is None else []

    def pick(self, choose_a, a=None, b=None):
        return (a if choose_a else b,)


class OldUpper:
    CATEGORY = "text_tools/text"
    FUNCTION = "upper"
    RETURN_TYPES = ("STRING",)
    DEPRECATED = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "", "defaultInput": True})}}

    async def upper(self, text):  # ComfyUI allows async node functions
        return [text.upper()]


class RandomTag:
    CATEGORY = "text_tools/random"
    FUNCTION = "tag"
    RETURN_TYPES = ("STRING",)
    NOT_IDEMPOTENT = True

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "seed": (
                    "INT",
                    {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": True},
                )
            }
        }

    def tag(self, seed):
        return (f"tag-{seed % 97}",)


class SplitNumber:
    CATEGORY = "text_tools/math"
    FUNCTION = "split"
    RETURN_TYPES = ("INT", "INT")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 47}), "base": ("COMBO", {"options": [10, 16]})}}

    def split(self, value, base):
        return divmod(value, base)


NODE_CLASS_MAPPINGS = {
    "TextTools_Repeat": TextRepeat,
    "TextTools_LazySwitch": LazySwitch,
    "TextTools_OldUpper": OldUpper,
    "TextTools_RandomTag": RandomTag,
    "TextTools_SplitNumber": SplitNumber,
}
NODE_DISPLAY_NAME_MAPPINGS = {"TextTools_Repeat": "Repeat Text", "TextTools_LazySwitch": "Lazy Switch"}
