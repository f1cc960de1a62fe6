"""The checked-in inputs, one module per folder of the project: image/ (image), tuning/ (tuning),
overlays/ (overlays, patch, proof_spec), hip/ (hip: the recipe, its compile and its artifact)."""
