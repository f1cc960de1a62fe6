"""OCI distribution and image formats: names and digests, HTTP to a registry, manifests, layouts,
layers, copying between stores, tar as the engine reads it. Knows nothing of vLLM, overlays or keys (go-containerregistry's remote/
and layout/)."""
