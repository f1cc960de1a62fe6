"""Stand-ins and the local stack, never part of a release: the fixture base and toolchain (fixture),
the local engine and registries (stack), the workflows' rehearsal under act (rehearse for the release,
rehearse_nightly, rehearsal_stage, act, act_jobs, signed_url_proxy, on the hosted runner's model in
runner) and its GitHub API stand-in (github_stand_in)."""
