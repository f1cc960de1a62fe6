"""After an image exists: the MI300X smoke gate (smoke), independent rebuilds and their sandbox's
broker (reproduce, broker), the node policy, proxy and deploy files (deploy), and following the
nightlies (track/: the ledger, the upstream, track, bump and its report; rebase)."""
