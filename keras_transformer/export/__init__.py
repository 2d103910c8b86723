"""The export stage: the SavedModel of a `Translator` for TF Serving (`savedmodel`), and the
CTranslate2 converter (`ctranslate2`) with its TensorFlow-free runtime (`ctranslate2_runtime`)."""
