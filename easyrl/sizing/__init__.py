"""Sizing a run before it starts: the model's anatomy (``anatomy``), the accelerators (``devices``), the per-device
memory estimate (``estimate``, with the experience forwards in ``experience`` and the vision tower in ``vision``)
and the FLOPs formula behind the MFU metric (``flops``). Arithmetic over configs: nothing here loads weights."""
