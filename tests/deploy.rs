//! The shipped deployment files agree with the code that reads them.

use std::path::Path;

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel))
        .unwrap_or_else(|e| panic!("{rel}: {e}"))
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
    let dockerfile = read("docker/Dockerfile");
    let mount = format!(":{}:ro", keys_dir.display());
    assert!(
        dockerfile.contains(&mount),
        "docker/Dockerfile must mount the key directory {} (read-only), found:\n{dockerfile}",
        keys_dir.display()
    );
    // Control: the image ships that very config.
    assert!(dockerfile.contains("COPY conf/gateway.yaml /etc/llm-gateway/gateway.yaml"));
}
