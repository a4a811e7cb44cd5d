"""A single-file pack in Loom's native API, with one malformed class among good ones."""

from nodes.api import INT, Input, Node, NodeContext, NodeSchema, Output, PluginRegistrar


class AddOne(Node):
    SCHEMA = NodeSchema(
        node_id="NativeSingle_AddOne",
        display_name="Add One",
        category="native_single",
        description="Adds one to an integer.",
        inputs=(Input("value", INT, "The integer.", default=1, min=0, max=100),),
        outputs=(Output("value", INT, "The integer plus one."),),
    )

    def run(self, ctx: NodeContext, *, value: int) -> tuple[int]:
        return (value + 1,)


class NoDescription(Node):
    SCHEMA = NodeSchema(
        node_id="NativeSingle_NoDescription",
        display_name="Broken",
        category="native_single",
        description="A node whose input lacks a description.",
        inputs=(Input("value", INT, ""),),
        outputs=(Output("value", INT, "Unchanged."),),
    )

    def run(self, ctx: NodeContext, *, value: int) -> tuple[int]:
        return (value,)


def loom_register(plugin: PluginRegistrar) -> None:
    plugin.add_node(AddOne, NoDescription)
