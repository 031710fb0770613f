"""The build up to the engine: the spec, where its outputs live, the plan and its rules, and one module
per stage output. Imports only ``plugins``."""
