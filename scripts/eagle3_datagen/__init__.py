"""eagle3-datagen: exact-token EAGLE-3 training data from SGLang's native /generate API."""

__version__ = "0.1.0"
