"""Data pipeline: prompt sources, images, videos, format templates and the RL prompt dataset (``dataset``); import the
submodules (``easyrl.data.images`` imports without ``datasets``)."""
