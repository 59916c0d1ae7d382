"""``easyrl simulate``: run the config's accelerator path as one rank of its real world on simulated devices
(docs/simulate.md)."""
