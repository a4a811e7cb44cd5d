"""The text station: primitives, string and logic nodes."""

# The modules of this station that declare nodes (each has ``NODES``), in registration order.
NODE_MODULES: tuple[str, ...] = (
    "primitives",
    "strings",
    "math_logic",
    "text_edit",
    "lists",
    "values",
    "save_text",
)
