"""`invoke track` and `invoke bump`: keep every upstream nightly before it ages out; try the newest.

track: list the upstream tags (the distribution API, paginated by `Link`), resolve each matching
tag to its linux/amd64 manifest, copy every digest not yet kept into the mirror (by digest, blobs
mounted or streamed once), read what each base says it is from the mirror's verified copy, and
record it all in the ledger, image/nightlies.yaml. The ledger is written whole and only when every
step held: a registry that breaks off its tag list or lies about a digest changes nothing.
bump: the newest kept nightly newer than the pin and not yet tried goes through `invoke rebase`
(proofs included) read from the mirror. Carried: image/base.yaml, overlays/ and the ledger change,
nothing else. Not carried: only the ledger changes, and the porting kits are in out/rebase/.
Upstream's code runs only inside the rebase's proofs (sandboxed); tracking runs none of it.
"""
