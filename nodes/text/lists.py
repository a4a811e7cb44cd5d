"""ComfyUI's list nodes: build a list from several inputs, pick one item, merge text or image lists.

They take whole lists (``input_is_list``: every input, widgets included, arrives as the list of
items on its link; see ``engine/lists.py``) and CreateList and the merges return a list output
(``is_list``), so later nodes run once per item. CreateList's growable inputs are spelled as ComfyUI's
V3 autogrow spells them in API prompts and UI files (``inputs.input0``, ``inputs.input1``, ...).
"""

from __future__ import annotations

from typing import Any

from engine.context import NodeContext
from engine.node import Node
from engine.schema import ANY, IMAGE, INT, STRING, Input, NodeSchema, Output

LIST_SLOTS = 50  # inputs.input0 .. inputs.input49, at least one


class ListError(ValueError):
    """A list a node cannot use; the message names the input."""


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _first(value: Any) -> Any:
    items = _items(value)
    return items[0] if items else None


class CreateList(Node):
    SCHEMA = NodeSchema(
        node_id="CreateList",
        display_name="Create List",
        category="utils/list",
        description="Join the items of every connected input, in slot order, into one list.",
        inputs=tuple(
            Input(f"inputs.input{i}", ANY, f"Items #{i + 1} (all inputs of one type).", optional=i >= 1)
            for i in range(LIST_SLOTS)
        ),
        outputs=(Output("list", ANY, "Every item, in slot order.", is_list=True),),
        input_is_list=True,
    )

    def run(self, ctx: NodeContext, **inputs: Any) -> tuple[list[Any]]:
        joined: list[Any] = []
        for i in range(LIST_SLOTS):
            if f"inputs.input{i}" in inputs:
                joined.extend(_items(inputs[f"inputs.input{i}"]))
        if not joined:
            raise ListError("inputs: nothing to put in the list; connect at least one input with items")
        return (joined,)


class GetItemFromList(Node):
    SCHEMA = NodeSchema(
        node_id="GetItemFromList",
        display_name="Get Item from List",
        category="utils/list",
        description="The item at `index` (0 is the first; negative counts from the end).",
        inputs=(
            Input("list", ANY, "The list to pick from."),
            Input("index", INT, "The position of the item (0-based).", default=0),
        ),
        outputs=(Output("*", ANY, "The item."),),
        input_is_list=True,
    )

    def run(self, ctx: NodeContext, *, list: Any, index: Any) -> tuple[Any]:  # noqa: A002 - ComfyUI's name
        items = _items(list)
        position = _first(index)
        if not items:
            raise ListError("list: the list is empty; connect a list with at least one item")
        if not isinstance(position, int) or not -len(items) <= position < len(items):
            raise ListError(
                f"index: expected an integer from {-len(items)} to {len(items) - 1} "
                f"(the list has {len(items)} items), found {position!r}"
            )
        return (items[position],)


def _merged(name: str, value: Any) -> tuple[list[Any]]:
    items = _items(value)
    if not items:
        raise ListError(f"{name}: the list is empty; connect a node that gives at least one item")
    return (items,)


class MergeTextLists(Node):
    SCHEMA = NodeSchema(
        node_id="MergeTextLists",
        display_name="Merge Text Lists",
        category="utils/list",
        description="One list of every text given (superseded by Create List).",
        inputs=(Input("texts", STRING, "The texts to merge.", force_input=True),),
        outputs=(Output("texts", STRING, "The merged list.", is_list=True),),
        input_is_list=True,
        deprecated=True,
    )

    def run(self, ctx: NodeContext, *, texts: Any) -> tuple[list[Any]]:
        return _merged("texts", texts)


class MergeImageLists(Node):
    SCHEMA = NodeSchema(
        node_id="MergeImageLists",
        display_name="Merge Image Lists",
        category="utils/list",
        description="One list of every image given (superseded by Create List).",
        inputs=(Input("images", IMAGE, "The images to merge."),),
        outputs=(Output("images", IMAGE, "The merged list.", is_list=True),),
        input_is_list=True,
    )

    def run(self, ctx: NodeContext, *, images: Any) -> tuple[list[Any]]:
        return _merged("images", images)


NODES: list[type[Node]] = [CreateList, GetItemFromList, MergeTextLists, MergeImageLists]
