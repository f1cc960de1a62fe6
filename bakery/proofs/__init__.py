"""Running upstream's code: the bubblewrap sandbox for everything we do not trust (sandbox), the
overlay proofs run in it, their cache and their signed verdicts (runner), and the one rule a required
overlay is held to (gate)."""
