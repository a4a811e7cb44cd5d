"""A ComfyUI-style pack that uses folder_paths at import time and while running."""

import os

import folder_paths

folder_paths.add_model_folder_path("folder_tools_presets", os.path.join(folder_paths.models_dir, "presets"))


class PickCheckpoint:
    CATEGORY = "folder_tools"
    FUNCTION = "pick"
    RETURN_TYPES = ("STRING", "STRING")
    RETURN_NAMES = ("name", "full_path")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"ckpt_name": (folder_paths.get_filename_list("checkpoints"),)}}

    def pick(self, ckpt_name):
        return (ckpt_name, folder_paths.get_full_path_or_raise("checkpoints", ckpt_name))


class SaveNote:
    CATEGORY = "folder_tools"
    FUNCTION = "save"
    RETURN_TYPES = ()
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "text": ("STRING", {"default": "hello"}),
                "filename_prefix": ("STRING", {"default": "notes/note"}),
            }
        }

    def save(self, text, filename_prefix):
        import folder_paths as fp  # a lazy import at run time must see the shim too

        folder, name, counter, subfolder, _ = fp.get_save_image_path(
            filename_prefix, fp.get_output_directory()
        )
        os.makedirs(folder, exist_ok=True)
        filename = f"{name}_{counter:05}_.txt"
        with open(os.path.join(folder, filename), "w") as f:
            f.write(text)
        return {"ui": {"files": [{"filename": filename, "subfolder": subfolder, "type": "output"}]}}


NODE_CLASS_MAPPINGS = {"FolderTools_PickCheckpoint": PickCheckpoint, "FolderTools_SaveNote": SaveNote}
