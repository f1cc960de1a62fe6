"""The pinned base: base.yaml's spec and its resolution (spec), and the base's files read lazily
from its layers, never unpacked (filesystem), each layer streamed once (scan) and what it holds kept
by digest (layercache)."""
