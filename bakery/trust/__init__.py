"""What a signature vouches for: the build record (record), keys, cosign signatures and DSSE
attestations (keys, sign, attest), the SBOM and SLSA provenance, views of the record (sbom,
provenance), the policy (policy: whose key signs what, what verify demands) and its verification
(verify), and the smoke results this machine has seen (smoke_ledger)."""
