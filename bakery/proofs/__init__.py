"""Running upstream's code: the bubblewrap sandbox for everything we do not trust (sandbox) and the
overlay proofs run in it, their cache and their signed verdicts (runner)."""
