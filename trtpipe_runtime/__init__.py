"""What the served Triton models import: the one copy of every rule they share with the product.

Standard library only, so it imports in any Python-backend stub: NGC's Triton TensorRT-LLM image, the
project's image and this checkout's stub alike (the modules that need numpy or ``triton_python_backend_utils``
import them where the stub has them: :mod:`trtpipe_runtime.triton_io`). The product imports it as an ordinary
package; ``model_repo.generate`` copies it into the version folder of every Python-backend model it writes
(``<model>/1/trtpipe_runtime/``), the folder the stub imports ``model.py`` from, so ``import trtpipe_runtime``
works there with no path set-up. A non-model folder at the repository root would stop ``tritonserver``
(model-control-mode none polls every folder there and fails without a config.pbtxt), and a model folder must
stand alone when copied: hence one copy per model. The build's stage keys hash this package
(``pipeline.build.templates_digest``).

Modules:
    bootstrap: the sys.path set-up the models run first (sys_path.json / TRTPIPE_PYTHONPATH).
    versions: the one TensorRT-LLM version parser and the options file chosen by installed release.
    params: config.pbtxt parameters and the portable runtime's fixed choices with their defaults.
    runtime_config: the portable runtime's continuous-batching settings.
    decoding: per-request decoding options, validated once for every runtime (the greedy rule, limits).
    detokenize: streamed token ids -> text that never splits a character; stop strings matched on the text.
    triton_io: request tensors -> Python values (needs numpy and the stub's triton_python_backend_utils).
    lifeline: a stub, the engine worker and the frontend end once the process they serve has exited.
"""
