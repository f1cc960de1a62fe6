"""The pinned base: base.yaml's spec and its resolution (spec), and the base's files read lazily
from its layers, never unpacked (filesystem)."""
