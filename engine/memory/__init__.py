"""Models in memory: the manager (``manager``) and its records, prefetch and block streaming
(``entries``, ``prefetch``, ``device_streaming``, ``streaming``), the budgets it keeps within
(``device_budget``, ``ram_budget``) and the device policy with its precision flags
(``device_policy``, ``precision``, ``precision_probe``). No torch at import time, no model code."""
