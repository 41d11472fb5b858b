//! The shipped deployment files agree with the code that reads them and
//! with each other: the Dockerfile, docker-compose.yml and deploy/k8s.
//! (`./dev lint-deploy` validates their syntax and schemas; this checks
//! what no schema knows: ports, paths, names, the grace budget.)

mod common;

use llm_gateway::config::{GatewayConfig, Overrides};
use serde_yaml::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn yaml(rel: &str) -> Value {
    serde_yaml::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `a.b.0.c` into a YAML value; panics naming the path when it is absent.
fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, key| {
        let next = match key.parse::<usize>() {
            Ok(i) => v.get(i),
            Err(_) => v.get(key),
        };
        next.unwrap_or_else(|| panic!("{path}: no {key:?} in {v:?}"))
    })
}

fn text<'a>(v: &'a Value, path: &str) -> &'a str {
    at(v, path)
        .as_str()
        .unwrap_or_else(|| panic!("{path} is not a string"))
}

fn number(v: &Value, path: &str) -> u64 {
    at(v, path)
        .as_u64()
        .unwrap_or_else(|| panic!("{path} is not a number"))
}

fn list<'a>(v: &'a Value, path: &str) -> &'a Vec<Value> {
    at(v, path)
        .as_sequence()
        .unwrap_or_else(|| panic!("{path} is not a list"))
}

fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn gateway_config(name: &str, text: &str) -> GatewayConfig {
    GatewayConfig::parse(Path::new(name), text, &Overrides::default())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `llm-gateway check` on a gateway.yaml and a routes directory.
fn check(config: &Path, routes: &Path) -> String {
    let out = Command::new(common::gateway_bin())
        .arg("check")
        .arg("--config")
        .arg(config)
        .arg("--routes")
        .arg(routes)
        .env_remove("LLM_GATEWAY_API_KEYS_FILE")
        .output()
        .expect("run check");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "check failed:\n{all}");
    all
}

/// The image's facts, read from docker/Dockerfile.
struct Image {
    text: String,
    uid: u64,
    cmd: Vec<String>,
}

fn image() -> Image {
    let text = read("docker/Dockerfile");
    let uid = text
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .and_then(|u| u.split(':').next())
        .and_then(|u| u.trim().parse().ok())
        .expect("docker/Dockerfile sets a numeric USER");
    let cmd = text
        .lines()
        .find_map(|l| l.strip_prefix("CMD "))
        .and_then(|c| serde_json::from_str(c).ok())
        .expect("docker/Dockerfile has a JSON-form CMD");
    Image { text, uid, cmd }
}

/// The value after `flag` in an argument list.
fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// The docker run line mounts the key directory where the image's config
/// reads the key file; otherwise auth would silently fail open.
#[test]
fn docker_mounts_keys_where_the_default_config_reads_them() {
    let gateway = read("conf/gateway.yaml");
    let keys_file = gateway
        .lines()
        .find_map(|l| l.strip_prefix("api_keys_file:"))
        .map(str::trim)
        .expect("conf/gateway.yaml names api_keys_file");
    assert_eq!(keys_file, llm_gateway::config::DEFAULT_API_KEYS_FILE);
    let keys_dir = Path::new(keys_file).parent().expect("a directory");
    let image = image();
    let mount = format!(":{}:ro", keys_dir.display());
    assert!(
        image.text.contains(&mount),
        "docker/Dockerfile must mount the key directory {} (read-only), found:\n{}",
        keys_dir.display(),
        image.text
    );
    // Control: the image ships that very config, and serves with it.
    assert!(image
        .text
        .contains("COPY conf/gateway.yaml /etc/llm-gateway/gateway.yaml"));
    assert_eq!(
        flag(&image.cmd, "--config"),
        Some("/etc/llm-gateway/gateway.yaml")
    );
    assert!(image.text.contains("ENTRYPOINT [\"llm-gateway\"]"));
    assert_ne!(image.uid, 0, "the image does not run as root");
}

struct Kube {
    gateway_yaml: String,
    gateway: GatewayConfig,
    routes: BTreeMap<String, String>,
    deployment: Value,
    service: Value,
}

fn kube() -> Kube {
    let config = yaml("deploy/k8s/base/configmap-gateway.yaml");
    // Not `at`: the key itself has a dot.
    let gateway_yaml = at(&config, "data")
        .get("gateway.yaml")
        .and_then(Value::as_str)
        .expect("the ConfigMap holds gateway.yaml")
        .to_string();
    let gateway = gateway_config("configmap-gateway.yaml gateway.yaml", &gateway_yaml);
    let routes_map = yaml("deploy/k8s/base/configmap-routes.yaml");
    let routes = at(&routes_map, "data")
        .as_mapping()
        .expect("routes data")
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().expect("key").to_string(),
                v.as_str().expect("text").to_string(),
            )
        })
        .collect();
    Kube {
        gateway_yaml,
        gateway,
        routes,
        deployment: yaml("deploy/k8s/base/deployment.yaml"),
        service: yaml("deploy/k8s/base/service.yaml"),
    }
}

/// Where the Deployment mounts the volume fed by `kind` named `name`
/// (`configMap`/`name` or `secret`/`secretName`), and whether by subPath.
fn mount_of(deployment: &Value, kind: &str, name: &str) -> String {
    let pod = at(deployment, "spec.template.spec");
    let volume = list(pod, "volumes")
        .iter()
        .find(|v| {
            v.get(kind).is_some_and(|src| {
                src.get("name")
                    .or(src.get("secretName"))
                    .and_then(Value::as_str)
                    == Some(name)
            })
        })
        .unwrap_or_else(|| panic!("no volume from {kind} {name}"));
    let volume = text(volume, "name");
    let mount = list(pod, "containers.0.volumeMounts")
        .iter()
        .find(|m| text(m, "name") == volume)
        .unwrap_or_else(|| panic!("volume {volume} is not mounted"));
    text(mount, "mountPath").to_string()
}

#[test]
fn k8s_configmap_gateway_yaml_and_routes_pass_check() {
    let k = kube();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.yaml");
    std::fs::write(&config, &k.gateway_yaml).unwrap();
    let routes = dir.path().join("routes");
    std::fs::create_dir(&routes).unwrap();
    for (name, body) in &k.routes {
        std::fs::write(routes.join(name), body).unwrap();
    }
    let out = check(&config, &routes);
    assert!(
        out.contains(&format!("config ok: {} route(s)", k.routes.len())),
        "{out}"
    );
    assert!(
        out.contains("watch: on"),
        "the pods reload on change: {out}"
    );
    // Control: check does fail on a broken route, so the pass above means something.
    std::fs::write(routes.join("broken.yaml"), "peers: [").unwrap();
    let failed = Command::new(common::gateway_bin())
        .args(["check", "--config"])
        .arg(&config)
        .arg("--routes")
        .arg(&routes)
        .output()
        .unwrap();
    assert!(!failed.status.success());
}

#[test]
fn k8s_paths_agree_between_gateway_yaml_and_the_deployment() {
    let k = kube();
    let d = &k.deployment;
    let container = at(d, "spec.template.spec.containers.0");
    let args: Vec<String> = list(container, "args")
        .iter()
        .map(|a| a.as_str().expect("arg").to_string())
        .collect();
    let config_path = PathBuf::from(flag(&args, "--config").expect("--config in args"));
    assert_eq!(
        config_path,
        Path::new(&mount_of(d, "configMap", "llm-gateway-config")).join("gateway.yaml"),
        "--config names gateway.yaml in the mounted ConfigMap"
    );
    assert!(
        flag(&args, "--routes").is_none(),
        "routes_dir comes from gateway.yaml"
    );
    assert_eq!(
        k.gateway.routes_dir,
        PathBuf::from(mount_of(d, "configMap", "llm-gateway-routes"))
    );
    let keys = &k.gateway.api_keys_file;
    assert_eq!(
        keys.parent().expect("a directory"),
        Path::new(&mount_of(d, "secret", "llm-gateway-api-keys"))
    );
    let secret = yaml("deploy/k8s/base/secret-api-keys.yaml");
    let key_name = keys.file_name().and_then(|n| n.to_str()).expect("name");
    assert!(
        at(&secret, "stringData").get(key_name).is_some(),
        "the Secret has the key file {key_name}"
    );
    // Whole volumes only: a subPath mount never sees the ..data swap that
    // the file watch follows.
    for m in list(container, "volumeMounts") {
        assert!(m.get("subPath").is_none(), "subPath mount: {m:?}");
        if text(m, "mountPath").starts_with("/etc/llm-gateway") {
            assert_eq!(at(m, "readOnly").as_bool(), Some(true), "{m:?}");
        }
    }
}

#[test]
fn k8s_ports_probes_and_labels_agree() {
    let k = kube();
    let d = &k.deployment;
    let container = at(d, "spec.template.spec.containers.0");
    let ports: BTreeMap<String, u64> = list(container, "ports")
        .iter()
        .map(|p| (text(p, "name").to_string(), number(p, "containerPort")))
        .collect();
    assert_eq!(ports.get("http"), Some(&u64::from(k.gateway.listen.port())));
    assert_eq!(
        ports.get("admin"),
        Some(&u64::from(k.gateway.admin_listen.port()))
    );
    let service_ports: BTreeSet<String> = list(&k.service, "spec.ports")
        .iter()
        .map(|p| {
            let target = text(p, "targetPort");
            assert!(ports.contains_key(target), "targetPort {target} exists");
            text(p, "name").to_string()
        })
        .collect();
    assert_eq!(
        service_ports,
        BTreeSet::from(["admin".into(), "http".into()])
    );
    let monitor = yaml("deploy/k8s/base/servicemonitor.yaml");
    let scrape = at(&monitor, "spec.endpoints.0");
    assert_eq!(text(scrape, "port"), "admin");
    assert_eq!(text(scrape, "path"), "/metrics");

    // The probes ask the admin port for a path the gateway serves.
    let gw = common::Gateway::start(&[]);
    for probe in ["readinessProbe", "livenessProbe"] {
        let get = at(container, &format!("{probe}.httpGet"));
        assert_eq!(text(get, "port"), "admin", "{probe}");
        let path = text(get, "path");
        assert_eq!(
            common::http::get(gw.admin, path).status(),
            200,
            "{probe} {path}"
        );
    }
    // Control: the admin listener does not answer 200 to any path.
    assert_eq!(common::http::get(gw.admin, "/readyz").status(), 404);

    // One set of labels ties the Deployment, Service, PDB and monitor.
    let pod_labels = labels(at(d, "spec.template.metadata.labels"));
    let selects_pods = |selector: &Value, what: &str| {
        let want = labels(selector);
        assert!(!want.is_empty(), "{what} selects something");
        for (k, v) in &want {
            assert_eq!(pod_labels.get(k), Some(v), "{what} selects the pods");
        }
    };
    selects_pods(at(d, "spec.selector.matchLabels"), "deployment");
    selects_pods(at(&k.service, "spec.selector"), "service");
    let pdb = yaml("deploy/k8s/base/poddisruptionbudget.yaml");
    selects_pods(at(&pdb, "spec.selector.matchLabels"), "pdb");
    let service_labels = labels(at(&k.service, "metadata.labels"));
    for (key, v) in labels(at(&monitor, "spec.selector.matchLabels")) {
        assert_eq!(
            service_labels.get(&key),
            Some(&v),
            "monitor selects the service"
        );
    }
}

#[test]
fn k8s_grace_budget_and_pod_security() {
    let k = kube();
    let pod = at(&k.deployment, "spec.template.spec");
    let container = at(pod, "containers.0");
    let sleep: Vec<&str> = list(container, "lifecycle.preStop.exec.command")
        .iter()
        .map(|c| c.as_str().expect("arg"))
        .collect();
    assert_eq!(sleep.first(), Some(&"sleep"));
    let sleep_secs: u64 = sleep[1].parse().expect("sleep seconds");
    assert!(sleep_secs > 0);
    // The kubelet counts from preStop: the sleep, then up to grace_period of
    // draining, must both fit before SIGKILL.
    let budget = number(pod, "terminationGracePeriodSeconds");
    let needed = sleep_secs + k.gateway.grace_period.as_secs();
    assert!(
        budget > needed,
        "terminationGracePeriodSeconds {budget} must exceed preStop {sleep_secs}s + grace_period {:?}",
        k.gateway.grace_period
    );
    assert_eq!(
        at(pod, "securityContext.runAsNonRoot").as_bool(),
        Some(true)
    );
    assert_eq!(number(pod, "securityContext.runAsUser"), image().uid);
    assert_eq!(
        at(container, "securityContext.readOnlyRootFilesystem").as_bool(),
        Some(true)
    );
    for kind in ["requests", "limits"] {
        let r = at(container, &format!("resources.{kind}"));
        assert!(
            r.get("cpu").is_some() && r.get("memory").is_some(),
            "{kind}"
        );
    }
    // Every manifest in the directory is applied by the kustomization.
    let kustomization = yaml("deploy/k8s/base/kustomization.yaml");
    let listed: BTreeSet<String> = list(&kustomization, "resources")
        .iter()
        .map(|r| r.as_str().expect("name").to_string())
        .collect();
    let present: BTreeSet<String> = std::fs::read_dir(root().join("deploy/k8s/base"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, present);
}

#[test]
fn docker_compose_wires_engines_routes_and_keys() {
    let compose = yaml("docker-compose.yml");
    let image = image();
    let conf = gateway_config("conf/gateway.yaml", &read("conf/gateway.yaml"));
    let routes_in_image = flag(&image.cmd, "--routes").expect("--routes in CMD");
    let gw = at(&compose, "services.gateway");
    let mut mounts = BTreeMap::new();
    for v in list(gw, "volumes") {
        let v = v.as_str().expect("short volume syntax");
        let parts: Vec<&str> = v.split(':').collect();
        assert_eq!(parts.get(2), Some(&"ro"), "{v} read-only");
        assert!(root().join(parts[0]).is_dir(), "{v}: host side exists");
        mounts.insert(parts[1].to_string(), parts[0].to_string());
    }
    let routes_host = mounts
        .get(routes_in_image)
        .unwrap_or_else(|| panic!("compose mounts {routes_in_image}"));
    let keys_dir = conf.api_keys_file.parent().expect("keys dir");
    let keys_host = mounts
        .get(keys_dir.to_str().expect("utf-8"))
        .unwrap_or_else(|| panic!("compose mounts {}", keys_dir.display()));
    let key_file = root()
        .join(keys_host)
        .join(conf.api_keys_file.file_name().expect("name"));
    let (_, keys) = llm_gateway::auth::KeySet::load(&key_file);
    assert!(
        keys.is_some_and(|k| !k.is_empty()),
        "{} holds a key",
        key_file.display()
    );

    // The routes pass check and point at the engines service's ports.
    let routes_dir = root().join(routes_host);
    let out = check(&root().join("conf/gateway.yaml"), &routes_dir);
    assert!(out.contains("config ok"), "{out}");
    let engines = at(&compose, "services.engines");
    let cmd: Vec<String> = list(engines, "command")
        .iter()
        .map(|c| c.as_str().expect("arg").to_string())
        .collect();
    assert_eq!(cmd.first().map(String::as_str), Some("sim"));
    assert_eq!(
        flag(&cmd, "--host"),
        Some("0.0.0.0"),
        "reachable from the gateway"
    );
    let first: u64 = flag(&cmd, "--port").expect("--port").parse().unwrap();
    let count: u64 = flag(&cmd, "--engines").expect("--engines").parse().unwrap();
    let mut peers = 0;
    for entry in std::fs::read_dir(&routes_dir).unwrap().flatten() {
        let route: Value = serde_yaml::from_str(&std::fs::read_to_string(entry.path()).unwrap())
            .expect("route yaml");
        for peer in list(&route, "peers") {
            peers += 1;
            assert_eq!(text(peer, "host"), "engines", "{peer:?}");
            let port = number(peer, "port");
            assert!(
                (first..first + count).contains(&port),
                "{port} is a sim engine"
            );
        }
    }
    assert!(peers > 0);

    // Published ports are the image config's listeners; stop waits for the drain.
    let published: BTreeSet<String> = list(gw, "ports")
        .iter()
        .map(|p| p.as_str().expect("port").to_string())
        .collect();
    for port in [conf.listen.port(), conf.admin_listen.port()] {
        assert!(
            published.contains(&format!("{port}:{port}")),
            "{port} published"
        );
    }
    let stop = llm_gateway::config::units::parse_duration(text(gw, "stop_grace_period"))
        .expect("duration");
    assert!(stop > conf.grace_period);
}

#[test]
fn the_scale_out_example_runs_two_replicas_on_one_redis() {
    use llm_gateway::config::store::SessionStoreConfig;
    let compose = yaml("deploy/scale-out/compose.yml");
    let services = at(&compose, "services");
    for name in ["redis", "engines", "gateway-a", "gateway-b", "front"] {
        assert!(!services[name].is_null(), "service {name}");
    }
    // Both replicas are the same service (a YAML merge of one anchor) and
    // read the example's gateway.yaml, which points at the redis service.
    let cmd: Vec<String> = list(at(services, "gateway-b"), "command")
        .iter()
        .map(|c| c.as_str().expect("arg").to_string())
        .collect();
    let config_in_container = flag(&cmd, "--config").expect("--config");
    let mounts: Vec<String> = list(at(services, "gateway-b"), "volumes")
        .iter()
        .map(|v| v.as_str().expect("short syntax").to_string())
        .collect();
    let config_dir = Path::new(config_in_container).parent().expect("dir");
    let host_dir = mounts
        .iter()
        .find_map(|m| {
            let p: Vec<&str> = m.split(':').collect();
            (Path::new(p[1]) == config_dir).then(|| p[0].to_string())
        })
        .expect("the example's directory is mounted where --config points");
    assert_eq!(host_dir, "./");
    let conf_path = "deploy/scale-out/gateway.yaml";
    let conf = gateway_config(conf_path, &read(conf_path));
    match conf.session_store {
        SessionStoreConfig::Redis(r) => assert!(r.url.contains("//redis:6379"), "{}", r.url),
        other => panic!("the example must share sessions: {other:?}"),
    }
    // Its routes (the engines service's) pass check with this gateway.yaml.
    let out = check(
        &root().join(conf_path),
        &root().join("deploy/compose/routes"),
    );
    assert!(out.contains("session store: redis"), "{out}");
    // The front spreads over exactly the two replicas.
    let nginx = read("deploy/scale-out/nginx.conf");
    assert!(nginx.contains("server gateway-a:8080;") && nginx.contains("server gateway-b:8080;"));
}

/// The base runs one replica (two behind a plain Service would split a
/// conversation's turns between two tables); the replicas-redis overlay
/// runs several on one Redis. Its gateway.yaml is the base's, line for
/// line, plus the shared session table (so the two cannot drift), and it
/// passes `llm-gateway check` with the base's routes, naming the overlay's
/// Redis Service. The control: the base's own says `local`.
#[test]
fn k8s_replicas_share_one_session_table_or_there_is_one_replica() {
    let k = kube();
    assert_eq!(number(&k.deployment, "spec.replicas"), 1);
    let overlay = "deploy/k8s/overlays/replicas-redis";
    let replicas = yaml(&format!("{overlay}/replicas.yaml"));
    assert!(number(&replicas, "spec.replicas") >= 2);
    let patched = yaml(&format!("{overlay}/configmap-gateway.yaml"));
    let overlay_yaml = at(&patched, "data")
        .get("gateway.yaml")
        .and_then(Value::as_str)
        .expect("the overlay's ConfigMap holds gateway.yaml")
        .to_string();
    let extra = overlay_yaml
        .strip_prefix(k.gateway_yaml.as_str())
        .unwrap_or_else(|| {
            panic!("the overlay's gateway.yaml starts with the base's:\n{overlay_yaml}")
        });
    assert!(extra.contains("session_store:"), "{extra}");

    let redis = std::fs::read_to_string(root().join(overlay).join("redis.yaml")).unwrap();
    let service: Vec<Value> = serde_yaml::Deserializer::from_str(&redis)
        .map(|d| serde::Deserialize::deserialize(d).expect("yaml"))
        .filter(|d: &Value| text(d, "kind") == "Service")
        .collect();
    let redis_host = text(&service[0], "metadata.name");

    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("routes");
    std::fs::create_dir(&routes).unwrap();
    for (name, body) in &k.routes {
        std::fs::write(routes.join(name), body).unwrap();
    }
    let run_check = |name: &str, text: &str| {
        let config = dir.path().join(name);
        std::fs::write(&config, text).unwrap();
        check(&config, &routes)
    };
    let out = run_check("overlay.yaml", &overlay_yaml);
    assert!(
        out.contains(&format!(
            "session store: redis at redis://{redis_host}:6379/0"
        )),
        "{out}"
    );
    let base = run_check("base.yaml", &k.gateway_yaml);
    assert!(base.contains("session store: local"), "{base}");
}

/// The body-log component: the gateway's env names the listener's Service
/// on the port the listener receives frames on, under the variable the
/// gateway reads; the listener's exporter port is the Service's `metrics`
/// port, which its ServiceMonitor scrapes; the listener runs the gateway's
/// own image.
#[test]
fn k8s_bodylog_component_wires_gateway_listener_and_monitor() {
    let dir = "deploy/k8s/components/bodylog";
    let docs: Vec<Value> =
        serde_yaml::Deserializer::from_str(&read(&format!("{dir}/bodylog-listener.yaml")))
            .map(|d| serde::Deserialize::deserialize(d).expect("yaml"))
            .collect();
    let of_kind = |kind: &str| docs.iter().find(|d| text(d, "kind") == kind).expect(kind);
    let (deployment, service, monitor) = (
        of_kind("Deployment"),
        of_kind("Service"),
        of_kind("ServiceMonitor"),
    );
    let container = at(deployment, "spec.template.spec.containers.0");
    assert_eq!(
        text(container, "image"),
        text(
            at(&kube().deployment, "spec.template.spec.containers.0"),
            "image"
        )
    );
    let args: Vec<String> = list(container, "args")
        .iter()
        .map(|a| a.as_str().expect("arg").to_string())
        .collect();
    assert_eq!(args[0], "bodylog-listen");
    let port_of = |addr: &str| addr.rsplit(':').next().unwrap().parse::<u64>().unwrap();
    let frames = port_of(flag(&args, "--listen").expect("--listen"));
    let exporter = port_of(flag(&args, "--metrics").expect("--metrics"));
    let service_port = |name: &str| {
        list(service, "spec.ports")
            .iter()
            .find(|p| text(p, "name") == name)
            .map(|p| number(p, "port"))
            .unwrap_or_else(|| panic!("service port {name}"))
    };
    assert_eq!(service_port("frames"), frames);
    assert_eq!(service_port("metrics"), exporter);
    assert_eq!(text(at(monitor, "spec.endpoints.0"), "port"), "metrics");

    let env = yaml(&format!("{dir}/gateway-env.yaml"));
    let var = at(&env, "spec.template.spec.containers.0.env.0");
    assert_eq!(text(var, "name"), llm_gateway::config::BODYLOG_ENV);
    let target = text(var, "value");
    assert_eq!(
        target,
        format!("{}:{frames}", text(service, "metadata.name")),
        "the gateway sends to the listener's Service"
    );
}

/// Every document of a multi-document manifest.
fn docs(rel: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(&read(rel))
        .map(|d| serde::Deserialize::deserialize(d).expect("yaml"))
        .collect()
}

/// The namespace whose EndpointSlices the shipped route watches.
fn watched_namespace(k: &Kube) -> String {
    let route: Value = serde_yaml::from_str(&k.routes["chat.yaml"]).expect("chat.yaml");
    text(&route, "peers_from.kubernetes.namespace").to_string()
}

/// What is wrong with the gateway's access to the API server: a Role that
/// grants anything but get/list/watch on discovery.k8s.io endpointslices,
/// lives in another namespace than `ns`, or is not bound to `account` (the
/// Deployment's ServiceAccount) in `ns`. Empty when it is right.
fn rbac_problems(role: &Value, binding: &Value, account: &str, ns: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let strings = |v: &Value, path: &str| -> BTreeSet<String> {
        list(v, path)
            .iter()
            .map(|s| s.as_str().expect("a string").to_string())
            .collect()
    };
    let rules = list(role, "rules");
    if rules.len() != 1 {
        problems.push(format!("{} rules, want exactly one", rules.len()));
    }
    for rule in rules {
        let want = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<BTreeSet<_>>();
        for (field, expected) in [
            ("apiGroups", want(&["discovery.k8s.io"])),
            ("resources", want(&["endpointslices"])),
            ("verbs", want(&["get", "list", "watch"])),
        ] {
            let got = strings(rule, field);
            if got != expected {
                problems.push(format!("{field} {got:?}, want {expected:?}"));
            }
        }
        if rule.get("resourceNames").is_some() {
            problems.push("resourceNames would hide slices the controller names".into());
        }
    }
    // A kustomization `namespace:` puts the Role there; one of its own
    // would be overridden, but a different one written here is a mistake.
    for (what, doc) in [("Role", role), ("RoleBinding", binding)] {
        if let Some(own) = doc.get("metadata").and_then(|m| m.get("namespace")) {
            if own.as_str() != Some(ns) {
                problems.push(format!("{what} in namespace {own:?}, want {ns}"));
            }
        }
    }
    let role_ref = at(binding, "roleRef");
    if text(role_ref, "kind") != "Role" || text(role_ref, "name") != text(role, "metadata.name") {
        problems.push(format!("the binding refers to {role_ref:?}"));
    }
    let bound = list(binding, "subjects").iter().any(|s| {
        text(s, "kind") == "ServiceAccount"
            && text(s, "name") == account
            && s.get("namespace").and_then(Value::as_str) == Some(ns)
    });
    if !bound {
        problems.push(format!("not bound to ServiceAccount {ns}/{account}"));
    }
    problems
}

/// The route watches EndpointSlices in one namespace, and the manifests
/// put the gateway there with exactly the access that needs: the
/// kustomizations' `namespace:`, the route's, the Role's and the
/// RoleBinding's subject agree, the Role grants get/list/watch on
/// endpointslices and nothing more, and it is bound to the ServiceAccount
/// the Deployment runs as (whose token is mounted). Redis, which talks to
/// no API server, gets no token. Each mutation below must be caught.
#[test]
fn k8s_rbac_grants_the_gateway_exactly_the_slices_its_route_watches() {
    let k = kube();
    let ns = watched_namespace(&k);
    let ns = ns.as_str();
    let base = yaml("deploy/k8s/base/kustomization.yaml");
    assert_eq!(
        text(&base, "namespace"),
        ns,
        "the base applies where the route watches"
    );
    let overlay = yaml("deploy/k8s/overlays/replicas-redis/kustomization.yaml");
    assert_eq!(text(&overlay, "namespace"), ns, "and so does the overlay");

    let pod = at(&k.deployment, "spec.template.spec");
    let account = text(pod, "serviceAccountName");
    assert_eq!(
        at(pod, "automountServiceAccountToken").as_bool(),
        Some(true),
        "the watcher reads the mounted token"
    );
    let sa = yaml("deploy/k8s/base/serviceaccount.yaml");
    assert_eq!(text(&sa, "kind"), "ServiceAccount");
    assert_eq!(text(&sa, "metadata.name"), account);

    let rbac = docs("deploy/k8s/base/rbac.yaml");
    let of_kind = |kind: &str| {
        rbac.iter()
            .find(|d| text(d, "kind") == kind)
            .expect(kind)
            .clone()
    };
    let (role, binding) = (of_kind("Role"), of_kind("RoleBinding"));
    assert_eq!(rbac.len(), 2, "a Role and its binding, no ClusterRole");
    assert_eq!(
        rbac_problems(&role, &binding, account, ns),
        Vec::<String>::new()
    );

    // Controls: each kind of mistake is reported.
    let mutated = |f: &dyn Fn(&mut Value, &mut Value)| {
        let (mut r, mut b) = (role.clone(), binding.clone());
        f(&mut r, &mut b);
        rbac_problems(&r, &b, account, ns)
    };
    let verbs = |r: &mut Value| r["rules"][0]["verbs"].as_sequence_mut().unwrap().clone();
    assert!(!mutated(&|r, _| {
        let mut v = verbs(r);
        v.push("delete".into());
        r["rules"][0]["verbs"] = Value::Sequence(v);
    })
    .is_empty());
    assert!(!mutated(&|r, _| {
        let mut v = verbs(r);
        v.retain(|x| x.as_str() != Some("watch"));
        r["rules"][0]["verbs"] = Value::Sequence(v);
    })
    .is_empty());
    assert!(!mutated(&|r, _| r["rules"][0]["apiGroups"] = vec![Value::from("")].into()).is_empty());
    assert!(
        !mutated(&|r, _| r["rules"][0]["resources"] = vec![Value::from("endpoints")].into())
            .is_empty()
    );
    assert!(!mutated(&|_, b| b["subjects"][0]["namespace"] = "default".into()).is_empty());
    assert!(!mutated(&|_, b| b["subjects"][0]["name"] = "default".into()).is_empty());
    assert!(!mutated(&|r, _| r["metadata"]["name"] = "other".into()).is_empty());

    // The book's Kubernetes page names the same namespace in its commands.
    let page = read("docs/src/deployment/kubernetes.md");
    let named: BTreeSet<&str> = page
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0] == "-n")
        .map(|w| w[1])
        .collect();
    assert_eq!(
        named,
        BTreeSet::from([ns]),
        "kubectl -n in docs/src/deployment/kubernetes.md"
    );

    // No token where nothing calls the API server.
    let redis = docs("deploy/k8s/overlays/replicas-redis/redis.yaml");
    let redis_pod = redis
        .iter()
        .find(|d| text(d, "kind") == "Deployment")
        .map(|d| at(d, "spec.template.spec"))
        .expect("redis Deployment");
    assert_eq!(
        at(redis_pod, "automountServiceAccountToken").as_bool(),
        Some(false)
    );
}

/// The replicas-redis overlay as shipped, run as two gateway processes on
/// loopback: its gateway.yaml and the base's chat.yaml, changed only where
/// a cluster address cannot work here (listeners and mount paths, which the
/// harness sets; the Redis URL, to a Redis this test starts; the route's
/// API server, to a stub serving the engines' EndpointSlice; the engines'
/// port). The selector, namespace and pod naming are the manifests'. With
/// the shared table every session's turns, alternating between the two,
/// go to one engine; the control, the same without `session_store`,
/// splits some.
#[test]
fn k8s_overlay_runs_as_two_gateways_that_agree_on_every_session() {
    use common::redis::Redis;
    let k = kube();
    let ns = watched_namespace(&k);
    let overlay = yaml("deploy/k8s/overlays/replicas-redis/configmap-gateway.yaml");
    let mut config: Value = serde_yaml::from_str(
        at(&overlay, "data")
            .get("gateway.yaml")
            .and_then(Value::as_str)
            .expect("the overlay's gateway.yaml"),
    )
    .expect("yaml");
    let mut route: Value = serde_yaml::from_str(&k.routes["chat.yaml"]).expect("chat.yaml");

    // Engines as three pods on loopback addresses, one port, as behind a Service.
    let port = common::free_port();
    let pods = [
        ("vllm-0", IpAddr::from([127, 0, 0, 2])),
        ("vllm-1", IpAddr::from([127, 0, 0, 3])),
        ("vllm-2", IpAddr::from([127, 0, 0, 4])),
    ];
    let _engines = llm_gateway_sim::spawn_engines_on(
        pods.iter()
            .map(|(_, ip)| SocketAddr::new(*ip, port))
            .collect(),
        vec![common::EngineConfig::default(); pods.len()],
    )
    .expect("simulated engines");
    let selector = text(&route, "peers_from.kubernetes.selector").to_string();
    let (key, value) = selector.split_once('=').expect("selector is key=value");
    let addresses: Vec<String> = pods.iter().map(|(_, ip)| ip.to_string()).collect();
    let endpoints: Vec<(&str, &str, bool)> = pods
        .iter()
        .zip(&addresses)
        .map(|((pod, _), ip)| (*pod, ip.as_str(), true))
        .collect();
    let mut slice = common::kube::slice("vllm-x1", 99, &endpoints, port);
    slice["metadata"]["namespace"] = ns.clone().into();
    slice["metadata"]["labels"] =
        serde_json::json!({key: value, "kubernetes.io/service-name": "vllm"});
    let api = common::kube::KubeApi::start(&common::kube::slice_list(100, &[slice]));
    let source = &mut route["peers_from"]["kubernetes"];
    source["api"] = api.url.clone().into();
    source["port"] = u64::from(port).into();

    // The harness writes these itself, for loopback and a temp dir.
    let map = config.as_mapping_mut().expect("a mapping");
    for key in [
        "listen",
        "admin_listen",
        "routes_dir",
        "api_keys_file",
        "grace_period",
    ] {
        assert!(map.remove(key).is_some(), "the overlay sets {key}");
    }
    let redis = Redis::start();
    let store = &mut config["session_store"];
    assert_eq!(text(store, "kind"), "redis");
    store["url"] = redis.url().into();
    // The default 20 ms suits a cluster; on a busy two-core test box a
    // slower answer would place a turn locally and look like a split.
    store["timeout"] = "200ms".into();

    let route = serde_yaml::to_string(&route).unwrap();
    let start = |config: &Value| {
        common::Gateway::start_with(
            &[("chat", route.clone())],
            common::GatewayOptions {
                extra_config: serde_yaml::to_string(config).unwrap(),
                // The manifest's own `watch: true` stays.
                watch: None,
                ..Default::default()
            },
        )
    };
    let discovered = |gw: &common::Gateway| {
        common::wait_for("the three pods as peers", common::DEADLINE, || {
            let h = common::http::get(gw.addr, "/chat/_health_status").json();
            let mut names: Vec<String> = h["peers"]
                .as_array()?
                .iter()
                .filter(|p| p["address"].is_string())
                .filter_map(|p| p["name"].as_str().map(str::to_string))
                .collect();
            names.sort();
            (names == ["vllm-0", "vllm-1", "vllm-2"]).then_some(())
        })
    };

    let (a, b) = (start(&config), start(&config));
    discovered(&a);
    discovered(&b);
    assert_eq!(common::split_sessions(&a, &b, 20, 4), 0);
    assert_eq!(a.metric("llm_gateway_session_store_up", &[]), 1.0);
    assert!(redis.keys().iter().any(|k| k.starts_with("llmgw:s:chat:")));
    // The gateways asked for the manifests' namespace and selector.
    let list_path = format!(
        "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector={}",
        selector.replace('/', "%2F").replace('=', "%3D")
    );
    let targets = api.targets();
    assert!(
        targets.contains(&list_path),
        "{list_path} not in {targets:?}"
    );

    // Control: without the shared table the same traffic splits sessions.
    config
        .as_mapping_mut()
        .unwrap()
        .remove("session_store")
        .expect("session_store");
    let (la, lb) = (start(&config), start(&config));
    discovered(&la);
    discovered(&lb);
    assert!(
        common::split_sessions(&la, &lb, 20, 4) > 0,
        "local tables agreed on every session: the test could not fail"
    );
}
