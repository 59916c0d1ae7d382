"""The workers: one Ray actor per device rank (``FSDPWorker``), holding the FSDP2-sharded model roles (actor,
reference, critic) and a colocated vLLM engine, started and called by ``WorkerGroup``."""
