"""Offline validation of deploy/k8s, run by `./dev lint-deploy` in its venv.

The layout is base/ (what `kubectl apply -k deploy/k8s/base` applies),
overlays/*/ and components/*/ beside it. Every resource the base lists is validated against the Kubernetes
JSON schemas that kubernetes-validate ships, strictly (an unknown field is an
error), at the oldest and the newest Kubernetes version the tool knows. The
kustomization's list and the directory must agree, so a manifest cannot be
added without being applied (and validated), nor listed without existing.

kubernetes-validate has no schema for a CRD such as the Prometheus
operator's ServiceMonitor, and for any kind it has no schema for it only
warns and passes. That would let a typo in a built-in kind through too, so
this driver uses its library API instead of its command line: the CRDs named
in CRDS skip the schema (and get a check of the fields the wiring relies
on); any other kind without a schema is an error.

Schemas do not see whether kustomize can assemble the pieces (an overlay
nested inside its own base, for one, is refused), so every kustomization
is also rendered with `kustomize build` or `kubectl kustomize`, whichever is
installed; without either that step is reported as skipped.
"""

import pathlib
import shutil
import subprocess
import sys

import kubernetes_validate
import yaml
from kubernetes_validate.utils import all_versions

CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def crd_check(doc):
    spec = doc.get("spec") or {}
    problems = []
    if not (spec.get("selector") or {}).get("matchLabels"):
        problems.append("spec.selector.matchLabels is missing")
    endpoints = spec.get("endpoints") or []
    if not endpoints or not all(e.get("port") for e in endpoints):
        problems.append("spec.endpoints needs at least one entry, each with a port name")
    return problems


def schema_versions():
    """The oldest and the newest Kubernetes version kubernetes-validate knows."""
    versions = all_versions()
    return [versions[0], versions[-1]]


def check_doc(doc, where, failures, verbose=True):
    """One manifest against the schemas (strict) at schema_versions(); a
    CRD of CRDS gets crd_check instead. Problems go to failures."""
    what = f"{where}: {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
    if (doc.get("apiVersion"), doc.get("kind")) in CRDS:
        problems = crd_check(doc)
        failures.extend(f"{what}: {p}" for p in problems)
        if verbose:
            print(f"{what}: CRD, no schema to validate against; required fields {'missing' if problems else 'present'}")
        return
    versions = schema_versions()
    before = len(failures)
    for version in versions:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path_in_doc = ".".join(str(p) for p in e.path)
            failures.append(f"{what}: Kubernetes {version}: {path_in_doc}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            failures.append(f"{what}: {e.message} (not a CRD listed in deploy/validate.py)")
    if verbose and len(failures) == before:
        print(f"{what}: valid (Kubernetes {' and '.join(versions)}, strict)")


def overlay_resources(overlay, failures):
    """An overlay's or a component's own manifests (its `resources` that are files, not the
    base directory), to be validated like the base's; its patches are
    partial objects with no schema of their own, so they need only exist
    and be listed. The directory and the lists must agree here too."""
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    resources = [r for r in kustomization.get("resources") or [] if r.endswith(".yaml")]
    patches = [p["path"] for p in kustomization.get("patches") or []]
    present = sorted(p.name for p in overlay.glob("*.yaml") if p.name != "kustomization.yaml")
    where = f"{overlay.parent.name}/{overlay.name}"
    for name in sorted(set(present) - set(resources) - set(patches)):
        failures.append(f"{where}/{name}: not listed in its kustomization.yaml")
    for name in sorted((set(resources) | set(patches)) - set(present)):
        failures.append(f"{where}/kustomization.yaml lists {name}, which does not exist")
    return [(f"{where}/{name}", overlay / name) for name in resources]


def render(k8s_dir, failures):
    """Each buildable kustomization (the base and every overlay; a component
    is built only as part of one) rendered as kubectl would apply it."""
    if shutil.which("kustomize"):
        command = ["kustomize", "build"]
    elif shutil.which("kubectl"):
        command = ["kubectl", "kustomize"]
    else:
        print("kustomize build: skipped (neither kustomize nor kubectl is installed)")
        return
    roots = [k8s_dir / "base"] + sorted(p.parent for p in (k8s_dir / "overlays").glob("*/kustomization.yaml"))
    for root in roots:
        where = root.relative_to(k8s_dir)
        done = subprocess.run(command + [str(root)], capture_output=True, text=True)
        if done.returncode != 0:
            failures.append(f"{where}: {' '.join(command)} failed: {done.stderr.strip()}")
        else:
            kinds = sum(1 for doc in yaml.safe_load_all(done.stdout) if doc)
            print(f"{where}: {' '.join(command)} renders {kinds} resources")


def main(k8s_dir):
    k8s_dir = pathlib.Path(k8s_dir)
    base = k8s_dir / "base"
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    listed = kustomization.get("resources") or []
    present = sorted(p.name for p in base.glob("*.yaml") if p.name != "kustomization.yaml")
    failures = []
    to_check = [(f"base/{name}", base / name) for name in listed]
    for overlay in sorted(
        list((k8s_dir / "overlays").glob("*/kustomization.yaml"))
        + list((k8s_dir / "components").glob("*/kustomization.yaml"))
    ):
        to_check += overlay_resources(overlay.parent, failures)
    for name in sorted(set(present) - set(listed)):
        failures.append(f"base/{name}: not listed in base/kustomization.yaml resources")
    for name in sorted(set(listed) - set(present)):
        failures.append(f"base/kustomization.yaml lists {name}, which does not exist")
    render(k8s_dir, failures)
    checked = 0
    for name, path in to_check:
        if not path.exists():
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            checked += 1
            check_doc(doc, name, failures)
    for f in failures:
        print(f"error: {f}", file=sys.stderr)
    if failures:
        return 1
    if checked == 0:
        print("error: no resources found", file=sys.stderr)
        return 1
    print(f"{checked} resources valid")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "deploy/k8s"))
