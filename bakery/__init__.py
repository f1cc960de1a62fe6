"""bakery: turn a digest-pinned vLLM ROCm nightly into one reproducible, signed image.

Folders follow the pipeline, each importing only those below it (tests/test_layers.py):
cli (what each invoke task does) > release, dev > bake > proofs, trust > inputs > base > oci >
the core modules here (errors, files, project, schema, engine, untrusted, broker_client).
docs/architecture.md's "Layout of this repository" says what lives where.
"""

__version__ = "0.1.0"
