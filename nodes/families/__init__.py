"""The model layer: each model family as a declaration (its own module here, over the bases in
``base``, ``unet_family`` and ``dit_family``), the component kinds it is made of (``components``),
and the catalog that finds them (``catalog``: detection, names, CLIP types, standalone files).
No Node classes live here; the family-specific ComfyUI nodes are in ``nodes.family_nodes``."""
