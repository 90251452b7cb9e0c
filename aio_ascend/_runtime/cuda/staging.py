"""The cuda backend's staging: the shared fenced ring of :mod:`aio_ascend._runtime.staging`
(moved there so that the ``acl`` backend's device-args path uses the same ring)."""

from __future__ import annotations

from ..staging import (
    CAPTURE_CHUNK_BYTES,
    DEFAULT_STAGING_BYTES,
    FENCE_EVERY,
    MAX_STAGING_ALIGN,
    MIN_STAGING_ALIGN,
    CaptureStaging,
    RingOps,
    StagingRing,
    staging_alignment,
)

__all__ = [
    "CAPTURE_CHUNK_BYTES",
    "DEFAULT_STAGING_BYTES",
    "FENCE_EVERY",
    "MAX_STAGING_ALIGN",
    "MIN_STAGING_ALIGN",
    "CaptureStaging",
    "RingOps",
    "StagingRing",
    "staging_alignment",
]
