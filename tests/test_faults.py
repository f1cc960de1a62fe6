"""Registry faults (issue 40): real commands, run as a user runs them, through a proxy that injects
one scripted fault at the k-th request of a kind (tests/proxy.py), in front of the real registry.
A transient fault must end in success, with the digest and tag of a clean run; any other must end
in one `error:` line with its exit code, and leave the tags its row says ("no tag": none at all),
as the registry itself answers.

What was injected, and how each command ended (mirror: `invoke mirror` of the fixture base, its
blobs downloaded and uploaded through the proxy, or mounted; build: `invoke build --push`, its push
through the proxy). "k" is the k-th request of that method and path; "always": from there on.

  fault                           where (k)                                   mirror            build --push
  500, 502, 503, 429 once         GET manifest 1, HEAD blob 3, GET blob 2,    recovered         recovered (503 HEAD
                                  POST upload 2, PATCH 2, PUT upload 2,                         manifest 2, 502 PUT
                                  PUT manifest 1 and 2 (by digest, by tag)                      manifest 2)
  503, 429 with Retry-After: 1    GET manifest 1, HEAD blob 3, GET blob 2,    recovered [3]     recovered (429 POST 2)
                                  POST upload 2
  reset (RST) mid-body, or        the eight places above                      recovered [1][2]  recovered (PATCH 1, PUT
    before an empty answer                                                                        upload 1 and 6, PUT
                                                                                                  manifest 3)
  body cut short (FIN)            the eight places above                      recovered [1]     -
  stall past the read deadline    the eight places above                      recovered         recovered (HEAD blob 2)
    before the answer
  stall mid-body                  the eight places above                      recovered [1]     -
  trickle: a byte every 0.25 s,   GET manifest 1, GET blob 2                  recovered [6]     -
    each before the read deadline
  503 or reset on a mount         POST ?mount= 2                              recovered [5]     -
  wrong Docker-Content-Digest     GET blob 1, HEAD blob 1                     recovered: the bytes are checked
                                                                              against the digest, the header unused
  wrong Docker-Content-Digest     GET manifest 1                              exit 5, no tag    -
  wrong Docker-Content-Digest     PUT upload 2 (build: 1)                     exit 5, no tag [4] exit 5, no tag [4]
  wrong Docker-Content-Digest     PUT manifest 1 (build: 1, the kernels       exit 5, no tag    exit 5, no v1; the
                                  artifact, and 2, the image by digest)                         kernels tag stands,
                                                                                                at its right digest
  wrong Docker-Content-Digest     PUT manifest 2, the tag                     exit 5; the tag stands, at the right
                                                                              digest (stored from our bytes)
  Location on another origin      POST upload 2, anonymous registry           recovered, the upload finished there
  Location on another origin      POST upload 1, credentials (basic auth)     exit 4, no credentials sent there,
                                                                              no tag
  503 always                      HEAD blob from 1                            exit 3, no tag    -
  429 + Retry-After: 1 always     GET manifest from 1                         exit 3, no tag    -
  reset always                    GET manifest from 1                         exit 3, no tag    -
  stall always                    GET manifest from 1                         exit 3, no tag    -
  stall mid-body always           GET blob from 1                             exit 3, no tag    -
  trickle always                  GET manifest from 1, GET blob from 1        exit 3, no tag [6] -
  429 + Retry-After: 1 always,    GET manifest from 1                         exit 3 "kept asking -
    waits limited to 2.5 s                                                    us to wait", no tag [7]
  500 always                      PUT manifest from 1                         -                 exit 3, no tag

Every failure is one `error:` line; each left exactly the tags its row says, none at another digest
(the kernels artifact's tag is pushed before the image's, under its own tag). What was fixed (each test named fails without it):
  [1] an idempotent request whose answer broke off mid-body was not asked again: exit 3 at once
      (short at GET /manifests/ #1)
  [2] the upload's closing PUT, applied but its answer lost, was resent into a closed session (404):
      exit 3; now the blob being there means done (reset at PUT /blobs/uploads/ #2)
  [3] Retry-After was ignored (a quarter of a second, then asked again); now waited for, at most
      60 s (test_retry_after_is_waited_for)
  [4] an upload's Docker-Content-Digest was not checked: exit 0 (wrong-digest at PUT /blobs/uploads/)
  [5] a mount (a POST, never resent) that failed transiently ended the copy: exit 3; now an upload
      follows (test_a_mount_that_fails_transiently_falls_back_to_an_upload)
  [6] a body that came a byte at a time, each before the read deadline, was read for as long as it
      lasted (each read waited for up to a megabyte; blobs had a deadline, checked only between
      such reads); now a body's reading may wait BAKERY_REGISTRY_SLOW_GRACE seconds plus one for each
      BAKERY_REGISTRY_MIN_RATE bytes that came, else it is given up as a transient failure
      (test_a_trickling_body_is_given_up_and_asked_again, trickle always at GET /manifests/ #1)
  [7] Retry-After was waited for up to a minute each time, four times a request (the token
      service's five); now up to BAKERY_REGISTRY_RETRY_AFTER_LIMIT seconds in all, 120 by default,
      past which the command ends (test_a_registry_that_keeps_asking_to_wait_ends_the_command)
The client's read deadline is BAKERY_REGISTRY_READ_TIMEOUT (1 s here, 300 s by default), a body's
pace BAKERY_REGISTRY_SLOW_GRACE and BAKERY_REGISTRY_MIN_RATE (0.5 s and 1 KiB/s here; 60 s and
32 KiB/s by default).
`invoke test` runs a sample; `invoke test --sweep` the whole table.
"""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from bakery.oci.refs import Reference
from proxy import Fault, FaultyProxy
from support import ROOT, copy_project, invoke, last_line, tags

READ_TIMEOUT_S = 2  # the client's read deadline in these runs (1 s was missed by a busy 2-core machine); a stall lasts longer
STALL_S = 4
# the client's deadlines in these runs: a trickle's few bytes are given up on within a second
FAST = {"BAKERY_REGISTRY_READ_TIMEOUT": str(READ_TIMEOUT_S), "BAKERY_REGISTRY_SLOW_GRACE": "0.5",
        "BAKERY_REGISTRY_MIN_RATE": "1024"}
ALWAYS = 1000  # times: a fault that never clears


def one_error_line(result) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


# what a failed run leaves in the repository, as the table says: no tag at all; every tag but v1 (the
# kernels artifact's, pushed before the image); every tag a complete run makes (the last write failed
# only in what the registry said back)
NO_TAG, NO_V1, ALL_TAGS = "no tag", "no v1", "the tag stands"


def check(result, proxy, registry: str, repo: str, complete: dict[str, str], expected) -> None:
    """`complete`: the tags a complete run makes, and their digests; `expected`: "ok" (the clean
    run's digest, every tag made as a clean run makes it), or (exit code, words of the error line,
    what it leaves: NO_TAG, NO_V1 or ALL_TAGS), checked against the registry's own answer."""
    assert proxy.hits(), f"the fault was never injected; requests: {proxy.seen}"
    found = tags(registry, repo)
    assert found.items() <= complete.items(), f"tags a complete run would not make: {found} (complete: {complete})"
    if expected == "ok":
        assert result.returncode == 0, result.stderr
        assert last_line(result).endswith(f"@{complete['v1']}"), result.stdout
        assert found == complete
        return
    code, words, left = expected
    line = one_error_line(result)
    assert result.returncode == code and words in line, (result.returncode, result.stderr)
    assert found == {NO_TAG: {}, NO_V1: {t: d for t, d in complete.items() if t != "v1"}, ALL_TAGS: complete}[left], \
        f"{left}, but the registry has {found}"


def fresh(name: str) -> str:
    return f"faults/{name}-{time.time_ns()}"  # the registry's storage outlives a run


# -- invoke mirror: the fixture base copied by digest, downloaded and uploaded through the proxy ---

def mirror(registry: str, base: Reference, tmp_path, script, mount: bool = False, env: dict | None = None):
    """`invoke mirror` from the proxy (named localhost:PORT) to the proxy (127.0.0.1:PORT): two
    names, so the blobs are streamed down and up again; with `mount`, one name, so the registry
    is asked to mount each blob from the source repository. `env`: more of the client's settings."""
    with FaultyProxy(registry, [], script=script, stall_s=STALL_S) as proxy:
        repo = fresh("mirror")
        src = f"{proxy.host if mount else f'localhost:{proxy.port}'}/{base.repository}@{base.digest}"
        result = invoke(ROOT, "mirror", "--base", src, "--to", f"{proxy.host}/{repo}:v1",
                        env={"BAKERY_CACHE": str(tmp_path / "cache"), **FAST, **(env or {})})
    return result, proxy, repo


OK = "ok"
# a clean mirror of the fixture base (4 blobs, two of them over 8 MiB, so sent in PATCH chunks) asks:
# GET manifest; per blob HEAD x2, POST, GET the blob, PATCH (large ones: 1 or 2) or none, PUT;
# PUT manifest by digest, then by tag
MIRROR_SAMPLE = [
    (Fault("503", method="GET", path="/manifests/"), OK),
    (Fault("429", 3, "HEAD", "/blobs/", retry_after=1), OK),
    (Fault("reset", 2, "GET", "/blobs/"), OK),  # mid-body of the 63 MiB layer
    (Fault("short", 1, "GET", "/manifests/"), OK),
    (Fault("reset", 2, "PUT", "/blobs/uploads/"), OK),  # the upload done, its answer lost
    (Fault("wrong-digest", 1, "PUT", "/manifests/"), (5, "stored manifest as", NO_TAG)),
    (Fault("stall", 1, "GET", "/manifests/", times=ALWAYS), (3, "unreachable", NO_TAG)),
    (Fault("trickle", 1, "GET", "/manifests/", times=ALWAYS), (3, "too slow", NO_TAG)),
]

PLACES = [("GET", "/manifests/", 1), ("HEAD", "/blobs/", 3), ("GET", "/blobs/", 2), ("POST", "/blobs/uploads/", 2),
          ("PATCH", "/blobs/uploads/", 2), ("PUT", "/blobs/uploads/", 2), ("PUT", "/manifests/", 1),
          ("PUT", "/manifests/", 2)]
TRANSIENT = [Fault(status, k, m, p) for status in ("500", "502", "503", "429") for m, p, k in PLACES] + \
    [Fault(status, k, m, p, retry_after=1) for status in ("503", "429") for m, p, k in PLACES[:4]] + \
    [Fault(cut, k, m, p) for cut in ("reset", "short", "stall", "stall-body") for m, p, k in PLACES] + \
    [Fault("trickle", k, m, p) for m, p, k in (PLACES[0], PLACES[2])] + \
    [Fault("wrong-digest", 1, "GET", "/blobs/"),  # a blob's bytes are checked against its digest: the header is moot
     Fault("wrong-digest", 1, "HEAD", "/blobs/")]
MIRROR_SWEEP = [(f, OK) for f in TRANSIENT] + [
    (Fault("wrong-digest", 1, "GET", "/manifests/"), (5, "lies about the digest", NO_TAG)),
    (Fault("wrong-digest", 2, "PUT", "/blobs/uploads/"), (5, "stored blob as", NO_TAG)),
    (Fault("wrong-digest", 2, "PUT", "/manifests/"), (5, "stored manifest as", ALL_TAGS)),  # right, but said wrong
    (Fault("503", 1, "HEAD", "/blobs/", times=ALWAYS), (3, "HTTP 503", NO_TAG)),
    (Fault("429", 1, "GET", "/manifests/", times=ALWAYS, retry_after=1), (3, "HTTP 429", NO_TAG)),
    (Fault("reset", 1, "GET", "/manifests/", times=ALWAYS), (3, "broke off", NO_TAG)),
    (Fault("stall-body", 1, "GET", "/blobs/", times=ALWAYS), (3, "broke off", NO_TAG)),
    (Fault("trickle", 1, "GET", "/blobs/", times=ALWAYS), (3, "too slow", NO_TAG)),
]


def _ids(cases):
    return [str(f).replace(" ", "_") for f, _ in cases]


@pytest.mark.parametrize("fault, expected", MIRROR_SAMPLE, ids=_ids(MIRROR_SAMPLE))
def test_mirror_sample(registry, fixture_base, tmp_path, fault, expected):
    result, proxy, repo = mirror(registry, fixture_base, tmp_path, [fault])
    check(result, proxy, registry, repo, {"v1": str(fixture_base.digest)}, expected)


@pytest.mark.sweep
@pytest.mark.parametrize("fault, expected", MIRROR_SWEEP, ids=_ids(MIRROR_SWEEP))
def test_mirror_sweep(registry, fixture_base, tmp_path, fault, expected):
    result, proxy, repo = mirror(registry, fixture_base, tmp_path, [fault])
    check(result, proxy, registry, repo, {"v1": str(fixture_base.digest)}, expected)


@pytest.mark.parametrize("fault", [Fault(cut, 2, "POST", "/blobs/uploads/") for cut in ("503", "reset")],
                         ids=["503", "reset"])
def test_a_mount_that_fails_transiently_falls_back_to_an_upload(registry, fixture_base, tmp_path, fault):
    """A mount is a POST, never resent: one that fails (or whose answer is lost) is followed by an
    upload, which finds the blob if the mount took. The request log shows which: after the failed
    mount, the mount not asked again, the upload's HEAD for that blob, then (503: the mount did not
    take) an upload session closed with that digest, or (reset: it took) no upload at all."""
    result, proxy, repo = mirror(registry, fixture_base, tmp_path, [fault], mount=True)
    check(result, proxy, registry, repo, {"v1": str(fixture_base.digest)}, OK)
    (failed,) = [i for i, (_, _, _, action) in enumerate(proxy.events) if action]
    digest = parse_qs(urlsplit(proxy.events[failed][2]).query)["mount"][0]
    after = [(method, path) for _, method, path, _ in proxy.events[failed + 1:]]
    assert not any(method == "POST" and f"mount={digest}" in path for method, path in after), after
    assert after[0] == ("HEAD", f"/v2/{repo}/blobs/{digest}"), after
    uploads = [(method, path) for method, path in after if "/blobs/uploads/" in path and "mount=" not in path]
    if fault.action == "503":
        assert uploads[0][0] == "POST" and uploads[-1][0] == "PUT" and f"digest={digest}" in uploads[-1][1], uploads
    else:
        assert uploads == [], uploads


def test_a_trickling_body_is_given_up_and_asked_again(registry, fixture_base, tmp_path):
    """The 63 MiB layer sent a byte every 0.25 s, each well before the 1 s read deadline: given up
    once it falls behind the pace (0.5 s, then 1 KiB/s here), its upload started over, the mirror
    complete. Before, the client read on until the proxy stopped trickling (10 s) and cut it short."""
    result, proxy, repo = mirror(registry, fixture_base, tmp_path, [Fault("trickle", 2, "GET", "/blobs/")])
    check(result, proxy, registry, repo, {"v1": str(fixture_base.digest)}, OK)
    (began, trickled), = [(t, p) for t, _, p, action in proxy.events if action]
    again = next(t for t, m, p, _ in proxy.events if m == "GET" and p == trickled and t > began)
    assert again - began < proxy.trickle_for / 2, f"asked again {again - began:.1f} s after the trickle began"


def test_an_upload_location_elsewhere_is_followed_without_credentials(registry, fixture_base, tmp_path):
    """Anonymous: the registry's Location to another origin is followed, and the copy completes."""
    with FaultyProxy(registry, []) as elsewhere:
        fault = Fault("foreign-location", 2, "POST", "/blobs/uploads/", to=elsewhere.host)
        result, proxy, repo = mirror(registry, fixture_base, tmp_path, [fault])
    check(result, proxy, registry, repo, {"v1": str(fixture_base.digest)}, OK)
    assert any(m == "PATCH" for m, _ in elsewhere.seen), "the upload went on elsewhere"


def test_an_upload_location_elsewhere_takes_no_credentials(registry, basic_registry, fixture_base, tmp_path):
    """With credentials: the other origin asks for them, is refused them, and the copy stops in
    one line (exit 4) before any tag."""
    login = {"BAKERY_REGISTRY_USER": "alice", "BAKERY_REGISTRY_PASSWORD": "s3cret"}
    with FaultyProxy(basic_registry, []) as elsewhere:
        fault = Fault("foreign-location", 1, "POST", "/blobs/uploads/", to=elsewhere.host)
        with FaultyProxy(basic_registry, [], script=[fault]) as proxy:
            repo = fresh("mirror-login")
            result = invoke(ROOT, "mirror", "--base", str(fixture_base), "--to", f"{proxy.host}/{repo}:v1",
                            env={"BAKERY_CACHE": str(tmp_path / "cache"), "BAKERY_REGISTRY_HOSTS": proxy.host,
                                 **login, **FAST})
    assert all(auth is None for _, _, auth in elsewhere.authorization)
    line = one_error_line(result)
    assert result.returncode == 4 and "credentials go only to the registry's own origin" in line, result.stderr
    found = requests.get(f"http://{basic_registry}/v2/{repo}/tags/list", auth=("alice", "s3cret"), timeout=30)
    assert found.status_code == 404 or not found.json().get("tags"), found.text


def test_retry_after_is_waited_for(registry, fixture_base, tmp_path):
    """A 429 that says Retry-After: 2 is asked again no sooner than 2 s later (not after the first
    backoff step, a quarter of a second)."""
    fault = Fault("429", 1, "GET", "/manifests/", retry_after=2)
    result, proxy, repo = mirror(registry, fixture_base, tmp_path, [fault])
    check(result, proxy, registry, repo, {"v1": str(fixture_base.digest)}, OK)
    asked = [t for t, m, p, _ in proxy.events if m == "GET" and "/manifests/" in p]
    assert asked[1] - asked[0] >= 2, f"asked again after {asked[1] - asked[0]:.2f} s"


def test_a_registry_that_keeps_asking_to_wait_ends_the_command(registry, fixture_base, tmp_path):
    """429 with Retry-After: 1 for ever, the waits limited to 2.5 s in all: asked three times (two
    waits of a second; a third would pass the limit), then one line saying so, exit 3, no tag.
    Before, it was asked five times whatever the limit (four waits of up to a minute each)."""
    fault = Fault("429", 1, "GET", "/manifests/", times=ALWAYS, retry_after=1)
    result, proxy, repo = mirror(registry, fixture_base, tmp_path, [fault],
                                 env={"BAKERY_REGISTRY_RETRY_AFTER_LIMIT": "2.5"})
    check(result, proxy, registry, repo, {"v1": str(fixture_base.digest)}, (3, "kept asking us to wait", NO_TAG))
    asked = [t for t, m, p, _ in proxy.events if m == "GET" and "/manifests/" in p]
    assert len(asked) == 3 and asked[-1] - asked[0] >= 2, [round(t - asked[0], 2) for t in asked]


# -- invoke build --push: the build's push through the proxy ----------------------------------

@pytest.fixture(scope="module")
def build_project(fixture_lock, tmp_path_factory):
    return copy_project(tmp_path_factory.mktemp("faults") / "project", fixture_lock)


def build_push(registry, base, project, script):
    with FaultyProxy(registry, [], script=script, stall_s=STALL_S) as proxy:
        repo = fresh("build")
        out = project / f"out-{repo.rsplit('-', 1)[1]}"
        result = invoke(project, "build", "--base", str(base), "--push", f"{proxy.host}/{repo}:v1",
                        "--out", str(out), env=FAST)
    return result, proxy, repo


@pytest.fixture(scope="module")
def clean_build(registry, fixture_base, build_project):
    """The reference: the tags a clean build's push makes (the image's, v1, and its kernels
    artifact's), and the requests it made."""
    result, proxy, repo = build_push(registry, fixture_base, build_project, [])
    assert result.returncode == 0, result.stderr
    made = tags(registry, repo)
    assert made["v1"] == str(Reference.parse(last_line(result)).digest)
    return made, proxy.seen


# a clean build's push asks: for the kernels artifact HEAD its manifest, per blob HEAD, POST, PUT, then
# PUT its manifest (PUT /manifests/ #1); for the image HEAD v1, HEAD each blob, then per blob a POST,
# PATCH (large ones) and PUT, the base's layers copied from the registry itself (not through the
# proxy); PUT the manifest by digest (#2), then by tag (#3)
BUILD_SAMPLE = [
    (Fault("502", 2, "PUT", "/manifests/"), OK),
    (Fault("reset", 6, "PUT", "/blobs/uploads/"), OK),
    (Fault("wrong-digest", 1, "PUT", "/manifests/"), (5, "stored manifest as", NO_V1)),
]
BUILD_SWEEP = [
    (Fault("503", 2, "HEAD", "/manifests/"), OK),
    (Fault("429", 2, "POST", "/blobs/uploads/", retry_after=1), OK),
    (Fault("reset", 1, "PATCH", "/blobs/uploads/"), OK),
    (Fault("reset", 1, "PUT", "/blobs/uploads/"), OK),
    (Fault("reset", 3, "PUT", "/manifests/"), OK),
    (Fault("stall", 2, "HEAD", "/blobs/"), OK),
    (Fault("wrong-digest", 1, "PUT", "/blobs/uploads/"), (5, "stored blob as", NO_TAG)),
    (Fault("wrong-digest", 2, "PUT", "/manifests/"), (5, "stored manifest as", NO_V1)),
    (Fault("500", 1, "PUT", "/manifests/", times=ALWAYS), (3, "HTTP 500", NO_TAG)),
]


@pytest.mark.parametrize("fault, expected", BUILD_SAMPLE, ids=_ids(BUILD_SAMPLE))
def test_build_push_sample(registry, fixture_base, build_project, clean_build, fault, expected):
    result, proxy, repo = build_push(registry, fixture_base, build_project, [fault])
    check(result, proxy, registry, repo, clean_build[0], expected)


@pytest.mark.sweep
@pytest.mark.parametrize("fault, expected", BUILD_SWEEP, ids=_ids(BUILD_SWEEP))
def test_build_push_sweep(registry, fixture_base, build_project, clean_build, fault, expected):
    result, proxy, repo = build_push(registry, fixture_base, build_project, [fault])
    check(result, proxy, registry, repo, clean_build[0], expected)
