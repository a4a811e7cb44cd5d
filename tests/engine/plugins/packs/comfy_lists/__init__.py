"""ComfyUI list semantics: OUTPUT_IS_LIST and INPUT_IS_LIST."""


class SplitWords:
    CATEGORY = "lists"
    FUNCTION = "split"
    RETURN_TYPES = ("STRING",)
    OUTPUT_IS_LIST = (True,)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "a b c"})}}

    def split(self, text):
        return (text.split(),)


class JoinWords:
    CATEGORY = "lists"
    FUNCTION = "join"
    RETURN_TYPES = ("STRING",)
    INPUT_IS_LIST = True

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {"words": ("STRING", {"forceInput": True}), "separator": ("STRING", {"default": "+"})}
        }

    def join(self, words, separator):
        return (separator[0].join(words),)


NODE_CLASS_MAPPINGS = {"Lists_SplitWords": SplitWords, "Lists_JoinWords": JoinWords}
