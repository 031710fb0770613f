"""What the stages ask, the ground floor: the registries (``recipes``, ``runtimes``, ``architectures``,
``targets``), the trtllm-build plugin resolver and SM gates (``resolve``), ``errors`` / ``fsutil``, and the
environment trtpipe's processes start with (``procenv``). Imports nothing of the other packages.
"""
