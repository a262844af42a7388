"""The engines' names and settings that the command line offers as choices, in a module that imports
nothing, so that `--help` and argument errors come before torch or any engine's library is imported.
`registry` checks that its engines are the ones named here."""

# The engines, by name (`registry.ENGINE_REGISTRY`), and those a model can be exported for.
ENGINES = ("torch", "ctranslate2", "onnx")
EXPORT_TARGETS = ("ctranslate2", "onnx")
CTRANSLATE2_DEVICES = ("cpu", "cuda")
# CTranslate2's weight types (ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES); float32 is the default.
CTRANSLATE2_QUANTIZATIONS = (
    "float32",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
)
# "default" keeps the export's weight type, converted where the device cannot compute in it (an
# int8_float16 export runs as int8_float32 on the CPU, say); "auto" takes the fastest type the device has.
# The others are CTranslate2's weight types, which the weights are converted to when the model loads.
CTRANSLATE2_COMPUTE_TYPES = ("default", "auto", *CTRANSLATE2_QUANTIZATIONS)
# Target tokens a CTranslate2 shortlist allows per source token.
DEFAULT_SHORTLIST_SIZE = 100
