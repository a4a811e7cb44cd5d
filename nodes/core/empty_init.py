"""The lock every module build holds while accelerate's ``init_empty_weights`` may be open.

accelerate's init_empty_weights patches nn.Module.register_parameter for the whole process while it
is open: a parameter set in another thread meanwhile (load_state_dict(assign=True), a module
constructor) lands on the meta device, and two threads inside it at once can leave the patch
installed for good. The memory manager builds on its prefetch thread while nodes build on the main
one, so every build holds this lock (the family builds in ``nodes.families.build``, a handle's
``load`` with its patches, other module builders such as TAESD)."""

from __future__ import annotations

import threading

EMPTY_INIT_LOCK = threading.RLock()
