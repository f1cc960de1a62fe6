"""`invoke build`: the pipeline from a pinned base to a derived image (pipeline), its outputs to a
registry or an OCI layout (publish), and the build record, the single source of truth (record)."""
