"""ComfyUI's text and logic nodes: string edits, comparisons, regular expressions, the lazy
If/Else switch and the custom combo.

Behaviour is ComfyUI's, including its forgiving parts: RegexMatch and RegexExtract treat an
invalid pattern as "no match"; RegexReplace reports it (naming the input), as ComfyUI fails there.
"""

from __future__ import annotations

import re
from typing import Any

from engine.context import NodeContext
from engine.node import NativeNodeDef, Node
from engine.schema import ANY, BOOLEAN, COMBO, INT, STRING, Input, NodeSchema, Output

_ADVANCED = {"advanced": True}


class TextError(ValueError):
    """Text input a node cannot use; the message names the input."""


def _text(name: str, description: str = "The text.") -> Input:
    return Input(name, STRING, description, multiline=True)


def _flag(name: str, description: str, default: bool, optional: bool = False) -> Input:
    return Input(name, BOOLEAN, description, default=default, optional=optional, extra=_ADVANCED)


def _flags(case_insensitive: bool, multiline: bool, dotall: bool) -> int:
    return (
        (re.IGNORECASE if case_insensitive else 0)
        | (re.MULTILINE if multiline else 0)
        | (re.DOTALL if dotall else 0)
    )


_STRING_OUT = (Output("STRING", STRING, "The resulting text."),)
_REGEX_FLAGS = (
    _flag("case_insensitive", "Ignore letter case.", True),
    _flag("multiline", "^ and $ match at every line.", False),
    _flag("dotall", ". also matches newlines.", False),
)


class StringReplace(Node):
    SCHEMA = NodeSchema(
        node_id="StringReplace",
        display_name="Replace Text",
        category="utils/string",
        description="Replace every occurrence of `find` with `replace`.",
        inputs=(_text("string"), _text("find", "The text to find."), _text("replace", "Its replacement.")),
        outputs=_STRING_OUT,
    )

    def run(self, ctx: NodeContext, *, string: str, find: str, replace: str) -> tuple[str]:
        return (string.replace(find, replace),)


class StringSubstring(Node):
    SCHEMA = NodeSchema(
        node_id="StringSubstring",
        display_name="Substring",
        category="utils/string",
        description="Characters start..end (Python slice: end excluded, negative counts from the end).",
        inputs=(
            _text("string"),
            Input("start", INT, "First character (0-based)."),
            Input("end", INT, "End (excluded)."),
        ),
        outputs=_STRING_OUT,
    )

    def run(self, ctx: NodeContext, *, string: str, start: int, end: int) -> tuple[str]:
        return (string[start:end],)


class StringTrim(Node):
    SCHEMA = NodeSchema(
        node_id="StringTrim",
        display_name="Trim Text",
        category="utils/string",
        description="Remove whitespace at both ends, the left or the right.",
        inputs=(_text("string"), Input("mode", COMBO, "Which ends.", options=("Both", "Left", "Right"))),
        outputs=_STRING_OUT,
    )

    def run(self, ctx: NodeContext, *, string: str, mode: str) -> tuple[str]:
        trim = {"Both": str.strip, "Left": str.lstrip, "Right": str.rstrip}.get(mode)
        return (trim(string) if trim else string,)


class StringLength(Node):
    SCHEMA = NodeSchema(
        node_id="StringLength",
        display_name="Text Length",
        category="utils/string",
        description="The number of characters.",
        inputs=(_text("string"),),
        outputs=(Output("length", INT, "The number of characters."),),
    )

    def run(self, ctx: NodeContext, *, string: str) -> tuple[int]:
        return (len(string),)


class StringContains(Node):
    SCHEMA = NodeSchema(
        node_id="StringContains",
        display_name="Contains Text",
        category="utils/string",
        description="Whether `substring` occurs in the text.",
        inputs=(
            _text("string"),
            _text("substring", "The text to look for."),
            _flag("case_sensitive", "Letter case matters.", True),
        ),
        outputs=(Output("contains", BOOLEAN, "True if found."),),
    )

    def run(self, ctx: NodeContext, *, string: str, substring: str, case_sensitive: bool) -> tuple[bool]:
        if not case_sensitive:
            string, substring = string.lower(), substring.lower()
        return (substring in string,)


class StringCompare(Node):
    SCHEMA = NodeSchema(
        node_id="StringCompare",
        display_name="Compare Text",
        category="utils/string",
        description="Whether string_a starts with, ends with, or equals string_b.",
        inputs=(
            _text("string_a", "The first text."),
            _text("string_b", "The second text."),
            Input("mode", COMBO, "The comparison.", options=("Starts With", "Ends With", "Equal")),
            _flag("case_sensitive", "Letter case matters.", True),
        ),
        outputs=(Output("BOOLEAN", BOOLEAN, "The result."),),
    )

    def run(
        self, ctx: NodeContext, *, string_a: str, string_b: str, mode: str, case_sensitive: bool
    ) -> tuple[bool]:
        if not case_sensitive:
            string_a, string_b = string_a.lower(), string_b.lower()
        if mode == "Starts With":
            return (string_a.startswith(string_b),)
        if mode == "Ends With":
            return (string_a.endswith(string_b),)
        return (string_a == string_b,)


class CaseConverter(Node):
    SCHEMA = NodeSchema(
        node_id="CaseConverter",
        display_name="Convert Text Case",
        category="utils/string",
        description="UPPERCASE, lowercase, Capitalize (first letter) or Title Case.",
        inputs=(
            _text("string"),
            Input("mode", COMBO, "The case.", options=("UPPERCASE", "lowercase", "Capitalize", "Title Case")),
        ),
        outputs=_STRING_OUT,
    )

    def run(self, ctx: NodeContext, *, string: str, mode: str) -> tuple[str]:
        convert = {
            "UPPERCASE": str.upper,
            "lowercase": str.lower,
            "Capitalize": str.capitalize,
            "Title Case": str.title,
        }.get(mode)
        return (convert(string) if convert else string,)


class RegexMatch(Node):
    SCHEMA = NodeSchema(
        node_id="RegexMatch",
        display_name="Match Text",
        category="utils/string",
        description="Whether the regular expression matches anywhere (an invalid pattern matches nothing).",
        inputs=(_text("string"), _text("regex_pattern", "A Python regular expression."), *_REGEX_FLAGS),
        outputs=(Output("matches", BOOLEAN, "True if it matches."),),
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        string: str,
        regex_pattern: str,
        case_insensitive: bool,
        multiline: bool,
        dotall: bool,
    ) -> tuple[bool]:
        try:
            return (
                re.search(regex_pattern, string, _flags(case_insensitive, multiline, dotall)) is not None,
            )
        except re.error:
            return (False,)


class RegexExtract(Node):
    SCHEMA = NodeSchema(
        node_id="RegexExtract",
        display_name="Extract Text",
        category="utils/string",
        description="The first match, all matches, the first match's group, or that group of every match "
        "(one per line); empty when nothing matches or the pattern is invalid.",
        inputs=(
            _text("string"),
            _text("regex_pattern", "A Python regular expression."),
            Input(
                "mode",
                COMBO,
                "What to extract.",
                options=("First Match", "All Matches", "First Group", "All Groups"),
            ),
            *_REGEX_FLAGS,
            Input(
                "group_index",
                INT,
                "The group for the group modes.",
                default=1,
                min=0,
                max=100,
                extra=_ADVANCED,
            ),
        ),
        outputs=_STRING_OUT,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        string: str,
        regex_pattern: str,
        mode: str,
        case_insensitive: bool,
        multiline: bool,
        dotall: bool,
        group_index: int,
    ) -> tuple[str]:
        flags = _flags(case_insensitive, multiline, dotall)
        try:
            return (_extract(string, regex_pattern, mode, flags, group_index),)
        except re.error:
            return ("",)


def _extract(string: str, pattern: str, mode: str, flags: int, group: int) -> str:
    def group_of(match: re.Match[str] | None) -> str | None:
        if match is None or len(match.groups()) < group:
            return None
        return match.group(group)

    if mode == "First Match":
        match = re.search(pattern, string, flags)
        return match.group(0) if match else ""
    if mode == "All Matches":
        found = re.findall(pattern, string, flags)
        return "\n".join(m[0] if isinstance(m, tuple) else m for m in found)
    if mode == "First Group":
        return group_of(re.search(pattern, string, flags)) or ""
    if mode == "All Groups":
        parts = [
            g for m in re.finditer(pattern, string, flags) if m.groups() and (g := group_of(m)) is not None
        ]
        return "\n".join(parts)
    return ""


class RegexReplace(Node):
    SCHEMA = NodeSchema(
        node_id="RegexReplace",
        display_name="Replace Text (Regex)",
        category="utils/string",
        description="Find and replace text using regex patterns.",
        inputs=(
            _text("string"),
            _text("regex_pattern", "A Python regular expression."),
            _text("replace", "The replacement (\\1 or \\g<name> insert groups)."),
            _flag("case_insensitive", "Ignore letter case.", True, optional=True),
            _flag("multiline", "^ and $ match at every line.", False, optional=True),
            _flag("dotall", ". also matches newlines.", False, optional=True),
            Input(
                "count",
                INT,
                "Most replacements; 0 replaces all.",
                default=0,
                min=0,
                max=100,
                optional=True,
                extra=_ADVANCED,
            ),
        ),
        outputs=_STRING_OUT,
    )

    def run(
        self,
        ctx: NodeContext,
        *,
        string: str,
        regex_pattern: str,
        replace: str,
        case_insensitive: bool = True,
        multiline: bool = False,
        dotall: bool = False,
        count: int = 0,
    ) -> tuple[str]:
        flags = _flags(case_insensitive, multiline, dotall)
        try:
            return (re.sub(regex_pattern, replace, string, count=count, flags=flags),)
        except re.error as exc:
            raise TextError(
                f"regex_pattern or replace: invalid regular expression ({exc}); "
                f"pattern {regex_pattern!r}, replacement {replace!r}"
            ) from exc


class ComfySwitchNode(Node):
    SCHEMA = NodeSchema(
        node_id="ComfySwitchNode",
        display_name="If/Else Switch",
        category="utils/logic",
        description="Pass on_true when switch is true, else on_false; only the chosen branch is computed.",
        inputs=(
            Input("switch", BOOLEAN, "Which branch to pass."),
            Input("on_false", ANY, "Passed when switch is false.", optional=True, lazy=True),
            Input("on_true", ANY, "Passed when switch is true.", optional=True, lazy=True),
        ),
        outputs=(Output("output", ANY, "The chosen value (None when its input is not connected)."),),
        experimental=True,
    )

    def check_lazy_status(self, ctx: NodeContext, **inputs: Any) -> list[str]:
        branch = "on_true" if inputs.get("switch") else "on_false"
        return [branch] if branch in inputs and inputs[branch] is None else []

    def run(self, ctx: NodeContext, *, switch: bool, on_false: Any = None, on_true: Any = None) -> tuple[Any]:
        return (on_true if switch else on_false,)


class CustomCombo(Node):
    SCHEMA = NodeSchema(
        node_id="CustomCombo",
        display_name="Custom Combo",
        category="utils",
        description="A combo whose options the editor defines; outputs the choice and its index.",
        inputs=(
            Input("choice", COMBO, "The chosen option (options are the editor's, not checked).", options=()),
            Input(
                "index",
                INT,
                "The choice's position (sent by ComfyUI's editor).",
                default=0,
                min=0,
                optional=True,
                force_input=True,
            ),
        ),
        outputs=(Output("STRING", STRING, "The choice."), Output("INDEX", INT, "Its index.")),
        experimental=True,
    )

    def run(self, ctx: NodeContext, *, choice: str, index: int = 0) -> tuple[str, int]:
        return (str(choice), int(index))


class _FreeChoiceDef(NativeNodeDef):
    """CustomCombo's choice is any text: the editor defines the options, so it is never checked
    against the (empty) option list."""

    self_validated = frozenset({"choice", "index"})


NODE_CLASSES: list[type[Node]] = [
    StringReplace,
    StringSubstring,
    StringTrim,
    StringLength,
    StringContains,
    StringCompare,
    CaseConverter,
    RegexMatch,
    RegexExtract,
    RegexReplace,
    ComfySwitchNode,
    CustomCombo,
]


def text_node_defs() -> list[type[Node] | NativeNodeDef]:
    """What to register: the classes, CustomCombo wrapped so its choice is never checked."""
    return [_FreeChoiceDef(n) if n is CustomCombo else n for n in NODE_CLASSES]


NODES = text_node_defs()
