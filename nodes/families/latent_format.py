"""LatentFormat: what a family's latent space is, for the sampler, previews and latent checks. Every
family's latent space is declared here, once (a family names the one it uses).

The VAE produces "raw" latents; the denoiser works on ``(raw - shift) * scale_factor`` (ComfyUI's
``LatentFormat.process_in``), and ``process_out`` is the inverse. Previews decode a latent either
with a small linear map (``rgb_factors``: one RGB row per latent channel, plus ``rgb_bias``) or
with the family's TAESD decoder (``taesd_decoder``: the file stem ComfyUI uses in
``models/vae_approx``). The numbers are ComfyUI's (``comfy/latent_formats.py``): ``SD15_LATENT``
(SD1.x, SD2.x), ``SDXL_LATENT``, ``FLUX_LATENT`` (Flux.1, Chroma, Z-Image), ``SD3_LATENT``,
``FLUX2_LATENT`` (128 channels: the 32-channel VAE latent in 2×2 patches), ``WAN21_LATENT``
(Wan 2.1, Qwen-Image: normalised per channel, :class:`ChannelLatentFormat`; ``WAN21_VIDEO_LATENT`` is the
same space for Wan 2.1's video latents) and ``WAN22_LATENT`` (the 48-channel Wan 2.2 VAE's, TI2V-5B). The
Wan latents are video latents [B, C, T, h, w]; previews show their first frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

RGB = tuple[float, float, float]


@dataclass(frozen=True)
class LatentFormat:
    """One family's latent space (see the module docstring)."""

    channels: int
    scale_factor: float
    shift: float = 0.0
    rgb_factors: tuple[RGB, ...] = ()
    rgb_bias: RGB = (0.0, 0.0, 0.0)
    taesd_decoder: str | None = None
    empty_node: str = "EmptyLatentImage"  # ComfyUI's node that makes empty latents of this space
    downscale: int = 8  # image pixels per latent cell (ComfyUI's spacial_downscale_ratio)

    def process_in(self, latent: Tensor) -> Tensor:
        """VAE latent -> model space: ``(latent - shift) * scale_factor``."""
        if self.shift:
            latent = latent - self.shift
        return latent * self.scale_factor

    def process_out(self, latent: Tensor) -> Tensor:
        """Model space -> VAE latent: ``latent / scale_factor + shift``."""
        out = latent / self.scale_factor
        return out + self.shift if self.shift else out

    @property
    def tag(self) -> str:
        """What a latent made in this space is tagged with (``latent_space``): channels and scale."""
        return f"{self.channels}x{self.scale_factor}"


SD15_LATENT = LatentFormat(
    channels=4,
    scale_factor=0.18215,
    rgb_factors=(
        (0.3512, 0.2297, 0.3227),
        (0.3250, 0.4974, 0.2350),
        (-0.2829, 0.1762, 0.2721),
        (-0.2120, -0.2616, -0.7177),
    ),
    taesd_decoder="taesd_decoder",
)

SDXL_LATENT = LatentFormat(
    channels=4,
    scale_factor=0.13025,
    rgb_factors=(
        (0.3651, 0.4232, 0.4341),
        (-0.2533, -0.0042, 0.1068),
        (0.1076, 0.1111, -0.0362),
        (-0.3165, -0.2492, -0.2188),
    ),
    rgb_bias=(0.1084, -0.0175, -0.0011),
    taesd_decoder="taesdxl_decoder",
)

FLUX_LATENT = LatentFormat(
    channels=16,
    scale_factor=0.3611,
    shift=0.1159,
    rgb_factors=(
        (-0.0346, 0.0244, 0.0681),
        (0.0034, 0.0210, 0.0687),
        (0.0275, -0.0668, -0.0433),
        (-0.0174, 0.0160, 0.0617),
        (0.0859, 0.0721, 0.0329),
        (0.0004, 0.0383, 0.0115),
        (0.0405, 0.0861, 0.0915),
        (-0.0236, -0.0185, -0.0259),
        (-0.0245, 0.0250, 0.1180),
        (0.1008, 0.0755, -0.0421),
        (-0.0515, 0.0201, 0.0011),
        (0.0428, -0.0012, -0.0036),
        (0.0817, 0.0765, 0.0749),
        (-0.1264, -0.0522, -0.1103),
        (-0.0280, -0.0881, -0.0499),
        (-0.1262, -0.0982, -0.0778),
    ),
    rgb_bias=(-0.0329, -0.0718, -0.0851),
    taesd_decoder="taef1_decoder",
    empty_node="EmptySD3LatentImage",
)

SD3_LATENT = LatentFormat(
    channels=16,
    scale_factor=1.5305,
    shift=0.0609,
    rgb_factors=(
        (-0.0922, -0.0175, 0.0749),
        (0.0311, 0.0633, 0.0954),
        (0.1994, 0.0927, 0.0458),
        (0.0856, 0.0339, 0.0902),
        (0.0587, 0.0272, -0.0496),
        (-0.0006, 0.1104, 0.0309),
        (0.0978, 0.0306, 0.0427),
        (-0.0042, 0.1038, 0.1358),
        (-0.0194, 0.0020, 0.0669),
        (-0.0488, 0.0130, -0.0268),
        (0.0922, 0.0988, 0.0951),
        (-0.0278, 0.0524, -0.0542),
        (0.0332, 0.0456, 0.0895),
        (-0.0069, -0.0030, -0.0810),
        (-0.0596, -0.0465, -0.0293),
        (-0.1448, -0.1463, -0.1189),
    ),
    rgb_bias=(0.2394, 0.2135, 0.1925),
    taesd_decoder="taesd3_decoder",
)

FLUX2_VAE_RGB = (  # ComfyUI's latent->RGB rows for the 32 VAE channels (comfy/latent_formats.py, Flux2)
    (0.0058, 0.0113, 0.0073),
    (0.0495, 0.0443, 0.0836),
    (-0.0099, 0.0096, 0.0644),
    (0.2144, 0.3009, 0.3652),
    (0.0166, -0.0039, -0.0054),
    (0.0157, 0.0103, -0.0160),
    (-0.0398, 0.0902, -0.0235),
    (-0.0052, 0.0095, 0.0109),
    (-0.3527, -0.2712, -0.1666),
    (-0.0301, -0.0356, -0.0180),
    (-0.0107, 0.0078, 0.0013),
    (0.0746, 0.0090, -0.0941),
    (0.0156, 0.0169, 0.0070),
    (-0.0034, -0.0040, -0.0114),
    (0.0032, 0.0181, 0.0080),
    (-0.0939, -0.0008, 0.0186),
    (0.0018, 0.0043, 0.0104),
    (0.0284, 0.0056, -0.0127),
    (-0.0024, -0.0022, -0.0030),
    (0.1207, -0.0026, 0.0065),
    (0.0128, 0.0101, 0.0142),
    (0.0137, -0.0072, -0.0007),
    (0.0095, 0.0092, -0.0059),
    (0.0000, -0.0077, -0.0049),
    (-0.0465, -0.0204, -0.0312),
    (0.0095, 0.0012, -0.0066),
    (0.0290, -0.0034, 0.0025),
    (0.0220, 0.0169, -0.0048),
    (-0.0332, -0.0457, -0.0468),
    (-0.0085, 0.0389, 0.0609),
    (-0.0076, 0.0003, -0.0043),
    (-0.0111, -0.0460, -0.0614),
)
# ComfyUI un-patchifies the 128 channels to 32 at twice the size before the map; Loom's linear preview works per
# latent pixel, so each VAE channel's row serves its 4 patch channels at a quarter weight (the 2x2 average).
FLUX2_LATENT = LatentFormat(
    channels=128,
    scale_factor=1.0,
    downscale=16,
    rgb_factors=tuple((r / 4, g / 4, b / 4) for r, g, b in FLUX2_VAE_RGB for _ in range(4)),
    rgb_bias=(-0.0329, -0.0718, -0.0851),
    empty_node="EmptyFlux2LatentImage",
)

# The Wan 2.1 latent space (Qwen-Image's): the per-channel statistics are the model's constants, not in
# the VAE file (ComfyUI's latent_formats.Wan21; diffusers keeps them in the VAE config).
WAN21_LATENTS_MEAN = (
    -0.7571,
    -0.7089,
    -0.9113,
    0.1075,
    -0.1745,
    0.9653,
    -0.1517,
    1.5508,
    0.4134,
    -0.0715,
    0.5517,
    -0.3632,
    -0.1922,
    -0.9497,
    0.2503,
    -0.2921,
)
WAN21_LATENTS_STD = (
    2.8184,
    1.4541,
    2.3275,
    2.6558,
    1.2196,
    1.7708,
    2.6052,
    2.0743,
    3.2687,
    2.1526,
    2.8652,
    1.5579,
    1.6382,
    1.1253,
    2.8251,
    1.9160,
)


@dataclass(frozen=True)
class ChannelLatentFormat(LatentFormat):
    """A latent space normalised per channel: model space = (latent − mean) · scale_factor / std."""

    mean: tuple[float, ...] = field(default=())
    std: tuple[float, ...] = field(default=())
    stats: str = "wan21"  # which statistics (part of the tag)

    def _stats(self, latent: Tensor) -> tuple[Tensor, Tensor]:
        import torch  # lazy: torch-heavy, only when a latent is processed

        view = (1, self.channels, *([1] * (latent.ndim - 2)))
        mean = torch.tensor(self.mean, dtype=latent.dtype, device=latent.device).view(view)
        std = torch.tensor(self.std, dtype=latent.dtype, device=latent.device).view(view)
        return mean, std

    def process_in(self, latent: Tensor) -> Tensor:
        mean, std = self._stats(latent)
        return (latent - mean) * self.scale_factor / std

    def process_out(self, latent: Tensor) -> Tensor:
        mean, std = self._stats(latent)
        return latent * std / self.scale_factor + mean

    @property
    def tag(self) -> str:
        return f"{self.channels}x{self.scale_factor}/{self.stats}"


WAN21_LATENT = ChannelLatentFormat(
    channels=16,
    scale_factor=1.0,
    rgb_factors=(
        (-0.1299, -0.1692, 0.2932),
        (0.0671, 0.0406, 0.0442),
        (0.3568, 0.2548, 0.1747),
        (0.0372, 0.2344, 0.1420),
        (0.0313, 0.0189, -0.0328),
        (0.0296, -0.0956, -0.0665),
        (-0.3477, -0.4059, -0.2925),
        (0.0166, 0.1902, 0.1975),
        (-0.0412, 0.0267, -0.1364),
        (-0.1293, 0.0740, 0.1636),
        (0.0680, 0.3019, 0.1128),
        (0.0032, 0.0581, 0.0639),
        (-0.1251, 0.0927, 0.1699),
        (0.0060, -0.0633, 0.0005),
        (0.3477, 0.2275, 0.2950),
        (0.1984, 0.0913, 0.1861),
    ),
    rgb_bias=(-0.1835, -0.0868, -0.3360),
    mean=WAN21_LATENTS_MEAN,
    std=WAN21_LATENTS_STD,
)

# The Wan 2.2 VAE's latent space (TI2V-5B; ComfyUI's latent_formats.Wan22): 48 channels, 1/16 in space.
# fmt: off
WAN22_LATENTS_MEAN = (
-0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
-0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
-0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
-0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
-0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
)
WAN22_LATENTS_STD = (
0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
)
WAN22_LATENT = ChannelLatentFormat(
    channels=48,
    scale_factor=1.0,
    downscale=16,
    rgb_factors=(
(0.0119, 0.0103, 0.0046), (-0.1062, -0.0504, 0.0165), (0.0140, 0.0409, 0.0491), (-0.0813, -0.0677, 0.0607),
(0.0656, 0.0851, 0.0808), (0.0264, 0.0463, 0.0912), (0.0295, 0.0326, 0.0590), (-0.0244, -0.0270, 0.0025),
(0.0443, -0.0102, 0.0288), (-0.0465, -0.0090, -0.0205), (0.0359, 0.0236, 0.0082), (-0.0776, 0.0854, 0.1048),
(0.0564, 0.0264, 0.0561), (0.0006, 0.0594, 0.0418), (-0.0319, -0.0542, -0.0637), (-0.0268, 0.0024, 0.0260),
(0.0539, 0.0265, 0.0358), (-0.0359, -0.0312, -0.0287), (-0.0285, -0.1032, -0.1237), (0.1041, 0.0537, 0.0622),
(-0.0086, -0.0374, -0.0051), (0.0390, 0.0670, 0.2863), (0.0069, 0.0144, 0.0082), (0.0006, -0.0167, 0.0079),
(0.0313, -0.0574, -0.0232), (-0.1454, -0.0902, -0.0481), (0.0714, 0.0827, 0.0447), (-0.0304, -0.0574, -0.0196),
(0.0401, 0.0384, 0.0204), (-0.0758, -0.0297, -0.0014), (0.0568, 0.1307, 0.1372), (-0.0055, -0.0310, -0.0380),
(0.0239, -0.0305, 0.0325), (-0.0663, -0.0673, -0.0140), (-0.0416, -0.0047, -0.0023), (0.0166, 0.0112, -0.0093),
(-0.0211, 0.0011, 0.0331), (0.1833, 0.1466, 0.2250), (-0.0368, 0.0370, 0.0295), (-0.3441, -0.3543, -0.2008),
(-0.0479, -0.0489, -0.0420), (-0.0660, -0.0153, 0.0800), (-0.0101, 0.0068, 0.0156), (-0.0690, -0.0452, -0.0927),
(-0.0145, 0.0041, 0.0015), (0.0421, 0.0451, 0.0373), (0.0504, -0.0483, -0.0356), (-0.0837, 0.0168, 0.0055),
    ),
    rgb_bias=(0.0317, -0.0878, -0.1388),
    mean=WAN22_LATENTS_MEAN,
    std=WAN22_LATENTS_STD,
    stats="wan22",
)
# fmt: on
# Wan 2.1's own models sample videos in the same space: 5-D latents (B, 16, frames, H/8, W/8), made by
# ComfyUI's EmptyHunyuanLatentVideo.
WAN21_VIDEO_LATENT = replace(WAN21_LATENT, empty_node="EmptyHunyuanLatentVideo")

# ComfyUI's .latent files written before "latent_format_version_0" hold latents multiplied by SD1's
# scale; LoadLatent divides them back (comfy's nodes.py LoadLatent). A file-format fact kept here
# because it is a family's number.
LEGACY_LATENT_FILE_SCALE = SD15_LATENT.scale_factor
