"""Offline checks of the Helm charts in deploy/helm, run by `./dev lint-deploy`
in its venv (helm and kubectl on PATH, see ./dev):

    python deploy/validate_helm.py deploy/helm deploy/k8s

0. Each chart's README.md has a row for every value of its values.yaml
   (a map may have one row for all its keys), and no row for a value that
   is not there.
1. `helm lint --strict` of each chart, with its defaults and with each of its
   ci/*-values.yaml.
2. `helm template` of the same, every rendered manifest validated against
   the Kubernetes schemas as deploy/validate.py validates deploy/k8s (strict,
   oldest and newest version; the ServiceMonitor CRD by its required fields).
3. The chart's refusals: a render that deploys but would not work (several
   replicas without a shared session table, a termination budget below the
   preStop sleep plus the grace period, a gateway.yaml key the chart owns, an
   unknown serviceMonitor.create) must fail, each paired with the same setup
   made valid, which must render.
4. Agreement with Kustomize: the charts, installed as the docs say (release
   names llm-gateway and llm-gateway-bodylog, the base's namespace, on a
   cluster serving the ServiceMonitor CRD), render the resources
   `kubectl kustomize` renders, name for name and field for field:
   - the gateway chart's defaults against deploy/k8s/base;
   - its ci/redis-bodylog-values.yaml plus the body-log chart's defaults
     against overlays/replicas-redis with components/bodylog added to the
     base (what the Kubernetes page tells an operator to do).
   The chart may add labels and annotations (its release label, the
   gateway.yaml checksum), and its selectors may hold more labels than the
   base's; nothing else may differ. ConfigMap files (gateway.yaml, routes)
   are compared as the YAML they parse to, since comments may differ.
5. Controls for 4: the same comparison must report a drift planted on each
   side (an edited copy of deploy/k8s, a chart value changed); a check that
   passes those too would be checking nothing.
"""

import pathlib
import shutil
import subprocess
import sys
import tempfile

import yaml

from validate import check_doc

GATEWAY_RELEASE = "llm-gateway"
BODYLOG_RELEASE = "llm-gateway-bodylog"
MONITOR_API = "monitoring.coreos.com/v1/ServiceMonitor"

# Label maps the chart may extend (its instance label, its checksum
# annotation): every base entry must be there, with its value, and the
# chart may have one where the base has none. A Service's selector is a
# label map; a Deployment's holds one (matchLabels), compared as a map.
SUPERSET_PATHS = {
    ("metadata", "labels"),
    ("metadata", "annotations"),
    ("spec", "selector"),
    ("spec", "selector", "matchLabels"),
    ("spec", "template", "metadata", "labels"),
    ("spec", "template", "metadata", "annotations"),
}


def is_label_map(value):
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def run(command):
    return subprocess.run(command, capture_output=True, text=True)


def docs_of(text):
    return [d for d in yaml.safe_load_all(text) if d]


def key(doc):
    meta = doc.get("metadata") or {}
    return (doc.get("kind"), meta.get("namespace"), meta.get("name"))


def label(k):
    kind, namespace, name = k
    return f"{kind}/{name}" + (f" ({namespace})" if namespace else "")


class Charts:
    def __init__(self, helm_dir, namespace):
        self.gateway = helm_dir / "llm-gateway"
        self.bodylog = helm_dir / "llm-gateway-bodylog"
        self.namespace = namespace

    def template(self, chart, release, args=(), monitor=True):
        """(docs, None) or (None, helm's error)."""
        command = ["helm", "template", release, str(chart), "-n", self.namespace, *args]
        if monitor:
            command += ["--api-versions", MONITOR_API]
        done = run(command)
        if done.returncode != 0:
            return None, done.stderr.strip()
        return docs_of(done.stdout), None


def kustomize(root):
    done = run(["kubectl", "kustomize", str(root)])
    if done.returncode != 0:
        raise SystemExit(f"kubectl kustomize {root} failed: {done.stderr.strip()}")
    return docs_of(done.stdout)


def with_bodylog_component(k8s_copy):
    """Adds components/bodylog to the copy's base, as the Kubernetes page says
    (`kustomize edit add component ../components/bodylog`)."""
    path = k8s_copy / "base" / "kustomization.yaml"
    text = path.read_text()
    if "\ncomponents:" in text:
        raise SystemExit(f"{path} already lists components; the composition below assumes none")
    path.write_text(text + "components:\n  - ../components/bodylog\n")


def kustomize_scenarios(k8s_dir):
    """The two renders the charts must agree with, from a copy of k8s_dir."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp) / "k8s"
        shutil.copytree(k8s_dir, copy)
        base = kustomize(copy / "base")
        with_bodylog_component(copy)
        redis_bodylog = kustomize(copy / "overlays" / "replicas-redis")
    return base, redis_bodylog


def differences(base, chart, path=()):
    """Where chart's value differs from base's, as `path: base X, chart Y`."""
    where = ".".join(str(p) for p in path) or "(whole)"
    if path in SUPERSET_PATHS and is_label_map(base) and is_label_map(chart):
        return [
            f"{where}.{k}: base {v!r}, chart {chart.get(k)!r}"
            for k, v in base.items()
            if chart.get(k) != v
        ]
    if isinstance(base, dict) and isinstance(chart, dict):
        out = []
        for k in sorted(set(base) | set(chart), key=str):
            if k not in chart:
                out.append(f"{where}.{k}: base {base[k]!r}, chart has none")
            elif k not in base:
                if not (path + (k,) in SUPERSET_PATHS and is_label_map(chart[k])):
                    out.append(f"{where}.{k}: chart {chart[k]!r}, base has none")
            else:
                out.extend(differences(base[k], chart[k], path + (k,)))
        return out
    if isinstance(base, list) and isinstance(chart, list):
        if len(base) != len(chart):
            return [f"{where}: base has {len(base)} entries, chart {len(chart)}: base {base!r}, chart {chart!r}"]
        out = []
        for i, (b, c) in enumerate(zip(base, chart)):
            out.extend(differences(b, c, path + (i,)))
        return out
    return [] if base == chart else [f"{where}: base {base!r}, chart {chart!r}"]


def parsed_files(doc):
    """A ConfigMap with each file parsed: the same settings with other
    comments are the same ConfigMap."""
    if doc.get("kind") != "ConfigMap":
        return doc
    doc = dict(doc)
    doc["data"] = {name: yaml.safe_load(text) for name, text in (doc.get("data") or {}).items()}
    return doc


def agreement(base_docs, chart_docs):
    base = {key(d): parsed_files(d) for d in base_docs}
    chart = {key(d): parsed_files(d) for d in chart_docs}
    problems = []
    for k in sorted(set(base) - set(chart), key=str):
        problems.append(f"{label(k)}: Kustomize renders it, the chart does not")
    for k in sorted(set(chart) - set(base), key=str):
        problems.append(f"{label(k)}: the chart renders it, Kustomize does not")
    for k in sorted(set(base) & set(chart), key=str):
        problems.extend(f"{label(k)}: {d}" for d in differences(base[k], chart[k]))
    return problems


def documented_values(readme_text):
    """The value paths README.md's table rows name (their first cell)."""
    rows = set()
    for line in readme_text.splitlines():
        if line.startswith("| `"):
            rows.add(line.split("`")[1])
    return rows


def undocumented(values, rows, path=""):
    """Every value values.yaml sets that README.md does not list. A row for a
    map covers the map (routes, resources, probes); else each of its keys
    needs its own. Also every row that names no value."""
    missing = []

    def walk(value, at):
        if at in rows:
            return
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, f"{at}.{k}" if at else k)
        else:
            missing.append(f"{at}: in values.yaml, no row in README.md")

    walk(values, path)

    def exists(dotted):
        node = values
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    missing += [f"{row}: a row in README.md, not in values.yaml" for row in sorted(rows) if not exists(row)]
    return missing


def values_documented(charts, failures):
    """Each chart's README.md lists every value, and only values; with a
    control that a row taken out is reported."""
    for chart in (charts.gateway, charts.bodylog):
        values = yaml.safe_load((chart / "values.yaml").read_text())
        rows = documented_values((chart / "README.md").read_text())
        problems = undocumented(values, rows)
        failures.extend(f"{chart.name}: {p}" for p in problems)
        if problems:
            continue
        dropped = sorted(rows)[0]
        if not undocumented(values, rows - {dropped}):
            failures.append(f"{chart.name}: control: README.md without its row for {dropped} passed the check")
        else:
            print(f"{chart.name}/README.md lists all {len(rows)} values (a row taken out, {dropped}, is reported)")


def lint(charts, failures):
    for chart in (charts.gateway, charts.bodylog):
        for values in [None] + sorted((chart / "ci").glob("*-values.yaml")):
            command = ["helm", "lint", "--strict", str(chart), "-n", charts.namespace]
            what = chart.name + (f" -f ci/{values.name}" if values else "")
            if values:
                command += ["-f", str(values)]
            done = run(command)
            if done.returncode != 0:
                failures.append(f"helm lint {what}: {done.stdout.strip()} {done.stderr.strip()}")
            else:
                print(f"helm lint --strict {what}: clean")


def render_and_validate(charts, failures):
    """Every chart with its defaults (on a cluster with and without the
    ServiceMonitor CRD) and with each ci values file, schema-validated."""
    checked = 0
    for chart, release in ((charts.gateway, GATEWAY_RELEASE), (charts.bodylog, BODYLOG_RELEASE)):
        renders = [([], False), ([], True)] + [
            (["-f", str(v)], True) for v in sorted((chart / "ci").glob("*-values.yaml"))
        ]
        for args, monitor in renders:
            what = f"helm template {chart.name}" + (f" {' '.join(args)}" if args else "") + (
                f" --api-versions {MONITOR_API}" if monitor else ""
            )
            docs, error = charts.template(chart, release, args, monitor)
            if error:
                failures.append(f"{what}: {error}")
                continue
            before = len(failures)
            for doc in docs:
                check_doc(doc, chart.name, failures, verbose=False)
            checked += len(docs)
            kinds = ", ".join(label(key(d)) for d in docs)
            state = "valid" if len(failures) == before else "INVALID"
            print(f"{what}: {len(docs)} resources {state} (strict schemas): {kinds}")
    return checked


def refusals(charts, failures):
    """Each refused setup fails to render with its reason, and the same setup
    made sound renders (so the refusal is the guard's, not a broken chart)."""
    cases = [
        (["--set", "replicaCount=3"], "without a shared session table",
         ["--set", "replicaCount=3", "--set", "redis.enabled=true"]),
        (["--set", "replicaCount=3"], "without a shared session table",
         ["--set", "replicaCount=3", "--set", "allowReplicasWithoutSessionStore=true"]),
        (["--set", "shutdown.gracePeriodSeconds=60"], "must cover",
         ["--set", "shutdown.gracePeriodSeconds=60", "--set", "shutdown.terminationGracePeriodSeconds=70"]),
        (["--set", "config.listen=0.0.0.0:9000"], "set by the chart",
         ["--set", "ports.http=9000"]),
        (["--set", "serviceMonitor.create=yes"], "takes auto, true or false",
         ["--set", "serviceMonitor.create=false"]),
    ]
    for refused, reason, sound in cases:
        docs, error = charts.template(charts.gateway, GATEWAY_RELEASE, refused)
        if docs is not None or reason not in (error or ""):
            failures.append(f"helm template {' '.join(refused)}: rendered, or failed for another reason "
                            f"than {reason!r}: {error}")
        else:
            print(f"refused as it should be: {' '.join(refused)} ({reason})")
        docs, error = charts.template(charts.gateway, GATEWAY_RELEASE, sound)
        if docs is None:
            failures.append(f"helm template {' '.join(sound)} (the control) failed: {error}")
        else:
            print(f"  and its control renders: {' '.join(sound)}")


def main(helm_dir, k8s_dir):
    helm_dir, k8s_dir = pathlib.Path(helm_dir), pathlib.Path(k8s_dir)
    namespace = yaml.safe_load((k8s_dir / "base" / "kustomization.yaml").read_text())["namespace"]
    charts = Charts(helm_dir, namespace)
    failures = []
    values_documented(charts, failures)
    lint(charts, failures)
    checked = render_and_validate(charts, failures)
    refusals(charts, failures)

    # Agreement with the Kustomize manifests.
    base, redis_bodylog = kustomize_scenarios(k8s_dir)
    redis_values = ["-f", str(charts.gateway / "ci" / "redis-bodylog-values.yaml")]

    def chart_default(gateway_args=()):
        docs, error = charts.template(charts.gateway, GATEWAY_RELEASE, list(gateway_args))
        if error:
            raise SystemExit(f"helm template {charts.gateway.name}: {error}")
        return docs

    def chart_redis_bodylog(gateway_args=(), bodylog_args=()):
        gateway, error = charts.template(charts.gateway, GATEWAY_RELEASE, redis_values + list(gateway_args))
        if error:
            raise SystemExit(f"helm template {charts.gateway.name}: {error}")
        bodylog, error = charts.template(charts.bodylog, BODYLOG_RELEASE, list(bodylog_args))
        if error:
            raise SystemExit(f"helm template {charts.bodylog.name}: {error}")
        return gateway + bodylog

    scenarios = [
        ("chart defaults vs deploy/k8s/base", base, chart_default()),
        ("chart ci/redis-bodylog-values.yaml + llm-gateway-bodylog defaults vs "
         "overlays/replicas-redis with components/bodylog", redis_bodylog, chart_redis_bodylog()),
    ]
    for name, kustomized, charted in scenarios:
        problems = agreement(kustomized, charted)
        failures.extend(f"{name}: {p}" for p in problems)
        if not problems:
            print(f"agree: {name}: {len(kustomized)} resources, "
                  f"{', '.join(label(key(d)) for d in kustomized)}")

    # Controls: a planted drift on either side must be reported, naming the
    # resource it is in.
    def edited_k8s(file, old, new):
        with tempfile.TemporaryDirectory() as tmp:
            copy = pathlib.Path(tmp) / "k8s"
            shutil.copytree(k8s_dir, copy)
            path = copy / file
            text = path.read_text()
            if old not in text:
                raise SystemExit(f"control: {file} no longer holds {old!r}; update the control")
            path.write_text(text.replace(old, new, 1))
            return kustomize_scenarios(copy)

    controls = [
        ("base/configmap-gateway.yaml client_idle_timeout 60s -> 61s", "ConfigMap/llm-gateway-config", "client_idle_timeout",
         lambda: agreement(edited_k8s("base/configmap-gateway.yaml", "client_idle_timeout: 60s",
                                      "client_idle_timeout: 61s")[0], chart_default())),
        ("base/configmap-routes.yaml health interval 5s -> 6s", "ConfigMap/llm-gateway-routes", "chat.yaml.health.interval",
         lambda: agreement(edited_k8s("base/configmap-routes.yaml", "interval: 5s", "interval: 6s")[0],
                           chart_default())),
        ("base/deployment.yaml preStop sleep 5 -> 6", "Deployment/llm-gateway ", "lifecycle.preStop",
         lambda: agreement(edited_k8s("base/deployment.yaml", '["sleep", "5"]', '["sleep", "6"]')[0],
                           chart_default())),
        ("overlay's session_store url /0 -> /1", "ConfigMap/llm-gateway-config", "session_store.url",
         lambda: agreement(edited_k8s("overlays/replicas-redis/configmap-gateway.yaml",
                                      "llm-gateway-redis:6379/0", "llm-gateway-redis:6379/1")[1],
                           chart_redis_bodylog())),
        ("component's listener --dir /data -> /logs", "Deployment/llm-gateway-bodylog", "args",
         lambda: agreement(edited_k8s("components/bodylog/bodylog-listener.yaml", '"--dir", "/data"',
                                      '"--dir", "/logs"')[1], chart_redis_bodylog())),
        ("chart --set config.max_body_size=20m", "ConfigMap/llm-gateway-config", "max_body_size",
         lambda: agreement(base, chart_default(["--set", "config.max_body_size=20m"]))),
        ("chart --set ports.admin=8091", "Service/llm-gateway ", "spec.ports",
         lambda: agreement(base, chart_default(["--set", "ports.admin=8091"]))),
        ("chart --set nameOverride=gateway (labels)", "Deployment/llm-gateway ", "labels.app.kubernetes.io/name",
         lambda: agreement(base, chart_default(["--set", "nameOverride=gateway"]))),
        ("chart --set podDisruptionBudget.enabled=false", "PodDisruptionBudget/llm-gateway", "the chart does not",
         lambda: agreement(base, chart_default(["--set", "podDisruptionBudget.enabled=false"]))),
        ("chart --set redis.maxmemory=256mb", "Deployment/llm-gateway-redis", "args",
         lambda: agreement(redis_bodylog, chart_redis_bodylog(["--set", "redis.maxmemory=256mb"]))),
        ("chart --set bodylog.listenerHost=other:9999", "Deployment/llm-gateway ", "env",
         lambda: agreement(redis_bodylog, chart_redis_bodylog(["--set", "bodylog.listenerHost=other:9999"]))),
        ("bodylog chart --set persistence.enabled=true", "PersistentVolumeClaim/llm-gateway-bodylog-data",
         "Kustomize does not",
         lambda: agreement(redis_bodylog, chart_redis_bodylog(bodylog_args=["--set", "persistence.enabled=true"]))),
        ("bodylog chart --set ports.metrics=9100", "Service/llm-gateway-bodylog", "spec.ports",
         lambda: agreement(redis_bodylog, chart_redis_bodylog(bodylog_args=["--set", "ports.metrics=9100"]))),
    ]
    for name, resource, field, reported in controls:
        problems = reported()
        caught = [p for p in problems if p.startswith(resource) and field in p]
        if not caught:
            failures.append(f"control not caught: {name}: the agreement check reported {problems or 'nothing'}, "
                            f"wanted a difference in {resource} at {field}")
        else:
            print(f"control caught: {name}: {caught[0]}")

    for f in failures:
        print(f"error: {f}", file=sys.stderr)
    if failures:
        return 1
    print(f"helm charts: {checked} rendered resources valid, {len(scenarios)} renders agree with Kustomize, "
          f"{len(controls)} planted drifts caught")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(*sys.argv[1:]))
