"""After an image exists: the MI300X smoke gate (smoke), independent rebuilds and their sandbox's
broker (reproduce, broker), where it runs (deploy/: the node policy, the front proxy, Kubernetes),
and following the nightlies (track/: the ledger, the upstream, track, bump and its report; rebase)."""
