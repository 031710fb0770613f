"""What the stages ask, the ground floor: the registries (``recipes``, ``runtimes``, ``architectures``,
``targets``), the trtllm-build plugin resolver and SM gates (``resolve``), and ``errors`` / ``fsutil``.
Imports nothing of the other packages."""
