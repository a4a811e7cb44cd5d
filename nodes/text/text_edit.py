"""ComfyUI's newer text nodes: format strings, JSON extraction, replace, case, prefix/suffix, truncate,
and the seed node.

``JsonExtractString`` is forgiving as ComfyUI's is (LLM output often wraps JSON in prose or code
fences): it decodes the first JSON object found in the text and returns ``""`` when there is none or
the key is absent, logging which.
"""

from __future__ import annotations

import json
import logging
import string
from typing import Any

from engine.context import NodeContext
from engine.node import Node
from engine.schema import ANY, INT, STRING, Input, NodeSchema, Output

log = logging.getLogger(__name__)

LETTERS = string.ascii_lowercase
SEED_MAX = 2**63 - 1


class TextFormatError(ValueError):
    """A format string the String Format node cannot fill; the message names the placeholder."""


def _text(name: str, description: str, default: str | None = None, multiline: bool = True) -> Input:
    return Input(name, STRING, description, default=default, multiline=multiline)


_TEXT_OUT = (Output("text", STRING, "The resulting text."),)


class StringFormat(Node):
    SCHEMA = NodeSchema(
        node_id="StringFormat",
        display_name="String Format",
        category="utils/string",
        description="Fill `{a}`, `{b:.3f}`, ... in a format string with the inputs a, b, ... (`{{` for a brace).",
        inputs=(
            _text("f_string", "The format string with placeholders named by input letters.", default="{a}"),
            *(
                Input(
                    f"values.{letter}",
                    ANY,
                    f"The value for `{{{letter}}}`.",
                    optional=True,
                    display_name=letter,
                )
                for letter in LETTERS
            ),
        ),
        outputs=(Output("STRING", STRING, "The formatted text."),),
    )

    def run(self, ctx: NodeContext, *, f_string: str, **given: Any) -> tuple[str]:
        values = {letter: given[f"values.{letter}"] for letter in LETTERS if f"values.{letter}" in given}
        try:
            return (f_string.format(**values),)
        except KeyError as exc:
            connected = ", ".join(values) or "none"
            raise TextFormatError(
                f"String Format: the placeholder {{{exc.args[0]}}} has no input (connected: {connected}); "
                "connect that input or write {{ and }} for literal braces."
            ) from None
        except IndexError:
            raise TextFormatError(
                "String Format: positional placeholders such as {} or {0} are not supported; name them "
                "by input letter, e.g. {a}."
            ) from None
        except ValueError as exc:
            raise TextFormatError(
                f"String Format: {exc} in {f_string!r} (write {{{{ and }}}} for literal braces)."
            ) from None


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object that decodes from some ``{`` in ``text``, else None."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


class JsonExtractString(Node):
    SCHEMA = NodeSchema(
        node_id="JsonExtractString",
        display_name="Extract String from JSON",
        category="utils/string",
        description="The value of `key` in the first JSON object found in the text; empty when there is none.",
        inputs=(
            _text("json_string", "Text holding a JSON object (prose or code fences around it are skipped)."),
            _text("key", "The key whose value to extract.", multiline=False),
        ),
        outputs=(Output("STRING", STRING, "The value as text, or empty."),),
    )

    def run(self, ctx: NodeContext, *, json_string: str, key: str) -> tuple[str]:
        found = first_json_object(json_string)
        if found is None:
            log.warning("node %s: no JSON object in the text; output is empty", ctx.node_id)
            return ("",)
        if key not in found:
            log.warning(
                "node %s: the JSON object has no key %r (keys: %s); output is empty",
                ctx.node_id,
                key,
                ", ".join(found),
            )
            return ("",)
        value = found[key]
        if value is None:
            return ("",)
        if isinstance(value, str):
            return (value,)
        if isinstance(value, (dict, list)):
            return (json.dumps(value, ensure_ascii=False),)
        return (str(value),)


class ReplaceText(Node):
    SCHEMA = NodeSchema(
        node_id="ReplaceText",
        display_name="Replace Text",
        category="utils/string",
        description="Replace every occurrence of `find` with `replace`.",
        inputs=(
            _text("text", "The text to process."),
            _text("find", "Text to find.", default="", multiline=False),
            _text("replace", "Text to replace it with.", default="", multiline=False),
        ),
        outputs=_TEXT_OUT,
    )

    def run(self, ctx: NodeContext, *, text: str, find: str, replace: str) -> tuple[str]:
        return (text.replace(find, replace) if find else text,)


class TextToLowercase(Node):
    SCHEMA = NodeSchema(
        node_id="TextToLowercase",
        display_name="Text to Lowercase",
        category="utils/string",
        description="The text in lower case.",
        inputs=(_text("text", "The text."),),
        outputs=_TEXT_OUT,
    )

    def run(self, ctx: NodeContext, *, text: str) -> tuple[str]:
        return (text.lower(),)


class TextToUppercase(Node):
    SCHEMA = NodeSchema(
        node_id="TextToUppercase",
        display_name="Text to Uppercase",
        category="utils/string",
        description="The text in upper case.",
        inputs=(_text("text", "The text."),),
        outputs=_TEXT_OUT,
    )

    def run(self, ctx: NodeContext, *, text: str) -> tuple[str]:
        return (text.upper(),)


class AddTextPrefix(Node):
    SCHEMA = NodeSchema(
        node_id="AddTextPrefix",
        display_name="Add Text Prefix",
        category="utils/string",
        description="The prefix, then the text.",
        inputs=(
            _text("text", "The text."),
            Input("prefix", STRING, "Text to put in front.", default="", optional=True),
        ),
        outputs=_TEXT_OUT,
    )

    def run(self, ctx: NodeContext, *, text: str, prefix: str = "") -> tuple[str]:
        return (prefix + text,)


class AddTextSuffix(Node):
    SCHEMA = NodeSchema(
        node_id="AddTextSuffix",
        display_name="Add Text Suffix",
        category="utils/string",
        description="The text, then the suffix.",
        inputs=(
            _text("text", "The text."),
            Input("suffix", STRING, "Text to put after it.", default="", optional=True),
        ),
        outputs=_TEXT_OUT,
    )

    def run(self, ctx: NodeContext, *, text: str, suffix: str = "") -> tuple[str]:
        return (text + suffix,)


class TruncateText(Node):
    SCHEMA = NodeSchema(
        node_id="TruncateText",
        display_name="Truncate Text",
        category="utils/string",
        description="The first `max_length` characters of the text.",
        inputs=(
            _text("text", "The text."),
            Input("max_length", INT, "Characters to keep.", default=77, min=1, max=10000),
        ),
        outputs=(Output("string", STRING, "The text cut to length."),),
    )

    def run(self, ctx: NodeContext, *, text: str, max_length: int) -> tuple[str]:
        return (text[:max_length],)


class SeedNode(Node):
    SCHEMA = NodeSchema(
        node_id="SeedNode",
        display_name="Seed",
        category="utils/primitive",
        description="One seed value to feed several samplers.",
        inputs=(
            Input("seed", INT, "The seed.", default=0, min=0, max=SEED_MAX, control_after_generate=True),
        ),
        outputs=(Output("seed", INT, "The seed."),),
    )

    def run(self, ctx: NodeContext, *, seed: int) -> tuple[int]:
        return (seed,)


NODES = (
    StringFormat,
    JsonExtractString,
    ReplaceText,
    TextToLowercase,
    TextToUppercase,
    AddTextPrefix,
    AddTextSuffix,
    TruncateText,
    SeedNode,
)
