"""The stages after the engine: the Triton repository (``generate`` + ``templates/``), the GPU-host bundle
and the deployment files. Imports ``builders`` and ``plugins``."""
