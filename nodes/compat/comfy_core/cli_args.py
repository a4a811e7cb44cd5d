"""Stand-in for ComfyUI's ``comfy.cli_args``: ``args`` with ComfyUI's option names at the values a
default ComfyUI start has, which is how Loom's plugin packs should read them (Loom's own command line
is not ComfyUI's; packs only branch on these). Each pack gets a fresh ``args`` namespace."""

from __future__ import annotations

import enum
from types import SimpleNamespace


class LatentPreviewMethod(enum.Enum):
    NoPreviews = "none"
    Auto = "auto"
    Latent2RGB = "latent2rgb"
    TAESD = "taesd"


def default_args() -> SimpleNamespace:
    """A namespace with ComfyUI's command-line options at their defaults."""
    return SimpleNamespace(
        listen="127.0.0.1",
        port=8188,
        enable_cors_header=None,
        max_upload_size=100,
        base_directory=None,
        extra_model_paths_config=None,
        output_directory=None,
        temp_directory=None,
        input_directory=None,
        user_directory=None,
        auto_launch=False,
        disable_auto_launch=False,
        cuda_device=None,
        cuda_malloc=False,
        disable_cuda_malloc=False,
        force_fp32=False,
        force_fp16=False,
        fp32_unet=False,
        fp64_unet=False,
        bf16_unet=False,
        fp16_unet=False,
        fp8_e4m3fn_unet=False,
        fp8_e5m2_unet=False,
        fp16_vae=False,
        fp32_vae=False,
        bf16_vae=False,
        cpu_vae=False,
        fp8_e4m3fn_text_enc=False,
        fp8_e5m2_text_enc=False,
        fp16_text_enc=False,
        fp32_text_enc=False,
        force_channels_last=False,
        directml=None,
        disable_ipex_optimize=False,
        preview_method=LatentPreviewMethod.NoPreviews,
        preview_size=512,
        cache_classic=False,
        cache_lru=0,
        cache_none=False,
        use_split_cross_attention=False,
        use_quad_cross_attention=False,
        use_pytorch_cross_attention=False,
        use_sage_attention=False,
        use_flash_attention=False,
        disable_xformers=True,
        force_upcast_attention=False,
        dont_upcast_attention=False,
        gpu_only=False,
        highvram=False,
        normalvram=False,
        lowvram=False,
        novram=False,
        cpu=False,
        reserve_vram=None,
        default_hashing_function="sha256",
        disable_smart_memory=False,
        deterministic=False,
        fast=set(),
        dont_print_server=False,
        quick_test_for_ci=False,
        windows_standalone_build=False,
        disable_metadata=False,
        disable_all_custom_nodes=False,
        multi_user=False,
        verbose="INFO",
        log_stdout=False,
        front_end_version="comfyanonymous/ComfyUI@latest",
        front_end_root=None,
        user_directory_default=None,
        enable_compress_response_body=False,
    )
