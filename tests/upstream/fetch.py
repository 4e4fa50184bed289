"""Brings PyTorch's upstream test/ tree onto this machine from Debian's
`pytorch` source package, with apt-get and the machine's own Debian sources.

    python -m tests.upstream.fetch          # prints the test directory

The tree lands in .cache/upstream/<version>/test (git-ignored) and is reused.
Nothing in it is edited: compatibility with this PyTorch is handled by
tests/upstream/compat.py.

Why Debian: the PyTorch wheel ships torch/testing/_internal (the OpInfo and
ModuleInfo databases, common_device_type) but not test/*.py, PyTorch publishes
no source distribution on the package index, and the only other registry this
project reaches is Debian's. The version is pinned (with the orig tarball's
SHA-256) so that the skip lists, which name tests, stay meaningful: the newest
version listed by the mirror's unstable index may not have its files served,
and a newer tree changes which tests exist. TORCHNEURON_UPSTREAM_DEBIAN_VERSION
with TORCHNEURON_UPSTREAM_DEBIAN_SUITE tries another version (the checksum is
then not checked, and the lists may need updating).
"""
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("TORCHNEURON_UPSTREAM_CACHE", os.path.join(ROOT, ".cache", "upstream"))

PINNED_VERSION = "2.6.0+dfsg-7"
PINNED_SUITE = "trixie"  # the suite whose pool serves PINNED_VERSION
PINNED_ORIG_SHA256 = "099a9601bc40d67656e75735c44abedb0fbe92d08817852ab7472eebb7e6ddff"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def version():
    return os.environ.get("TORCHNEURON_UPSTREAM_DEBIAN_VERSION", PINNED_VERSION)


def upstream_version():
    """'2.6.0' for '2.6.0+dfsg-7'."""
    return version().split("+")[0].split("-")[0]


def test_dir():
    return os.path.join(CACHE, version(), "test")


def _debian_uri():
    """The main archive URI of the machine's configured Debian sources (deb822 or
    one-line), so that no host name is written anywhere in the project."""
    candidates = []
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        uris, suites = [], []
        for line in open(path):
            key, _, value = line.partition(":")
            if key.strip() == "URIs":
                uris += value.split()
            elif key.strip() == "Suites":
                suites += value.split()
        if any(not s.endswith("-security") for s in suites):
            candidates += uris
    for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
        if not os.path.exists(path):
            continue
        for line in open(path):
            parts = [p for p in line.split("#")[0].split() if not p.startswith("[")]
            if len(parts) >= 3 and parts[0] in ("deb", "deb-src") and not parts[2].endswith("-security"):
                candidates.append(parts[1])
    for uri in candidates:
        if uri.rstrip("/").endswith("/debian"):
            return uri
    if candidates:
        return candidates[0]
    raise RuntimeError("no Debian archive found in /etc/apt/sources.list{,.d}; the upstream tests need one")


def _apt(args, workdir):
    opts = [f"-o=Dir::Etc::SourceList={workdir}/sources.list", "-o=Dir::Etc::SourceParts=/dev/null",
            f"-o=Dir::State::Lists={workdir}/lists", f"-o=Dir::Cache={workdir}/cache",
            "-o=APT::Sandbox::User=root", "-o=Debug::NoLocking=1", "-qq"]
    subprocess.run(["apt-get", *opts, *args], cwd=workdir, check=True)


def fetch(quiet=False):
    """Returns the test directory, downloading and unpacking it on first use."""
    dest = test_dir()
    stamp = os.path.join(CACHE, version(), ".complete")
    if os.path.exists(stamp):
        return dest
    if not shutil.which("apt-get"):
        raise RuntimeError("apt-get is needed to fetch PyTorch's test files (Debian's pytorch source package)")
    suite = os.environ.get("TORCHNEURON_UPSTREAM_DEBIAN_SUITE", PINNED_SUITE)
    os.makedirs(CACHE, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        # A private apt state: the machine's sources keep only binary entries, and
        # its package lists stay as they are.
        os.makedirs(f"{work}/lists/partial")
        os.makedirs(f"{work}/cache/archives/partial")
        signed = f" [signed-by={KEYRING}]" if os.path.exists(KEYRING) else ""
        with open(f"{work}/sources.list", "w") as f:
            f.write(f"deb-src{signed} {_debian_uri()} {suite} main\n")
        if not quiet:
            print(f"[upstream] fetching Debian's pytorch {version()} source package ({suite})", file=sys.stderr)
        _apt(["update"], work)
        _apt(["source", "--download-only", f"pytorch={version()}"], work)
        orig = glob.glob(f"{work}/pytorch_*.orig.tar.*")
        if len(orig) != 1:
            raise RuntimeError(f"expected one orig tarball, found {orig}")
        if version() == PINNED_VERSION:
            h = hashlib.sha256(open(orig[0], "rb").read()).hexdigest()
            if h != PINNED_ORIG_SHA256:
                raise RuntimeError(f"{orig[0]}: SHA-256 {h}, expected {PINNED_ORIG_SHA256}")
        unpack = os.path.join(work, "unpack")
        with tarfile.open(orig[0]) as tar:
            members = [m for m in tar.getmembers() if m.name.split("/")[1:2] == ["test"]]
            tar.extractall(unpack, members=members, filter="data")
        (top,) = os.listdir(unpack)
        shutil.rmtree(os.path.join(CACHE, version()), ignore_errors=True)
        os.makedirs(os.path.join(CACHE, version()))
        os.rename(os.path.join(unpack, top, "test"), dest)
        open(stamp, "w").write(os.path.basename(orig[0]) + "\n")
    return dest


if __name__ == "__main__":
    print(fetch())
