"""The version of aio_ascend, defined once: read by setuptools (``pyproject.toml``, dynamic
version), re-exported as ``aio_ascend.__version__`` and printed by ``aio-ascend --version``."""

__version__ = "0.2.0.dev0"
