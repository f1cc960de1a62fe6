"""bakery: turn a digest-pinned vLLM ROCm nightly into one reproducible, signed image.

Modules mirror the pipeline: refs (names and digests) -> transport (HTTP) ->
registry / layout (where blobs live) -> base, extract, layer, image (the build
stages) -> record (the single source of truth) -> build, mirror (orchestration).
"""

__version__ = "0.1.0"
