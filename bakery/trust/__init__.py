"""What a signature vouches for: keys, cosign signatures and DSSE attestations (keys, sign, attest),
the SBOM and SLSA provenance (sbom, provenance), the policy and its verification (verify), and the
smoke results this machine has seen (smoke_ledger)."""
