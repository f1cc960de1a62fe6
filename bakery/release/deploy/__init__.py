"""Where the image runs: the node policy that lets a host pull and run only what our release keys
signed (node_policy), the Kubernetes manifests of a fleet of single-MI300X nodes (k8s), and the front
proxy in front of them (caddy)."""
