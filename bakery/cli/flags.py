"""What each flag of each invoke task means: the text `invoke --help TASK` shows, kept here so
tasks.py stays a list of tasks and their calls."""

BUILD = {"base": "base image REF@sha256:DIGEST, overriding image/base.yaml",
         "push": "push to REGISTRY/REPO[:TAG]",
         "layout": "also write an OCI image layout directory (air-gapped hand-off)",
         "out": "directory for blobs and build-record.json (default: out/)",
         "lock": "overlays lock to verify against (default: overlays/overlays.lock)",
         "toolchain": "image REF@sha256:DIGEST whose files hip/ compiles over (default: BAKERY_TOOLCHAIN, else the "
                      "base itself)",
         "key": "a release public key PEM: a kernel artifact or proof verdict in the push target is used only "
                "if release keys (this and the policy's) signed it",
         "policy": "policy naming the release keys (default: provenance/policy.yaml)",
         "recompile": "compile hip/ here, never taking the push target's kernel artifact",
         "reprove": "run every overlay proof here, whatever this machine's cache or the push target holds"}

MIRROR = {"to": "destination REGISTRY/REPO[:TAG]",
          "base": "source REF@sha256:DIGEST (default: image/base.yaml)",
          "image": "copy this signed image of ours (REF@sha256:DIGEST) with its .sig and .att instead of the base",
          "layout": "with --image: write into this OCI layout directory instead of a registry"}

TOOLCHAIN = {"registry": "registry host:port to push the stand-in toolchain to (default: the local stack's)"}

FIXTURE = {"registry": "registry host:port to push the fixture to (default: the local stack's)",
           "vllm": "vLLM release to build it from: 0.26.0 (default) or 0.27.0, the nightly's two neighbours"}

TEST = {"k": "only tests matching this pytest -k expression (ruff and mypy, which run first otherwise, are left out)",
        "x": "stop at the first failure",
        "rehearsal": "also run the workflow rehearsals under act (tests/test_rehearse.py: minutes each; CI runs them)",
        "fast": "only the quick tests that need no Docker engine or registry (about a minute; nothing is started)",
        "sweep": "also run the full crash and registry-fault sweeps (issue 40; tests marked sweep: minutes)"}

LOCK = {"base": "base image REF@sha256:DIGEST, overriding image/base.yaml",
        "lock": "lock file to write (default: overlays/overlays.lock)"}

PROVE = {"base": "base image REF@sha256:DIGEST, overriding image/base.yaml",
         "device": "cpu (default: Triton's interpreter) or cuda (the proofs' Triton kernels compiled for the GPU "
                   "torch sees, CUDA or ROCm)",
         "kit": "a porting kit (out/rebase/OVERLAY-ID, from `invoke rebase`): prove its edited ours.py instead"}

REBASE = {"base": "the new base REF@sha256:DIGEST (the nightly you are moving to)",
          "lock": "lock file to write (default: overlays/overlays.lock)",
          "out": "where overlays that need porting by hand are written (default: out/, as out/rebase/ID/)"}

TRACK = {"from_": "the upstream REGISTRY/REPO whose nightlies to keep, e.g. docker.io/vllm/vllm-openai-rocm",
         "mirror": "your REGISTRY/REPO they are copied to, by digest",
         "tags": "only upstream tags matching this glob (default: *)",
         "ledger": "the ledger (default: image/nightlies.yaml)",
         "no_bump": "only mirror and record; try nothing (the workflow's credentialed job)",
         "report": "where bump writes its Markdown report (default: out/track/report.md)",
         "list_": "print the ledger, newest first, with what each nightly would need; change nothing"}

BUMP = {"ledger": "the ledger (default: image/nightlies.yaml)",
        "nightly": "try this kept nightly (sha256:DIGEST, as `invoke track --list` shows) instead of the newest "
                   "untried: bisect, or re-try after porting",
        "report": "where to write the Markdown report (default: out/track/report.md)",
        "out": "where porting kits go (default: out/, as out/rebase/ID/)"}

KEYGEN = {"out": "directory for ROLE.key (encrypted) and ROLE.pub (default: .)",
          "role": "release (signs the image, its SBOM and provenance; default), rebuilder (signs a rebuild's outcome) "
                  "or smoke (signs the MI300X result)"}

KEYCHECK = {"role": "release, rebuilder or smoke: whose secret key (BAKERY_SIGNING_KEY, BAKERY_REBUILDER_SIGNING_KEY, "
                    "BAKERY_SMOKE_SIGNING_KEY, with BAKERY_KEY_PASSWORD) to check",
            "public": "the PEM public key it must match (what the role's repository variable holds)"}

CHECK_TAG = {"tag": "the release tag (GITHUB_REF_NAME)"}

PREFLIGHT = {"repository": "the GitHub repository OWNER/NAME (default: the origin remote's)",
             "api": "GitHub's REST API (default: GITHUB_API_URL, else https://api.github.com); the token is GITHUB_TOKEN "
                    "or GH_TOKEN, one that may read the repository's settings"}

AWAIT_RUNNER = {"job": "the job's name as the run shows it (its `name:`)",
                "minutes": "how long it may stay queued for a runner (default 30)"}

ATTEST = {"image": "the image REGISTRY/REPO@sha256:DIGEST to sign",
          "record": "its build record (default: out/build-record.json)",
          "key": "encrypted private key file (default: BAKERY_SIGNING_KEY from the environment)",
          "layout": "attest inside this OCI layout directory instead of a registry",
          "keyless": "sign without a key, as the workflow identity of the OIDC token (SIGSTORE_ID_TOKEN, else the "
                     "GitHub Actions job's own): Sigstore bundles only, with a Fulcio certificate and a Rekor entry",
          "trust_config": "keyless: the Sigstore services and root (a ClientTrustConfig JSON; default: the public "
                          "instance's, fetched by TUF)"}

ATTACH = {"image": "the image REGISTRY/REPO@sha256:DIGEST the statement is about",
          "envelope": "a signed DSSE envelope or keyless bundle (e.g. from `invoke smoke --attest --envelope FILE`)",
          "key": "the public key of ROLE (e.g. smoke.pub): the envelope must verify with it (none for a keyless "
                 "bundle: it must verify by ROLE's identity under keyless.roles in the policy)",
          "policy": "verification policy, for a keyless bundle (default: provenance/policy.yaml)",
          "role": "the role the envelope comes from (default smoke): only statement types that role signs are "
                  "attached"}

POLICY = {"containers": "an empty or new directory: policy.json, registries.d/ and the release keys are written "
                        "there, to install as /etc/containers on a podman or CRI-O node",
          "k8s": "an empty or new directory: policy-controller ClusterImagePolicy and Kyverno ClusterPolicy files "
                 "are written there, to kubectl apply (instead of --containers)",
          "smoke_key": "with --k8s: a smoke public key PEM, added to the policy's roles.smoke keys (repeatable)",
          "rebuilder_key": "with --k8s: a rebuilder public key PEM, added to the policy's roles.rebuilder keys "
                           "(repeatable)",
          "policy": "verification policy (default: provenance/policy.yaml)",
          "key": "a release public key PEM, added to the policy's roles.release keys (repeatable)",
          "mirror": "MIRROR_HOST/REPO=ORIGINAL_HOST/REPO: a mirror of an allowed repository that nodes pull from, "
                    "signatures copied with it (repeatable)",
          "accept": "HOST/NAMESPACE/NAME of another image the nodes may pull unsigned (the pause image, the proxy, "
                    "a device plugin; repeatable): everything else not ours is refused"}

DEPLOY = {"image": "the release REGISTRY/REPO@sha256:DIGEST to run",
          "proxy_image": "the Caddy image, by digest (CADDY@sha256:DIGEST)",
          "hostname": "the proxy's HTTPS name (name or name:port)",
          "allow": "a source CIDR the proxy admits (repeatable; everyone else gets 403)",
          "email": "ACME contact address (not needed with --internal-tls)",
          "internal_tls": "certificate from Caddy's own CA (a private name, no ACME)",
          "compose": "write DIR/.env and DIR/Caddyfile, then docker compose up -d (IMAGE verified first, smoke "
                     "required, as for --k8s)",
          "snapshot": "the model snapshot directory on the host or nodes, mounted read-only",
          "compose_file": "with --compose: the compose file (default: image/compose.yaml)",
          "k8s": "write Kubernetes manifests for --replicas single-MI300X nodes into DIR (new or empty)",
          "replicas": "with --k8s: how many MI300X nodes (one GPU each)",
          "key": "release public key for verify", "smoke_key": "smoke public key for verify",
          "rebuilder_key": "a rebuilder public key for verify (repeatable): the policy asks for its rebuilds",
          "policy": "verification policy (default: provenance/policy.yaml)"}

VERIFY = {"image": "REGISTRY/REPO@sha256:DIGEST (or :TAG, resolved and reported)",
          "key": "a release public key PEM (release.pub), added to the policy's roles.release keys",
          "smoke_key": "a smoke public key PEM (smoke.pub), added to the policy's roles.smoke keys",
          "policy": "verification policy (default: provenance/policy.yaml)",
          "layout": "verify an OCI layout directory (offline) instead of a registry",
          "require_smoke": "also demand a passing MI300X smoke attestation",
          "rebuilder_key": "a rebuilder public key PEM, added to the policy's roles.rebuilder keys (repeatable)",
          "require_rebuilds": "demand that this many distinct rebuilder keys attest a rebuild giving this digest",
          "skip_blobs": "do not download and hash every layer (faster, weaker)"}

REPRODUCE = {"image": "the released REGISTRY/REPO@sha256:DIGEST to rebuild",
            "release_key": "a release public key PEM: the provenance is read only once its signature holds",
            "policy": "verification policy (default: provenance/policy.yaml)",
            "toolchain": "compile hip/ in this image (default: the one the provenance names)",
            "workdir": "where to clone and build (default: a new temporary folder, kept only when the rebuild "
                       "gives other bytes); a new or empty folder, or one a rebuild made: the source/ "
                       "and build/ an earlier run left there are removed first",
            "attest": "sign the outcome (match or not) onto IMAGE as this rebuilder, with --key",
            "key": "with --attest: this rebuilder's encrypted private key (default: BAKERY_REBUILDER_SIGNING_KEY)",
            "outcome": "write what the rebuild gave (its manifest, the differences) to this file, for "
                       "`invoke attest-rebuild` in a job that holds the key and runs no build"}

ATTEST_REBUILD = {"image": "the released REGISTRY/REPO@sha256:DIGEST that was rebuilt",
            "outcome": "the file `invoke reproduce --outcome` wrote",
            "release_key": "a release public key PEM (the provenance is re-read and checked here)",
            "policy": "verification policy (default: provenance/policy.yaml)",
            "key": "this rebuilder's encrypted private key (default: BAKERY_REBUILDER_SIGNING_KEY)",
            "keyless": ATTEST["keyless"], "trust_config": ATTEST["trust_config"]}

SMOKE = {"image": "REGISTRY/REPO@sha256:DIGEST to gate (the candidate)",
         "model_dir": "the model snapshot directory (.../snapshots/<revision>), mounted read-only; needed to launch "
                      "the servers and for vLLM's own `vllm bench serve`",
         "port": "host port for the API on 127.0.0.1 (default 8000)",
         "report": "where to write the JSON report (default: out/smoke-report.json)",
         "reference": "what the candidate is compared with: last-promoted (the newest v* tag git has merged into "
                      "HEAD, not HEAD's own, resolved in the candidate's repository; else seed-stack), REPO:TAG or REPO@sha256:... (a "
                      "promoted release, verified with its smoke result as of the revision it was built from, which "
                      "must be in this checkout's history), or seed-stack (the pinned base with each "
                      "baked file bind-mounted read-only: the first release)",
         "not_promoted": "with --reference last-promoted: release tags (by spaces or commas) whose release was "
                         "never promoted, passed over (else a release tag without its registry tag stops the gate)",
         "release_key": "a release public key that verifies a promoted reference (default: provenance/policy.yaml's)",
         "smoke_key": "a smoke public key that verifies a promoted reference's smoke result (default: the policy's)",
         "record": "with --reference seed-stack: the candidate's build record (default: out/build-record.json)",
         "endpoint": "PATH=URL, once per path (dspark, native): the candidate served elsewhere; the gate launches "
                     "no candidate container",
         "reference_endpoint": "PATH=URL, once per path: the reference served elsewhere",
         "approvals": "the reviewed A/B differences the gate lets through (default: provenance/smoke-approvals.yaml); "
                      "its sha256 is signed into the result",
         "bench_client": "the `vllm bench serve` command to measure speed with (default: the reference image's, "
                         "by docker run)",
         "tokenizer": "with --bench-client: the tokenizer folder that client loads",
         "bfcl": "the python of a venv holding requirements/bfcl.txt (BFCL's harness, for the tool calls; default: "
                 "one built for this run in its temporary folder)",
         "attest": "sign the report onto the digest with the smoke key (--key or BAKERY_SMOKE_SIGNING_KEY)",
         "key": "encrypted smoke private key file for --attest (smoke.key)",
         "envelope": "with --attest: write the signed envelope to this file instead of pushing it (a job "
                     "without push rights hands it to `invoke attach`)",
         "keyless": "with --attest: sign as this job's workflow identity (the smoke role's under keyless.roles), "
                    "not with a key; the OIDC token is asked for when the gate has finished",
         "trust_config": ATTEST["trust_config"]}

PROMOTE = {"image": "the smoke-tested REGISTRY/REPO@sha256:DIGEST",
           "tag": "the release tag to point at it (e.g. v1.2.0)",
           "key": "a release public key PEM (added to the policy's)",
           "smoke_key": "a smoke public key PEM (added to the policy's)",
           "policy": "verification policy (default: provenance/policy.yaml)",
           "rebuilder_key": "a rebuilder public key PEM, added to the policy's roles.rebuilder keys (repeatable)",
           "require_rebuilds": "demand that this many distinct rebuilder keys attest a rebuild giving this digest",
           "smoke_run": "demand a smoke result from this workflow run (REPO#RUN_ID; the release workflow passes its "
                        "own, so a result of an earlier run put back is refused)"}

DISK = {"base": "base image REF@sha256:DIGEST (default: image/base.yaml)",
        "toolchain": "toolchain image REF@sha256:DIGEST (default: BAKERY_TOOLCHAIN, else the base)",
        "unless_cached_in": "REGISTRY/REPO: if it holds this recipe's kernel artifact, signed by a release key, "
                            "nothing will be compiled",
        "key": "a release public key PEM (beside the policy's) to check that artifact's signature with",
        "policy": "policy naming the release keys (default: provenance/policy.yaml)"}

COMPILE = {"toolchain": "image REF@sha256:DIGEST to compile over (default: BAKERY_TOOLCHAIN, else the pinned base)",
           "verify": "compile again here, ignoring every cache, and prove the cached outputs byte-identical",
           "registry": "REGISTRY/REPO holding the kernel artifact (kernels-<key>): fetch it (if a release key "
                       "signed it), or push it there",
           "key": "a release public key PEM (beside the policy's) to check the artifact's signature with",
           "policy": "policy naming the release keys (default: provenance/policy.yaml)"}

REHEARSE = {"workflow": "release (default: a v* tag push) or nightly (a schedule)",
            "drill": "release: broken-proof, unsigned-kernels, smoke-failed, rebuild-mismatch, foreign-revision or "
                     "dirty-checkout (each must stop the release); nightly: needs-porting",
            "smoke_stand_in": "release: the smoke job's MI300X step signs the tests' stand-in report (there is no "
                              "MI300X here), so attach-smoke and promote run",
            "work": "folder for the rehearsal's clone, keys, logs and artifacts (default: out/rehearsal)",
            "keyless": "release: no key at all; each role signs as its own workflow's identity (BAKERY_SIGNING=keyless) "
                       "against the local Sigstore stand-in, with OIDC tokens from the GitHub stand-in"}

PRUNE = {"repository": "the image repository, REGISTRY/REPO (the mirror is the ledger's); or oci:DIR, an OCI layout "
                       "(what `invoke mirror --image --layout` fills): its names judged as tags, then the blobs "
                       "nothing kept reaches removed",
         "key": "a release public key PEM (a release's signed provenance says what it needs kept)",
         "policy": "verification policy (default: provenance/policy.yaml)",
         "retention": "the retention policy (default: provenance/retention.yaml)",
         "ledger": "the nightly ledger (default: image/nightlies.yaml; none: the mirror is not pruned)",
         "apply": "delete what the plan deletes (default: a dry run that only prints it)",
         "via": "how deletes reach the registry: registry (its DELETE), github (GitHub's package-versions API, "
                "GITHUB_TOKEN; GHCR takes no DELETE), auto (default: github for ghcr.io)"}
