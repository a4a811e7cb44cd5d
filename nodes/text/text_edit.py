"""ComfyUI's newer text nodes: format, JSON extraction, replace, case, prefix/suffix, strip,
truncate, and JSON conversion of arrays and dictionaries.

StringFormat's growable values are declared as ComfyUI's V3 Autogrow inputs appear in API prompts
and UI files (``values.a`` .. ``values.z``). JsonExtractString keeps ComfyUI's forgiving behaviour:
no JSON object, a missing key or a null value give an empty string; other values come out as
JSON text (so an extracted object can be read by a second JsonExtractString).
"""

from __future__ import annotations

import json
import string as string_module
from typing import Any

from engine.context import NodeContext
from engine.node import Node
from engine.schema import ANY, INT, STRING, Input, NodeSchema, Output
from nodes.text.math_logic import LETTERS

_TEXT_OUT = (Output("text", STRING, "The resulting text."),)


class TextFormatError(ValueError):
    """A format string the values cannot fill; the message names the placeholder."""


def _text(name: str = "text", description: str = "The text to process.", **options: Any) -> Input:
    return Input(name, STRING, description, **({"multiline": True} | options))


class StringFormat(Node):
    SCHEMA = NodeSchema(
        node_id="StringFormat",
        display_name="Format Text",
        category="utils/string",
        description="Fill a Python format string ('{a} x {b}') from the values a, b, c, ...",
        inputs=(
            _text("f_string", "The template with {a}, {b}, ... placeholders.", default="{a}"),
            *(Input(f"values.{n}", ANY, f"The value for {{{n}}}.", optional=True) for n in LETTERS),
        ),
        outputs=(Output("STRING", STRING, "The formatted text."),),
    )

    def run(self, ctx: NodeContext, *, f_string: str, **values: Any) -> tuple[str]:
        named = {k.removeprefix("values."): v for k, v in values.items()}
        try:
            return (f_string.format(**named),)
        except KeyError as exc:
            given = ", ".join(sorted(named)) or "none"
            raise TextFormatError(
                f"f_string: placeholder {{{exc.args[0]}}} has no value (connected: {given}); "
                "connect a value for it or remove the placeholder"
            ) from exc
        except (IndexError, ValueError) as exc:
            raise TextFormatError(
                f"f_string {f_string!r}: {exc}; use named placeholders such as {{a}} (write {{{{ for a literal brace)"
            ) from exc


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text``, trying each '{' in turn (prose and code fences skipped)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


class JsonExtractString(Node):
    SCHEMA = NodeSchema(
        node_id="JsonExtractString",
        display_name="Extract Text from JSON",
        category="utils/string",
        description="The value of `key` in the first JSON object of the text, as text ('' if absent).",
        inputs=(
            _text("json_string", "Text holding a JSON object (prose and code fences are skipped)."),
            Input("key", STRING, "The key whose value to extract."),
        ),
        outputs=(Output("STRING", STRING, "The value as text, or '' when missing."),),
    )

    def run(self, ctx: NodeContext, *, json_string: str, key: str) -> tuple[str]:
        data = first_json_object(json_string)
        value = None if data is None else data.get(key)
        if value is None:
            return ("",)
        # objects and arrays as JSON text, so a second JsonExtractString can read them
        return (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False),)


class ReplaceText(Node):
    SCHEMA = NodeSchema(
        node_id="ReplaceText",
        display_name="Replace Text",
        category="utils/string",
        description="Replace every occurrence of `find` with `replace`.",
        inputs=(
            _text(),
            _text("find", "Text to find.", default=""),
            _text("replace", "Its replacement.", default=""),
        ),
        outputs=_TEXT_OUT,
    )

    def run(self, ctx: NodeContext, *, text: str, find: str, replace: str) -> tuple[str]:
        return (text.replace(find, replace),)


class TextToLowercase(Node):
    SCHEMA = NodeSchema(
        node_id="TextToLowercase",
        display_name="Text to Lowercase",
        category="utils/string",
        description="The text in lowercase.",
        inputs=(_text(),),
        outputs=_TEXT_OUT,
    )

    def run(self, ctx: NodeContext, *, text: str) -> tuple[str]:
        return (text.lower(),)


class TextToUppercase(Node):
    SCHEMA = NodeSchema(
        node_id="TextToUppercase",
        display_name="Text to Uppercase",
        category="utils/string",
        description="The text in uppercase.",
        inputs=(_text(),),
        outputs=_TEXT_OUT,
    )

    def run(self, ctx: NodeContext, *, text: str) -> tuple[str]:
        return (text.upper(),)


class AddTextPrefix(Node):
    SCHEMA = NodeSchema(
        node_id="AddTextPrefix",
        display_name="Add Text Prefix",
        category="utils/string",
        description="The prefix followed by the text.",
        inputs=(_text(), _text("prefix", "Text to put in front.", default="", optional=True)),
        outputs=_TEXT_OUT,
    )

    def run(self, ctx: NodeContext, *, text: str, prefix: str = "") -> tuple[str]:
        return (prefix + text,)


class AddTextSuffix(Node):
    SCHEMA = NodeSchema(
        node_id="AddTextSuffix",
        display_name="Add Text Suffix",
        category="utils/string",
        description="The text followed by the suffix.",
        inputs=(_text(), _text("suffix", "Text to append.", default="", optional=True)),
        outputs=_TEXT_OUT,
    )

    def run(self, ctx: NodeContext, *, text: str, suffix: str = "") -> tuple[str]:
        return (text + suffix,)


class StripWhitespace(Node):
    SCHEMA = NodeSchema(
        node_id="StripWhitespace",
        display_name="Strip Whitespace",
        category="utils/string",
        description="The text without leading and trailing whitespace.",
        inputs=(_text(),),
        outputs=_TEXT_OUT,
    )

    def run(self, ctx: NodeContext, *, text: str) -> tuple[str]:
        return (text.strip(string_module.whitespace),)


class TruncateText(Node):
    SCHEMA = NodeSchema(
        node_id="TruncateText",
        display_name="Truncate Text",
        category="utils/string",
        description="The first `max_length` characters of the text.",
        inputs=(
            _text(),
            Input("max_length", INT, "Maximum text length in characters.", default=77, min=1, max=10000),
        ),
        outputs=(Output("string", STRING, "The truncated text."),),
    )

    def run(self, ctx: NodeContext, *, text: str, max_length: int) -> tuple[str]:
        return (text[:max_length],)


def _to_json(value: Any, indent: int, expected: type, name: str) -> str:
    if not isinstance(value, expected):
        raise TypeError(f"{name}: expected a {expected.__name__}, found {type(value).__name__}")
    try:
        return json.dumps(value, indent=indent or None, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}: holds a value JSON cannot write ({exc})") from exc


def _indent_input() -> Input:
    return Input(
        "indent",
        INT,
        "Spaces per indent level; 0 gives one compact line.",
        default=2,
        min=0,
        max=8,
        optional=True,
    )


class ConvertArrayToString(Node):
    SCHEMA = NodeSchema(
        node_id="ConvertArrayToString",
        display_name="Convert Array to String",
        category="utils/string",
        description="The array written as JSON text.",
        inputs=(Input("array", "ARRAY", "The array to convert."), _indent_input()),
        outputs=(Output("STRING", STRING, "The array as JSON."),),
    )

    def run(self, ctx: NodeContext, *, array: Any, indent: int = 2) -> tuple[str]:
        return (_to_json(list(array) if isinstance(array, tuple) else array, indent, list, "array"),)


class ConvertDictionaryToString(Node):
    SCHEMA = NodeSchema(
        node_id="ConvertDictionaryToString",
        display_name="Convert Dictionary to String",
        category="utils/string",
        description="The dictionary written as JSON text.",
        inputs=(Input("dictionary", "DICT", "The dictionary to convert."), _indent_input()),
        outputs=(Output("STRING", STRING, "The dictionary as JSON."),),
    )

    def run(self, ctx: NodeContext, *, dictionary: Any, indent: int = 2) -> tuple[str]:
        return (_to_json(dictionary, indent, dict, "dictionary"),)


NODES: list[type[Node]] = [
    StringFormat,
    JsonExtractString,
    ReplaceText,
    TextToLowercase,
    TextToUppercase,
    AddTextPrefix,
    AddTextSuffix,
    StripWhitespace,
    TruncateText,
    ConvertArrayToString,
    ConvertDictionaryToString,
]
