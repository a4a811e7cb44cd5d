"""Workflow formats, in one place.

- :mod:`~engine.formats.api`: ComfyUI's API format (what the engine executes), its checks, the
  errors every format reports, and the one "is this a link" test.
- :mod:`~engine.formats.saved`: Loom's saved format (API graph plus editor layout), versioned and
  migrated on load.
- :mod:`~engine.formats.modes`: node modes (muted, bypassed) and what they do to a graph.
- :mod:`~engine.formats.widgets`: how a UI-format node's ``widgets_values`` map onto its inputs.
- :mod:`~engine.formats.ui_rules`: the UI-format rules as data (``ui_rules.json``), shared with the
  editor, which imports the same file from ``GET /api/v1/workflows/ui-rules``.
- :mod:`~engine.formats.ui_import` / :mod:`~engine.formats.ui_export`: ComfyUI's UI (litegraph)
  format to API format, and Loom's saved format to UI format; :mod:`~engine.formats.ui_parse`
  reads and checks the UI format's containers (link tables, subgraph and group node definitions).
- :mod:`~engine.formats.png`: PNG text chunks, and the metadata image nodes embed.
- :mod:`~engine.formats.load`: loading any of them from a file or parsed JSON.
"""

from engine.formats.api import MAX_NODES, WorkflowFormatError, WorkflowTooLarge, is_link, normalize_api
from engine.formats.load import LoadedWorkflow, detect_format, load_workflow, load_workflow_file
from engine.formats.png import png_info, read_png_workflow
from engine.formats.saved import SavedWorkflow, from_saved, to_saved
from engine.formats.ui_export import saved_to_ui
from engine.formats.ui_import import convert_ui_to_api
from engine.formats.widgets import ConversionProblem

__all__ = [
    "MAX_NODES",
    "ConversionProblem",
    "LoadedWorkflow",
    "SavedWorkflow",
    "WorkflowFormatError",
    "WorkflowTooLarge",
    "convert_ui_to_api",
    "detect_format",
    "from_saved",
    "is_link",
    "load_workflow",
    "load_workflow_file",
    "normalize_api",
    "png_info",
    "read_png_workflow",
    "saved_to_ui",
    "to_saved",
]
