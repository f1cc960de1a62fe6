"""Stand-ins and the local stack, never part of a release: the fixture base and toolchain (fixture),
the local engine and registries (stack), the workflows' rehearsal under act (rehearse) and its
GitHub API stand-in (github_stand_in)."""
