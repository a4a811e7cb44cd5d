"""A pack in ComfyUI's newer API: comfy_entrypoint() and define_schema()/execute() classes."""

from comfy_api.latest import ComfyExtension, io, ui


class MultiplyInt(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="V3Pack_Multiply",
            display_name="Multiply (V3)",
            category="v3_pack/math",
            description="Multiplies two integers.",
            inputs=[
                io.Int.Input("a", default=3, min=0, max=100, tooltip="First factor."),
                io.Int.Input("b", default=4, min=0, max=100),
                io.Combo.Input("mode", options=["plain", "negated"], default="plain"),
            ],
            outputs=[io.Int.Output(display_name="product", tooltip="a times b")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, a, b, mode):
        value = a * b if mode == "plain" else -a * b
        return io.NodeOutput(value, ui=ui.PreviewText(f"{cls.hidden.unique_id}: {value}"))

    @classmethod
    def validate_inputs(cls, a, b, mode):
        return True if a != 13 else "a must not be 13"


class ShowInt(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="V3Pack_Show",
            category="v3_pack/output",
            inputs=[io.Int.Input("value", force_input=True)],
            outputs=[],
            is_output_node=True,
        )

    @classmethod
    async def execute(cls, value):
        return io.NodeOutput(ui={"text": [str(value)], "had_prompt": [cls.hidden.prompt is not None]})

    @classmethod
    def fingerprint_inputs(cls, value):
        return float("nan")


class PackExtension(ComfyExtension):
    async def get_node_list(self):
        return [MultiplyInt, ShowInt]


async def comfy_entrypoint():
    return PackExtension()
