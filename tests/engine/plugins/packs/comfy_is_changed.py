"""A single-file ComfyUI-style pack with IS_CHANGED hooks."""

import hashlib
import os

import folder_paths


class FileText:
    CATEGORY = "is_changed"
    FUNCTION = "read"
    RETURN_TYPES = ("STRING",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "note.txt"})}}

    @classmethod
    def IS_CHANGED(cls, name):
        path = os.path.join(folder_paths.get_input_directory(), name)
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()

    def read(self, name):
        with open(os.path.join(folder_paths.get_input_directory(), name)) as f:
            return (f.read(),)


class Clock:
    CATEGORY = "is_changed"
    FUNCTION = "tick"
    RETURN_TYPES = ("INT",)
    count = 0

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    @classmethod
    def IS_CHANGED(cls):
        return float("NaN")

    def tick(self):
        Clock.count += 1
        return (Clock.count,)


NODE_CLASS_MAPPINGS = {"IsChanged_FileText": FileText, "IsChanged_Clock": Clock}
