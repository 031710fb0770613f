"""The stages after the engine: the Triton repository (``generate`` + ``templates/``), every server command line
(``launch``), the GPU-host bundle and the deployment files. Imports ``builders``, ``plugins`` and ``trtpipe_runtime``."""
