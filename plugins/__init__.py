"""TensorRT-LLM plugin and feature resolution (see :mod:`plugins.resolve`)."""

from plugins.resolve import PluginDecision, resolve_plugins

__all__ = ["PluginDecision", "resolve_plugins"]
