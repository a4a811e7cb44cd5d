"""NodeRegistry's public interface, as the queue's coalescer uses it."""

from __future__ import annotations

from engine.registry import NodeRegistry
from engine.schema import DynamicOptions
from tests.engine.stub_nodes import Add, Const, Show


def test_an_extended_registry_adds_nodes_and_leaves_the_base_alone() -> None:
    base = NodeRegistry()
    base.register_all([Const, Add])
    extended = base.extended([Show, Const])  # Const is there already: the base's is kept
    assert base.names() == ["Add", "Const"]
    assert extended.names() == ["Add", "Const", "Show"]
    assert extended.get("Const") is base.get("Const")
    assert extended.collisions == [] and base.collisions == []


def test_an_extended_registry_shares_the_option_sources() -> None:
    base = NodeRegistry()
    extended = base.extended([Show])
    base.add_options_source("things", lambda: ["a", "b"])  # added after: seen by both
    assert extended.resolve_options(DynamicOptions("things")) == ["a", "b"]
